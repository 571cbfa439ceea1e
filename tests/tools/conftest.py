"""The checkout's development package (``scripts/recoverssm_dev``: the benchmarks, the kernel check,
the P/D demo), importable by the tests of the tools as its scripts import it."""

import sys
from pathlib import Path

SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
