"""Several recurrent groups planned as one engine step, and the step's align-mode decisions.

A hybrid model's recurrent layers may form several groups (vLLM's mamba groups: distinct state
specs, each group with its own layers, state tensors and block table). One decision per request
applies to every group; :class:`MultiGroupPlanner` binds all groups and turns a step into one
:class:`MultiGroupPlan` that is checked whole before a byte moves.

The decisions (:func:`align_pre_copy`, :func:`align_post_process`) are vLLM's align-mode formulas,
computed by the compiled core with its consistency checks; see the functions for the formulas.

Two semantics for a request whose source and destination columns are equal:

* ``"pre_copy"`` -- vLLM's pre-copy: a no-op whatever the accepted count;
* ``"post_process"`` -- vLLM's post-process and :meth:`CopyPlanner.plan_align`: with
  ``num_accepted > 1`` the conv window shifts in place and the temporal state is taken from the
  accepted column.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from . import _core
from ._core import ErrorWord, Layout
from .device_path import DevicePath, check_step
from .errors import BindingError, PlanError
from .guard import BoundTensors
from .plan_format import STATE_META_DTYPE, records
from .tensors import describe_tensor

__all__ = [
    "MultiGroupPlanner",
    "MultiGroupPlan",
    "PreCopyDecision",
    "PostProcessDecision",
    "StagedStep",
    "Semantics",
    "align_pre_copy",
    "align_post_process",
]

log = logging.getLogger("recoverssm_rs")

Semantics = Literal["pre_copy", "post_process"]


def _i64(x: Any) -> np.ndarray:
    """A C-contiguous int64 host array (numpy or CPU tensor; no copy when it already is one)."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # torch.Tensor
        x = x.detach().numpy()
    return np.ascontiguousarray(x, dtype=np.int64)


def _tables(block_tables: Sequence[Any]) -> list[np.ndarray]:
    return [_i64(t) for t in block_tables]


class PreCopyDecision(NamedTuple):
    """vLLM's pre-copy decision per request (int64 arrays, one entry per request)."""

    prev: np.ndarray
    """Column the running state is read from (``-1``: a fresh state)."""
    curr: np.ndarray
    """The new running column ``(computed + scheduled - 1) // block_size``: store it."""
    src_col: np.ndarray
    """``prev`` where the state moves, else ``-1``."""
    bias: np.ndarray
    """Accepted-token offset of the move (``num_accepted - 1``), 0 where nothing moves."""
    num_accepted: np.ndarray
    """``num_accepted`` after the reset (1 where the state moved)."""


class PostProcessDecision(NamedTuple):
    """vLLM's post-process decision per request (int64 arrays)."""

    running: np.ndarray
    """Tokens the running state covers (``computed + scheduled - drafts``)."""
    aligned: np.ndarray
    """Tokens after acceptance, rounded down to a block boundary."""
    dest: np.ndarray
    """Column that must hold the state after ``aligned`` tokens."""
    bias: np.ndarray
    """Offset of that state from the running state (``aligned - running``)."""
    src_col: np.ndarray
    """The running column where a save copies anything, else ``-1``."""
    num_accepted: np.ndarray
    """``num_accepted`` for the next step (1 where the state was shifted in place)."""


class StagedStep(NamedTuple):
    """The host half of a device step (see :meth:`MultiGroupPlanner.stage_pre_copy`)."""

    vectors: np.ndarray
    """int64 ``[k, R]``: the host-decided vectors."""
    staged: np.ndarray
    """int32: the table (if any), then the per-request vectors the kernel reads."""
    table_shape: tuple[int, int, int]
    """``(groups, R, cols)`` of the staged table (``(0, R, 0)`` when none was staged)."""


def _decision(raw: bytes, cls: Any, n: int) -> Any:
    rows = np.frombuffer(raw, dtype=np.int64).reshape(len(cls._fields), n)
    return cls(*rows)


