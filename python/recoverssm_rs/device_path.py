"""The device path of a CUDA-bound :class:`~recoverssm_rs.CopyPlanner`: one fused-kernel launch per
step from device-resident inputs, with no host synchronisation.

The core's ``FusedCopy`` (made once per planner) checks every input and packs the launch; this
module describes the inputs, narrows int64 inputs to int32 on the device when it must, zeroes the
planner's error word and hands the core's launch to the driver. Every torch CUDA call goes through
:data:`cuda_ops` (a seam that tests without a GPU replace).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np

from . import _core
from ._core import ErrorWord
from .cuda import module
from .errors import PlanError
from .plan_format import CONSTANTS

__all__ = ["CudaOps", "cuda_ops", "DevicePath", "check_step", "HOST_ALTERNATIVE"]

log = logging.getLogger("recoverssm_rs")

HOST_ALTERNATIVE = (
    "the device path reads its inputs in device memory; for host inputs use "
    "planner.plan_align(...) and CopyPlan.execute()"
)


class CudaOps:
    """The few torch CUDA calls the device path makes, in one place.

    torch is imported on first use (the package works without it). Tests without a GPU replace the
    module's instance (:data:`cuda_ops`) to run the device path's host logic.
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

    def stage_i32(self, host: np.ndarray, index: int) -> Any:
        """A device copy of a 1-D int32 host array, queued on the current stream without waiting:
        one copy into pinned memory (which torch's caching host allocator keeps until the
        asynchronous copy has run), then the host-to-device copy."""
        torch = self.torch()
        pinned = torch.empty(len(host), dtype=torch.int32, pin_memory=True)
        pinned.numpy()[:] = host
        return pinned.to(torch.device("cuda", index), non_blocking=True)

    def stack_rows(self, tables: list[Any], rows: int, index: int) -> Any:
        """``[len(tables), rows, cols]``: the first ``rows`` rows of each CUDA table, stacked on the
        device (queued on the current stream)."""
        torch = self.torch()
        return torch.stack([t[:rows] for t in tables])

    def zeros_i32(self, n: int, index: int) -> Any:
        torch = self.torch()
        out = torch.zeros(n, dtype=torch.int32, device=torch.device("cuda", index))
        torch.cuda.synchronize(index)
        return out

    def synchronize(self, index: int) -> None:
        self.torch().cuda.synchronize(index)


cuda_ops = CudaOps()


def _as_int32(torch: Any, x: Any) -> Any:
    """``x`` as int32 with a contiguous last axis, converted on the device (no host copy)."""
    if x.dtype != torch.int32:
        x = x.to(torch.int32)
    if x.shape[-1] > 1 and x.stride()[-1] != 1:
        x = x.contiguous()
    return x


def check_step(device: str, block_table: Any, src_col: Any, second: Any, num_accepted: Any,
               block_size: int | None, err: Any, groups: int = 1, num_accepted_out: Any = None) -> int:
    """The core's checks of a step (int32 or int64 inputs) before anything is bound or uploaded;
    returns the number of requests."""
    return int(_core.check_fused_step(device, block_table, src_col, second, num_accepted, err, block_size, groups,
                                      num_accepted_out))


class DevicePath:
    """What a CUDA-bound planner keeps on the device for the fused kernel (made once): the state
    meta table, the planner's error word, and the core's launch builder."""

    def __init__(self, index: int, device: str, meta: np.ndarray, *, max_accepted: int, num_blocks: int,
                 groups: int = 1) -> None:
        self.index = index
        chunks = _core.state_chunks(int(meta["state_bytes"].max()) if len(meta) else 0)
        temporal = CONSTANTS["RS_KIND_TEMPORAL"]
        self.meta = cuda_ops.upload(meta.view(np.uint8).reshape(-1), index)
        self.err = cuda_ops.zeros_i32(3, index)
        self.fused = _core.FusedCopy(device, int(self.meta.data_ptr()), len(meta), max_accepted, num_blocks,
                                     bool(np.any(meta["kind"] == temporal)), chunks, int(self.err.data_ptr()),
                                     groups)
        self.err_requests = 0
        log.debug("uploaded %d state metas to cuda:%d", len(meta), index)

    def launch(self, block_table: Any, src_col: Any, second: Any, num_accepted: Any,
               block_size: int | None, stream: Any, err: Any, pre_copy: bool = False,
               num_accepted_out: Any = None) -> None:
        """Check, pack and launch one step (``second``: dst_col, or running with a block size;
        ``pre_copy``: equal columns are a no-op whatever the accepted count; ``num_accepted_out``:
        where the kernel writes the accepted counts after the step)."""
        index = self.index
        # The core describes and checks the tensors and packs the launch; int64 inputs, or a table
        # with a strided column axis, pass its checks but are first narrowed / made contiguous on
        # the device (``narrow``), then packed.
        out = num_accepted_out
        kl, n, narrow = self.fused.step(block_table, src_col, second, num_accepted, err, block_size, pre_copy, out)
        ts = cuda_ops.torch_stream(stream, index)
        with cuda_ops.context(index, ts):
            if narrow:
                torch = cuda_ops.torch()
                if block_table.dim() == 2 and block_table.shape[0] > n and block_table.dtype != torch.int32:
                    block_table = block_table[:n]  # only the rows this step reads of a wide table
                block_table, src_col, second, num_accepted = (
                    _as_int32(torch, x) for x in (block_table, src_col, second, num_accepted))
                kl = self.fused.launch(block_table, src_col, second, num_accepted, err, block_size, pre_copy, out)
            if err is None:
                self.err.zero_()
                self.err_requests = n
            if kl is not None:
                module.launch(kl, index, ts)

    def last_error(self) -> ErrorWord:
        """The planner's error word (synchronises the device)."""
        cuda_ops.synchronize(self.index)
        return ErrorWord([int(x) for x in self.err.cpu().tolist()], self.err_requests)
