"""``python -m recoverssm_rs``: see :mod:`recoverssm_rs.cli`."""

import sys

from .cli import main

sys.exit(main(prog="python -m recoverssm_rs"))