def align_pre_copy(
    block_tables: Sequence[Any],
    num_computed: Any,
    num_scheduled: Any,
    num_accepted: Any,
    running_col: Any,
    *,
    block_size: int,
    num_spec_blocks: int,
    fresh: Any = None,
    req_ids: Sequence[Any] | None = None,
) -> PreCopyDecision:
    """vLLM's align-mode pre-copy decision, without copies.

    Per request: ``prev`` = ``running_col`` (the stored running column), or
    ``(num_computed - 1) // block_size`` where it is ``-1`` (new, resumed or preempted);
    ``curr = ceil((num_computed + num_scheduled) / block_size) - 1``; the state moves ``prev ->
    curr`` with offset ``num_accepted - 1`` iff ``prev != -1 and prev != curr``, and then
    ``num_accepted`` resets to 1.

    Args:
        block_tables: one ``[>= R, cols]`` block table per group (null block 0).
        num_computed, num_scheduled (drafts included), num_accepted, running_col: ``[R]``.
        fresh: optional ``[R]`` mask of rows new or resumed this step.
        req_ids: optional names for error messages.

    Raises:
        PlanError: naming the request: inconsistent lengths or counts, a fresh row holding a
            running column (stale), a prefix-cache hit whose recurrent column holds no state, a
            window or source column outside a group's row or on the null block.
    """
    c = _i64(num_computed)
    raw = _core.align_pre_copy(
        _tables(block_tables), c, _i64(num_scheduled), _i64(num_accepted), _i64(running_col),
        int(block_size), int(num_spec_blocks), None if fresh is None else _i64(fresh), req_ids)
    return _decision(raw, PreCopyDecision, len(c))


def align_post_process(
    block_tables: Sequence[Any],
    state_col: Any,
    num_computed: Any,
    num_scheduled: Any,
    num_draft: Any,
    num_accepted: Any,
    *,
    block_size: int,
    num_spec_blocks: int,
    req_ids: Sequence[Any] | None = None,
) -> PostProcessDecision:
    """vLLM's align-mode post-process decision, without copies.

    Per request: ``running = computed + scheduled - drafts``, ``new = running + accepted - 1``,
    ``aligned = new // block_size * block_size``; if ``aligned >= running`` the state after
    ``aligned`` tokens (offset ``aligned - running``) is saved at ``dest = aligned // block_size -
    1``; when ``dest == state_col`` that is an in-place shift and ``num_accepted`` resets to 1.

    Raises:
        PlanError: naming the request: ``state_col`` not this step's running column, drafts or
            accepted counts out of range, a saved state's columns outside a row or null.
    """
    s = _i64(state_col)
    raw = _core.align_post_process(
        _tables(block_tables), s, _i64(num_computed), _i64(num_scheduled), _i64(num_draft),
        _i64(num_accepted), int(block_size), int(num_spec_blocks), req_ids)
    return _decision(raw, PostProcessDecision, len(s))


class MultiGroupPlan:
    """One step's copies over every group; run it with :meth:`execute`."""

    __slots__ = ("_plan", "_bound")

    def __init__(self, plan: _core.GroupPlan, bound: Sequence[BoundTensors]) -> None:
        self._plan = plan
        self._bound = tuple(bound)

    def __len__(self) -> int:
        """(group, layer, state, request) copies planned, before coalescing."""
        return self._plan.num_copies

    @property
    def nbytes(self) -> int:
        return self._plan.nbytes

    @property
    def num_segments(self) -> int:
        return self._plan.num_segments

    def group_stats(self) -> list[tuple[int, int, int, int]]:
        """Per group: ``(copies, segments, waves, bytes)``."""
        return self._plan.group_stats()

    def execute(self) -> None:
        """Run every group's copies over the bound CPU tensors (the Rust host executor, GIL
        released); every group's segments are checked before the first byte moves.

        Raises:
            BindingError: a bound tensor or its storage no longer has the memory it was bound with
                (see :class:`~recoverssm_rs.guard.BoundTensors`); nothing is written.
        """
        for b in self._bound:
            b.check()
        self._plan.execute_host()
        for b in self._bound:
            b.mark_written()

    def __repr__(self) -> str:
        return f"MultiGroupPlan(copies={len(self)}, segments={self.num_segments}, bytes={self.nbytes})"


