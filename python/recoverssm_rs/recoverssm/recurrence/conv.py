"""Deprecated alias of :mod:`recoverssm_rs.speculative.recurrence.conv` (see :mod:`recoverssm_rs.recoverssm`)."""

import importlib

from recoverssm_rs.speculative.recurrence.conv import *  # noqa: F403

_target = importlib.import_module("recoverssm_rs.speculative.recurrence.conv")


def __getattr__(name: str) -> object:
    return getattr(_target, name)
