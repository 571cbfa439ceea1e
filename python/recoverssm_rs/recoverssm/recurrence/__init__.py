"""Deprecated alias of :mod:`recoverssm_rs.speculative.recurrence` (see :mod:`recoverssm_rs.recoverssm`)."""

import importlib

from recoverssm_rs.speculative.recurrence import *  # noqa: F403

_target = importlib.import_module("recoverssm_rs.speculative.recurrence")


def __getattr__(name: str) -> object:
    return getattr(_target, name)
