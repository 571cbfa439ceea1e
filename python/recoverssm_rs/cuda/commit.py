"""The RecoverSSM commit kernel ``rs_recover_commit``: its per-layer table (built and checked by the
core from the tensors themselves), and its launch for a :class:`~recoverssm_rs.StateCache` or from
raw device buffers. The core builds every launch (``_core.CommitLaunch``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from .._core import ErrorWord
from ..plan_format import ABI, COMMIT_META_DTYPE, COMMIT_ROW_DTYPE, CONSTANTS, records
from . import module

__all__ = [
    "COMMIT_DTYPE_PAIRS",
    "build_commit_meta",
    "commit_grid",
    "launch_recover_commit",
    "CommitKernel",
]

THREADS: int = CONSTANTS["RS_THREADS"]
#: (recurrent state dtype, key+gate record dtype) pairs the commit kernel is instantiated for.
COMMIT_DTYPE_PAIRS: tuple[tuple[str, str], ...] = tuple(tuple(p) for p in ABI["commit_dtype_pairs"])


def build_commit_meta(
    recurrent: Any,
    corrections: Any,
    keygate: Any,
    conv: Any = None,
    conv_window: Any = None,
    *,
    kind: str,
    conv_layout: str = "DS",
    conv_kernel_size: int = 1,
) -> np.ndarray:
    """The per-layer ``COMMIT_META_DTYPE`` table of ``rs_recover_commit`` (host numpy array).

    Each argument is a sequence of per-layer torch tensors or numpy arrays (or one tensor with a
    leading layer axis): ``recurrent`` ``[num_blocks, H, V, K]`` (float32, bfloat16 or float16),
    ``corrections`` ``[max_requests, H, Q, V]`` float32, ``keygate`` ``[max_requests, H, Q, K + 1]``
    (``kind="gdn"``) or ``[..., 2K]`` (``"kda"``), ``conv`` ``[num_blocks, W, D]`` (SD) or
    ``[num_blocks, D, W]`` (DS) with ``W = conv_kernel_size - 1 + Q - 1``, and ``conv_window``
    ``[max_requests, same]`` (``conv`` and ``conv_window`` both ``None``: no conv state). Only
    addresses, strides and shapes are read, so CPU tensors give a table for the host emulation, CUDA
    tensors one for the device. The rules are the core's (``rust/commit/meta.rs``).

    Raises:
        BindingError: a shape, dtype, stride, alignment or device that the kernel cannot take.
    """
    # Every argument, by name, to the core's table builder (the same keywords).
    return records(_core.commit_meta_table(**locals()), dtype=COMMIT_META_DTYPE).copy()


def _table_bytes(meta: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(meta).view(COMMIT_META_DTYPE)).view(np.uint8).reshape(-1)


def commit_grid(meta: Any, *, threads: int = THREADS) -> tuple[int, int]:
    """``(rec_ctas, conv_ctas)``: CTAs per (layer, row) of the commit kernel with ``threads``
    threads per CTA for a ``COMMIT_META_DTYPE`` table (one per (head, value tile) of the largest
    layer, one per 16 KiB of the largest conv window)."""
    rec, conv = _core.commit_grid(_table_bytes(meta), threads)
    return int(rec), int(conv)


def launch_recover_commit(
    meta_dev: Any,
    meta: Any,
    rows_dev: Any,
    num_rows: int | None = None,
    *,
    num_blocks: int,
    max_requests: int,
    num_accepted: Any = None,
    err: Any = None,
    stream: Any = None,
) -> None:
    """Launch ``rs_recover_commit`` on the caller's stream; never synchronises, never allocates.

    Args:
        meta_dev: the device copy of ``meta`` (the host ``COMMIT_META_DTYPE`` table, which gives
            the layers and the grid).
        rows_dev: device array of ``COMMIT_ROW_DTYPE`` records (the core's commit plan; padding
            rows have ``state_block <= 0``); the first ``num_rows`` are committed (default: all).
        num_blocks: blocks of the pools; max_requests: workspace rows.
        num_accepted: optional int32 device vector indexed by ``row.count_index`` (the row's
            request as the core plans it): the count becomes ``clamp(num_accepted[count_index], 0,
            row.count)`` on the device.
        err: optional int32 device vector of 3 elements (zeroed by the caller): see
            :class:`~recoverssm_rs.cuda.ErrorWord` (its request numbers are row indices).
        stream: a CuPy stream or a ``torch.cuda.Stream``; ``None``: the current torch stream.
    """
    ck = _core.CommitLaunch(
        _table_bytes(meta),
        device=rows_dev,
        metas=module.address(meta_dev),
        num_blocks=num_blocks,
        max_requests=max_requests,
        err=0 if err is None else module.address(err),
    )
    kl = ck.launch(rows=rows_dev, num_rows=num_rows, num_accepted=num_accepted)
    if kl is not None:
        index = ck.device_index
        module.launch(kl, index, stream)


class CommitKernel:
    """The commit kernel bound to one CUDA :class:`~recoverssm_rs.StateCache`: the table on the
    device, a fixed-address row buffer and error word (graph-safe), and the core's launch builder,
    all made once.

    The methods :meth:`device_name`, :meth:`device_arg` and :meth:`staging` are the seam a test
    without a GPU overrides to run this class over host memory with the kernel emulated."""

    def __init__(self, meta: np.ndarray, *, device: Any, num_blocks: int, max_requests: int) -> None:
        import torch

        self.meta = meta
        self.meta_dev = torch.from_numpy(meta.view(np.uint8).copy()).to(device)
        self.rows_dev = torch.zeros(max(1, max_requests) * COMMIT_ROW_DTYPE.itemsize, dtype=torch.uint8, device=device)
        self.err = torch.zeros(3, dtype=torch.int32, device=device)
        self.launcher = _core.CommitLaunch(
            _table_bytes(meta),
            device=self.device_name(),
            metas=int(self.meta_dev.data_ptr()),
            num_blocks=num_blocks,
            max_requests=max_requests,
            err=int(self.err.data_ptr()),
        )
        self.device_index = int(self.launcher.device_index)
        self._rows_of_last: Any = 0  # rows of the last launch, or that launch (read when decoding)
        self.ready: bool | None = None

    def device_name(self) -> str:
        """The device the core checks every argument against."""
        return str(self.meta_dev.device)

    def device_arg(self, x: Any) -> Any:
        """A device argument as the core is to see it (the tensor itself)."""
        return x

    def staging(self, nbytes: int) -> Any:
        """Pinned host staging for an asynchronous host -> device copy (torch's caching host
        allocator keeps it alive until the copy that used it has run)."""
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def commit(
        self,
        planner: _core.CommitPlanner,
        bound: _core.BoundTensors,
        num_accepted: Any,
        state_blocks: Any,
        query_lens: Any,
        *,
        device: str,
        device_counts: bool,
        max_requests: int,
        align: dict[str, Any],
    ) -> np.ndarray:
        """A whole commit with one call into the core and one launch on the current stream: the
        core checks ``bound`` (the cache's tensors), plans (``planner``; with ``device_counts`` each
        request for its whole window, ``num_accepted`` then staying on the device, checked against
        the cache's ``device``) and packs the launch over the row buffer; the plan's rows are
        staged into it through pinned memory and the kernel is launched. Returns the plan; nothing
        is written when the core raises."""
        import torch

        if device_counts:
            counts = num_accepted
            if counts.dtype != torch.int32 or not counts.is_contiguous():
                # the core checks the caller's counts; the kernel reads their int32 copy
                counts = counts.to(dtype=torch.int32, memory_format=torch.contiguous_format)
            kw = {"device_counts": num_accepted, "launch_counts": self.device_arg(counts)}
        else:
            kw = {"num_accepted": num_accepted}
        raw, kl = self.launcher.commit(
            planner,
            bound,
            state_blocks=state_blocks,
            query_lens=query_lens,
            max_requests=max_requests,
            rows=self.device_arg(self.rows_dev),
            device=device,
            **kw,
            **align,
        )
        rows = records(raw, dtype=COMMIT_ROW_DTYPE)
        if len(rows) == 0:
            return rows
        nbytes = len(rows) * COMMIT_ROW_DTYPE.itemsize
        host = self.staging(nbytes)
        host.numpy()[:] = rows.view(np.uint8)
        self.rows_dev[:nbytes].copy_(host, non_blocking=True)
        self.err.zero_()
        self._rows_of_last = 0 if kl is None else len(rows)
        if kl is not None:
            module.launch(kl, self.device_index, None)
        return rows

    def launch(self, rows: Any, num_rows: int | None, num_accepted: Any, stream: Any) -> None:
        """Check and pack the launch (the core), then zero the error word and launch over device
        ``rows`` on ``stream`` (default: the current stream)."""
        import torch

        acc = None if num_accepted is None else self.device_arg(num_accepted)
        kl = self.launcher.launch(rows=self.device_arg(rows), num_rows=num_rows, num_accepted=acc)
        ctx = torch.cuda.stream(stream) if stream is not None and hasattr(stream, "cuda_stream") else None
        if ctx is not None:
            with ctx:
                self.err.zero_()
        else:
            self.err.zero_()
        self._rows_of_last = 0 if kl is None else kl  # its row count is read by error()
        if kl is not None:
            module.launch(kl, self.device_index, stream)

    def error(self) -> ErrorWord:
        """The decoded error word of the last launch (a synchronising read)."""
        last = self._rows_of_last
        rows = last if isinstance(last, int) else int(dict(last.values())["num_rows"])
        return ErrorWord([int(x) for x in self.err.cpu().tolist()], rows)
