"""``benches/bench.py``: options, the run, the table, ``--json`` and ``--plot``.

torch runs with one intra-op thread unless ``--threads`` says otherwise: on a shared machine its
default (every core) made the baselines swing by orders of magnitude between repeats, while one
thread gives figures that repeat. Every figure is printed with its spread (the min-max of the
timing rounds' medians).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
from typing import Any

from recoverssm_rs import backend_check
from recoverssm_rs.errors import BackendUnavailableError, RecoverSSMError
from recoverssm_rs.tools.cli_args import (
    HelpFormatter,
    Parser,
    add_json_option,
    add_quiet_option,
    fail,
    int_at_least,
    max_threads,
    memory_problem,
    output_path,
    write_json,
)

from . import gpu_copy, host_copy, plan_step
from .progress import Progress
from .timing import Budget

__all__ = [
    "FULL",
    "MAX_BUDGET",
    "PROG",
    "QUICK",
    "build_parser",
    "configure",
    "format_report",
    "main",
    "run",
    "settings",
]

PROG = "benches/bench.py"
"""The program's name in its messages."""

MAX_BUDGET = 60.0
"""The most seconds ``--budget`` gives one method in one case (a full run times about 40 of them)."""

DEFAULT_THREADS = 1
"""torch intra-op threads unless ``--threads`` is given: the setting whose figures repeat."""

BENCHMARKS = ("plan", "host")

FULL: dict[str, Any] = {
    "requests": [1, 16, 64, 256, 1024],
    "layers": 48,
    "sizes": ["4K", "64K", "256K", "2M"],
    "batches": [64, 256],
    "budget": 0.4,
}
"""Settings of a full run (about a minute on a 2-core machine)."""
QUICK: dict[str, Any] = {
    "requests": [1, 16, 64],
    "layers": 8,
    "sizes": ["4K", "64K", "256K"],
    "batches": [64],
    "budget": 0.02,
}
"""Settings of ``--quick`` (10-15 s on a loaded 2-core machine; a smoke test, not for figures)."""


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x, 10) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected comma-separated integers >= 1") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected integers >= 1")
    return sorted(set(values))


def _size_list(text: str) -> list[str]:
    sizes = [x.strip() for x in text.split(",") if x.strip()]
    bad = [s for s in sizes if s not in host_copy.SHAPES]
    if not sizes or bad:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected sizes from {', '.join(host_copy.SHAPES)} (comma-separated)"
        )
    return sorted(set(sizes), key=list(host_copy.SHAPES).index)


