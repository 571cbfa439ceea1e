"""The device path of :class:`recoverssm_rs.vllm.VllmMambaStep`: each half-step is one call into the
core (decide what needs no accepted count, stage, pack the launch) and one fused launch over every
mamba group; the accepted counts never visit the host and nothing synchronises (docs/design.md
section 3.6, "The engine step on the device"). Every torch CUDA call goes through
:data:`recoverssm_rs.cuda.ops.cuda_ops` (the seam the tests replace to run this path emulated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _core
from .._core import ErrorWord, VllmSlots
from ..cuda import module, ops
from ..engine import EngineAdapter, ErrorWordBuffer
from ..errors import PlanError, _reading
from ..plan_format import records
from ..planner import Planner
from .decide import PostProcessInputs, PreCopyInputs

__all__ = ["DeviceStep"]


class DeviceStep(EngineAdapter):
    """The two fused launches of a step for a planner bound to CUDA states (``planner``: every mamba
    group, with vLLM's ``block_size``; ``max_num_reqs``: the most requests of a step). The accepted
    counts a launch returns are views into this object's buffers, valid until the same half of the
    next step; both halves report into one error word (:meth:`last_error`)."""

    def __init__(self, planner: Planner, max_num_reqs: int) -> None:
        super().__init__(planner)
        self.index = self.cuda("the device step")
        self.max_num_reqs = VllmSlots.check_capacity(max_num_reqs)
        self._out: Any = None  # int32 [3 * max_num_reqs]: the pre-copy's counts, the post-process's, the remapped
        self.error = ErrorWordBuffer(self.index)
        """The step's error word (zeroed by each pre-copy)."""
        self._staging: Any = None  # int32 device buffer the staged step is copied into (sized by the core)
        self._post_rows = 0  # the requests of the last post-process (the rows prev_rows index)

    def launch(
        self,
        step: PreCopyInputs | PostProcessInputs,
        *,
        stream: Any = None,
        device_tables: Sequence[Any] | None = None,
        prev_rows: Any = None,
    ) -> tuple[np.ndarray, Any]:
        """One half-step for every group in one launch: the pre-copy for a :class:`PreCopyInputs`,
        the post-process (decided on the device) for a :class:`PostProcessInputs`.

        Args:
            step: the half-step's vectors: host tables and ``[R]`` vectors, except
                ``num_accepted``, which may be a CUDA tensor (read only by the kernel), or ``None``
                for a pre-copy given ``prev_rows``.
            stream: a torch or CuPy stream; ``None``: the current torch stream.
            device_tables: the same tables already on the device (vLLM's
                ``block_table[g].get_device_tensor(R)``), stacked there instead of staged.
            prev_rows: a pre-copy's alternative to ``num_accepted``: each batch row's row in the
                previous step (CUDA; ``-1`` or out of range: new, reads 1); the last post-process's
                accepted counts are remapped on the device.

        Returns:
            ``(curr, counts)``: a pre-copy's new running columns (host int64, vLLM's
            ``mamba_state_idx``; a post-process's core vector) and the ``[R]`` int32 CUDA accepted
            counts for what follows.

        Raises:
            PlanError: naming the request, before anything is queued.
        """
        pre = isinstance(step, PreCopyInputs)
        if self._out is None:
            self.planner.device_path("the device step")  # the state table and the planner's word; compiled at launch
            self._out = ops.cuda_ops.zeros_i32(3 * self.max_num_reqs, self.index)
        out, m, cuda, ts = self._out, self.max_num_reqs, ops.cuda_ops, self.stream(stream)
        with _reading("device_tables (the groups' device block tables)", PlanError):
            devs = None if device_tables is None else list(device_tables)  # read once: the core's and the stack's

        def buffers(n: int, rows: int) -> tuple[Any, Any]:
            """The staging buffer of at least ``n`` elements (the core sizes it for ``max_num_reqs``
            requests: allocated again only for wider tables) and the device tables stacked."""
            if self._staging is None or self._staging.shape[0] < n:
                self._staging = cuda.empty_i32(n, self.index)
            return self._staging, None if devs is None else cuda.stack_rows(devs, rows, self.index)

        def run(staged: Any, kl: Any, rows: int) -> None:
            """The half-step's writes, run by the core after every check (nothing is queued on an
            error), before it records them."""
            with cuda.context(self.index, ts):
                if pre:
                    self.error.reset(0)  # the step's word: the post-process ORs into it too
                    if prev_rows is not None:
                        cuda.remap_counts(out[m : m + self._post_rows], prev_rows[:rows], out[2 * m : 2 * m + rows])
                if kl is not None:
                    cuda.stage_i32(staged, self._staging)
                    module.launch(kl, self.index, ts)
                    self.error.requests = max(self.error.requests, rows)

        half = _core.vllm_device_pre_copy if pre else _core.vllm_device_post_process
        kw = {"buffers": buffers, "err": self.error.alloc(), "out": out, "device_tables": devs, "prev_rows": prev_rows}
        vector = records(half(self.core, run, max_num_reqs=m, step=step, **kw)[0], np.int64)
        first = 0 if pre else m
        if not pre:
            self._post_rows = len(vector)
        return vector, out[first : first + len(vector)]

    def last_error(self) -> ErrorWord:
        """The error word of the current step (both halves since the last pre-copy); a step with an
        error must not be continued. **Synchronises** the device (for checks, not the loop)."""
        return self.error.read()

    def __repr__(self) -> str:
        return f"DeviceStep(cuda:{self.index}, groups={self.planner.num_groups}, max_num_reqs={self.max_num_reqs})"
