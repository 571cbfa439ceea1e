"""Deprecated: the old import path of :mod:`recoverssm_rs.speculative` (renamed in 0.2.0).

``recoverssm_rs.recoverssm`` and every module under it (``.state_cache``, ``.recurrence``,
``.memory_report``, ...) still import, as the very same module objects as under
``recoverssm_rs.speculative``, with a :class:`DeprecationWarning`. The old path is removed in 0.3.0.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

_OLD = __name__
_NEW = "recoverssm_rs.speculative"

warnings.warn(
    f"{_OLD} is renamed {_NEW}; import {_NEW} instead (the old path is removed in 0.3.0)",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``recoverssm_rs.recoverssm.X`` to the module ``recoverssm_rs.speculative.X``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_NEW + spec.name[len(_OLD) :])

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new path's, already executed."""


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
