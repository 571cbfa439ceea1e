"""One rank's block pool as a transfer sees it: the layout, its fingerprint, the persistent state
tensors of every layer, and raw byte views of them (numpy or torch, CPU or CUDA)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core import BoundTensors, Layout, LayoutFingerprint, Planner

__all__ = ["StatePool", "byte_view"]

#: ``(num_layers, num_blocks, block_strides)``: what a transfer plan needs of a pool.
Geometry = tuple[int, int, list[int]]


def _is_torch(t: Any) -> bool:
    return hasattr(t, "data_ptr") and hasattr(t, "element_size")


def _read_once(x: Any) -> Any:
    """``x``, or a list of its items when it is a one-shot iterator (a generator, ``iter(list)``:
    read a second time, it would be empty); anything else is left for the core to judge."""
    try:
        return list(x) if iter(x) is x else x
    except TypeError:  # not iterable: the core names it
        return x


def byte_view(t: Any) -> Any:
    """A flat uint8 view of the memory a state tensor ``[num_blocks, *shape]`` spans, from its
    block 0 to the end of its last block (strided pages included): a numpy array for numpy and CPU
    torch tensors, a torch tensor on the same device for CUDA tensors."""
    if _is_torch(t):
        es = t.element_size()
        inner = int(np.prod(t.shape[1:])) * es
        span = (t.shape[0] - 1) * t.stride(0) * es + inner
        if t.device.type == "cpu":
            return np.ctypeslib.as_array((ctypes.c_uint8 * span).from_address(t.data_ptr()))
        import torch

        v = torch.empty(0, dtype=torch.uint8, device=t.device)
        v.set_(t.untyped_storage(), t.storage_offset() * es, (span,), (1,))
        return v
    a = np.asarray(t)
    inner = int(np.prod(a.shape[1:])) * a.itemsize
    span = (a.shape[0] - 1) * a.strides[0] + inner
    return np.ctypeslib.as_array((ctypes.c_uint8 * span).from_address(a.ctypes.data))


class StatePool:
    """One rank's persistent state tensors: ``states[layer][i]`` is the ``i``-th persistent state
    of ``layer`` as a tensor ``[num_blocks, *shape]`` (numpy array or torch tensor; blocks may be
    strided views into shared pages). The tensors are checked against ``layout`` by the core
    (dtype, per-block shape, dense blocks, one device, no aliasing) on construction.

    The pool keeps its tensors in an immutable tuple and guards them as the planners guard theirs
    (:class:`~recoverssm_rs._core.BoundTensors`): every executor calls :meth:`check` before it
    reads or writes, so a tensor freed (``untyped_storage().resize_(0)``), resized or re-pointed
    since construction is a :class:`~recoverssm_rs.errors.BindingError` naming it, and nothing
    moves.

    Args:
        layout: the rank's layout, from a family calculator (it knows the TP split).
        states: per layer, the persistent state tensors (workspace tensors may follow; ignored).
        tp_rank: this pool's tensor-parallel rank.
        block_size: tokens per cache block (informational, part of the fingerprint).
    """

    def __init__(
        self, layout: Layout, states: Sequence[Sequence[Any]], *, tp_rank: int = 0, block_size: int = 0
    ) -> None:
        # The core checks every argument (BindingError naming it): the layout and every tensor
        # against it by its binding, the rank and block size by the fingerprint. It and the pool
        # both read ``states``: one-shot iterators are read once, here, for both.
        states = _read_once(states)
        if isinstance(states, (list, tuple)):
            states = [_read_once(layer) for layer in states]
        self._binding = Planner([(layout, states)], persistent_only=True)
        self._layout = layout
        self._fingerprint = LayoutFingerprint(layout, tp_rank=tp_rank, block_size=block_size)
        n = layout.copyable_prefix_len
        self._tensors: tuple[Any, ...] = tuple(t for layer in states for t in list(layer)[:n])
        self._num_layers = len(states)
        self._num_blocks = int(self._binding.num_blocks)
        self._device = str(self._binding.device)
        names = [s.name for s in layout.persistent]
        self._guard = BoundTensors(
            [(t, f"pool rank {tp_rank}: layer {i // n}, state '{names[i % n]}'") for i, t in enumerate(self._tensors)]
        )
        # What the transfers plan with, read once from the tensors the core checked: a tensor
        # re-strided in place later (``as_strided_``) or an attribute assigned cannot make a plan
        # address memory outside the views.
        self._views: tuple[Any, ...] = tuple(byte_view(t) for t in self._tensors)
        self._strides: tuple[int, ...] = tuple(self.block_stride(t) for t in self._tensors)
        self._addresses: tuple[int, ...] = tuple(
            int(t.data_ptr()) if _is_torch(t) else int(np.asarray(t).ctypes.data) for t in self._tensors
        )

    @property
    def layout(self) -> Layout:
        """The rank's layout (read-only, like every attribute the pool was bound with)."""
        return self._layout

    @property
    def fingerprint(self) -> LayoutFingerprint:
        """The pool's layout fingerprint, its TP rank and block size included."""
        return self._fingerprint

    @property
    def num_layers(self) -> int:
        """Layers of state tensors."""
        return self._num_layers

    @property
    def num_blocks(self) -> int:
        """Blocks of every state tensor (block 0 is the null block)."""
        return self._num_blocks

    @property
    def device(self) -> str:
        """The tensors' device (``cpu``, ``cuda:0``)."""
        return self._device

    @property
    def tensors(self) -> tuple[Any, ...]:
        """The persistent state tensors, layer-major (immutable: the pool is bound to them)."""
        return self._tensors

    @property
    def views(self) -> tuple[Any, ...]:
        """Flat uint8 views of :attr:`tensors` (see :func:`byte_view`); call :meth:`check` first."""
        return self._views

    def check(self) -> None:
        """Raises :class:`~recoverssm_rs.errors.BindingError`, naming the tensor, when a bound tensor
        or its storage no longer has the memory the pool was built with (freed, resized or
        re-pointed): nothing may then be read or written through the pool."""
        self._guard.check()

    @property
    def guard(self) -> BoundTensors:
        """The bound tensors' guard: every read or write through the pool is one core call
        (``guarded_write`` / ``guarded_transfer``) that checks it, copies, and records the write."""
        return self._guard

    @property
    def geometry(self) -> Geometry:
        """``(num_layers, num_blocks, block_strides)`` with one byte stride per (layer, state)."""
        return (self.num_layers, self.num_blocks, list(self._strides))

    @staticmethod
    def block_stride(t: Any) -> int:
        """Bytes between consecutive blocks of a state tensor."""
        if _is_torch(t):
            return int(t.stride(0) * t.element_size())
        return int(np.asarray(t).strides[0])

    def addresses(self) -> list[int]:
        """Address of block 0 of every (layer, state) tensor, layer-major (as bound)."""
        return list(self._addresses)

    def spans(self) -> list[int]:
        """Bytes each (layer, state) tensor spans (its byte view's length)."""
        return [int(v.shape[0]) for v in self.views]

    def __repr__(self) -> str:
        return (
            f"StatePool({self.fingerprint.family}, rank {self.fingerprint.tp_rank}/"
            f"{self.fingerprint.tp_size}, layers={self.num_layers}, blocks={self.num_blocks}, "
            f"device={self.device})"
        )