def _seconds(text: str) -> float:
    allowed = f"seconds above 0 and at most {MAX_BUDGET:g}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {allowed}") from None
    if not (0 < value <= MAX_BUDGET and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {allowed}")
    return value


def _arg_string(text: str) -> list[str]:
    import shlex

    try:
        return shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {e} (quote as in a shell)") from None


PLOT_SUFFIXES = (".png", ".svg", ".pdf")
"""What ``--plot`` writes (matplotlib takes the format from the suffix)."""


_DESCRIPTION = (
    "Measure the copy planner (plan step: throughput against requests) and the host executor (host "
    "copy: bandwidth against state size) against the baselines engines use today (a per-copy "
    "Python loop, vectorised numpy, torch copy_ and index copies), on this machine's CPU; with --gpu "
    "also the GPU copy benchmark. The methods are timed interleaved in rounds; every figure comes "
    "with its spread over the rounds (min-max of the rounds' medians). torch runs with one thread "
    "unless --threads says otherwise (its default of every core gave figures that did not repeat "
    "on a shared machine). Progress goes to stderr, the tables to stdout. Needs torch."
)


def build_parser(prog: str = PROG) -> Parser:
    """The benchmark's argument parser (one-line errors, defaults in the help)."""
    p = Parser(prog=prog, formatter_class=HelpFormatter, description=_DESCRIPTION)
    configure(p)
    return p


def configure(p: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``p``."""
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test, not for figures (about 10-15 s on a loaded 2-core machine): "
        f"requests {','.join(map(str, QUICK['requests']))}, {QUICK['layers']} layers, "
        f"sizes {','.join(QUICK['sizes'])}, batch {','.join(map(str, QUICK['batches']))}",
    )
    p.add_argument(
        "--only", choices=BENCHMARKS, action="append", help="run only this benchmark (repeatable; default: both)"
    )
    p.add_argument(
        "--requests",
        type=_int_list,
        metavar="N,N,...",
        help=f"plan step: request counts (default {','.join(map(str, FULL['requests']))})",
    )
    p.add_argument(
        "--layers", type=int_at_least(1), metavar="N", help=f"plan step: GDN layers (default {FULL['layers']})"
    )
    p.add_argument(
        "--sizes",
        type=_size_list,
        metavar="SIZE,...",
        help=f"host copy: state sizes, of {', '.join(host_copy.SHAPES)} (default all)",
    )
    p.add_argument(
        "--batches",
        type=_int_list,
        metavar="N,N,...",
        help=f"host copy: blocks per call (default {','.join(map(str, FULL['batches']))})",
    )
    p.add_argument(
        "--budget",
        type=_seconds,
        metavar="SECONDS",
        help=f"timing per method and case, at most {MAX_BUDGET:g} (default {FULL['budget']})",
    )
    p.add_argument(
        "--threads",
        type=int_at_least(1, max_threads()),
        default=DEFAULT_THREADS,
        metavar="N",
        help="torch intra-op threads, at most this machine's CPUs (more threads: figures that "
        "swing with the machine's load)",
    )
    add_json_option(p, "the results")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=output_path(PLOT_SUFFIXES),
        help="draw throughput against requests and bandwidth against state size, with the "
        "baselines and the spread, into FILE (.png, .svg or .pdf; needs matplotlib: "
        "the 'plot' extra)",
    )
    p.add_argument(
        "--gpu",
        action="store_true",
        help="also run the GPU copy benchmark (benches/gpu_copy.py of a source checkout; "
        "needs a CUDA device, torch and CuPy); it runs first",
    )
    p.add_argument(
        "--gpu-args",
        default=None,
        metavar="ARGS",
        type=_arg_string,
        help="with --gpu: arguments for the GPU copy benchmark as one string, written "
        f"--gpu-args='...' (default: its own; with --quick: {' '.join(gpu_copy.QUICK_ARGS)!r})",
    )
    add_quiet_option(p)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The effective settings: the options given, the rest from ``QUICK`` or ``FULL``."""
    base = QUICK if args.quick else FULL
    out = {k: (getattr(args, k) if getattr(args, k) is not None else base[k]) for k in base}
    out["benchmarks"] = sorted(set(args.only), key=BENCHMARKS.index) if args.only else list(BENCHMARKS)
    out["quick"] = bool(args.quick)
    return out


def _machine(torch: Any) -> dict[str, Any]:
    import numpy as np
    from recoverssm_rs import __version__

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "recoverssm_rs": __version__,
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_device": bool(torch.cuda.is_available()),
        "load_average": list(os.getloadavg()),
    }


def run(cfg: dict[str, Any], progress_enabled: bool = True) -> dict[str, Any]:
    """Run the CPU benchmarks of ``cfg`` (see :func:`settings`); returns the JSON document."""
    import torch

    budget = Budget(cfg["budget"])
    units = 0
    if "plan" in cfg["benchmarks"]:
        units += plan_step.count_units(cfg["requests"])
    if "host" in cfg["benchmarks"]:
        units += host_copy.count_units(cfg["sizes"], cfg["batches"])
    progress = Progress(units, enabled=progress_enabled)
    doc: dict[str, Any] = {
        "benchmark": "benches/bench.py",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": cfg,
        "machine": _machine(torch),
    }
    t0 = time.perf_counter()
    try:
        if "plan" in cfg["benchmarks"]:
            doc["plan_step"] = plan_step.run(cfg["requests"], cfg["layers"], budget, progress)
        if "host" in cfg["benchmarks"]:
            doc["host_copy"] = host_copy.run(cfg["sizes"], cfg["batches"], budget, progress)
    finally:
        progress.close()
    doc["machine"]["load_average_after"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def format_report(doc: dict[str, Any]) -> str:
    """The tables of every benchmark in ``doc``, with a header naming the machine."""
    m = doc["machine"]
    parts = [
        (
            f"recoverssm_rs {m['recoverssm_rs']} bench, {doc['date']}: {m['cpus']} CPUs, torch {m['torch']} "
            f"({m['torch_threads']} threads), numpy {m['numpy']}, Python {m['python']}; load average "
            f"{m['load_average'][0]:.2f} -> {m['load_average_after'][0]:.2f}; {doc['wall_s']:.1f} s"
        )
    ]
    if "plan_step" in doc:
        parts.append(plan_step.format_table(doc["plan_step"]))
    if "host_copy" in doc:
        parts.append(host_copy.format_table(doc["host_copy"]))
    if "gpu_copy" in doc:
        parts.append(gpu_copy.format_table(doc["gpu_copy"]))
    return "\n\n".join(parts)


def _check_resources(parser: argparse.ArgumentParser, cfg: dict[str, Any]) -> None:
    """Refuse, before measuring, a run whose pools cannot be made or do not fit in memory."""
    if "plan" in cfg["benchmarks"]:
        req, layers = cfg["requests"], cfg["layers"]
        # Name the option furthest above its default: the one to lower.
        if layers / FULL["layers"] >= max(req) / max(FULL["requests"]):
            flag, value, what = "--layers", str(layers), f"(with --requests up to {max(req)})"
        else:
            flag, value, what = "--requests", ",".join(map(str, req)), f"(with --layers {layers})"
        problem = plan_step.reserve_problem(req, layers) or memory_problem(
            plan_step.memory_bytes(req, layers), "the plan step's address arrays"
        )
        if problem:
            parser.error(f"argument {flag}: invalid value {value} {what}: {problem}")
    if "host" in cfg["benchmarks"]:
        problem = memory_problem(host_copy.memory_bytes(cfg["sizes"], cfg["batches"]), "the host copy's largest pool")
        if problem:
            parser.error(
                f"argument --batches: invalid value {','.join(map(str, cfg['batches']))} (with "
                f"--sizes {','.join(cfg['sizes'])}): {problem}"
            )


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the benchmark with the command-line arguments ``argv``; returns the exit status. A
    refusal is one line ``PROG: error: ...`` on stderr (exit status 2 for a bad argument, 1 for a
    missing piece), Ctrl-C one line and exit status 130."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        return _run_command(parser, args)
    except RecoverSSMError as e:
        fail(prog, f"{type(e).__name__}: {e}")
    except ModuleNotFoundError as e:  # matplotlib for --plot, CuPy for --gpu: the extra to install
        message = backend_check.missing_module_message(e, f"`{prog}`")
        if message is None:
            raise
        fail(prog, message)
    except KeyboardInterrupt:
        fail(prog, "interrupted", 130)


def _run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # Every argument and every missing piece is reported before a minute of measuring, not after.
    if args.gpu_args is not None and not args.gpu:
        parser.error("argument --gpu-args: only with --gpu")
    cfg = settings(args)
    _check_resources(parser, cfg)
    backend_check.require("torch", f"`{parser.prog}`")
    if args.plot:
        backend_check.require("matplotlib", f"`{parser.prog} --plot`")
    import torch

    torch.set_num_threads(args.threads)
    if args.gpu:
        if not torch.cuda.is_available():
            raise BackendUnavailableError("bench --gpu: torch sees no CUDA device")
        backend_check.require_gpu_stack()
        gpu_copy.require_script()
    elif torch.cuda.is_available() and not args.quiet:
        print("bench: a CUDA device is present; add --gpu for the GPU copy benchmark", file=sys.stderr)

    gpu_doc = None
    if args.gpu:  # first: a bad --gpu-args is refused by the script before the CPU minute
        extra = args.gpu_args if args.gpu_args is not None else list(gpu_copy.QUICK_ARGS) if args.quick else []
        try:
            gpu_doc = gpu_copy.run(extra)
        except gpu_copy.GpuArgsError as e:
            parser.error(f"argument --gpu-args: invalid value {' '.join(extra)!r}: {e}")
    doc = run(cfg, progress_enabled=not args.quiet)
    if gpu_doc is not None:
        doc["gpu_copy"] = gpu_doc

    if args.json != "-":
        print(format_report(doc))
    if args.json:
        write_json(doc, args.json, parser.prog)
        if args.json != "-" and not args.quiet:
            print(f"bench: results written to {args.json}", file=sys.stderr)
    if args.plot:
        from .plot import save_plot

        save_plot(
            doc,
            args.plot,
            title=f"recoverssm_rs {doc['machine']['recoverssm_rs']} on "
            f"{doc['machine']['cpus']} CPUs ({doc['date'][:10]})",
        )
        if not args.quiet:
            print(f"bench: plot written to {args.plot}", file=sys.stderr)
    return 0
