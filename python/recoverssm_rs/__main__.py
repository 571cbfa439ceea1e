"""``python -m recoverssm_rs`` and the ``recoverssm`` console script: see :mod:`recoverssm_rs.tools.cli`.

:func:`main` runs the command line and turns a missing optional dependency (torch, CuPy,
matplotlib) into one line on stderr naming the extra to install, with exit status 1, instead of a
traceback, a closed stdout (``| head``) into a quiet exit, and Ctrl-C (``KeyboardInterrupt``) at
any point into one line, ``PROG: error: interrupted``, with exit status 130.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command line; returns the exit status. ``prog`` names the program in messages
    (default: the console script's name)."""
    name = prog or "recoverssm"
    try:
        return _main(argv, name)
    except KeyboardInterrupt:
        print(f"{name}: error: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None, prog: str) -> int:
    from .backend_check import missing_module_message
    from .tools.cli import main as cli_main

    try:
        return cli_main(argv, prog=prog)
    except ModuleNotFoundError as exc:
        args = list(sys.argv[1:] if argv is None else argv)
        command = next((a for a in args if not a.startswith("-")), None)
        message = missing_module_message(exc, f"`{command}`" if command else "this command")
        if message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `recoverssm presets | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main(prog="python -m recoverssm_rs"))
