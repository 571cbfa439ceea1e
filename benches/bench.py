"""The planner and the host executor against their baselines, on this machine's CPU (with ``--gpu``
also the GPU copy benchmark): tables on stdout, progress on stderr, ``--json`` and ``--plot``.

    .venv/bin/python benches/bench.py [--quick] [--only plan|host] [--json FILE] [--plot FILE.png]

The benchmark's code is the checkout's development package ``recoverssm_dev.bench`` (under
``scripts/``; the wheel does not ship it). ``--help`` lists the options.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from recoverssm_dev.bench.command import main  # noqa: E402 (after the path of the development package)

if __name__ == "__main__":
    sys.exit(main(prog="benches/bench.py"))
