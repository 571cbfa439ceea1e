"""The device path of :class:`recoverssm_rs.vllm.VllmMambaStep`: each half of the step is one fused
launch over every mamba group, and the accepted counts never visit the host.

Per half, the host decides what needs no accepted count -- the pre-copy's columns (``prev``,
``curr``) and the post-process's ``running`` -- with every check of the host path that does not
read a count (the core's ``device_pre_copy`` / ``device_post_process``). The core stages the step
for the kernel as one int32 buffer (the groups' block tables, then the per-request vectors), which
goes to the device in one asynchronous copy on the caller's stream. The kernel reads the accepted
counts in device memory, decides and copies every state of every layer of every group, validates
each request (the planner's error word), and writes the counts for what follows into a buffer of
this object (vLLM's resets: 1 where the running state moved). Both halves report into one error
word per step (:meth:`DeviceStep.last_error`). Nothing here synchronises with the device.

The block tables are staged from the host tables the step was checked against, or, for wide
tables, taken from the engine's own device tables (``device_tables``), stacked on the device.

Every torch CUDA call goes through :data:`recoverssm_rs.device_path.cuda_ops` (the seam the tests
replace to run this path on the host, through the emulation of the real kernel).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, device_path
from ._core import ErrorWord
from .errors import PlanError
from .groups import MultiGroupPlanner, StagedStep

__all__ = ["DeviceStep", "on_device"]

log = logging.getLogger("recoverssm_rs")


def on_device(x: Any) -> bool:
    """Whether ``x`` is a tensor or array in CUDA memory (as the core describes it)."""
    d = _core.describe_arg(x)
    return d is not None and d[4].startswith("cuda")


def _host_counts(x: Any) -> np.ndarray:
    """Host counts as int64 (a CPU tensor's numpy view; the core checks the values)."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach().numpy()
    return np.ascontiguousarray(x, dtype=np.int64)


class DeviceStep:
    """The two fused launches of a step for a planner bound to CUDA states.

    Args:
        planner: the multi-group planner (CUDA states).
        max_num_reqs: the most requests of a step (the size of the output buffers).

    The counts a launch writes are views into buffers of this object (one for the pre-copy, one
    for the post-process): use them before the same half of the next step overwrites them. Both
    halves report into this object's error word (:meth:`last_error`), zeroed by each pre-copy, so
    it covers the whole step.
    """

    def __init__(self, planner: MultiGroupPlanner, max_num_reqs: int) -> None:
        device = planner.device
        if not device.startswith("cuda"):
            raise PlanError(f"the device step needs CUDA states; these groups are bound to {device} tensors")
        _, _, idx = device.partition(":")
        self.planner = planner
        self.index = int(idx) if idx else 0
        self.max_num_reqs = int(max_num_reqs)
        self._out: Any = None  # int32 [2 * max_num_reqs]: the pre-copy's counts, then the post-process's
        self._err: Any = None  # int32 [3]: the step's error word
        self._err_rows = 0

    def _buffers(self) -> tuple[Any, Any]:
        if self._out is None:
            self.planner.prepare_device()
            ops = device_path.cuda_ops
            self._out = ops.zeros_i32(2 * self.max_num_reqs, self.index)
            self._err = ops.zeros_i32(3, self.index)
        return self._out, self._err

    def _table(self, staged: Any, shape: tuple[int, int, int], device_tables: Sequence[Any] | None, rows: int) -> Any:
        """The step's ``[groups, R, cols]`` table: the staged one, or the engine's device tables
        stacked on the device."""
        if device_tables is None:
            g, r, c = shape
            return staged[: g * r * c].view(g, r, c)
        return device_path.cuda_ops.stack_rows(list(device_tables), rows, self.index)

    def _check_step(self, r: int, device_tables: Sequence[Any] | None) -> None:
        """The step's size and the engine's device tables, before anything is staged."""
        if r > self.max_num_reqs:
            raise PlanError(f"{r} requests in the step, more than max_num_reqs = {self.max_num_reqs}")
        if device_tables is not None:
            _core.check_device_tables(self.planner.device, list(device_tables), self.planner.num_groups, r)

    def _upload(self, st: StagedStep, num_accepted: Any, dev_counts: bool, device_tables: Sequence[Any] | None,
                r: int) -> tuple[Any, Any, Any, Any]:
        """One half's launch inputs (in the caller's stream context): the staged buffer copied to
        the device and cut into ``(table, first vector, second vector, counts)``; the counts are
        the caller's device tensor when they were not staged."""
        dev = device_path.cuda_ops.stage_i32(st.staged, self.index)
        table = self._table(dev, st.table_shape, device_tables, r)
        n = st.table_shape[0] * st.table_shape[1] * st.table_shape[2]
        acc = num_accepted if dev_counts else dev[n + 2 * r: n + 3 * r]
        return table, dev[n: n + r], dev[n + r: n + 2 * r], acc

    def pre_copy(self, block_tables: Sequence[Any], num_computed: Any, num_scheduled: Any, running_col: Any,
                 num_accepted: Any, *, fresh: Any = None, req_ids: Sequence[Any] | None = None,
                 stream: Any = None, device_tables: Sequence[Any] | None = None) -> tuple[np.ndarray, Any]:
        """vLLM's pre-copy for every group in one launch.

        Args:
            block_tables: one host ``[>= R, cols]`` table per group (the host checks run on them).
            num_computed, num_scheduled, running_col: host ``[R]`` vectors (as
                :func:`~recoverssm_rs.groups.align_pre_copy`).
            num_accepted: ``[R]`` counts of the previous step: a CUDA tensor (read only by the
                kernel, which checks them) or a host array (staged with the step, after every host
                check of :func:`~recoverssm_rs.groups.align_pre_copy`).
            fresh, req_ids: as :func:`~recoverssm_rs.groups.align_pre_copy`.
            stream: a torch or CuPy stream; ``None``: the current torch stream.
            device_tables: the same tables already on the device (one CUDA ``[>= R, cols]`` per
                group, e.g. vLLM's ``block_table[g].get_device_tensor(R)``): stacked on the device
                instead of staging the host tables (for wide tables). They must hold what the host
                tables hold; the kernel still checks every block id and column it reads.

        Returns:
            ``(curr, counts)``: the new running columns (host int64; store them per request) and
            the ``[R]`` int32 CUDA counts after the reset, for the forward pass.

        Raises:
            PlanError: naming the request, before anything is queued.
        """
        r = len(num_computed)
        self._check_step(r, device_tables)
        dev_counts = on_device(num_accepted)
        st = self.planner.stage_pre_copy(_as_host_tables(block_tables), num_computed, num_scheduled, running_col,
                                         fresh=fresh, req_ids=req_ids,
                                         num_accepted=None if dev_counts else _host_counts(num_accepted),
                                         stage_table=device_tables is None)
        out, err = self._buffers()
        counts = out[:r]
        ops = device_path.cuda_ops
        with ops.context(self.index, ops.torch_stream(stream, self.index)):
            err.zero_()  # the step's word: the post-process ORs into it too
            self._err_rows = 0
            if r == 0:
                return st.vectors[1], counts
            table, src, curr, acc = self._upload(st, num_accepted, dev_counts, device_tables, r)
        self.planner.launch(table, src, curr, acc, "pre_copy", stream=stream, err=err, num_accepted_out=counts)
        self._err_rows = r
        return st.vectors[1], counts

    def post_process(self, block_tables: Sequence[Any], state_col: Any, num_computed: Any, num_scheduled: Any,
                     num_draft: Any, num_accepted: Any, *, req_ids: Sequence[Any] | None = None,
                     stream: Any = None, device_tables: Sequence[Any] | None = None) -> Any:
        """vLLM's post-process for every group in one launch, decided on the device.

        Args:
            block_tables: the step's host tables.
            state_col: the ``curr`` :meth:`pre_copy` returned; num_computed, num_scheduled,
                num_draft: host ``[R]`` vectors of the same step.
            num_accepted: ``[R]`` tokens accepted this step (bonus included): a CUDA tensor (the
                sampler's; the kernel checks ``1 <= a <= 1 + num_spec_blocks``) or a host array
                (every check of :func:`~recoverssm_rs.groups.align_post_process` runs).
            req_ids, stream, device_tables: as :meth:`pre_copy`.

        Returns:
            The ``[R]`` int32 CUDA counts for the next step (1 where the running state was shifted
            in place).

        Raises:
            PlanError: naming the request, before anything is queued.
        """
        r = len(state_col)
        self._check_step(r, device_tables)
        dev_counts = on_device(num_accepted)
        st = self.planner.stage_post_process(_as_host_tables(block_tables), state_col, num_computed, num_scheduled,
                                             num_draft, req_ids=req_ids,
                                             num_accepted=None if dev_counts else _host_counts(num_accepted),
                                             stage_table=device_tables is None)
        out, err = self._buffers()
        counts = out[self.max_num_reqs: self.max_num_reqs + r]
        if r == 0:
            return counts
        ops = device_path.cuda_ops
        with ops.context(self.index, ops.torch_stream(stream, self.index)):
            table, state_col_dev, running, acc = self._upload(st, num_accepted, dev_counts, device_tables, r)
        self.planner.launch_post_process(table, state_col_dev, running, acc, stream=stream, err=err,
                                         num_accepted_out=counts)
        self._err_rows = max(self._err_rows, r)
        return counts

    def last_error(self) -> ErrorWord:
        """The error word of the current step (both halves since the last :meth:`pre_copy`):
        which error kinds the kernel saw and the first / last rejected request. A step with an
        error must not be continued: a rejected request was skipped (nothing of it written) while
        its counts followed the decision. **Synchronises** the device (for checks, not the loop)."""
        if self._err is None:
            return ErrorWord([0, 0, 0], 0)
        device_path.cuda_ops.synchronize(self.index)
        return ErrorWord([int(x) for x in self._err.cpu().tolist()], self._err_rows)

    def __repr__(self) -> str:
        return f"DeviceStep(cuda:{self.index}, groups={self.planner.num_groups}, max_num_reqs={self.max_num_reqs})"


def _as_host_tables(block_tables: Sequence[Any]) -> list[Any]:
    out = []
    for g, t in enumerate(block_tables):
        if on_device(t):
            raise PlanError(f"group {g}: pass the host block table (vLLM's block_table.get_numpy_array()); the "
                            "step checks it on the host and stages exactly what it checked")
        out.append(t.detach().numpy() if hasattr(t, "detach") else t)
    return out
