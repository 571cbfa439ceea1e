"""Deprecated alias of :mod:`recoverssm_rs.speculative.recurrence.verify` (see :mod:`recoverssm_rs.recoverssm`)."""

import importlib

from recoverssm_rs.speculative.recurrence.verify import *  # noqa: F403

_target = importlib.import_module("recoverssm_rs.speculative.recurrence.verify")


def __getattr__(name: str) -> object:
    return getattr(_target, name)
