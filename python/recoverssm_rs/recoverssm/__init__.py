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


def _register(new_name: str) -> None:
    """Registers, under the old path, every imported module below ``new_name``: importing one by the
    old path then finds it in ``sys.modules`` and the import system does not set it as an attribute
    of its package, where it would hide a package attribute of the same name (the function
    ``recurrence.commit`` beside the module ``recurrence.commit``)."""
    for name, module in list(sys.modules.items()):
        if name.startswith(new_name + "."):
            sys.modules.setdefault(_OLD + name[len(_NEW) :], module)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``recoverssm_rs.recoverssm.X`` to the module ``recoverssm_rs.speculative.X``."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_NEW + spec.name[len(_OLD) :])
        self._specs[spec.name] = module.__spec__  # the import system sets the alias spec on it next
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new path's, already executed: its own spec is put back and its
        imported submodules are registered under the old path."""
        old = module.__spec__.name if module.__spec__ is not None else ""
        if old in self._specs:
            module.__spec__ = self._specs.pop(old)
        _register(module.__name__)


def __getattr__(name: str) -> ModuleType:
    """``recoverssm_rs.recoverssm.X`` as an attribute: the module ``recoverssm_rs.speculative.X``."""
    try:
        return importlib.import_module(f"{_OLD}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {_OLD!r} has no attribute {name!r}") from None


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
_register(_NEW)
