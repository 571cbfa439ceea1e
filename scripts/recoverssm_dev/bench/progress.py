"""A progress bar on stderr: redrawn in place on a terminal, one line per case elsewhere (logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Counts ``total`` units of work; :meth:`advance` marks one done.

    On a terminal the bar is redrawn in place (``[#####-----]  12/50  3.1 s  case: detail``); on
    anything else (a pipe, a log file, a test) a line is written only when the case changes, so a
    log shows each case once without carriage-return clutter. ``enabled=False`` writes nothing.
    """

    def __init__(self, total: int, stream: TextIO | None = None, *, enabled: bool = True, width: int = 28) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.width = width
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self._t0: float | None = None  # set by the first update: the clock starts with the work
        self._last_case: str | None = None
        self._drawn = 0

    def __repr__(self) -> str:
        return f"Progress({self.done}/{self.total}, tty={self.tty})"

    def start(self, case: str, detail: str = "") -> None:
        """Show that ``case`` (``detail``) is being worked on, without counting a unit."""
        self._show(case, detail)

    def advance(self, case: str, detail: str = "") -> None:
        """Count one unit of ``case`` done (``detail`` names the unit, e.g. the method)."""
        self.done = min(self.total, self.done + 1)
        self._show(case, detail)

    def close(self) -> None:
        """End the bar (a newline after an in-place bar)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0

    def _show(self, case: str, detail: str) -> None:
        if not self.enabled:
            return
        if self._t0 is None:
            self._t0 = time.perf_counter()
        elapsed = time.perf_counter() - self._t0
        count = f"{self.done:>{len(str(self.total))}}/{self.total}"
        if self.tty:
            filled = round(self.width * self.done / self.total)
            text = f"[{'#' * filled}{'-' * (self.width - filled)}] {count} {elapsed:6.1f} s  {case}"
            text += f": {detail}" if detail else ""
            pad = max(0, self._drawn - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._drawn = len(text)
            self.stream.flush()
        elif case != self._last_case:
            self.stream.write(f"bench: [{count}] {elapsed:6.1f} s  {case}\n")
            self.stream.flush()
        self._last_case = case
