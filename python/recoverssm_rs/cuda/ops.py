"""The few torch CUDA calls the device paths make, behind one seam (:data:`cuda_ops`) that tests
without a GPU replace to run the device paths' host logic (with the kernels emulated on the host).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..errors import PlanError
from ..placement import cuda_index  # the one device parser (re-exported here)

__all__ = ["CudaOps", "cuda_ops", "cuda_index"]


class CudaOps:
    """The few torch CUDA calls the device path makes, in one place.

    torch is imported on first use (the package works without it). Tests without a GPU replace the
    module's instance (:data:`cuda_ops`) to run the device path's host logic.
    """

    @staticmethod
    def torch() -> Any:
        import torch

        return torch

    @staticmethod
    def launch_arg(t: Any) -> Any:
        """A buffer or an engine tensor as a launch receives it: ``t`` itself. The documented hook
        of checks that run the device paths on host tensors standing in for CUDA ones (they
        replace it with a wrapper that reports a CUDA device)."""
        return t

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
            raise PlanError(f"stream must be a torch.cuda.Stream, a CuPy stream or None, got {type(stream).__name__}")
        torch = self.torch()
        return torch.cuda.ExternalStream(int(ptr), device=torch.device("cuda", index))

    def upload(self, raw: np.ndarray, index: int) -> Any:
        """A device copy of host bytes; waits for it (once per planner or step object)."""
        torch = self.torch()
        dev = torch.from_numpy(np.ascontiguousarray(raw).copy()).to(torch.device("cuda", index))
        torch.cuda.synchronize(index)
        return dev

    def stage_i32(self, host: Any, dest: Any) -> None:
        """Copies a 1-D int32 host buffer into the front of the device vector ``dest``, queued on
        the current stream without waiting: one copy into pinned memory (which torch's caching
        host allocator keeps until the asynchronous copy has run), then the host-to-device copy."""
        torch = self.torch()
        host = np.frombuffer(host, dtype=np.int32)
        pinned = torch.empty(len(host), dtype=torch.int32, pin_memory=True)
        pinned.numpy()[:] = host
        dest[: len(host)].copy_(pinned, non_blocking=True)

    def stack_rows(self, tables: list[Any], rows: int, index: int) -> Any:
        """``[len(tables), rows, cols]``: the first ``rows`` rows of each CUDA table, stacked on the
        device (queued on the current stream)."""
        torch = self.torch()
        return torch.stack([t[:rows] for t in tables])

    def filled(self, sizes: list[tuple[int, int, bool]], device: Any) -> list[Any]:
        """One vector per ``(fill, length, wide)`` of ``sizes`` on ``device`` (a torch device),
        int64 where ``wide`` else int32, every element ``fill``."""
        torch = self.torch()
        return [
            torch.full((n,), fill, dtype=torch.int64 if wide else torch.int32, device=device) for fill, n, wide in sizes
        ]

    def copy_i64(self, raw: bytes, dest: Any) -> None:
        """Copies the int64 words ``raw`` into the int64 vector ``dest`` of as many elements
        (torch's copy from pageable host memory), on the current stream."""
        torch = self.torch()
        dest.copy_(torch.frombuffer(bytearray(raw), dtype=torch.int64))

    def remap_counts(self, prev: Any, prev_rows: Any, dest: Any) -> None:
        """``dest[i] = prev[prev_rows[i]]``, 1 where ``prev_rows[i]`` is outside ``prev`` (a row new
        to the batch), queued on the current stream: no host read of a device value."""
        n = prev.shape[0]
        if n == 0:
            dest.fill_(1)
            return
        kept = (prev_rows >= 0) & (prev_rows < n)
        dest.copy_(prev.index_select(0, prev_rows.clamp(0, n - 1)).masked_fill_(~kept, 1))

    def ids_i64(self, ids: Any, index: int) -> Any:
        """The host ids ``ids`` (a sequence of ints) as an int64 vector on ``cuda:index``, copied
        on the current stream."""
        torch = self.torch()
        return torch.as_tensor(ids, dtype=torch.int64).to(torch.device("cuda", index), non_blocking=True)

    def as_i32(self, x: Any) -> Any:
        """``x``, an int32 or int64 CUDA tensor, as int32 with a contiguous last axis, converted on
        the device (no host copy). int64 values outside int32 saturate at its bounds instead of
        wrapping (``2**32 + 5`` would read as block ``5``): the kernels compare ids, columns and
        counts with bounds inside int32 (``< 0``, ``>= cols``, ``>= num_blocks``, ...), so a
        saturated value fails the check the int64 value fails, and a running count saturated at
        ``2**31 - 1`` reaches no column of a row either: such a request writes nothing."""
        torch = self.torch()
        if x.dtype != torch.int32:
            x = x.clamp(-(2**31), 2**31 - 1).to(torch.int32)
        if len(x.shape) and x.shape[-1] > 1 and x.stride()[-1] != 1:
            x = x.contiguous()
        return x

    def empty_i32(self, n: int, index: int) -> Any:
        """An uninitialised int32 device vector (no synchronisation)."""
        torch = self.torch()
        return torch.empty(n, dtype=torch.int32, device=torch.device("cuda", index))

    def zeros_i32(self, n: int, index: int) -> Any:
        torch = self.torch()
        out = torch.zeros(n, dtype=torch.int32, device=torch.device("cuda", index))
        torch.cuda.synchronize(index)
        return out

    def synchronize(self, index: int) -> None:
        self.torch().cuda.synchronize(index)

    def capturing(self) -> bool:
        """Whether the current CUDA stream is capturing a graph (``False`` without CUDA)."""
        cuda = self.torch().cuda
        return bool(cuda.is_available() and cuda.is_current_stream_capturing())


cuda_ops = CudaOps()
