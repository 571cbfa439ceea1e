"""The device path of :class:`recoverssm_rs.vllm.VllmMambaStep`: each half of the step is one fused
launch over every mamba group, and the accepted counts never visit the host.

Per half, the host decides what needs no accepted count -- the pre-copy's columns (``prev``,
``curr``) and the post-process's ``running`` -- with every check of the host path that does not
read a count (the core's ``device_pre_copy`` / ``device_post_process``). The core stages the step
for the kernel as one int32 buffer (the groups' block tables, then the per-request vectors), which
goes to the device in one asynchronous copy on the caller's stream. The kernel reads the accepted
counts in device memory, decides and copies every state of every layer of every group, validates
each request (the planner's error word), and writes the counts for what follows into a buffer of
this object (vLLM's resets: 1 where the running state moved). Nothing here synchronises with the
device.

Every torch CUDA call goes through :data:`recoverssm_rs.device_path.cuda_ops` (the seam the tests
replace to run this path on the host, through the emulation of the real kernel).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, device_path
from .errors import PlanError
from .groups import MultiGroupPlanner

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
    for the post-process): use them before the same half of the next step overwrites them. Run
    both halves of a step on one stream (the post-process reads the block table the pre-copy
    staged).
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
        self._table: Any = None  # the staged [groups, R, cols] table of the current step
        self._rows = -1

    def _outputs(self) -> Any:
        if self._out is None:
            self.planner.prepare_device()
            self._out = device_path.cuda_ops.zeros_i32(2 * self.max_num_reqs, self.index)
        return self._out

    def _stage(self, host: np.ndarray, stream: Any) -> Any:
        ops = device_path.cuda_ops
        with ops.context(self.index, ops.torch_stream(stream, self.index)):
            return ops.stage_i32(host, self.index)

    def pre_copy(self, block_tables: Sequence[Any], num_computed: Any, num_scheduled: Any, running_col: Any,
                 num_accepted: Any, *, fresh: Any = None, req_ids: Sequence[Any] | None = None,
                 stream: Any = None) -> tuple[np.ndarray, Any]:
        """vLLM's pre-copy for every group in one launch.

        Args:
            block_tables: one host ``[>= R, cols]`` table per group (checked on the host and staged).
            num_computed, num_scheduled, running_col: host ``[R]`` vectors (as
                :func:`~recoverssm_rs.groups.align_pre_copy`).
            num_accepted: ``[R]`` counts of the previous step: a CUDA tensor (read only by the
                kernel) or a host array (staged with the step).
            fresh, req_ids: as :func:`~recoverssm_rs.groups.align_pre_copy`.
            stream: a torch or CuPy stream; ``None``: the current torch stream.

        Returns:
            ``(curr, counts)``: the new running columns (host int64; store them per request) and
            the ``[R]`` int32 CUDA counts after the reset, for the forward pass.

        Raises:
            PlanError: naming the request, before anything is queued (every host check of
                :func:`~recoverssm_rs.groups.align_pre_copy` that needs no count).
        """
        r = len(num_computed)
        if r > self.max_num_reqs:
            raise PlanError(f"{r} requests in the step, more than max_num_reqs = {self.max_num_reqs}")
        dev_counts = on_device(num_accepted)
        host = None if dev_counts else _host_counts(num_accepted)
        st = self.planner.stage_pre_copy(_as_host_tables(block_tables), num_computed, num_scheduled, running_col,
                                         fresh=fresh, req_ids=req_ids, num_accepted=host)
        curr = st.vectors[1]
        g, rows, width = st.table_shape
        out = self._outputs()
        counts = out[:r]
        if r == 0:
            return curr, counts
        dev = self._stage(st.staged, stream)
        n = g * rows * width
        self._table, self._rows = dev[:n].view(g, rows, width), r
        acc = num_accepted if dev_counts else dev[n + 2 * r: n + 3 * r]
        self.planner.launch(self._table, dev[n: n + r], dev[n + r: n + 2 * r], acc, "pre_copy", stream=stream,
                            num_accepted_out=counts)
        return curr, counts

    def post_process(self, block_tables: Sequence[Any], state_col: Any, num_computed: Any, num_scheduled: Any,
                     num_draft: Any, num_accepted: Any, *, req_ids: Sequence[Any] | None = None,
                     stream: Any = None) -> Any:
        """vLLM's post-process for every group in one launch, decided on the device.

        Args:
            block_tables: the step's host tables (checked again; the kernel reads the table the
                pre-copy staged).
            state_col: the ``curr`` :meth:`pre_copy` returned; num_computed, num_scheduled,
                num_draft: host ``[R]`` vectors of the same step.
            num_accepted: ``[R]`` tokens accepted this step (bonus included): a CUDA tensor (the
                sampler's) or a host array.
            req_ids, stream: as :meth:`pre_copy`.

        Returns:
            The ``[R]`` int32 CUDA counts for the next step (1 where the running state was shifted
            in place).

        Raises:
            PlanError: naming the request, before anything is queued; or no pre-copy of this step.
        """
        r = len(state_col)
        if self._rows != r and r:
            raise PlanError(f"post_process of {r} requests, but the step's pre_copy staged {max(self._rows, 0)}: "
                            "run pre_copy first, with the same batch")
        dev_counts = on_device(num_accepted)
        host = None if dev_counts else _host_counts(num_accepted)
        st = self.planner.stage_post_process(_as_host_tables(block_tables), state_col, num_computed, num_scheduled,
                                             num_draft, req_ids=req_ids, num_accepted=host)
        out = self._outputs()
        counts = out[self.max_num_reqs: self.max_num_reqs + r]
        if r == 0:
            return counts
        dev = self._stage(st.staged, stream)
        acc = num_accepted if dev_counts else dev[2 * r: 3 * r]
        self.planner.launch_post_process(self._table, dev[:r], dev[r: 2 * r], acc, stream=stream,
                                         num_accepted_out=counts)
        return counts

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
