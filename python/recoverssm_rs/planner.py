"""Copy plans for recurrent-state copies between cache blocks: :class:`Planner` and :class:`CopyPlan`.

A :class:`Planner` binds one or more recurrent groups (vLLM's mamba groups: each a
:class:`~recoverssm_rs.Layout` bound to its layers' state tensors and indexed by its own block
table; one layout is one group) to the compiled core's planner, which describes and checks every
tensor, keeps them alive and guards their memory. Each step it turns vectorised inputs into one
validated, hazard-ordered, coalesced :class:`CopyPlan` over every group (the core does the work
with the GIL released); :meth:`CopyPlan.execute` runs it on the states' device.

For CUDA states there is also a *device path* that never reads the step's inputs on the host:
:meth:`Planner.launch_align` (explicit columns), :meth:`Planner.launch_align_decision` (vLLM's
align decision taken on the device) and :meth:`Planner.launch` launch the fused state-copy kernel
once per step on the caller's stream, straight from device-resident ``int32`` / ``int64`` tensors,
so an engine need not wait for ``num_accepted`` after sampling, and the call can be captured in a
CUDA graph.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, TypedDict, TypeVar, Unpack

import numpy as np

from . import _core
from ._core import ErrorWord, Layout
from .cuda import module, ops
from .cuda.copy import execute_plan
from .errors import PlanError
from .forward import Forward
from .placement import cuda_index
from .plan_format import MOVE_ROW_DTYPE, SEGMENT_DTYPE, STATE_META_DTYPE, TILE_DTYPE, records

__all__ = ["Planner", "CopyPlan", "TileTable", "Semantics", "DEFAULT_TILE_BYTES"]

log = logging.getLogger("recoverssm_rs")

#: How a request whose source and destination columns are equal is treated: ``"pre_copy"`` (vLLM's
#: pre-copy) moves nothing; ``"post_process"`` (vLLM's post-process, :meth:`Planner.plan_align`)
#: shifts the conv window in place by ``num_accepted - 1`` and takes the temporal state from the
#: accepted column.
Semantics = Literal["pre_copy", "post_process"]

DEFAULT_TILE_BYTES = 64 * 1024

T = TypeVar("T")


class LaunchOptions(TypedDict, total=False):
    """Keyword options of the device launches (:meth:`Planner.launch_align` documents each)."""

    stream: Any
    err: Any
    num_accepted_out: Any


_LAUNCH_OPTIONS = frozenset(LaunchOptions.__annotations__)


class TileTable(NamedTuple):
    """Tiles of a plan for the GPU batched-copy kernel, grouped by wave."""

    tiles: np.ndarray
    """``TILE_DTYPE`` records."""
    wave_starts: np.ndarray
    """``uint32 [num_waves + 1]``: tiles of wave ``w`` are ``tiles[wave_starts[w]:wave_starts[w+1]]``."""
    tile_bytes: int


class CopyPlan:
    """The validated copies of one step over every group of a :class:`Planner`. Inspect it with
    zero-copy numpy views; run it with :meth:`execute`. Holds its planner (and so the state
    tensors) alive."""

    __slots__ = ("_plan", "_planner", "_views")

    def __init__(self, plan: _core.CopyPlan, planner: Planner) -> None:
        self._plan = plan
        self._planner = planner
        self._views: dict[str, np.ndarray] = {}

    def _view(self, name: str, raw: Any, dtype: Any) -> np.ndarray:
        v = self._views.get(name)
        if v is None:
            v = self._views[name] = records(raw(), dtype=dtype)
        return v

    @property
    def segments(self) -> np.ndarray:
        """Segment records (``SEGMENT_DTYPE``), grouped by wave; a read-only view."""
        return self._view("segments", self._plan.segments, SEGMENT_DTYPE)

    @property
    def rows(self) -> np.ndarray:
        """Compact per-request records (``MOVE_ROW_DTYPE``), by group, then request."""
        return self._view("rows", self._plan.rows, MOVE_ROW_DTYPE)

    @property
    def waves(self) -> np.ndarray:
        """``uint32 [num_waves + 1]``: segments of wave ``w`` are ``segments[waves[w]:waves[w+1]]``."""
        return self._view("waves", self._plan.wave_starts, np.uint32)

    def tiles(self, tile_bytes: int = DEFAULT_TILE_BYTES) -> TileTable:
        """Cut the segments into tiles of about ``tile_bytes`` (a multiple of 16)."""
        t, w = self._plan.tiles(tile_bytes)
        return TileTable(records(t, dtype=TILE_DTYPE), records(w, dtype=np.uint32), tile_bytes)

    num_waves: Forward[int] = Forward(
        "_plan", "Ordered waves: copies of a wave may run concurrently, waves run in order."
    )
    num_segments: Forward[int] = Forward("_plan", "Coalesced segments of the plan.")
    num_requests: Forward[int] = Forward("_plan", "Requests (per group) that move something.")
    nbytes: Forward[int] = Forward("_plan", "Bytes the plan copies.")

    @property
    def planner(self) -> Planner:
        return self._planner

    def group_stats(self) -> list[tuple[int, int, int, int]]:
        """Per group: ``(copies, segments, waves, bytes)``."""
        return self._plan.group_stats()

    def __len__(self) -> int:
        """(group, layer, state, request) copies planned, before coalescing."""
        return self._plan.num_copies

    def execute(self, stream: Any = None) -> None:
        """Run the plan on the states' device: the Rust host executor for CPU states (GIL
        released; every segment is checked before the first byte moves), the CUDA kernels for
        CUDA states (on ``stream``, default the current torch stream; one launch per wave).

        Raises:
            BindingError: a bound tensor or its storage no longer has the memory it was bound with
                (``set_()``, ``resize_()``, ``.data = ...``, a freed storage); nothing is written.
        """
        if self._planner.device == "cpu":
            self._plan.execute_host()
            return
        self._planner.guarded(lambda: execute_plan(self, stream=stream))

    def __repr__(self) -> str:
        return (
            f"CopyPlan(copies={len(self)}, segments={self.num_segments}, requests={self.num_requests}, "
            f"waves={self.num_waves}, bytes={self.nbytes})"
        )


class _DevicePath:
    """What a CUDA-bound planner keeps on the device for the fused kernel (made once): its table of
    state metas and its error word, registered with the core's planner."""

    def __init__(self, core: _core.Planner, index: int) -> None:
        meta = records(core.state_meta(), dtype=STATE_META_DTYPE)
        self.index = index
        self.meta = ops.cuda_ops.upload(meta.view(np.uint8).reshape(-1), index)
        self.err = ops.cuda_ops.zeros_i32(3, index)
        core.bind_device(int(self.meta.data_ptr()), int(self.err.data_ptr()))
        self.err_requests = 0
        log.debug("uploaded %d state metas to cuda:%d", len(meta), index)

    def runner(self, stream: Any, own_err: bool) -> tuple[Callable[[Any, int], None], Callable[[Any, int], None]]:
        """``(run, write)`` for a guarded launch on the torch stream ``stream``: ``write(launch,
        requests)`` zeroes the planner's error word for ``requests`` (with ``own_err``: the step
        brings none of its own) and queues the launch (``None``: nothing to launch); ``run`` does
        it with ``stream`` made current on the states' device."""
        cuda = ops.cuda_ops

        def write(kl: Any, n: int) -> None:
            if own_err:
                self.err.zero_()
                self.err_requests = n
            if kl is not None:
                module.launch(kl, self.index, stream)

        def run(kl: Any, n: int) -> None:
            with cuda.context(self.index, stream):
                write(kl, n)

        return run, write

    def last_error(self) -> ErrorWord:
        ops.cuda_ops.synchronize(self.index)
        return ErrorWord([int(x) for x in self.err.cpu().tolist()], self.err_requests)