class MultiGroupPlanner:
    """Plans a step's state copies for several recurrent groups at once.

    Args:
        groups: per group ``(layout, states)``: ``states[layer]`` lists that layer's tensors; the
            first ``len(layout.persistent)`` are bound (``[num_blocks, *state_shape]`` each),
            the rest (workspace, or tensors no copy function covers) are left alone.
        block_size: tokens per block, shared by every group.
        num_spec_blocks: speculative blocks (draft tokens per step); every layout's ``num_spec``
            must equal it.

    Raises:
        BindingError: a tensor does not match its group's layout (the message names the group,
            layer and state), or a layout's ``num_spec`` differs from ``num_spec_blocks``.
    """

    __slots__ = ("_core", "_states", "_bound", "_device_path")

    def __init__(self, groups: Sequence[tuple[Layout, Sequence[Sequence[Any]]]], *, block_size: int,
                 num_spec_blocks: int) -> None:
        self._states = tuple(tuple(tuple(layer)[: len(layout.persistent)] for layer in states) for layout, states in groups)
        labels = []
        for g, (layout, _) in enumerate(groups):
            names = [st.name for st in layout.states]
            labels.append(lambda l, s, g=g, names=names, b=layout.backend: f"group {g} ({b}): layer {l}, state {s} ('{names[s]}')")
        descs = []
        for g, group in enumerate(self._states):
            rows = []
            for li, layer in enumerate(group):
                row = []
                for si, t in enumerate(layer):
                    try:
                        row.append(describe_tensor(t))
                    except TypeError as exc:
                        raise BindingError(f"{labels[g](li, si)}: {exc}") from None
                rows.append(row)
            descs.append(rows)
        self._core = _core.GroupPlanner([layout for layout, _ in groups], descs, self._states,
                                        int(block_size), int(num_spec_blocks))
        self._bound = tuple(BoundTensors(group, labels[g]) for g, group in enumerate(self._states))
        self._device_path: DevicePath | None = None
        log.debug("bound %d recurrent groups (%s)", self.num_groups,
                  ", ".join(f"{layers} layers x {blocks} blocks" for layers, blocks in self._core.group_sizes()))

    @property
    def num_groups(self) -> int:
        return self._core.num_groups

    @property
    def block_size(self) -> int:
        return self._core.block_size

    @property
    def num_spec_blocks(self) -> int:
        return self._core.num_spec_blocks

    @property
    def device(self) -> str:
        return self._core.device

    @property
    def layouts(self) -> list[Layout]:
        return self._core.layouts()

    @property
    def states(self) -> tuple[tuple[tuple[Any, ...], ...], ...]:
        """The bound tensors: ``states[group][layer][state]`` (an immutable copy)."""
        return self._states

    def plan(self, block_tables: Sequence[Any], src_col: Any, dst_col: Any, num_accepted: Any,
             semantics: Semantics) -> MultiGroupPlan:
        """Plan ``dst_col <- src_col`` moves carrying ``num_accepted`` in every group: conv windows
        shifted left by ``num_accepted - 1``, temporal states from column ``src_col +
        num_accepted - 1``; a negative column moves nothing. ``semantics`` decides equal columns
        (see the module docstring).

        Raises:
            PlanError: as :meth:`CopyPlanner.plan_align`, prefixed with the group.
        """
        return MultiGroupPlan(self._core.plan(_tables(block_tables), _i64(src_col), _i64(dst_col),
                                              _i64(num_accepted), semantics), self._bound)

    def pre_copy(self, block_tables: Sequence[Any], num_computed: Any, num_scheduled: Any,
                 num_accepted: Any, running_col: Any, *, fresh: Any = None,
                 req_ids: Sequence[Any] | None = None) -> tuple[PreCopyDecision, MultiGroupPlan]:
        """:func:`align_pre_copy` and its copies (pre-copy semantics), in one core call."""
        c = _i64(num_computed)
        raw, plan = self._core.pre_copy(
            _tables(block_tables), c, _i64(num_scheduled), _i64(num_accepted), _i64(running_col),
            None if fresh is None else _i64(fresh), req_ids)
        return _decision(raw, PreCopyDecision, len(c)), MultiGroupPlan(plan, self._bound)

    def post_process(self, block_tables: Sequence[Any], state_col: Any, num_computed: Any,
                     num_scheduled: Any, num_draft: Any, num_accepted: Any, *,
                     req_ids: Sequence[Any] | None = None) -> tuple[PostProcessDecision, MultiGroupPlan]:
        """:func:`align_post_process` and its copies (post-process semantics), in one core call."""
        s = _i64(state_col)
        raw, plan = self._core.post_process(
            _tables(block_tables), s, _i64(num_computed), _i64(num_scheduled), _i64(num_draft),
            _i64(num_accepted), req_ids)
        return _decision(raw, PostProcessDecision, len(s)), MultiGroupPlan(plan, self._bound)

    # ---- device path: one fused launch for every group ----------------------------------------

    def stage_pre_copy(self, block_tables: Sequence[Any], num_computed: Any, num_scheduled: Any, running_col: Any, *,
                       fresh: Any = None, req_ids: Sequence[Any] | None = None, num_accepted: Any = None,
                       stage_table: bool = True) -> StagedStep:
        """The host half of a device pre-copy (the core's ``device_step::stage_pre_copy``): the
        columns (``vectors``: ``prev, curr, src_col``) and the step staged for the kernel: the int32
        ``[groups * R * cols]`` table (unless ``stage_table`` is false), then ``src_col``, ``curr``
        and, when given on the host, ``num_accepted``. With host counts every check of
        :func:`align_pre_copy` runs; without them, every check that needs no count (the kernel
        checks the rest).

        Raises:
            PlanError: naming the request.
        """
        c = _i64(num_computed)
        cols, raw, shape = self._core.device_pre_copy(
            _tables(block_tables), c, _i64(num_scheduled), _i64(running_col),
            None if fresh is None else _i64(fresh), req_ids, None if num_accepted is None else _i64(num_accepted),
            stage_table)
        return StagedStep(np.frombuffer(cols, dtype=np.int64).reshape(3, len(c)), np.frombuffer(raw, dtype=np.int32),
                          shape)

    def stage_post_process(self, block_tables: Sequence[Any], state_col: Any, num_computed: Any, num_scheduled: Any,
                           num_draft: Any, *, req_ids: Sequence[Any] | None = None, num_accepted: Any = None,
                           stage_table: bool = True) -> StagedStep:
        """The host half of a device post-process: ``running`` (``vectors[0]``) and the staged
        step: the table (unless ``stage_table`` is false), then ``state_col``, ``running`` and host
        ``num_accepted`` when given (then every check of :func:`align_post_process` runs).

        Raises:
            PlanError: naming the request.
        """
        s = _i64(state_col)
        running, raw, shape = self._core.device_post_process(
            _tables(block_tables), s, _i64(num_computed), _i64(num_scheduled), _i64(num_draft), req_ids,
            None if num_accepted is None else _i64(num_accepted), stage_table)
        return StagedStep(np.frombuffer(running, dtype=np.int64).reshape(1, len(s)),
                          np.frombuffer(raw, dtype=np.int32), shape)

    def _cuda_index(self, what: str) -> int:
        device = self.device
        if not device.startswith("cuda"):
            raise PlanError(f"{what} is part of the device path (CUDA states), but these groups are bound to {device} "
                            "tensors: plan the step with plan(...) and run it with MultiGroupPlan.execute()")
        _, _, idx = device.partition(":")
        return int(idx) if idx else 0

    def _device(self, index: int, first_step: tuple[Any, ...] | None = None) -> DevicePath:
        dp = self._device_path
        if dp is None:
            if first_step is not None:
                bt, src, second, acc, block_size, err = first_step
                check_step(self.device, bt, src, second, acc, block_size, err, groups=self.num_groups)
            meta = records(self._core.state_meta(), dtype=STATE_META_DTYPE)
            dp = DevicePath(index, self.device, meta, max_accepted=1 + self.num_spec_blocks,
                            num_blocks=self._core.max_blocks, groups=self.num_groups)
            self._device_path = dp
        return dp

    def prepare_device(self) -> None:
        """Upload the state table of every group and allocate the error word (once; call it before
        capturing a CUDA graph, as :meth:`CopyPlanner.prepare_device`)."""
        self._device(self._cuda_index("prepare_device"))

    def launch(self, block_table: Any, src_col: Any, dst_col: Any, num_accepted: Any, semantics: Semantics, *,
               stream: Any = None, err: Any = None, num_accepted_out: Any = None) -> None:
        """One fused kernel launch moves ``dst_col <- src_col`` in every group at once (CUDA
        states; no host synchronisation), with the semantics of :meth:`plan`.

        Args:
            block_table: CUDA ``int32`` (or ``int64``) tensor ``[groups, >= R, cols]``, group ``g``'s
                table at ``[g]`` (``torch.stack`` of the groups' tables; any group stride).
            src_col, dst_col, num_accepted: CUDA int32 (or int64) vectors ``[R]``, shared by the
                groups (one decision per request).
            semantics: ``"pre_copy"`` (equal columns move nothing) or ``"post_process"``.
            stream, err: as :meth:`CopyPlanner.launch_align`.
            num_accepted_out: optional CUDA ``int32`` ``[R]`` (no byte shared with an input):
                each request's accepted count after the step, written by the kernel (1 where the
                running state moved, ``num_accepted[r]`` elsewhere; vLLM's reset).

        The kernel validates each (request, group) on the device and skips a rejected one (the
        error word says which request); the host plan rejects the whole step instead. As for
        :meth:`CopyPlanner.launch_align`, no request may write a block another request reads.

        Raises:
            PlanError: before anything is queued: host states, an input that is not a CUDA tensor on
                the states' device, a bad dtype or shape, a table without one slice per group, or
                an unknown ``semantics``.
        """
        if semantics not in ("pre_copy", "post_process"):
            raise PlanError(f"semantics must be 'pre_copy' or 'post_process', got {semantics!r}")
        self._launch(block_table, src_col, dst_col, num_accepted, None, semantics == "pre_copy", stream, err,
                     num_accepted_out, "launch")

    def launch_post_process(self, block_table: Any, state_col: Any, running: Any, num_accepted: Any, *,
                            stream: Any = None, err: Any = None, num_accepted_out: Any = None) -> None:
        """vLLM's post-process decided and applied on the device for every group, in one launch:
        the host never reads ``num_accepted``.

        Per request: ``aligned = (running + num_accepted - 1) // block_size * block_size``; when
        ``aligned >= running`` the state after ``aligned`` tokens is saved at column ``aligned //
        block_size - 1`` from ``state_col`` (an in-place shift when that is ``state_col``), as
        :func:`align_post_process` decides on the host. ``num_accepted_out`` receives the counts
        for the next step (1 after an in-place shift).

        Args:
            block_table: as :meth:`launch`.
            state_col: CUDA int32/int64 ``[R]``, this step's running column (``-1``: padding).
            running: CUDA int32/int64 ``[R]``, ``computed + scheduled - drafts``.
            num_accepted: CUDA int32/int64 ``[R]``, the tokens accepted this step (bonus included).
            stream, err, num_accepted_out: as :meth:`launch`.
        """
        self._launch(block_table, state_col, running, num_accepted, self.block_size, False, stream, err,
                     num_accepted_out, "launch_post_process")

    def _launch(self, block_table: Any, src_col: Any, second: Any, num_accepted: Any, block_size: int | None,
                pre_copy: bool, stream: Any, err: Any, out: Any, what: str) -> None:
        index = self._cuda_index(what)
        dp = self._device(index, (block_table, src_col, second, num_accepted, block_size, err))
        for b in self._bound:
            b.check()
        dp.launch(block_table, src_col, second, num_accepted, block_size, stream, err, pre_copy=pre_copy,
                  num_accepted_out=out)
        for b in self._bound:
            b.mark_written()

    def last_error(self) -> ErrorWord:
        """The error word of the last launch without ``err`` (synchronises the device)."""
        self._cuda_index("last_error")
        dp = self._device_path
        return ErrorWord([0, 0, 0], 0) if dp is None else dp.last_error()

    def __repr__(self) -> str:
        sizes = self._core.group_sizes()
        return (f"MultiGroupPlanner(groups={self.num_groups}, layers={[s[0] for s in sizes]}, "
                f"block_size={self.block_size}, num_spec_blocks={self.num_spec_blocks}, device={self.device!r})")
