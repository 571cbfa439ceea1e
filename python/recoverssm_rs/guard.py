"""The tensors a planner or a state cache bound, kept and checked.

:class:`BoundTensors` holds a strong reference to every bound tensor (so dropping the caller's
references cannot free the memory a plan writes), checks before every execute and every launch that
each tensor and each distinct storage still has the address and size it was bound with (the core's
``StorageGuard``: a ``set_()``, ``resize_()``, ``.data = ...`` or ``untyped_storage().resize_(0)``
after binding is a :class:`~recoverssm_rs.errors.BindingError` naming the layer and state, and
nothing is written), and after a write bumps autograd's version counter of what was written, as
torch's own in-place operations do.

What it cannot see: memory the caller frees or re-purposes behind torch's back (a storage over a
buffer released through another object), torch tensors over read-only memory (torch does not record
writability), and another thread resizing a storage while a host copy runs with the GIL released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _core

__all__ = ["BoundTensors"]


class BoundTensors:
    """Bound tensors, per layer; ``label(layer, state)`` names one in error messages."""

    __slots__ = ("tensors", "_guard", "_roots")

    def __init__(self, layers: Sequence[Sequence[Any]], label: Callable[[int, int], str]) -> None:
        self.tensors: tuple[tuple[Any, ...], ...] = tuple(tuple(layer) for layer in layers)
        entries: list[tuple[Any, str, int, str]] = []
        storages: dict[tuple[str, int], tuple[Any, int, int, str]] = {}
        roots: dict[int, Any] = {}
        for li, layer in enumerate(self.tensors):
            for si, t in enumerate(layer):
                name = label(li, si)
                if isinstance(t, np.ndarray):
                    entries.append((t, "array_interface", int(t.__array_interface__["data"][0]), name))
                    continue
                entries.append((t, "data_ptr", int(t.data_ptr()), name))
                storage = getattr(t, "untyped_storage", None)
                if storage is not None:
                    st = storage()
                    storages.setdefault((str(t.device), int(st.data_ptr())), (st, int(st.data_ptr()), int(st.nbytes()), name))
                # Views share their base's version counter: bump one tensor per base. Inference
                # tensors have no version counter.
                if hasattr(t, "is_inference") and not t.is_inference():
                    root = t._base if t._base is not None else t
                    roots[id(root)] = root
        self._guard = _core.StorageGuard(entries, list(storages.values()))
        self._roots = tuple(roots.values())

    def check(self) -> None:
        """Raise :class:`~recoverssm_rs.errors.BindingError` when a bound tensor or storage no
        longer has the memory it was bound with (nothing has been written then)."""
        self._guard.check()

    def mark_written(self) -> None:
        """Bump autograd's version counters of the bound torch tensors (after a write)."""
        if self._roots:
            import torch

            torch.autograd.graph.increment_version(self._roots)

    def __repr__(self) -> str:
        return f"BoundTensors({len(self.tensors)} layers, {self._guard!r})"
