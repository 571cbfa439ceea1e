"""The device path of :class:`recoverssm_rs.vllm.VllmMambaStep`: each half of the step is one call
into the core and one fused launch over every mamba group, and the accepted counts never visit the
host.

Per half, the core decides what needs no accepted count -- the pre-copy's columns (``prev``,
``curr``) and the post-process's ``running`` -- with every check of the host path that does not
read a count, stages the step as one int32 buffer (the groups' block tables, then the per-request
vectors) and packs the launch that reads it from this object's device staging buffer. The staged
bytes go to the device in one asynchronous copy on the caller's stream, then the kernel reads the
accepted counts in device memory, decides and copies every state of every layer of every group,
validates each request (the step's error word) and writes the counts for what follows into a buffer
of this object (vLLM's resets: 1 where the running state moved). Nothing here synchronises with the
device.

Every device buffer is static: the counts, the error word and the staging buffer are allocated by
the first step, the staging buffer sized for ``max_num_reqs`` requests of the tables' width (it
grows only for wider tables); each half-step's staged bytes are copied into it. A pre-copy given
``prev_rows`` (each row's row in the previous step) instead of ``num_accepted`` remaps the previous
post-process's counts to this step's rows on the device, new rows reading 1 (vLLM's
``add_request``), into a buffer of this object.

The block tables are staged from the host tables the step was checked against, or, for wide
tables, taken from the engine's own device tables (``device_tables``), stacked on the device.

Every torch CUDA call goes through :data:`recoverssm_rs.cuda.ops.cuda_ops` (the seam the tests
replace to run this path on the host, through the emulation of the real kernel).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._core import ErrorWord, VllmSlots
from ..cuda import module, ops
from ..engine import EngineAdapter
from ..errors import PlanError, _reading
from ..plan_format import records
from .decide import PostProcessInputs, PreCopyInputs, fields

if TYPE_CHECKING:
    from ..planner import Planner

__all__ = ["DeviceStep"]

log = logging.getLogger("recoverssm_rs")


def _rows(x: Any, name: str) -> int:
    """The requests of a step's ``[R]`` vector (a ``PlanError`` naming it when it has no length;
    the core checks its values)."""
    with _reading(name, PlanError):
        return len(x)


def _remap(prev: Any, prev_rows: Any, dest: Any) -> None:
    """``dest[i] = prev[prev_rows[i]]``, 1 where ``prev_rows[i]`` is outside ``prev`` (a new row),
    queued on the current stream: no host read of a device value."""
    n = prev.shape[0]
    if n == 0:
        dest.fill_(1)
        return
    kept = (prev_rows >= 0) & (prev_rows < n)
    dest.copy_(prev.index_select(0, prev_rows.clamp(0, n - 1)).masked_fill_(~kept, 1))


def _int32_counts(x: Any) -> Any:
    """Device counts as int32, narrowed on the device (the core checks every other dtype)."""
    dtype = str(getattr(x, "dtype", ""))
    if "cuda" in str(getattr(x, "device", "")) and dtype in ("torch.int64", "int64"):
        return x.to(ops.cuda_ops.torch().int32)
    return x


class DeviceStep(EngineAdapter):
    """The two fused launches of a step for a planner bound to CUDA states.

    Args:
        planner: the planner of every mamba group (CUDA states, with vLLM's ``block_size``).
        max_num_reqs: the most requests of a step (the size of the output buffers).

    The counts a launch writes are views into buffers of this object (one for the pre-copy, one
    for the post-process): use them before the same half of the next step overwrites them. Both
    halves report into this object's error word (:meth:`last_error`), zeroed by each pre-copy, so
    it covers the whole step.
    """

    def __init__(self, planner: Planner, max_num_reqs: int) -> None:
        super().__init__(planner)
        self.index = self.cuda("the device step")
        self.max_num_reqs = VllmSlots.check_capacity(max_num_reqs)
        # int32 [3 * max_num_reqs]: the pre-copy's counts, the post-process's, the remapped counts
        self._out: Any = None
        self._err: Any = None  # int32 [3]: the step's error word
        self._staging: Any = None  # int32 device buffer the staged step is copied into
        self._err_rows = 0
        self._post_rows = 0  # the requests of the last post-process (the rows prev_rows index)

    def _buffers(self) -> tuple[Any, Any]:
        if self._out is None:
            self.planner.device_path("the device step")  # the state table and the planner's word; compiled at launch
            cuda = ops.cuda_ops
            self._out = cuda.zeros_i32(3 * self.max_num_reqs, self.index)
            self._err = cuda.zeros_i32(3, self.index)
        return self._out, self._err

    def _stage(self, tables: Sequence[Any], rows: int, device_tables: Sequence[Any] | None) -> tuple[Any, Any]:
        """The staging buffer, allocated for ``max_num_reqs`` requests of the tables' width (again
        only for wider tables), and the engine's device tables stacked on the device when given."""
        if rows > self.max_num_reqs:
            raise PlanError(f"{rows} requests in the step, more than max_num_reqs = {self.max_num_reqs}")
        table = None
        per_row = 3  # the vectors of a half-step
        if device_tables is None:
            per_row += len(tables) * max((np.shape(t)[1] for t in tables), default=0)
        else:
            _core.check_device_tables(
                device=self.placement.name, tables=list(device_tables), groups=self.planner.num_groups, rows=rows
            )
            table = ops.cuda_ops.stack_rows(list(device_tables), rows, self.index)
        if self._staging is None or self._staging.shape[0] < per_row * rows:
            self._staging = ops.cuda_ops.empty_i32(per_row * self.max_num_reqs, self.index)
        return self._staging, table

    def launch(
        self,
        step: PreCopyInputs | PostProcessInputs,
        *,
        stream: Any = None,
        device_tables: Sequence[Any] | None = None,
        prev_rows: Any = None,
    ) -> tuple[np.ndarray, Any]:
        """One half of vLLM's step for every group in one launch: the pre-copy for a
        :class:`~recoverssm_rs.vllm.decide.PreCopyInputs`, the post-process (decided on the device)
        for a :class:`~recoverssm_rs.vllm.decide.PostProcessInputs`. The core decides what needs no
        count, stages and packs (one call); then, on ``stream``, the staged step is copied to the
        device and the kernel launched.

        Args:
            step: the half-step's vectors. ``tables``: one host ``[>= R, cols]`` table per group
                (the host checks run on them); the other vectors host ``[R]`` (as
                :func:`~recoverssm_rs.vllm.decide.align_pre_copy` /
                :func:`~recoverssm_rs.vllm.decide.align_post_process`; a post-process's
                ``state_col`` is the ``curr`` of its pre-copy), except ``num_accepted``: a CUDA
                tensor (read only by the kernel, which checks ``1 <= a <= 1 + num_spec_blocks``)
                or a host array (staged with the step, after every host check of the ``align_*``
                function); a pre-copy's is the previous step's counts, ``None`` with
                ``prev_rows``; a post-process's the tokens accepted this step (bonus included).
            stream: a torch or CuPy stream; ``None``: the current torch stream.
            device_tables: the same tables already on the device (one CUDA ``[>= R, cols]`` per
                group, e.g. vLLM's ``block_table[g].get_device_tensor(R)``): stacked on the device
                instead of staging the host tables (for wide tables). They must hold what the host
                tables hold; the kernel still checks every block id and column it reads.
            prev_rows: a pre-copy's alternative to ``num_accepted``: a CUDA int32 / int64
                ``[>= R]`` vector, each row's row in the previous step (``-1``, or any index
                outside the previous step's rows, for a row new to the batch, which reads 1): the
                counts of this object's last post-process are remapped to this step's rows on the
                device (into a buffer of this object), so the runner need not follow its batch
                reorders.

        Returns:
            ``(vector, counts)``: the core's vector (a pre-copy's ``curr``, the new running columns
            as host int64: vLLM's ``mamba_state_idx``, store them per request) and the ``[R]``
            int32 CUDA counts (a pre-copy's after the reset, for the forward pass; a
            post-process's for the next step, 1 where the running state was shifted in place).

        Raises:
            PlanError: naming the request, before anything is queued.
        """
        pre = isinstance(step, PreCopyInputs)
        first = "num_computed" if pre else "state_col"  # the vector that gives the requests
        kwargs = fields(step)
        rows = _rows(kwargs[first], first)
        given = kwargs["num_accepted"] is not None
        kwargs["num_accepted"] = _int32_counts(kwargs["num_accepted"])
        out, err = self._buffers()
        counts = out[:rows] if pre else out[self.max_num_reqs : self.max_num_reqs + rows]
        staging, table = self._stage(kwargs["tables"], rows, device_tables)
        cuda = ops.cuda_ops
        ts = self.stream(stream)
        if prev_rows is not None:
            _core.vllm_check_prev_rows(
                device=self.placement.name,
                prev_rows=prev_rows,
                rows=rows,
                num_accepted_given=given,
            )
            kwargs["num_accepted"] = out[2 * self.max_num_reqs : 2 * self.max_num_reqs + rows]

        def run(staged: Any, kl: Any) -> None:
            """The half-step's writes, run by the core after every check (nothing is queued on an
            error), before it records them."""
            with cuda.context(self.index, ts):
                if pre:
                    err.zero_()  # the step's word: the post-process ORs into it too
                    self._err_rows = 0
                    if prev_rows is not None:
                        prev = out[self.max_num_reqs : self.max_num_reqs + self._post_rows]
                        _remap(prev, prev_rows[:rows], kwargs["num_accepted"])
                if kl is not None:
                    cuda.stage_i32(staged, staging)
                    module.launch(kl, self.index, ts)
                    self._err_rows = max(self._err_rows, rows)

        half = _core.vllm_device_pre_copy if pre else _core.vllm_device_post_process
        vector, _, _ = half(
            self.core, run, staging=staging, device_table=table, err=err, num_accepted_out=counts, **kwargs
        )
        if not pre:
            self._post_rows = rows
        return records(vector, np.int64), counts

    def last_error(self) -> ErrorWord:
        """The error word of the current step (both halves since the last pre-copy :meth:`launch`):
        which error kinds the kernel saw and the first / last rejected request. A step with an
        error must not be continued: a rejected request was skipped (nothing of it written) while
        its counts followed the decision. **Synchronises** the device (for checks, not the loop)."""
        if self._err is None:
            return ErrorWord([0, 0, 0], 0)
        ops.cuda_ops.synchronize(self.index)
        return ErrorWord([int(x) for x in self._err.cpu().tolist()], self._err_rows)

    def __repr__(self) -> str:
        return f"DeviceStep(cuda:{self.index}, groups={self.planner.num_groups}, max_num_reqs={self.max_num_reqs})"
