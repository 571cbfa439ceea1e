"""Host executor bandwidth against torch on the same bytes.

    .venv/bin/python benches/host_copy.py [--sizes 4K 64K 256K 2M] [--batches 64 256] [--json]

For each state size S and batch N: a real CPU pool ``[2N + 1, *state]`` fp32 (one temporal
state, one layer; the 2 MiB case is Kimi-K3-like ``[32, 128, 128]`` fp32), and
``plan_copy(src, dst)`` of N blocks to N other blocks, both in random order (no two copies
coalesce, as in an engine step). Timed:

  execute        ``plan.execute()`` (plan built outside the timed region; N segments)
  plan+execute   ``planner.plan_copy(src, dst).execute()``
  execute(1seg)  ``plan.execute()`` for blocks ``1..N -> N+1..2N``: coalesced to one segment
  copy_          ``dst_view.copy_(src_view)`` of one contiguous tensor of the same N*S bytes
  index          ``pool[dst_idx] = pool[src_idx]`` (gather into a temporary, then scatter)

Bandwidth is bytes read + bytes written per second (2 N S / t; for ``index`` the temporary's extra
traffic is not counted), median over repetitions, in GB/s (1e9). Small pools sit in the CPU caches
(no rotation), so the small sizes measure cache bandwidth and per-call overhead. The executor uses
2 threads per wave of >= 4 MiB where the machine has them; torch uses its intra-op threads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from recoverssm_rs import Layout, StateSpec
from recoverssm_rs.planner import CopyPlanner

SHAPES = {"4K": (1024,), "64K": (16384,), "256K": (65536,), "2M": (32, 128, 128)}


def bench(fn, budget_s: float, min_reps: int = 3, max_reps: int = 300):
    fn()  # warm up (first-touch of the temporaries, thread pools)
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    reps = int(min(max_reps, max(min_reps, budget_s / max(one, 1e-7))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return np.array(ts) / 1e9


def run_case(name: str, shape, n: int, budget_s: float, seed: int = 0):
    layout = Layout("BENCH", [StateSpec("temporal", shape, "float32", "persistent", "temporal")])
    pool = torch.empty(2 * n + 1, *shape)
    pool.copy_(torch.arange(2 * n + 1, dtype=torch.float32).view(-1, *[1] * len(shape)).expand_as(pool))
    planner = CopyPlanner(layout, [[pool]])
    rng = np.random.default_rng(seed)
    src = (1 + rng.permutation(n)).astype(np.int64)
    dst = (n + 1 + rng.permutation(n)).astype(np.int64)
    plan = planner.plan_copy(src, dst)
    plan.execute()
    assert torch.equal(pool[torch.from_numpy(dst)], pool[torch.from_numpy(src)]), "executor result wrong"
    state_bytes = layout.persistent[0].nbytes
    payload = n * state_bytes
    assert plan.nbytes == payload
    seq = planner.plan_copy(np.arange(1, n + 1), np.arange(n + 1, 2 * n + 1))
    src_view, dst_view = pool[1:n + 1], pool[n + 1:2 * n + 1]
    src_idx, dst_idx = torch.from_numpy(src), torch.from_numpy(dst)

    def index_copy():
        pool[dst_idx] = pool[src_idx]

    methods = {
        "execute": plan.execute,
        "plan+execute": lambda: planner.plan_copy(src, dst).execute(),
        "execute(1seg)": seq.execute,
        "copy_": lambda: dst_view.copy_(src_view),
        "index": index_copy,
    }
    out = {"size": name, "state_bytes": state_bytes, "batch": n, "payload_bytes": payload,
           "segments": plan.num_segments, "segments_seq": seq.num_segments, "methods": {}}
    for k, fn in methods.items():
        ts = bench(fn, budget_s)
        med = float(np.median(ts))
        out["methods"][k] = {"median_s": med, "p10_s": float(np.percentile(ts, 10)),
                             "p90_s": float(np.percentile(ts, 90)), "reps": len(ts),
                             "GBps": 2 * payload / med / 1e9}
    out["executor_over_copy_"] = out["methods"]["execute"]["GBps"] / out["methods"]["copy_"]["GBps"]
    del plan, seq, planner, pool
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--batches", nargs="*", type=int, default=[64, 256])
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timing per method and case")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    say = (lambda *a: None) if args.json else print
    load0 = os.getloadavg()[0]
    say(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, "
        f"load average {load0:.2f}; GB/s = (bytes read + written) / s")
    cols = ["execute", "plan+execute", "execute(1seg)", "copy_", "index"]
    say(f"{'state':>6} {'N':>4} {'MiB':>7} {'segs':>5} " + " ".join(f"{c:>13}" for c in cols) + f" {'exec/copy_':>10}")
    results = []
    t_start = time.perf_counter()
    for name in args.sizes:
        for n in args.batches:
            r = run_case(name, SHAPES[name], n, args.budget)
            results.append(r)
            say(f"{name:>6} {n:>4} {r['payload_bytes'] / 2**20:>7.1f} {r['segments']:>5} "
                + " ".join(f"{r['methods'][c]['GBps']:>8.1f} GB/s" for c in cols)
                + f" {r['executor_over_copy_']:>9.2f}x")
    say(f"\nbest case (p10 of the times), GB/s:")
    for r in results:
        say(f"{r['size']:>6} {r['batch']:>4} " + " ".join(
            f"{2 * r['payload_bytes'] / r['methods'][c]['p10_s'] / 1e9:>8.1f} GB/s" for c in cols))
    say(f"\nmedian times (us): " + "; ".join(
        f"{r['size']}x{r['batch']}: exec {r['methods']['execute']['median_s'] * 1e6:.0f}, "
        f"copy_ {r['methods']['copy_']['median_s'] * 1e6:.0f}" for r in results))
    say(f"total {time.perf_counter() - t_start:.1f} s; load average {load0:.2f} -> {os.getloadavg()[0]:.2f} "
        "(other processes on these CPUs distort the medians, torch's thread barriers most)")
    if args.json:
        print(json.dumps({"torch_threads": torch.get_num_threads(), "load_average": [load0, os.getloadavg()[0]],
                          "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
