"""The commands of the command line whose code stays in the source checkout: the benchmarks
(``bench``), the kernel compile check (``check-kernels``) and the two-process P/D demo
(``pd-demo``). The wheel does not ship them; each command answers with one line saying how to run
it from a checkout (exit status 1), whatever its arguments (``--help`` included).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from .cli_args import fail

__all__ = ["DEV_COMMANDS", "add_parsers", "how_to_run"]

DEV_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("benches/bench.py", "measure the planner and the host executor against their baselines"),
    "check-kernels": ("scripts/check_kernels.py", "compile the CUDA kernels with this machine's NVRTC"),
    "pd-demo": ("scripts/pd_demo.py", "prefill and decode in two processes, states moved over NIXL"),
}
"""Command -> (its script in the checkout, what it does)."""


def how_to_run(command: str, args: list[str]) -> str:
    """The line that says how to run ``command`` (with ``args``) from a source checkout."""
    script, _ = DEV_COMMANDS[command]
    line = shlex.join([".venv/bin/python", script, *args])
    return (
        f"`{command}` is a development tool of the source checkout, not part of the installed "
        f"package: in a clone of the repository, after `bash scripts/setup.sh`, run `{line}`"
    )


def add_parsers(sub: Any) -> None:
    """Register every command of :data:`DEV_COMMANDS` on ``sub`` (an argparse subparsers object):
    each takes any arguments and answers with :func:`how_to_run`."""
    for command, (script, what) in DEV_COMMANDS.items():
        # No option of its own (not even -h): every argument is kept for the line it prints.
        p = sub.add_parser(
            command, help=f"{what} (from a source checkout: {script})", add_help=False, prefix_chars="\0"
        )
        p.add_argument("args", nargs="*")
        p.set_defaults(func=_answer, parser=p, command_name=command)


def _answer(args: argparse.Namespace) -> int:
    fail(args.parser.prog, how_to_run(args.command_name, list(args.args)))