class Planner:
    """Plans state copies for one layout bound to an engine's state tensors (one group); see
    :meth:`from_groups` for several.

    Args:
        layout: the layer layout.
        states: ``states[layer]`` is the list of that layer's state tensors, in layout order: the
            persistent states (``[num_blocks, *state_shape]`` each, torch tensors or numpy arrays,
            possibly strided views into one buffer), optionally followed by the workspace tensors
            (ignored: they are never copied). All on one device.
        block_size: tokens per block, for vLLM's step decisions (:mod:`recoverssm_rs.vllm`).

    Two ways to run a step:

    * **host plan** -- :meth:`plan_align` / :meth:`plan` / :meth:`plan_copy` on host inputs, then
      :meth:`CopyPlan.execute`: everything is validated and hazard-ordered on the host before a byte
      moves (any device; needs ``num_accepted`` on the host);
    * **device path** (CUDA states only) -- :meth:`launch_align` / :meth:`launch_align_decision` /
      :meth:`launch` on device inputs: one fused kernel launch per step on the caller's stream, no
      host synchronisation, CUDA-graph capturable. The kernel validates each request itself
      (invalid requests are skipped and flagged in an error word, see :meth:`last_error`) and relies
      on the caller for the cross-request hazard precondition described in :meth:`launch_align`.

    ``core`` is the compiled core's planner (the binding, its guard, its plans and launches).

    Raises:
        BindingError: a tensor does not match the layout (dtype, per-block shape, dense inner
            dimensions, block stride, alignment, device, overlapping memory); the message names
            the group, layer and state.
    """

    __slots__ = ("core", "_device_path", "__weakref__")

    def __init__(self, layout: Layout, states: Sequence[Sequence[Any]], *, block_size: int | None = None) -> None:
        self._bind([(layout, states)], block_size)

    @classmethod
    def from_groups(
        cls,
        groups: Sequence[tuple[Layout, Sequence[Sequence[Any]]]],
        *,
        block_size: int | None = None,
        also_guard: _core.SglangPool | None = None,
    ) -> Planner:
        """A planner over several recurrent groups: per group ``(layout, states)``, ``states[layer]``
        that layer's tensors, of which the first ``len(layout.persistent)`` are bound (the rest,
        workspace or tensors no copy function covers, are left alone). One decision per request
        applies to every group, so every layout has the same ``num_spec``; a step takes one block
        table per group. ``also_guard``: the core's pool whose tensors the states are views of
        (an SGLang pool's layer-stacked tensors), checked before every write and launch.

        Different groups may share memory: vLLM lays one layer of each KV-cache group over one raw
        tensor and gives each group its own blocks from one pool, so the same block id never
        holds two groups' states at once. The planner runs one group's copies after another's,
        never beside them; keeping two groups off one block is the engine's allocator's job. Only
        the states within one group must not share memory.

        Raises:
            BindingError: as the constructor's (the message names the group; two states of one
                group sharing memory among them), groups on different devices, or layouts with
                different ``num_spec``.
        """
        self = cls.__new__(cls)
        self._bind(groups, block_size, persistent_only=True, also_guard=also_guard)
        return self

    def _bind(
        self, groups: Any, block_size: int | None, *, persistent_only: bool = False, also_guard: Any = None
    ) -> None:
        self.core = _core.Planner(groups, block_size=block_size, persistent_only=persistent_only, also_guard=also_guard)
        self._device_path: _DevicePath | None = None
        log.debug("bound %s", self.core)

    # ---- what is bound -----------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """The layout of a one-group planner."""
        layouts = self.core.layouts
        if len(layouts) != 1:
            raise PlanError(f"this planner has {len(layouts)} groups; use planner.layouts")
        return layouts[0]

    layouts: Forward[list[Layout]] = Forward("core", "The layout of every group.")
    num_groups: Forward[int] = Forward("core", "Recurrent groups bound.")
    num_layers: Forward[int] = Forward("core", "Layers of every group.")
    num_blocks: Forward[int] = Forward("core", "Blocks of the (largest) pool.")
    num_spec: Forward[int] = Forward("core", "Speculative blocks after the running column, shared by every group.")
    block_size: Forward[int | None] = Forward("core", "Tokens per block, for vLLM's step decisions (or None).")
    device: Forward[str] = Forward("core", '``"cpu"`` or ``"cuda:N"``.')
    states: Forward[tuple[tuple[tuple[Any, ...], ...], ...]] = Forward(
        "core", "The bound persistent tensors, ``states[group][layer][state]`` (the planner keeps its own references)."
    )

    @property
    def state_meta(self) -> np.ndarray:
        """Per (group, layer, persistent state) metadata (``STATE_META_DTYPE``) for the fused kernel."""
        return records(self.core.state_meta(), dtype=STATE_META_DTYPE)

    # ---- host plans -----------------------------------------------------------------------

    def plan(
        self, block_tables: Any, src_col: Any, dst_col: Any, num_accepted: Any, semantics: Semantics = "post_process"
    ) -> CopyPlan:
        """Plan ``dst_col <- src_col`` moves carrying ``num_accepted`` in every group: conv windows
        shifted left by ``num_accepted - 1``, temporal states from column ``src_col +
        num_accepted - 1``; a negative column moves nothing. ``semantics`` decides equal columns
        (:data:`Semantics`).

        Args:
            block_tables: one ``[>= R, cols]`` int32/int64 host table per group.
            src_col, dst_col, num_accepted: ``[R]`` int32/int64 host vectors.

        Raises:
            PlanError: as :meth:`plan_align` (prefixed with the group when there are several).
        """
        return CopyPlan(
            self.core.plan(
                tables=block_tables,
                src_col=src_col,
                dst_col=dst_col,
                num_accepted=num_accepted,
                semantics=semantics,
            ),
            self,
        )

    def plan_align(self, block_table: Any, src_col: Any, dst_col: Any, num_accepted: Any) -> CopyPlan:
        """Plan an align-mode step (speculative decoding with prefix caching) of a one-group planner.

        Per request ``r``, with ``a = num_accepted[r]`` and ``bt = block_table[r]``: conv windows
        ``bt[dst_col]`` get the window of ``bt[src_col]`` shifted left by ``a - 1`` columns (in
        place when both are the same block); temporal states ``bt[dst_col] <- bt[src_col + a - 1]``.
        Rows with a negative column are padding; rows whose source and destination are both the
        null block 0 are skipped; ``src_col == dst_col`` with ``a == 1`` is a no-op.

        Args:
            block_table: ``[R, cols]`` int32/int64 block ids (numpy, CPU tensor or lists).
            src_col, dst_col, num_accepted: ``[R]`` int32/int64.

        Raises:
            PlanError: before anything moves, naming the request and state: an input that is not an
                integer array, a column outside the row, ``num_accepted`` outside
                ``1..=1+num_spec``, a block id outside the pool, the null block as a destination or
                a source, a published block as a destination (:meth:`publish`), two copies writing
                the same block, or a cycle of copies that cannot be ordered without staging.
        """
        return CopyPlan(
            self.core.plan(block_table=block_table, src_col=src_col, dst_col=dst_col, num_accepted=num_accepted), self
        )

    def plan_copy(self, src_blocks: Any, dst_blocks: Any) -> CopyPlan:
        """Plan whole-block copies ``dst_blocks[i] <- src_blocks[i]`` of every persistent state of
        every layer of every group (forks, prefix-cache hits). Equal ids are no-ops, negative ids
        padding."""
        return CopyPlan(self.core.plan_copy(src_blocks=src_blocks, dst_blocks=dst_blocks), self)

    # ---- published states (copy-on-write) ----------------------------------------------------

    def publish(self, blocks: Any, *, group: int = 0) -> None:
        """Publish ``blocks`` of ``group``: one more holder each (a checkpoint reachable from the
        prefix index is one holder, each request sharing the block another). Until its last holder
        retracts it, a host plan that would write a published block is refused (a
        :class:`~recoverssm_rs.PlanError` naming the request, state and block; nothing written):
        copy it to a free block with :meth:`plan_copy` and write there. vLLM's device half-steps
        (:class:`~recoverssm_rs.vllm.device_step.DeviceStep`) are checked too, against every block
        the kernel writes or may write with the accepted counts still on the device. The fused
        launches (:meth:`launch_step`, :meth:`device_step`) read their block tables from device
        memory and are not: their caller keeps published blocks out of the destination columns.

        Raises:
            PlanError: an id outside ``1..num_blocks`` or a group that does not exist; nothing
                changes.
        """
        self.core.publish(blocks, group=group)

    def retract(self, blocks: Any, *, group: int = 0) -> None:
        """Drop one holder of each of ``blocks`` of ``group`` (an eviction from the prefix index,
        a sharing request that finished); a block left without holders may be written again.

        Raises:
            PlanError: a block not published as often as it is listed; nothing changes.
        """
        self.core.retract(blocks, group=group)

    def published(self, group: int = 0) -> list[int]:
        """The published blocks of ``group``, ascending."""
        return self.core.published(group)

    def holders(self, block: int, *, group: int = 0) -> int:
        """The holders of ``block`` in ``group`` (0: not published, writable)."""
        return self.core.holders(block, group=group)

    # ---- device path ------------------------------------------------------------------------

    def guarded(self, write: Callable[[], T]) -> T:
        """One guarded write of the bound tensors, in one core call: they are checked (a
        :class:`~recoverssm_rs.BindingError`, and ``write`` not called, when one moved), ``write()``
        runs (a launch, a host copy), and the write is recorded (autograd's version counters).
        Returns what ``write`` returns."""
        return self.core.guarded(write)

    def device_path(
        self, what: str, first_step: tuple[Any, ...] | None = None, options: dict[str, Any] | None = None
    ) -> _DevicePath:
        """The device path (the state table on the device, the planner's error word), made on
        first use -- after the core has checked ``first_step``'s inputs (the tensors in
        ``device_step`` order, with its keyword ``options``), so a bad first step touches nothing.

        Raises:
            PlanError: host states (naming ``what``).
        """
        index = cuda_index(self.device, what)
        dp = self._device_path
        if dp is None:
            if first_step is not None:
                self.core.check_device_step(*first_step, **(options or {}))
            dp = self._device_path = _DevicePath(self.core, index)
        return dp

    def prepare_device(self) -> None:
        """Upload the state metadata table (:attr:`state_meta`) to the states' device, allocate the
        planner's error word, and compile and load the fused kernels.

        The first launch does the upload and allocation itself (synchronising once); call this
        first when the first launch must not synchronise or compile: before capturing a CUDA graph,
        or under ``torch.cuda.set_sync_debug_mode("error")``.

        Raises:
            PlanError: the planner is bound to CPU tensors.
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        dp = self.device_path("prepare_device")
        module.function_ptr("rs_state_copy", dp.index)

    def launch_runner(self, what: str, stream: Any = None) -> Callable[[Any, int], None]:
        """``run(launch, requests)`` for a core call that checks its inputs and then launches on
        this planner's device path (an engine shell's guarded launch): the planner's error word
        zeroed for ``requests``, then the launch queued on ``stream`` (torch, CuPy or ``None``: the
        current torch stream) of the states' device. Makes the device path first
        (:meth:`device_path`: a :class:`PlanError` naming ``what`` for host states)."""
        dp = self.device_path(what)
        return dp.runner(ops.cuda_ops.torch_stream(stream, dp.index), True)[0]

    def launch(
        self,
        block_table: Any,
        src_col: Any,
        dst_col: Any,
        num_accepted: Any,
        semantics: Semantics = "post_process",
        **opts: Unpack[LaunchOptions],
    ) -> None:
        """One fused kernel launch moves ``dst_col <- src_col`` in every group at once (CUDA
        states; no host synchronisation), with the semantics of :meth:`plan`.

        Args:
            block_table: CUDA ``int32`` (or ``int64``) tensor ``[>= R, cols]`` for one group, or
                ``[groups, >= R, cols]`` (group ``g``'s table at ``[g]``; any group stride).
            src_col, dst_col, num_accepted: CUDA int32 (or int64) vectors ``[R]``, shared by the
                groups (one decision per request).
            semantics: ``"pre_copy"`` (equal columns move nothing) or ``"post_process"``.
            stream, err, num_accepted_out: as :meth:`launch_align`.

        The kernel validates each (request, group) on the device and skips a rejected one (the
        error word says which request); the host plan rejects the whole step instead. As for
        :meth:`launch_align`, no request may write a block another request reads.

        Raises:
            PlanError: before anything is queued: host states, an input that is not a CUDA tensor on
                the states' device, a bad dtype or shape, a table without one slice per group, or
                an unknown ``semantics``.
        """
        if semantics not in ("pre_copy", "post_process"):
            raise PlanError(f"semantics must be 'pre_copy' or 'post_process', got {semantics!r}")
        if semantics == "pre_copy":
            self._launch("launch", opts, block_table, src_col, dst_col, num_accepted, pre_copy=True)
        else:
            self._launch("launch", opts, block_table, src_col, dst_col, num_accepted)

    def launch_align(
        self,
        block_table: Any,
        src_col: Any,
        dst_col: Any,
        num_accepted: Any,
        **opts: Unpack[LaunchOptions],
    ) -> None:
        """Launch an align-mode step on the device: one fused kernel launch, no host synchronisation.

        The semantics are those of :meth:`plan_align`, executed by the fused kernel for every
        persistent state of every layer at once, reading the inputs in device memory. The launch
        goes on ``stream`` (default: the current torch stream of the states' device), so it orders
        with the surrounding torch work; it can be captured in a CUDA graph (call
        :meth:`prepare_device` before capturing, and keep the input tensors and the number of
        requests fixed between replays).

        **Precondition (not checked):** no request's destination block ``bt[dst_col]`` is a source
        block (``bt[src_col]`` or ``bt[src_col + a - 1]``) of *another* request in the same step,
        and no two requests write the same block. The kernel runs all requests concurrently; this
        holds when each request writes only blocks it owns (the usual case). When in doubt, use
        :meth:`plan_align` on host inputs, which checks these hazards and orders the copies in
        waves. (A request whose conv source and destination are the same block is fine: the kernel
        shifts in place in memmove order.)

        **Validation on the device:** the kernel checks each request (``a`` in
        ``1 ..= 1 + num_spec``, columns inside the row, destination ids in ``[1, num_blocks)``,
        source ids in ``[0, num_blocks)``); an invalid request is *skipped* -- nothing of it is
        written, the other requests still run -- and flagged in the error word: ``err`` if given,
        else the planner's own word, read with :meth:`last_error`. Block ids are read as int32
        (int64 inputs are narrowed on the device, saturating: an id beyond int32 stays invalid).

        Args:
            block_table: CUDA ``int32`` (or ``int64``) tensor ``[>= R, cols]``, on the states'
                device; rows beyond ``R`` are ignored; the row stride may be anything.
            src_col, dst_col, num_accepted: CUDA ``int32`` (or ``int64``) vectors ``[R]``. int64
                inputs are converted on the device, never copied to the host; a value beyond
                int32 saturates at its bound, which the kernel's checks treat as the value itself.
            stream: a ``torch.cuda.Stream`` or CuPy stream; ``None``: the current torch stream.
            err: an optional caller-owned ``int32[3]`` CUDA tensor that the kernel ORs its error
                bits into (zero it before the step; decode a host copy with
                ``cuda.decode_error_word(err.cpu(), R)``). ``None``: the planner's own word, zeroed
                asynchronously on ``stream`` by each call (one word per planner: with launches on
                several concurrent streams, pass your own).
            num_accepted_out: an optional CUDA ``int32`` vector ``[R]`` (sharing no byte with an
                input) where the kernel writes each request's accepted count after the step: 1
                where its state was moved or shifted, ``num_accepted[r]`` elsewhere.

        Raises:
            PlanError: on the host, before anything is queued: the planner is bound to CPU tensors
                (use :meth:`plan_align` + :meth:`CopyPlan.execute`), or an input is not a CUDA
                tensor on the states' device, has the wrong dtype or shape (the message names it).
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        self._launch("launch_align", opts, block_table, src_col, dst_col, num_accepted)

    def launch_align_decision(
        self,
        block_table: Any,
        src_col: Any,
        running: Any,
        num_accepted: Any,
        block_size: int,
        **opts: Unpack[LaunchOptions],
    ) -> None:
        """Launch an align-mode step whose copy decision is taken on the device (vLLM's GPU path).

        Per request ``r`` with ``a = num_accepted[r]``: ``new = running[r] + a - 1``,
        ``aligned = new // block_size * block_size``; the request copies iff
        ``aligned >= running[r]`` and ``aligned >= block_size``, and then behaves exactly like
        :meth:`launch_align` with ``dst_col = aligned // block_size - 1`` and accepted count
        ``aligned - running[r] + 1``. ``running = computed + scheduled - drafts`` (the tokens before
        this step's drafts); a negative ``src_col`` is padding. The host never reads
        ``num_accepted``.

        Same launch, precondition, device validation and error word as :meth:`launch_align`; a
        negative ``running`` is reported as an ``"args"`` error. ``num_accepted_out``: 1 where the
        save shifted the running state in place (``aligned // block_size - 1 == src_col``),
        ``num_accepted[r]`` elsewhere.

        Raises:
            PlanError: as :meth:`launch_align`, or ``block_size`` not an integer in ``1..2**31``.
        """
        self._launch("launch_align_decision", opts, block_table, src_col, running, num_accepted, block_size=block_size)

    def launch_post_process(
        self,
        block_table: Any,
        state_col: Any,
        running: Any,
        num_accepted: Any,
        **opts: Unpack[LaunchOptions],
    ) -> None:
        """vLLM's post-process decided and applied on the device for every group, in one launch
        (:meth:`launch_align_decision` with this planner's ``block_size``): ``state_col`` is this
        step's running column, ``running = computed + scheduled - drafts``, ``num_accepted`` this
        step's accepted count (bonus included); ``num_accepted_out`` receives the accepted counts for
        the next step (1 after an in-place shift)."""
        if self.block_size is None:
            raise PlanError("launch_post_process needs the planner's block_size (Planner(..., block_size=...))")
        self._launch(
            "launch_post_process", opts, block_table, state_col, running, num_accepted, block_size=self.block_size
        )

    def _launch(
        self,
        what: str,
        opts: LaunchOptions,
        block_table: Any,
        src_col: Any,
        second: Any,
        num_accepted: Any,
        **extra: Any,
    ) -> None:
        """One step launched with ``opts`` (a launch method's ``**opts: Unpack[LaunchOptions]``, an
        unknown key a ``TypeError`` as for any keyword); ``extra``: the core's keyword options of
        the step (``block_size``, ``pre_copy``; a new one is a field of the core's
        ``StepOptions``). As :meth:`_step`."""
        if not opts:
            self._step(what, block_table, src_col, second, num_accepted, None, None, None, extra)
            return
        if not opts.keys() <= _LAUNCH_OPTIONS:
            raise TypeError(f"{what}() got an unexpected keyword argument {min(opts.keys() - _LAUNCH_OPTIONS)!r}")
        get = opts.get
        self._step(
            what, block_table, src_col, second, num_accepted, get("stream"), get("err"), get("num_accepted_out"), extra
        )

    def _step(
        self,
        what: str,
        block_table: Any,
        src_col: Any,
        second: Any,
        num_accepted: Any,
        stream: Any,
        err: Any,
        num_accepted_out: Any,
        extra: dict[str, Any] | None,
    ) -> None:
        """One step as one guarded core call (``launch_step``: the guard and every input checked,
        the launch packed and queued on ``stream``, the write recorded;
        the tensors positionally, ``extra`` the core's keyword options); int64 or strided inputs
        that passed the checks are first narrowed on the device (a second call)."""
        core = self.core
        dp = self._device_path
        if dp is None:
            dp = self.device_path(what, (block_table, src_col, second, num_accepted, err, num_accepted_out), extra)
        cuda = ops.cuda_ops
        ts = cuda.torch_stream(stream, dp.index)
        run, write = dp.runner(ts, err is None)
        args = (block_table, src_col, second, num_accepted, err, num_accepted_out)
        n, narrow = core.launch_step(run, *args, **extra) if extra else core.launch_step(run, *args)
        if narrow:
            torch = cuda.torch()
            with cuda.context(dp.index, ts):  # the narrowing and the launch on one stream
                if block_table.dim() == 2 and block_table.shape[0] > n and block_table.dtype != torch.int32:
                    block_table = block_table[:n]  # only the rows this step reads of a wide table
                block_table, src_col, second, num_accepted = (
                    cuda.as_i32(x) for x in (block_table, src_col, second, num_accepted)
                )
                core.launch_step(
                    write, block_table, src_col, second, num_accepted, err, num_accepted_out, **(extra or {})
                )

    def last_error(self) -> ErrorWord:
        """The planner's error word after its last launch without ``err``: which error kinds the
        kernel saw and the first / last rejected request (``.ok`` when nothing was rejected).

        **Synchronises** the states' device (it reads device memory): for debugging and tests, not
        for the step loop. After a CUDA-graph replay it reflects that replay.

        Raises:
            PlanError: the planner is bound to CPU tensors (host plans raise instead of skipping).
        """
        cuda_index(self.device, "last_error")
        dp = self._device_path
        return ErrorWord([0, 0, 0], 0) if dp is None else dp.last_error()

    def __repr__(self) -> str:
        layers = [n for n, _ in self.core.group_sizes()]
        if len(layers) == 1:
            return f"Planner({self.layout.backend!r}, layers={layers[0]}, blocks={self.num_blocks}, device={self.device!r})"
        backends = [l.backend for l in self.layouts]
        return (
            f"Planner(groups={len(layers)}, backends={backends}, layers={layers}, blocks={self.num_blocks}, "
            f"device={self.device!r})"
        )
