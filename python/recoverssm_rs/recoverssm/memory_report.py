"""Deprecated alias of :mod:`recoverssm_rs.speculative.memory_report` (see :mod:`recoverssm_rs.recoverssm`)."""

import importlib

from recoverssm_rs.speculative.memory_report import *  # noqa: F403

_target = importlib.import_module("recoverssm_rs.speculative.memory_report")


def __getattr__(name: str) -> object:
    return getattr(_target, name)
