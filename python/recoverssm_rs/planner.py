"""Copy plans for recurrent-state copies between cache blocks.

A :class:`CopyPlanner` binds a :class:`~recoverssm_rs.Layout` to an engine's state tensors (per
layer, the persistent states ``[num_blocks, *state_shape]``, torch tensors or numpy arrays, possibly
strided views into one shared buffer). Each step, :meth:`CopyPlanner.plan_align` (speculative
decoding / prefix-cache alignment) or :meth:`CopyPlanner.plan_copy` (forks, cache hits) turns
vectorised inputs into a validated, hazard-ordered, coalesced :class:`CopyPlan`; the Rust core does
all of the work with the GIL released. :meth:`CopyPlan.execute` runs it on the states' device.

For CUDA states there is also a *device path* that never reads the step's inputs on the host:
:meth:`CopyPlanner.launch_align` (explicit columns) and :meth:`CopyPlanner.launch_align_decision`
(vLLM's align decision taken on the device) launch the fused state-copy kernel once per step on the
caller's stream, straight from device-resident ``int32`` / ``int64`` tensors -- so an engine need
not wait for ``num_accepted`` after sampling, and the call can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _core
from ._core import Layout
from .errors import PlanError
from .plan_format import MOVE_ROW_DTYPE, SEGMENT_DTYPE, STATE_META_DTYPE, TILE_DTYPE, records
from .tensors import describe_arg, describe_tensor

if TYPE_CHECKING:
    from .gpu import ErrorWord

__all__ = ["CopyPlanner", "CopyPlan", "TileTable", "describe_tensor"]

log = logging.getLogger("recoverssm_rs")

DEFAULT_TILE_BYTES = 64 * 1024


def _host_ints(x: Any, name: str) -> Any:
    """A host integer array for the core (numpy arrays pass through without a copy)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "device") and hasattr(x, "numpy"):  # torch.Tensor
        if x.device.type != "cpu":
            raise PlanError(
                f"{name} is on {x.device}; host plans read host inputs (copying them to the host "
                "would synchronise the device). Pass CPU arrays, or launch the device-side copy "
                "with the GPU executor, which reads its inputs in device memory."
            )
        try:
            return x.detach().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): never an integer array
            raise PlanError(f"{name} must be an int32 or int64 array, got {x.dtype}") from None
    return np.asarray(x)


# ------------------------------------------------------------------------------------------------
# Device path helpers (CopyPlanner.launch_align / launch_align_decision)
# ------------------------------------------------------------------------------------------------

_KIND_TEMPORAL = 0  # STATE_META_DTYPE kind of a temporal state (gpu.KIND_TEMPORAL)


