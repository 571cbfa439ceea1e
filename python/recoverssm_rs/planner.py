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

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core
from ._core import ErrorWord, Layout
from .copy_plan import CopyPlan, TileTable
from .cuda import module
from .device_path import DevicePath, check_step
from .errors import BindingError, PlanError
from .guard import BoundTensors
from .plan_format import STATE_META_DTYPE, records
from .tensors import describe_tensor, host_ints

__all__ = ["CopyPlanner", "CopyPlan", "TileTable"]

log = logging.getLogger("recoverssm_rs")


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

    __slots__ = ("_core", "_states", "_bound", "_meta", "_device_path", "__weakref__")

    def __init__(self, layout: Layout, states: Sequence[Sequence[Any]]) -> None:
        self._states = tuple(tuple(layer) for layer in states)
        names = [s.name for s in layout.states]

        def label(layer: int, state: int) -> str:
            name = names[state] if state < len(names) else "?"
            return f"{layout.backend}: layer {layer}, state {state} ('{name}')"

        descs = []
        for li, layer in enumerate(self._states):
            row = []
            for si, t in enumerate(layer):
                try:
                    row.append(describe_tensor(t))
                except TypeError as exc:
                    raise BindingError(f"{label(li, si)}: {exc}") from None
            descs.append(row)
        self._core = _core.Planner(layout, descs, self._states)
        persistent = len(layout.persistent)
        self._bound = BoundTensors([layer[:persistent] for layer in self._states], label)
        self._meta: np.ndarray | None = None
        self._device_path: DevicePath | None = None
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
    def states(self) -> tuple[tuple[Any, ...], ...]:
        """The bound tensors, per layer (an immutable copy: the planner keeps its own references)."""
        return self._states

    @property
    def bound(self) -> BoundTensors:
        """The bound persistent tensors, checked before every execute and launch (see
        :class:`~recoverssm_rs.guard.BoundTensors`)."""
        return self._bound

    @property
    def device_path(self) -> DevicePath | None:
        """The device path's state (metadata table and error word on the device, the core's launch
        builder), once a launch or :meth:`prepare_device` made it; ``None`` before."""
        return self._device_path

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
                host_ints(block_table, "block_table"),
                host_ints(src_col, "src_col"),
                host_ints(dst_col, "dst_col"),
                host_ints(num_accepted, "num_accepted"),
            ),
            self,
        )

    def plan_copy(self, src_blocks: Any, dst_blocks: Any) -> CopyPlan:
        """Plan whole-block copies ``dst_blocks[i] <- src_blocks[i]`` of every persistent state of
        every layer (forks, prefix-cache hits). Equal ids are no-ops, negative ids padding."""
        return CopyPlan(
            self._core.plan_copy(host_ints(src_blocks, "src_blocks"), host_ints(dst_blocks, "dst_blocks")),
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
                f"{what} is part of the device path (CUDA states), but this planner is bound to {device} "
                "tensors; for host states plan the step with planner.plan_align(...) (host inputs) "
                "and run it with CopyPlan.execute()"
            )
        _, _, idx = device.partition(":")
        return int(idx) if idx else 0

    def _device(self, index: int, first_step: tuple[Any, ...] | None = None) -> DevicePath:
        """The device path, made (table uploaded, error word allocated) on first use -- after the
        core has checked ``first_step``'s inputs, so a bad first step touches nothing."""
        dp = self._device_path
        if dp is None:
            if first_step is not None:
                check_step(self.device, *first_step)
            dp = DevicePath(index, self.device, self.state_meta, max_accepted=1 + self.layout.num_spec,
                            num_blocks=self.num_blocks)
            self._device_path = dp
        return dp

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
        self._device(index)
        module.function_ptr("rs_state_copy", index)

    def launch_align(
        self,
        block_table: Any,
        src_col: Any,
        dst_col: Any,
        num_accepted: Any,
        *,
        stream: Any = None,
        err: Any = None,
        num_accepted_out: Any = None,
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
            num_accepted_out: an optional CUDA ``int32`` vector ``[R]`` (sharing no byte with an
                input) where the kernel writes each request's accepted count after the step: 1
                where its state was moved or shifted, ``num_accepted[r]`` elsewhere.

        Raises:
            PlanError: on the host, before anything is queued: the planner is bound to CPU tensors
                (use :meth:`plan_align` + :meth:`CopyPlan.execute`), or an input is not a CUDA
                tensor on the states' device, has the wrong dtype or shape (the message names it).
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        index = self._cuda_index("launch_align")
        step = (block_table, src_col, dst_col, num_accepted, None, err)
        dp = self._device(index, step)
        self._bound.check()
        dp.launch(block_table, src_col, dst_col, num_accepted, None, stream, err, num_accepted_out=num_accepted_out)
        self._bound.mark_written()

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
        num_accepted_out: Any = None,
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
            num_accepted_out: as :meth:`launch_align`: 1 where the save shifted the running state
                in place (``aligned // block_size - 1 == src_col``), ``num_accepted[r]`` elsewhere.

        Raises:
            PlanError: as :meth:`launch_align`, or ``block_size < 1``.
        """
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
            raise PlanError(f"block_size must be a host integer, got {type(block_size).__name__}")
        index = self._cuda_index("launch_align_decision")
        step = (block_table, src_col, running, num_accepted, int(block_size), err)
        dp = self._device(index, step)
        self._bound.check()
        dp.launch(block_table, src_col, running, num_accepted, int(block_size), stream, err,
                  num_accepted_out=num_accepted_out)
        self._bound.mark_written()

    def last_error(self) -> ErrorWord:
        """The planner's error word after its last :meth:`launch_align` /
        :meth:`launch_align_decision` without ``err``: which error kinds the kernel saw and the
        first / last rejected request (``gpu.ErrorWord``; ``.ok`` when nothing was rejected).

        **Synchronises** the states' device (it reads device memory): for debugging and tests, not
        for the step loop. After a CUDA-graph replay it reflects that replay.

        Raises:
            PlanError: the planner is bound to CPU tensors (host plans raise instead of skipping).
        """
        self._cuda_index("last_error")
        dp = self._device_path
        if dp is None:
            return ErrorWord([0, 0, 0], 0)
        return dp.last_error()

    def __repr__(self) -> str:
        return (f"CopyPlanner({self.layout.backend!r}, layers={self.num_layers}, "
                f"blocks={self.num_blocks}, device={self.device!r})")
