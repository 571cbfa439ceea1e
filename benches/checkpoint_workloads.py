"""The checkpoint policies on every generated workload: reused tokens, hit requests, checkpoint
writes and peak checkpoints, with an unlimited pool and with a quarter of the peak vLLM's policy
held unlimited (at least 8 checkpoints), in one run.

    python benches/checkpoint_workloads.py [--json FILE] [--plot FILE] [--block-size B] [--granularity G]

Prints a Markdown table (the one in benches/README.md) and the targets' verdicts: the
`recoverssm` policy never below `vllm` on any workload at either budget; at least 80% of the
bound on the shared-prompt and few-shot workloads; over all workloads at least 1.5x `vllm`'s
reused tokens at both budgets and 85% of the bound unlimited. The bound per request: the longest
prefix it shares with any earlier request's prompt + output, floored to the granularity, at most
its prompt length - 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from recoverssm_rs.checkpoints import POLICIES, simulate
from recoverssm_rs.checkpoints.workloads import WORKLOADS

PER_WORKLOAD_80 = ("shared-long", "shared-short", "few-shot")


def run(block_size: int, granularity: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, gen in WORKLOADS.items():
        trace = gen()
        vllm_free = simulate(trace, "vllm", block_size=block_size, granularity=granularity)
        quarter = max(8, vllm_free["peak_checkpoints"] // 4)
        for budget_name, budget in (("unlimited", None), (f"quarter ({quarter})", quarter)):
            for policy in POLICIES:
                out = simulate(trace, policy, block_size=block_size, granularity=granularity, budget_checkpoints=budget)
                for key in ("reused", "bound", "writes"):
                    out.pop(key)
                out["workload"] = name
                out["budget"] = budget_name
                rows.append(out)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | budget | policy | reused tokens | of prompt | of bound | hit requests | writes | peak |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bound = max(r["upper_bound_tokens"], 1)
        lines.append(
            f"| {r['workload']} | {r['budget']} | {r['policy']} | {r['reused_tokens']:,} | "
            f"{r['reused_tokens'] / r['prompt_tokens']:.1%} | {r['reused_tokens'] / bound:.1%} | "
            f"{r['hit_requests']}/{r['requests']} | {r['checkpoint_writes']:,} | {r['peak_checkpoints']} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    def get(w: str, b: str, p: str) -> dict[str, Any]:
        return next(r for r in rows if r["workload"] == w and r["budget"].startswith(b) and r["policy"] == p)

    out = []
    workloads = [w for w in WORKLOADS if w != "mix"]
    for b in ("unlimited", "quarter"):
        worst = min(
            (get(w, b, "recoverssm")["reused_tokens"] - get(w, b, "vllm")["reused_tokens"], w) for w in WORKLOADS
        )
        out.append(
            (f"{b}: recoverssm >= vllm on every workload (worst margin {worst[0]:,} on {worst[1]})", worst[0] >= 0)
        )
        mine = sum(get(w, b, "recoverssm")["reused_tokens"] for w in workloads)
        theirs = sum(get(w, b, "vllm")["reused_tokens"] for w in workloads)
        ratio = mine / theirs if theirs else float("inf")
        out.append(
            (
                f"{b}: all workloads (mix excluded) recoverssm / vllm reused = {ratio:.2f}x (target >= 1.5x)",
                ratio >= 1.5,
            )
        )
    for w in PER_WORKLOAD_80:
        r = get(w, "unlimited", "recoverssm")
        share = r["reused_tokens"] / max(r["upper_bound_tokens"], 1)
        out.append(
            (
                f"{w}: recoverssm reuses {share:.1%} of the bound (target >= 80%)",
                share >= 0.8 and r["reused_tokens"] > 0,
            )
        )
    mine = sum(get(w, "unlimited", "recoverssm")["reused_tokens"] for w in workloads)
    bound = sum(get(w, "unlimited", "recoverssm")["upper_bound_tokens"] for w in workloads)
    out.append(
        (
            f"all workloads: recoverssm reuses {mine / bound:.1%} of the bound unlimited (target >= 85%)",
            mine >= 0.85 * bound,
        )
    )
    return out


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(WORKLOADS)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.2
    for ax, budget in zip(axes, ("unlimited", "quarter")):
        for k, policy in enumerate(POLICIES):
            vals = []
            for w in workloads:
                r = next(
                    x for x in rows if x["workload"] == w and x["budget"].startswith(budget) and x["policy"] == policy
                )
                vals.append(100.0 * r["reused_tokens"] / max(r["upper_bound_tokens"], 1))
            ax.bar([i + (k - 1.5) * width for i in range(len(workloads))], vals, width, label=policy)
        ax.set_xticks(range(len(workloads)), workloads, rotation=20)
        ax.set_ylabel("reused tokens, % of the bound")
        ax.set_title(f"{budget} pool" + (" (1/4 of vLLM's unlimited peak, >= 8)" if budget == "quarter" else ""))
        ax.set_ylim(0, 110)
    axes[0].legend(fontsize=8, loc="lower left", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, default=1056)
    ap.add_argument("--granularity", type=int, default=64)
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--plot", help="write a PNG of reuse per policy per workload here")
    args = ap.parse_args()
    rows = run(args.block_size, args.granularity)
    print(table(rows))
    print()
    ok = True
    for text, good in verdicts(rows):
        print(f"- {'met' if good else 'NOT met'}: {text}")
        ok &= good
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
