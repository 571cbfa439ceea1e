"""``recoverssm simulate TRACE [TRACE ...] --policy NAME``: replay request traces through checkpoint
policies.

A trace is JSON lines, one request per line in arrival order (see
:mod:`recoverssm_rs.checkpoints`). ``--policy`` takes one policy, a comma-separated list, or
``all``; the text report is one row per policy and trace, ``--json`` writes one object per run (a
list when there are several; with several traces each names its ``trace``), ``--plot PATH`` writes
the figure of reused tokens and checkpoint memory per policy per trace (needs matplotlib). Every flag's value is checked by the core before the trace is read: a
refused value is answered with ``argument --flag: invalid value ...`` (exit status 2); a bad trace
line is a ``PlanError`` naming the line and the field (exit status 1).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..checkpoints import POLICIES, CheckpointCache, simulate
from ..errors import RecoverSSMError
from .cli_args import HelpFormatter, add_json_option, core_reason, fail, output_path, write_json

__all__ = ["add_parser", "format_rows"]

_FLAGS = {
    "policy": "--policy",
    "block_size": "--block-size",
    "granularity": "--granularity",
    "budget": "--budget-checkpoints",
    "budget_bytes": "--budget-bytes",
    "state_bytes": "--state-bytes",
}


def add_parser(sub: Any) -> None:
    """Registers ``simulate``."""
    p = sub.add_parser(
        "simulate",
        formatter_class=HelpFormatter,
        help="replay a request trace through a checkpoint placement policy",
        description="Replay a JSON-lines request trace ({id, arrival, prompt, output} per line, in "
        "arrival order) one request at a time through a recurrent-checkpoint policy, and count the "
        "prompt tokens reused, the hits, the checkpoint writes and the most checkpoints held.\n\n"
        f"Policies: {', '.join(POLICIES)}.",
    )
    p.add_argument("trace", metavar="TRACE", nargs="+", help="trace files (JSON lines), one workload each")
    p.add_argument(
        "--policy",
        default="recoverssm",
        metavar="NAME",
        help="a policy, a comma-separated list of policies, or 'all'",
    )
    p.add_argument(
        "--block-size", type=int, default=1056, dest="block_size", metavar="B", help="the engine's block size (tokens)"
    )
    p.add_argument("--granularity", type=int, default=64, metavar="G", help="the scan's chunk size (tokens)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--budget-checkpoints",
        type=int,
        dest="budget",
        metavar="N",
        help="the most checkpoints held at once (default: unlimited)",
    )
    budget.add_argument(
        "--budget-bytes",
        type=int,
        dest="budget_bytes",
        metavar="N",
        help="the bytes checkpoints may use (with --state-bytes; default: unlimited)",
    )
    p.add_argument("--state-bytes", type=int, dest="state_bytes", metavar="N", help="the bytes of one checkpoint")
    p.add_argument(
        "--plot",
        metavar="PATH",
        type=output_path((".png", ".svg", ".pdf")),
        help="write the plot of reused tokens and memory per policy per trace here (.png, .svg or .pdf; needs matplotlib)",
    )
    add_json_option(p, "the totals")
    p.set_defaults(func=_cmd, parser=p)


def _policies(text: str) -> list[str]:
    return list(POLICIES) if text == "all" else [t.strip() for t in text.split(",")]


def _check_flags(args: argparse.Namespace) -> None:
    """Builds each policy's cache once, so the core checks every flag before the trace is read;
    a refused value is reported against its flag."""
    parser: argparse.ArgumentParser = args.parser
    for policy in _policies(args.policy):
        given = {
            "block_size": args.block_size,
            "granularity": args.granularity,
            "budget": args.budget,
            "budget_bytes": args.budget_bytes,
            "state_bytes": args.state_bytes,
        }
        try:
            CheckpointCache(policy, **given)
        except (RecoverSSMError, OverflowError, TypeError) as e:
            text = str(e)
            # The core's message starts with the argument's name (longest first: budget_bytes
            # before budget).
            name = next((n for n in sorted(("policy", *given), key=len, reverse=True) if text.startswith(n)), None)
            if name is None and "state_bytes" in text:
                name = "state_bytes" if args.state_bytes is None else "budget_bytes"
            if name is None:
                parser.error(text)
            value = policy if name == "policy" else given[name]
            parser.error(f"argument {_FLAGS[name]}: invalid value {value!r}: {core_reason(e, value, name)}")


def format_rows(runs: list[dict[str, Any]]) -> str:
    """The text report: one row per run (policy, and trace when the runs name one)."""
    named = any("trace" in r for r in runs)
    width = max([5] + [len(str(r.get("trace", ""))) for r in runs])
    head = (
        f"{'trace':<{width}} " if named else ""
    ) + f"{'policy':<11} {'requests':>8} {'prompt tok':>11} {'reused tok':>11} {'reuse':>6} {'bound':>6} "
    head += f"{'hits':>5} {'writes':>7} {'evicted':>7} {'peak':>5}"
    lines = [head]
    for r in runs:
        tokens = max(r["prompt_tokens"], 1)
        lines.append(
            (f"{r.get('trace', ''):<{width}} " if named else "")
            + f"{r['policy']:<11} {r['requests']:>8} {r['prompt_tokens']:>11} {r['reused_tokens']:>11} "
            f"{r['reused_tokens'] / tokens:>6.1%} {r['upper_bound_tokens'] / tokens:>6.1%} {r['hit_requests']:>5} "
            f"{r['checkpoint_writes']:>7} {r['evictions']:>7} {r['peak_checkpoints']:>5}"
        )
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    _check_flags(args)
    runs = []
    for trace in args.trace:
        for policy in _policies(args.policy):
            try:
                out = simulate(
                    trace,
                    policy,
                    block_size=args.block_size,
                    granularity=args.granularity,
                    budget_checkpoints=args.budget,
                    budget_bytes=args.budget_bytes,
                    state_bytes=args.state_bytes,
                )
            except OSError as e:
                fail(args.parser.prog, f"cannot read trace {trace!r}: {e.strerror or e}")
            for key in ("reused", "bound", "writes"):
                out.pop(key)
            if len(args.trace) > 1:
                out["trace"] = trace
            runs.append(out)
    if args.json != "-":
        print(format_rows(runs))
    if args.plot:
        _plot(runs, args)
    if args.json:
        write_json(runs[0] if len(runs) == 1 else runs, args.json, args.parser.prog)
    return 0


def _plot(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from ..checkpoints.plot import plot_runs

    if len(args.trace) == 1:
        runs = [{**r, "trace": args.trace[0]} for r in runs]
    try:
        plot_runs(runs, args.plot)
    except ImportError:
        fail(args.parser.prog, "--plot needs matplotlib: pip install 'recoverssm_rs[plot]'")
    except OSError as e:
        fail(args.parser.prog, f"cannot write the plot {args.plot!r}: {e.strerror or e}")
