"""Prefill and decode in two OS processes, the states moved over NIXL with re-sharding and checked
against one-instance decoding (needs NIXL: ``pip install nixl-cu12``).

    .venv/bin/python scripts/pd_demo.py [--prefill-tp 2 --decode-tp 4 ...]

The code is the checkout's development package (``scripts/recoverssm_dev/pd_demo*.py``).
"""

from __future__ import annotations

import sys

from recoverssm_dev.pd_demo_cli import main

if __name__ == "__main__":
    sys.exit(main(prog="scripts/pd_demo.py"))
