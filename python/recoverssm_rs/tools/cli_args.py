"""Argument parsing shared by the subcommands: one-line errors, wrapped help with the defaults,
ranged integers, and the options every subcommand spells the same way.

The shared vocabulary:

- ``--json [FILE]`` (:func:`add_json_option`): write the command's JSON document to ``FILE``
  (the text report still goes to stdout); ``-``, or no ``FILE``, writes the JSON to stdout in place
  of the text report. The path is checked when the arguments are parsed, before any work
  (:func:`output_path`): a folder, a missing folder or a place that cannot be written is refused.
- ``--quiet`` (:func:`add_quiet_option`): no progress lines on stderr.

A bad argument is answered by :meth:`Parser.error`: one line ``PROG COMMAND: error: argument
--flag: invalid value ...: what it must be (see --help)``, exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "Parser",
    "HelpFormatter",
    "allowed_range",
    "int_at_least",
    "one_line",
    "fail",
    "output_path",
    "add_json_option",
    "add_quiet_option",
    "write_json",
    "available_memory",
    "memory_problem",
    "max_threads",
    "core_reason",
]


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal, paragraph by paragraph (blank lines separate them);
    shows each option's default where it has a value (not for flags, nor for options whose help
    says what an unset option means)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
        return "\n\n".join(
            textwrap.fill(" ".join(p.split()), width, initial_indent=indent, subsequent_indent=indent)
            for p in paragraphs
        )

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or not action.option_strings
            or action.nargs in (0, "?")
            or default is None
            or default is argparse.SUPPRESS
        ):
            return text
        return text + " (default: %(default)s)"


_HINT = re.compile(r"\(see |\b(?:use|choose|pass|set|install|run) ")
"""What a message that already says what to do contains (a core error's remedy, a ``(see ...)``)."""


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line, ``PROG: error: MESSAGE``
    (exit status 2), without the usage block, with one hint: the message's own (``use ...``,
    ``(see --list-params gdn)``) or else ``(see --help)``; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        text = one_line(message)
        if not _HINT.search(text):
            text += " (see --help)"
        self.exit(2, f"{self.prog}: error: {text}\n")


def one_line(text: str) -> str:
    """``text`` with its line breaks folded into spaces."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def allowed_range(low: int, high: int | None = None) -> str:
    """The integers ``low`` to ``high`` in words that read one way only: ``">= 1"``, or ``"from 1
    to 8 inclusive"``."""
    return f">= {low}" if high is None else f"from {low} to {high} inclusive"


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high`` inclusive (``high`` None: no upper
    bound)."""
    allowed = allowed_range(low, high)

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"invalid value {value}: must be {allowed}")
        return value

    parse.__name__ = f"integer {allowed}"
    return parse


def max_threads() -> int:
    """The most CPU threads a command lets torch use: this machine's CPU count."""
    return os.cpu_count() or 1


def core_reason(e: BaseException, value: Any, name: str | None = None) -> str:
    """What the core's error ``e`` about ``value`` says the value must be: the core's message
    without the parameter's own name (and value) it starts with when it converts parameter
    ``name``. Other errors (``OverflowError``, ``TypeError``) are put in a flag's words."""
    text = str(e)
    if name is not None:
        text = re.sub(rf"^{re.escape(name)}(?: = \S+)? ", "", text)
    if re.search(r"must be a host integer", text):  # the API's word for a Python or numpy int
        return "expected an integer"
    if isinstance(e, OverflowError):
        if isinstance(value, int) and value < 0:
            return "must be >= 0"
        return f"too large for the core ({text})"
    if isinstance(e, TypeError):
        m = re.search(r"is not an instance of '(\w+)'", text)
        if m:
            return {"bool": "expected true or false", "str": "expected a name"}.get(
                m.group(1), f"expected a {m.group(1)}"
            )
        if "integer" in text:
            return "expected an integer"
    return text


def fail(prog: str, message: str, status: int = 1) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` (one line) on stderr and exit with ``status``."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(status)


# ---- output files ------------------------------------------------------------------------------


def _writable_problem(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (a folder, a missing folder, no permission), or
    None. Asks the operating system: opens the file for appending (which changes nothing in an
    existing file) and removes it again if the open created it."""
    if path.is_dir():
        return "is a folder; expected a file name"
    if not path.parent.is_dir():
        return f"the folder of {str(path)!r} does not exist"
    existed = path.exists()
    if existed and not path.is_file():  # a device or a pipe (/dev/null, /dev/stdout): take it
        return None if os.access(path, os.W_OK) else "cannot be written"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return f"cannot be created in {str(path.parent)!r} ({e.strerror})"
        return f"cannot be written ({e.strerror})"
    os.close(fd)
    if not existed:
        os.unlink(path)
    return None


def output_path(suffixes: Iterable[str] = (), *, stdout: bool = False) -> Callable[[str], str]:
    """An argparse ``type`` for an output file: refuses a folder, a missing folder, a place that
    cannot be written and (with ``suffixes``) a name without one of them; ``stdout`` lets ``-``
    through (stdout)."""
    endings = tuple(s.lower() for s in suffixes)

    def parse(text: str) -> str:
        if stdout and text == "-":
            return text
        if not text:
            raise argparse.ArgumentTypeError("invalid value '': expected a file name")
        if endings and not text.lower().endswith(endings):
            listed = ", ".join(endings[:-1]) + " or " + endings[-1] if len(endings) > 1 else endings[0]
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}: the file name must end in {listed} (the format follows the suffix)"
            )
        problem = _writable_problem(Path(text))
        if problem is not None:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {problem}")
        return text

    parse.__name__ = "output file"
    return parse


def add_json_option(p: argparse.ArgumentParser, what: str = "the results") -> None:
    """``--json [FILE]``: the shared spelling (see the module docstring)."""
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        type=output_path(stdout=True),
        help=f"write {what} as JSON to FILE (the text still goes to stdout); '-', or no "
        f"FILE, writes the JSON to stdout in place of the text",
    )


def add_quiet_option(p: argparse.ArgumentParser) -> None:
    """``--quiet``: the shared spelling of "no progress lines"."""
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def write_json(doc: Any, dest: str, prog: str) -> None:
    """Write ``doc`` as JSON to ``dest`` (``-``: stdout). A file that cannot be written after all
    (the disk filled up, say) is one line on stderr and exit status 1."""
    text = json.dumps(doc, indent=2)
    if dest == "-":
        print(text)
        return
    try:
        Path(dest).write_text(text + "\n")
    except OSError as e:
        fail(prog, f"cannot write {dest!r}: {e.strerror or e}")


# ---- memory -------------------------------------------------------------------------------------


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation on this machine (``MemAvailable``), or None
    where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def memory_problem(nbytes: int, what: str, available: int | None = None) -> str | None:
    """Why ``nbytes`` of ``what`` cannot be allocated here (more than the memory available), or
    None."""
    from .formatting import human_bytes

    have = available_memory() if available is None else available
    if have is None or nbytes <= have:
        return None
    return f"{what} would take {human_bytes(nbytes)}, more than the {human_bytes(have)} of memory available"
