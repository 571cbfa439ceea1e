"""Argument parsing shared by the subcommands: one-line errors, defaults in the help, ranged
integers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["Parser", "HelpFormatter", "int_at_least", "one_line", "fail"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (where it has a value: not for flags and options whose help
    says what an unset option means); keeps descriptions' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or not action.option_strings or action.nargs == 0
                or default is None or default is argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line, ``PROG: error: MESSAGE``
    (exit status 2), without the usage block; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def one_line(text: str) -> str:
    """``text`` with its line breaks folded into spaces."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, high]`` (``high`` None: no upper bound)."""
    allowed = f">= {low}" if high is None else f"in {low}..{high}"

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}: expected an integer {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"invalid value {value}: must be {allowed}")
        return value

    parse.__name__ = f"integer {allowed}"
    return parse


def fail(prog: str, message: str, status: int = 1) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` (one line) on stderr and exit with ``status``."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(status)