class _CudaOps:
    """The few torch CUDA calls the device path makes, in one place.

    torch is imported on first use (the package works without it). Tests without a GPU replace the
    module's instance (``planner._cuda_ops``) to run the device path's host logic.
    """

    @staticmethod
    def torch() -> Any:
        import torch

        return torch

    def context(self, index: int, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``cuda:index`` current and, if given, ``stream`` (a torch stream) current."""
        torch = self.torch()
        if stream is None and torch.cuda.current_device() == index:
            return contextlib.nullcontext()  # the common case, without a device switch
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(index))
        if stream is not None:
            stack.enter_context(torch.cuda.stream(stream))
        return stack

    def torch_stream(self, stream: Any, index: int) -> Any:
        """``stream`` as a torch CUDA stream: a torch stream passes through, a CuPy stream (anything
        with ``.ptr``) is wrapped in ``torch.cuda.ExternalStream``; ``None`` stays ``None``."""
        if stream is None or hasattr(stream, "cuda_stream"):
            return stream
        ptr = getattr(stream, "ptr", None)
        if ptr is None:
            raise PlanError(
                f"stream must be a torch.cuda.Stream, a CuPy stream or None, got {type(stream).__name__}"
            )
        torch = self.torch()
        return torch.cuda.ExternalStream(int(ptr), device=torch.device("cuda", index))

    def upload(self, raw: np.ndarray, index: int) -> Any:
        """A device copy of host bytes; waits for it (once per planner)."""
        torch = self.torch()
        dev = torch.from_numpy(np.ascontiguousarray(raw).copy()).to(torch.device("cuda", index))
        torch.cuda.synchronize(index)
        return dev

    def zeros_i32(self, n: int, index: int) -> Any:
        torch = self.torch()
        out = torch.zeros(n, dtype=torch.int32, device=torch.device("cuda", index))
        torch.cuda.synchronize(index)
        return out

    def synchronize(self, index: int) -> None:
        self.torch().cuda.synchronize(index)


_cuda_ops = _CudaOps()


class _DeviceState(NamedTuple):
    """What a CUDA-bound planner keeps on the device for the fused kernel (created once)."""

    meta: Any
    """The ``state_meta`` table as raw bytes on the states' device (uint8 tensor)."""
    num_meta: int
    has_temporal: bool
    err: Any
    """The planner's own ``int32[3]`` error word (used when a launch gets no ``err``)."""
    chunks: int
    """CTAs per state copy (``gpu.state_chunks`` of the largest state)."""


_HOST_ALTERNATIVE = (
    "the device path reads its inputs in device memory; for host inputs use "
    "planner.plan_align(...) and CopyPlan.execute()"
)


def _as_device_int32(torch: Any, x: Any) -> Any:
    """``x`` as int32 with a contiguous last axis, converted on the device (no host copy)."""
    if x.dtype != torch.int32:
        x = x.to(torch.int32)
    if x.shape[-1] > 1 and x.stride()[-1] != 1:
        x = x.contiguous()
    return x


class TileTable(NamedTuple):
    """Tiles of a plan for the GPU batched-copy kernel, grouped by wave."""

    tiles: np.ndarray
    """``TILE_DTYPE`` records."""
    wave_starts: np.ndarray
    """``uint32 [num_waves + 1]``: tiles of wave ``w`` are ``tiles[wave_starts[w]:wave_starts[w+1]]``."""
    tile_bytes: int


class CopyPlan:
    """The validated copies of one step. Inspect it with zero-copy numpy views; run it with
    :meth:`execute`. Holds its planner (and so the state tensors) alive."""

    __slots__ = ("_plan", "_planner", "_segments", "_rows", "_waves")

    def __init__(self, plan: _core.Plan, planner: CopyPlanner) -> None:
        self._plan = plan
        self._planner = planner
        self._segments: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._waves: np.ndarray | None = None

    @property
    def segments(self) -> np.ndarray:
        """Segment records (``SEGMENT_DTYPE``), grouped by wave; a read-only view."""
        if self._segments is None:
            self._segments = records(self._plan.segments(), dtype=SEGMENT_DTYPE)
        return self._segments

    @property
    def rows(self) -> np.ndarray:
        """Compact per-request records (``MOVE_ROW_DTYPE``), sorted by request."""
        if self._rows is None:
            self._rows = records(self._plan.rows(), dtype=MOVE_ROW_DTYPE)
        return self._rows

    @property
    def waves(self) -> np.ndarray:
        """``uint32 [num_waves + 1]``: segments of wave ``w`` are ``segments[waves[w]:waves[w+1]]``."""
        if self._waves is None:
            self._waves = records(self._plan.wave_starts(), dtype=np.uint32)
        return self._waves

    def tiles(self, tile_bytes: int = DEFAULT_TILE_BYTES) -> TileTable:
        """Cut the segments into tiles of about ``tile_bytes`` (a multiple of 16)."""
        t, w = self._plan.tiles(tile_bytes)
        return TileTable(records(t, dtype=TILE_DTYPE), records(w, dtype=np.uint32),
                         tile_bytes)

    @property
    def num_waves(self) -> int:
        """Ordered waves: copies of a wave may run concurrently, waves run in order."""
        return self._plan.num_waves

    @property
    def num_segments(self) -> int:
        return self._plan.num_segments

    @property
    def num_requests(self) -> int:
        """Requests that move something."""
        return self._plan.num_requests

    @property
    def nbytes(self) -> int:
        """Bytes the plan copies."""
        return self._plan.nbytes

    @property
    def planner(self) -> CopyPlanner:
        return self._planner

    def __len__(self) -> int:
        """Number of (layer, state, request) copies planned, before coalescing."""
        return self._plan.num_copies

    def execute(self, stream: Any = None) -> None:
        """Run the plan on the states' device: the Rust host executor for CPU states (GIL
        released; every segment is checked before the first byte moves), the CUDA kernels for
        CUDA states (on ``stream``, default the current torch stream; one launch per wave)."""
        if self._planner.device == "cpu":
            self._plan.execute_host()
            return
        from . import gpu

        gpu.execute_plan(self, stream=stream)

    def __repr__(self) -> str:
        return (
            f"CopyPlan(copies={len(self)}, segments={self.num_segments}, "
            f"requests={self.num_requests}, waves={self.num_waves}, bytes={self.nbytes})"
        )


class CopyPlanner:
    """Plans state copies for one layout bound to an engine's state tensors.

    Args:
        layout: the layer layout.
        states: ``states[layer]`` is the list of that layer's state tensors, in layout order:
            the persistent states (``[num_blocks, *state_shape]`` each), optionally followed by the
            workspace tensors (ignored: they are never copied). All on one device.

    Two ways to run a step:

    * **host plan** -- :meth:`plan_align` / :meth:`plan_copy` on host inputs, then
      :meth:`CopyPlan.execute`: everything is validated and hazard-ordered on the host before a byte
      moves (any device; needs ``num_accepted`` on the host);
    * **device path** (CUDA states only) -- :meth:`launch_align` / :meth:`launch_align_decision` on
      device inputs: one fused kernel launch per step on the caller's stream, no host
      synchronisation, CUDA-graph capturable. The kernel validates each request itself (invalid
      requests are skipped and flagged in an error word, see :meth:`last_error`) and relies on the
      caller for the cross-request hazard precondition described in :meth:`launch_align`.

    Raises:
        BindingError: a tensor does not match the layout (dtype, per-block shape, dense inner
            dimensions, block stride, alignment, device, overlapping memory); the message names
            the layer and state.
    """

    __slots__ = ("_core", "_states", "_meta", "_device_state", "_err_requests", "__weakref__")

    def __init__(self, layout: Layout, states: Sequence[Sequence[Any]]) -> None:
        self._states = [list(layer) for layer in states]
        descs = [[describe_tensor(t) for t in layer] for layer in self._states]
        self._core = _core.Planner(layout, descs, self._states)
        self._meta: np.ndarray | None = None
        self._device_state: _DeviceState | None = None
        self._err_requests = 0
        log.debug("bound %r: %d layers, %d blocks on %s", layout.backend, self.num_layers,
                  self.num_blocks, self.device)

    @property
    def layout(self) -> Layout:
        return self._core.layout

    @property
    def num_layers(self) -> int:
        return self._core.num_layers

    @property
    def num_blocks(self) -> int:
        return self._core.num_blocks

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return self._core.device

    @property
    def states(self) -> list[list[Any]]:
        """The bound tensors, per layer."""
        return self._states

    @property
    def state_meta(self) -> np.ndarray:
        """Per (layer, persistent state) metadata (``STATE_META_DTYPE``) for the fused kernel."""
        if self._meta is None:
            self._meta = records(self._core.state_meta(), dtype=STATE_META_DTYPE)
        return self._meta

    def plan_align(self, block_table: Any, src_col: Any, dst_col: Any, num_accepted: Any) -> CopyPlan:
        """Plan an align-mode step (speculative decoding with prefix caching).

        Per request ``r``, with ``a = num_accepted[r]`` and ``bt = block_table[r]``:
        conv windows ``bt[dst_col]`` get the window of ``bt[src_col]`` shifted left by ``a - 1``
        columns (in place when both are the same block); temporal states
        ``bt[dst_col] <- bt[src_col + a - 1]``. Rows with a negative column are padding; rows whose
        source and destination are both the null block 0 are skipped; ``src_col == dst_col`` with
        ``a == 1`` is a no-op.

        Args:
            block_table: ``[R, cols]`` int32/int64 block ids (numpy or CPU tensor).
            src_col, dst_col, num_accepted: ``[R]`` int32/int64.

        Raises:
            PlanError: before anything moves, naming the request and state: a column outside the
                row, ``num_accepted`` outside ``1..=1+num_spec``, a block id outside the pool, the
                null block as a destination or a source, two copies writing the same block, or a
                cycle of copies that cannot be ordered without staging.
        """
        return CopyPlan(
            self._core.plan_align(
                _host_ints(block_table, "block_table"),
                _host_ints(src_col, "src_col"),
                _host_ints(dst_col, "dst_col"),
                _host_ints(num_accepted, "num_accepted"),
            ),
            self,
        )

    def plan_copy(self, src_blocks: Any, dst_blocks: Any) -> CopyPlan:
        """Plan whole-block copies ``dst_blocks[i] <- src_blocks[i]`` of every persistent state of
        every layer (forks, prefix-cache hits). Equal ids are no-ops, negative ids padding."""
        return CopyPlan(
            self._core.plan_copy(_host_ints(src_blocks, "src_blocks"),
                                 _host_ints(dst_blocks, "dst_blocks")),
            self,
        )

    # --------------------------------------------------------------------------------------------
    # Device path
    # --------------------------------------------------------------------------------------------

    def _cuda_index(self, what: str) -> int:
        """The CUDA device index of the bound states; :class:`PlanError` for a CPU-bound planner."""
        device = self.device
        if not device.startswith("cuda"):
            raise PlanError(
                f"{what} launches the fused CUDA kernel, but this planner is bound to {device} "
                "tensors; for host states plan the step with planner.plan_align(...) (host inputs) "
                "and run it with CopyPlan.execute()"
            )
        _, _, idx = device.partition(":")
        return int(idx) if idx else 0

    def _device(self, index: int) -> _DeviceState:
        ds = self._device_state
        if ds is None:
            meta = self.state_meta
            from .gpu import state_chunks

            chunks = state_chunks(int(meta["state_bytes"].max()) if len(meta) else 0)
            # The launch constants, checked once: each step's inputs are checked by check_step_args.
            _core.check_fused_launch(len(meta), 0, 1 + self.layout.num_spec, self.num_blocks, chunks, None, 0)
            ds = _DeviceState(
                meta=_cuda_ops.upload(meta.view(np.uint8).reshape(-1), index),
                num_meta=len(meta),
                has_temporal=bool(np.any(meta["kind"] == _KIND_TEMPORAL)),
                err=_cuda_ops.zeros_i32(3, index),
                chunks=chunks,
            )
            self._device_state = ds
            log.debug("uploaded %d state metas to cuda:%d", len(meta), index)
        return ds

    def prepare_device(self) -> None:
        """Upload the state metadata table (:attr:`state_meta`) to the states' device, allocate the
        planner's error word, and compile and load the fused kernels.

        The first :meth:`launch_align` / :meth:`launch_align_decision` does the upload and
        allocation itself (synchronising once); call this first when the first launch must not
        synchronise or compile: before capturing a CUDA graph, or under
        ``torch.cuda.set_sync_debug_mode("error")``.

        Raises:
            PlanError: the planner is bound to CPU tensors.
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        index = self._cuda_index("prepare_device")
        from . import gpu

        self._device(index)
        gpu.get_kernel("rs_state_copy")
        gpu.get_kernel("rs_state_copy_align")

    def _step_inputs(
        self, what: str, block_table: Any, vectors: Sequence[tuple[Any, str]], err: Any,
        block_size: int | None = None,
    ) -> tuple[int, int]:
        """The core's checks of a step's device inputs (nothing is queued before they pass);
        returns ``(device index, requests)``."""
        index = self._cuda_index(what)

        def desc(x: Any, name: str) -> Any:
            if not (hasattr(x, "data_ptr") and hasattr(x, "element_size")):
                raise PlanError(f"{name}: expected a CUDA tensor on cuda:{index}, got a {type(x).__name__}; "
                                f"{_HOST_ALTERNATIVE}")
            return describe_arg(x)

        n = _core.check_step_args(
            self.device, desc(block_table, "block_table"), [(name, desc(x, name)) for x, name in vectors],
            None if err is None else desc(err, "err"), block_size)
        return index, int(n)

    def launch_align(
        self,
        block_table: Any,
        src_col: Any,
        dst_col: Any,
        num_accepted: Any,
        *,
        stream: Any = None,
        err: Any = None,
    ) -> None:
        """Launch an align-mode step on the device: one fused kernel launch, no host synchronisation.

        The semantics are those of :meth:`plan_align` (per request ``r``, ``a = num_accepted[r]``,
        ``bt = block_table[r]``: conv windows ``bt[dst_col] <- bt[src_col]`` shifted left by
        ``a - 1`` columns, in place when both are the same block; temporal states
        ``bt[dst_col] <- bt[src_col + a - 1]``; a negative ``src_col`` or ``dst_col`` is padding;
        ``src_col == dst_col`` with ``a == 1`` is a no-op), executed by the fused kernel
        (``gpu.launch_state_copy``) for every persistent state of every layer at once, reading the
        inputs in device memory. The launch goes on ``stream`` (default: the current torch stream
        of the states' device), so it orders with the surrounding torch work; it can be captured
        in a CUDA graph (call :meth:`prepare_device` before capturing, and keep the input tensors
        and the number of requests fixed between replays).

        **Precondition (not checked):** no request's destination block ``bt[dst_col]`` is a source
        block (``bt[src_col]`` or ``bt[src_col + a - 1]``) of *another* request in the same step,
        and no two requests write the same block. The kernel runs all requests concurrently; this
        holds when each request writes only blocks it owns (the usual case: a request's boundary
        block belongs to that request). When in doubt, use :meth:`plan_align` on host inputs, which
        checks these hazards and orders the copies in waves. (A request whose conv source and
        destination are the same block is fine: the kernel shifts in place in memmove order.)

        **Validation on the device:** the kernel checks each request (``a`` in
        ``1 ..= 1 + num_spec``, columns inside the row, destination ids in ``[1, num_blocks)``,
        source ids in ``[0, num_blocks)``); an invalid request is *skipped* -- nothing of it is
        written, the other requests still run -- and flagged in the error word: ``err`` if given,
        else the planner's own word, read with :meth:`last_error`. Block ids are read as int32
        (int64 inputs are narrowed on the device).

        Args:
            block_table: CUDA ``int32`` (or ``int64``) tensor ``[>= R, cols]``, on the states'
                device; rows beyond ``R`` are ignored; the row stride may be anything.
            src_col, dst_col, num_accepted: CUDA ``int32`` (or ``int64``) vectors ``[R]``. int64
                inputs are converted on the device (``.to(torch.int32)``), never copied to the host.
            stream: a ``torch.cuda.Stream`` or CuPy stream; ``None``: the current torch stream.
            err: an optional caller-owned ``int32[3]`` CUDA tensor that the kernel ORs its error
                bits into (zero it before the step; decode a host copy with
                ``gpu.decode_error_word(err.cpu(), R)``). ``None``: the planner's own word, zeroed
                asynchronously on ``stream`` by each call (one word per planner: with launches on
                several concurrent streams, pass your own).

        Raises:
            PlanError: on the host, before anything is queued: the planner is bound to CPU tensors
                (use :meth:`plan_align` + :meth:`CopyPlan.execute`), or an input is not a CUDA
                tensor on the states' device, has the wrong dtype or shape (the message names it).
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        index, n = self._step_inputs(
            "launch_align",
            block_table,
            [(src_col, "src_col"), (dst_col, "dst_col"), (num_accepted, "num_accepted")],
            err,
        )
        self._launch("rs_state_copy", index, n, block_table, src_col, dst_col, num_accepted, None, stream, err)

    def launch_align_decision(
        self,
        block_table: Any,
        src_col: Any,
        running: Any,
        num_accepted: Any,
        block_size: int,
        *,
        stream: Any = None,
        err: Any = None,
    ) -> None:
        """Launch an align-mode step whose copy decision is taken on the device (vLLM's GPU path).

        Per request ``r`` with ``a = num_accepted[r]``: ``new = running[r] + a - 1``,
        ``aligned = new // block_size * block_size``; the request copies iff
        ``aligned >= running[r]`` and ``aligned >= block_size``, and then behaves exactly like
        :meth:`launch_align` with ``dst_col = aligned // block_size - 1`` and accepted count
        ``aligned - running[r] + 1``. ``running = computed + scheduled - drafts`` (the tokens before
        this step's drafts); a negative ``src_col`` is padding. The host never reads
        ``num_accepted``.

        Same launch, precondition (no request's destination block is another request's source
        block), device validation and error word as :meth:`launch_align`; a negative ``running``
        is reported as an ``"args"`` error.

        Args:
            block_table: CUDA ``int32``/``int64`` ``[>= R, cols]``.
            src_col, running, num_accepted: CUDA ``int32``/``int64`` vectors ``[R]``.
            block_size: tokens per block (a host integer, ``>= 1``).
            stream, err: as :meth:`launch_align`.

        Raises:
            PlanError: as :meth:`launch_align`, or ``block_size < 1``.
        """
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
            raise PlanError(f"block_size must be a host integer, got {type(block_size).__name__}")
        index, n = self._step_inputs(
            "launch_align_decision",
            block_table,
            [(src_col, "src_col"), (running, "running"), (num_accepted, "num_accepted")],
            err,
            int(block_size),
        )
        self._launch("rs_state_copy_align", index, n, block_table, src_col, running, num_accepted,
                     int(block_size), stream, err)

    def _launch(self, kernel: str, index: int, n: int, block_table: Any, src_col: Any, mid: Any,
                num_accepted: Any, block_size: int | None, stream: Any, err: Any) -> None:
        from . import gpu

        ds = self._device(index)
        ts = _cuda_ops.torch_stream(stream, index)
        torch = _cuda_ops.torch()
        # validated: check_step_args passed, and the conversions below make every input an int32
        # tensor with a contiguous last axis, so the launch layer reads addresses only.
        common = dict(max_accepted=1 + self.layout.num_spec, num_blocks=self.num_blocks,
                      has_temporal=ds.has_temporal, num_requests=n, stream=ts, validated=True,
                      chunks=ds.chunks)
        with _cuda_ops.context(index, ts):
            if block_table.shape[0] > n and block_table.dtype != torch.int32:
                block_table = block_table[:n]  # narrow only the rows this step reads
            bt = _as_device_int32(torch, block_table)
            s = _as_device_int32(torch, src_col)
            m = _as_device_int32(torch, mid)
            a = _as_device_int32(torch, num_accepted)
            if err is None:
                word = ds.err
                word.zero_()
                self._err_requests = n
            else:
                word = err
            if block_size is None:
                gpu.launch_state_copy(ds.meta, ds.num_meta, bt, s, m, a, word, **common)
            else:
                gpu.launch_state_copy_align(ds.meta, ds.num_meta, bt, s, m, a, word, block_size=block_size,
                                            **common)

    def last_error(self) -> ErrorWord:
        """The planner's error word after its last :meth:`launch_align` /
        :meth:`launch_align_decision` without ``err``: which error kinds the kernel saw and the
        first / last rejected request (``gpu.ErrorWord``; ``.ok`` when nothing was rejected).

        **Synchronises** the states' device (it reads device memory): for debugging and tests, not
        for the step loop. After a CUDA-graph replay it reflects that replay.

        Raises:
            PlanError: the planner is bound to CPU tensors (host plans raise instead of skipping).
        """
        index = self._cuda_index("last_error")
        from . import gpu

        ds = self._device_state
        if ds is None:
            return gpu.decode_error_word([0, 0, 0], 0)
        _cuda_ops.synchronize(index)
        return gpu.decode_error_word(ds.err.cpu(), self._err_requests)

    def __repr__(self) -> str:
        return (f"CopyPlanner({self.layout.backend!r}, layers={self.num_layers}, "
                f"blocks={self.num_blocks}, device={self.device!r})")
