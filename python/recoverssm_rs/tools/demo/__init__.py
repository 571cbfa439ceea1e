"""The package's end-to-end check, ``python -m recoverssm_rs demo``.

A toy hybrid model (random weights, seeded) with GDN layers (scalar gate, SD conv windows,
float32 records) and KDA layers (per-channel gate, DS conv windows, bfloat16 conv and key/gate
records, float32 recurrent state, as the Kimi-K3-like preset) is served the way an engine serves
it — prefix-cache hits, forks, speculative windows, align-mode commits that write boundary states —
and after every step every state is compared with decoding only the accepted tokens one at a time.

Modules: :mod:`.config` (options and their up-front check), :mod:`.model` (the toy layers),
:mod:`.engine` (block pool, prefix cache, requests, the step loop), :mod:`.oracle` (the
token-by-token reference and the checks), :mod:`.report` (figures and text), :mod:`.runner`
(:func:`run`), :mod:`.cli` (the ``demo`` subcommand).

:func:`run` reports progress through a callback (and the ``recoverssm_rs.tools.demo`` logger); it never
prints. Importing this package needs no torch; running the demo does.
"""

from __future__ import annotations

from .config import DEFAULTS, PRESET, DemoOptionError, recoverssm_presets, validate
from .oracle import TOLERANCE
from .report import format_summary
from .runner import run

__all__ = [
    "run",
    "format_summary",
    "validate",
    "recoverssm_presets",
    "DemoOptionError",
    "DEFAULTS",
    "PRESET",
    "TOLERANCE",
]
