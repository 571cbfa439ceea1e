"""The slot kernel over an SGLang pool on CUDA (``rs_slot_scatter``): one launch clears slots or
commits the accepted verify states (commit and track passes together) for every layer and state
tensor, reading the engine's index vectors in device memory -- no host synchronisation, no
temporary beyond the indices narrowed to int64. The core builds and checks the records (one per
layer of each state tensor, uploaded once) and each launch; the kernel checks each index and
reports a rejected request in the pool's error word (:meth:`SglangMambaPool.last_error`)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._core import ErrorWord
from ..cuda import module, ops

if TYPE_CHECKING:
    from .pool import SglangMambaPool

__all__ = ["SlotKernel"]

log = logging.getLogger("recoverssm_rs")


class SlotKernel:
    """The device records of one pool for one use (``commit``: with the verify scratch) and the
    pool's error word."""

    def __init__(self, pool: SglangMambaPool, *, commit: bool, err: Any) -> None:
        states = pool._tensors()
        scratch: list[Any] = [None] * len(states)
        if commit:
            live = [i for i, c in enumerate(pool.conv) if math.prod(c.shape) > 0]
            windows = pool.intermediate_conv_window or []
            scratch = [windows[i] for i in live]
            if len(scratch) < len(states):
                scratch.append(pool.intermediate_ssm)
        raw, self.num_meta, self.max_bytes = _core.sglang_slot_table(states=states, scratch=scratch)
        self.index = int(pool.device.split(":")[1])
        self.device = pool.device
        self.meta = ops.cuda_ops.upload(np.frombuffer(raw, dtype=np.uint8), self.index)
        self.err = err
        first = next((s for s in scratch if s is not None), None)
        self.num_rows = 0 if first is None else int(first.shape[1])
        self.draft = 0 if first is None else int(first.shape[2])
        log.debug("sglang: %d slot records on %s (commit=%s)", self.num_meta, self.device, commit)

    def launch(self, pool: SglangMambaPool, slots: Any, **vectors: Any) -> int:
        """One launch on the current stream: clear ``slots`` (no other vector) or commit (with
        ``steps`` and the optional ``rows``, ``track_slots``, ``track_steps``). Returns the number of
        requests (for the error word)."""
        torch = ops.cuda_ops.torch()
        args = {k: _int64(torch, pool, v) for k, v in vectors.items() if v is not None}
        slots = _int64(torch, pool, slots)
        kl = _core.sglang_slot_launch(
            device=self.device,
            metas=int(self.meta.data_ptr()),
            num_meta=self.num_meta,
            max_bytes=self.max_bytes,
            num_slots=pool.num_slots,
            num_rows=self.num_rows,
            draft=self.draft,
            slots=slots,
            err=self.err,
            **args,
        )
        pool.planner.core.check()
        self.err.zero_()
        if kl is not None:
            module.launch(kl, self.index, None)
        pool.planner.core.mark_written()
        return int(slots.shape[0]) if len(slots.shape) == 1 else 0


def _int64(torch: Any, pool: SglangMambaPool, x: Any) -> Any:
    """``x`` as a contiguous int64 vector on the pool's device (converted there, never read back)."""
    x = pool._on_device(x)
    if x.dtype != torch.int64:
        x = x.to(torch.int64)
    if len(x.shape) == 1 and x.shape[0] > 1 and x.stride()[0] != 1:
        x = x.contiguous()
    return x


def last_error(err: Any, index: int, requests: int) -> ErrorWord:
    """The decoded error word (synchronises the device)."""
    ops.cuda_ops.synchronize(index)
    return ErrorWord([int(x) for x in err.cpu().tolist()], requests)
