"""Compile the package's CUDA kernels with this machine's NVRTC (no GPU or driver needed) and report
each kernel's registers, stack, spills and barriers per architecture.

    .venv/bin/python scripts/check_kernels.py [--arch 90 ...] [--cache DIR] [--json [FILE]]

The code is the checkout's development package (``scripts/recoverssm_dev/check_kernels.py``).
"""

from __future__ import annotations

import sys

from recoverssm_dev.check_kernels import main

if __name__ == "__main__":
    sys.exit(main(prog="scripts/check_kernels.py"))
