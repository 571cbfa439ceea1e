"""SGLang's mamba pool: :class:`SglangMambaPool` runs ``MambaPool``'s operations over the package's
planner, with SGLang's slot ids as block ids (slot 0, SGLang's dummy, is the null block): how the
layer-stacked tensors form layouts, and what each operation checks and launches, is docs/design.md
section 10. SGLang is never imported: the pool is read by attribute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from .. import _core
from .._core import Layout
from ..cuda import ops
from ..engine import EngineAdapter, ErrorWordBuffer
from ..errors import PlanError
from ..planner import Planner
from .device import ARG_NAMES, host_copy, ids_on_device, runner

__all__ = ["SglangMambaPool", "install"]

log = logging.getLogger("recoverssm_rs")

T = TypeVar("T")


class SglangMambaPool(EngineAdapter):
    """Drop-in ``MambaPool`` operations (same signatures and effects): ``copy_from``, ``fork``,
    ``clear_slots``, ``get_cpu_copy`` / ``load_cpu_copy`` (HiCache) and :meth:`commit_after_verify`;
    on CUDA each is one kernel launch. Each operation is one call into the core, which checks every
    argument and the pool's tensors before anything is written.

    Args:
        conv: SGLang's ``mamba_cache.conv``: one or more ``[layers, slots + 1, *conv_shape]``
            tensors.
        temporal: ``mamba_cache.temporal``, ``[layers, slots + 1, *temporal_shape]`` (may be empty,
            as for short-conv layers).
        intermediate_ssm, intermediate_conv_window: the verify scratch of a speculative pool
            (``None`` otherwise).
        conv_layout: ``"DS"`` for SGLang's usual ``(dim, K-1)`` conv slots, ``"SD"`` for
            ``(K-1, dim)`` (Kimi-Linear).

    Raises:
        LayoutError / BindingError: the tensors do not form the layout (the core's message names
            the state and layer).

    Every operation raises, with nothing written: :class:`~recoverssm_rs.PlanError` for a bad slot
    id (not an integer, negative, outside the pool, the dummy slot 0; a load's slot named twice;
    on CUDA, ``clear_slots`` and the commit skip and report a bad id in :meth:`last_error` instead)
    and :class:`~recoverssm_rs.BindingError` for a pool tensor re-pointed or its storage resized.
    """

    def __init__(
        self,
        conv: Sequence[Any],
        temporal: Any,
        *,
        intermediate_ssm: Any = None,
        intermediate_conv_window: Sequence[Any] | None = None,
        conv_layout: Literal["SD", "DS"] = "DS",
    ) -> None:
        self.tensors = _core.SglangPool(
            conv=conv,
            temporal=temporal,
            intermediate_ssm=intermediate_ssm,
            intermediate_conv_window=intermediate_conv_window,
            conv_layout=conv_layout,
        )
        """The pool's tensors as the core holds them (checked, guarded before every write; their
        groups, layer views and verify scratch)."""
        self.conv = list(conv)
        self.temporal = temporal
        self.intermediate_ssm = intermediate_ssm
        self.intermediate_conv_window = None if intermediate_conv_window is None else list(intermediate_conv_window)
        self.conv_layout = conv_layout
        # The planner binds each layer's views; the pool's guard, checked by the planner before each
        # of its writes and launches, refuses a stacked tensor re-pointed under those views.
        super().__init__(Planner.from_groups(self.tensors.layer_groups(), also_guard=self.tensors))
        # Fixed once bound: read here, not from the core on every call.
        self._groups, self._num_slots = self.planner.num_groups, self.planner.num_blocks
        self._scratch: list[tuple[Any, Any]] | None = None
        self.slot_error = ErrorWordBuffer(self.placement.index)
        """The error word of the slot kernel's launches (:meth:`last_error`)."""

    def guarded(self, write: Callable[[], T]) -> T:
        """:meth:`EngineAdapter.guarded` over the pool's layer-stacked tensors (whose layers the
        planner binds), one core call."""
        return self.tensors.guarded(write)

    def check_bound(self) -> None:
        """Checks every tensor of the pool before a read (a :class:`~recoverssm_rs.BindingError`
        naming the tensor that moved)."""
        self.tensors.check()

    @classmethod
    def from_pool(cls, pool: Any) -> SglangMambaPool:
        """The operations over an SGLang ``MambaPool``'s tensors (read by attribute): its
        ``mamba_cache`` and, for Kimi-Linear's ``(K-1, dim)`` conv slots, ``conv_slice_axis == 1``."""
        cache = pool.mamba_cache
        return cls(
            cache.conv,
            cache.temporal,
            intermediate_ssm=getattr(cache, "intermediate_ssm", None),
            intermediate_conv_window=getattr(cache, "intermediate_conv_window", None),
            conv_layout="SD" if getattr(pool, "conv_slice_axis", 0) == 1 else "DS",
        )

    @property
    def device(self) -> str:
        """The states' device (``"cpu"`` or ``"cuda:N"``)."""
        return self.placement.name

    @property
    def layouts(self) -> list[Layout]:
        """The layouts of the bound groups (one per conv tensor; the temporal state rides with the
        first)."""
        return self.planner.layouts

    @property
    def num_layers(self) -> int:
        """SGLang's mamba layers (the leading axis of every state tensor)."""
        return int((self.conv[0] if self.conv else self.temporal).shape[0])

    @property
    def num_slots(self) -> int:
        """Slots including the dummy slot 0 (SGLang's ``size + 1``)."""
        return self._num_slots

    def state_tensors(self) -> list[Any]:
        """The pool's non-empty state tensors in SGLang's order (every conv tensor, then the
        temporal state)."""
        return self.tensors.state_tensors()

    def verify_scratch(self) -> list[tuple[Any, Any]]:
        """``(state tensor, its verify scratch)`` for every non-empty state tensor, the temporal
        state first; a :class:`~recoverssm_rs.PlanError` for a pool without verify scratch."""
        if self._scratch is None:  # fixed once bound: asked of the core once
            self._scratch = self.tensors.verify_scratch()
        return self._scratch

    # ---- SGLang's MambaPool operations ----------------------------------------------------------

    def copy_from(self, src_indices: Any, dst_indices: Any) -> None:
        """SGLang's ``MambaPool.copy_from``: ``dst`` slots get the states of the ``src`` slots (host:
        one ordered plan; CUDA: one fused launch, sources and destinations disjoint as SGLang's).
        Also a :class:`~recoverssm_rs.PlanError`: lengths that differ, a cycle or two copies to one
        slot."""
        if self.placement.is_cuda:  # int32 slot ids on the device; one guarded launch (docs/design.md section 10)
            src = ids_on_device(self, src_indices, "copy_from", "src_indices", 32)
            dst = ids_on_device(self, dst_indices, "copy_from", "dst_indices", 32)
            self.tensors.copy_launch(self.planner.core, self.planner.launch_runner, self.upload, src, dst)
        else:  # the slots checked, the planner's copy plan run by the host executor
            self.tensors.copy_from(self.planner.core, src_indices, dst_indices)

    def upload(self, raw: bytes) -> Any:
        """``raw`` copied to the pool's device (what the core's launches read: built once)."""
        return ops.cuda_ops.upload(np.frombuffer(raw, dtype=np.uint8), self.placement.index)

    def fork(self, src_indices: Any, dst_indices: Any) -> None:
        """A fork (SGLang's radix donation: ``alloc`` then ``copy_from``): :meth:`copy_from`."""
        self.copy_from(src_indices, dst_indices)

    def clear_slots(self, indices: Any) -> None:
        """SGLang's ``MambaPool.clear_slots``: zero every state of the given slots (CUDA: one launch
        of the slot kernel; a :class:`~recoverssm_rs.PlanError` for indices that are not an integer
        vector on the pool's device)."""
        if self.placement.is_cuda:
            self.slot_launch(False, indices)
        else:
            self.tensors.clear_slots(indices)

    def slot_launch(self, commit: bool, slots: Any, **vectors: Any) -> None:
        """One guarded launch of the slot kernel on the current stream, one core call: clear ``slots``,
        or with ``commit`` the verify commit (``vectors``: ``steps``, ``rows``, ``track_slots``,
        ``track_steps``); the first launch of each use uploads the pool's records (built by the core)."""
        op, arg = ("commit_after_verify", "state_indices") if commit else ("clear_slots", "indices")
        args = {k: ids_on_device(self, v, op, ARG_NAMES[k]) for k, v in vectors.items() if v is not None}
        slots = ids_on_device(self, slots, op, arg)
        run = runner(self, int(slots.shape[0]) if len(slots.shape) == 1 else 0)
        self.tensors.slot_launch(run, commit, self.upload, slots=slots, **args, err=self.slot_error.alloc())

    def last_error(self) -> Any:
        """The error word of the last slot-kernel launch on CUDA (:meth:`copy_from` reports in
        ``planner.last_error()``). **Synchronises** the device: for debugging and tests. A
        :class:`~recoverssm_rs.PlanError` on a host pool (host operations raise instead of skipping)."""
        if not self.slot_error.launched:
            raise PlanError("last_error: no slot kernel has run on this pool (host pools raise instead)")
        return self.slot_error.read()

    def get_cpu_copy(self, indices: Any) -> tuple[list[Any], Any]:
        """SGLang's ``MambaPool.get_cpu_copy``: ``(conv_cpu, temporal_cpu)``, the slots' states on the
        host, layer-stacked (``conv_cpu[i]`` is ``conv[i][:, indices]``)."""
        return host_copy(self, "get_cpu_copy", indices)  # type: ignore[no-any-return]

    def load_cpu_copy(self, mamba_cache_cpu: Sequence[Any], indices: Any) -> None:
        """SGLang's ``MambaPool.load_cpu_copy``: a :meth:`get_cpu_copy` result written back into the
        slots (a historical third element is ignored, as there). Also a
        :class:`~recoverssm_rs.PlanError`: host tensors whose device, dtype or shape differ from the
        pool's."""
        host_copy(self, "load_cpu_copy", indices, mamba_cache_cpu)

    def state_pool(self, layout: Layout, *, tp_rank: int = 0, block_size: int = 0) -> Any:
        """This pool as a transfer pool (:class:`recoverssm_rs.transfer.StatePool`): ``layout`` is the
        rank's family layout (:func:`~recoverssm_rs.sglang.layout_for`); binds the first conv tensor
        and the temporal state of every layer (docs/design.md section 11).

        Raises:
            BindingError: the pool's tensors are not ``layout``'s (dtype, per-slot shape).
            LayoutError: the pool has more than one conv tensor (their transfer is not supported:
                binding only the first would leave the others stale on the destination).
        """
        from ..transfer import StatePool  # the transfer tiers import torch-side backends: on use

        return StatePool(layout, self.tensors.transfer_layers(), tp_rank=tp_rank, block_size=block_size)

    def commit_after_verify(
        self,
        state_indices: Any,
        last_correct_step_indices: Any,
        track_indices: Any = None,
        steps_to_track: Any = None,
        src_indices: Any = None,
    ) -> None:
        """The speculative commit after verify (SGLang's ``scatter_mamba_states_after_mtp_verify``;
        argument names are SGLang's): request ``r`` with accepted step ``s =
        last_correct_step_indices[r] >= 0`` gets, in slot ``state_indices[r]``, the states its
        verify recorded at step ``s`` in scratch row ``src_indices[r]`` (default ``r``); with
        ``track_indices``, slot ``track_indices[r]`` also gets step ``steps_to_track[r]``. Padded
        rows (``-1``, or the dummy slot 0) write nothing. docs/design.md section 10.

        Raises:
            PlanError: a pool without verify scratch; vectors of different lengths (CUDA: or not on
                the pool's device); host states: a step past the draft, a slot or row past the
                pool, or two requests writing one slot.
        """
        if not self.verify_scratch():
            return
        given = dict(rows=src_indices, track_slots=track_indices, track_steps=steps_to_track)
        if self.placement.is_cuda:  # one launch: every tensor, both passes; the indices stay on the device
            self.slot_launch(True, state_indices, steps=last_correct_step_indices, **given)
        else:  # one core call: every index checked, then the moves
            self.tensors.commit(slots=state_indices, steps=last_correct_step_indices, **given)

    def __repr__(self) -> str:
        return (
            f"SglangMambaPool(slots={self.num_slots}, layers={self.num_layers}, "
            f"groups={self._groups}, device={self.device!r}, "
            f"speculative={self.intermediate_ssm is not None or bool(self.intermediate_conv_window)})"
        )


def install(pool: Any) -> SglangMambaPool:
    """Route a running SGLang ``MambaPool``'s ``copy_from``, ``clear_slots``, ``get_cpu_copy``
    and ``load_cpu_copy`` through a :class:`SglangMambaPool` over its tensors (instance attributes,
    so other pools are untouched; ``del pool.copy_from`` etc. restores SGLang's). Returns the
    adapter. Pools with slot siblings (per-layer-embedding side states) or ReplaySSM rings keep
    SGLang's methods, which also move those."""
    ops = SglangMambaPool.from_pool(pool)
    if getattr(pool, "_slot_siblings", ()) or getattr(pool, "replayssm_write_pos", None) is not None:
        log.warning("sglang: pool has slot siblings or ReplaySSM rings; left on SGLang's own methods")
        return ops
    pool.copy_from = ops.copy_from
    pool.clear_slots = ops.clear_slots
    pool.get_cpu_copy = ops.get_cpu_copy
    pool.load_cpu_copy = ops.load_cpu_copy
    log.info("sglang: %r installed", ops)
    return ops
