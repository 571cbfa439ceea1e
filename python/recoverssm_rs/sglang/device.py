"""The slot kernel over an SGLang pool on CUDA (``rs_slot_scatter``): one launch clears slots,
commits the accepted verify states or moves HiCache's host copies, for every layer and state
tensor, reading the engine's index vectors in device memory (docs/design.md section 10)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..cuda import ops

if TYPE_CHECKING:
    from .pool import SglangMambaPool

__all__ = ["ARG_NAMES", "SlotKernel", "host_ids", "get_cpu_copy", "load_cpu_copy"]

log = logging.getLogger("recoverssm_rs")


def host_ids(x: Any, op: str, arg: str, *, num_slots: int | None = None, unique: bool = False) -> np.ndarray:
    """``x`` (any tensor, array or list; the argument ``arg`` of ``op``) as a host int64 array, checked
    by the core (integers; with ``num_slots``, slots of the pool other than the dummy slot 0; with
    ``unique``, no slot twice). A device tensor is copied to the host as it is (never cast)."""
    device = getattr(getattr(x, "device", None), "type", None)
    if device is not None and device != "cpu" and hasattr(x, "detach"):
        x = x.detach().to("cpu")
    return np.asarray(_core.sglang_ids(op, arg, x, num_slots=num_slots, unique=unique), dtype=np.int64)


class SlotKernel:
    """The device records of one pool for one use (``commit``: with the verify scratch)."""

    def __init__(self, pool: SglangMambaPool, *, commit: bool) -> None:
        states = pool.state_tensors()
        by_state = {id(t): x for t, x in pool.verify_scratch()} if commit else {}
        scratch = [by_state.get(id(t)) for t in states]
        raw, self.num_meta, self.max_bytes = _core.sglang_slot_table(states=states, scratch=scratch)
        self.commit = commit
        self.index = pool.placement.index
        self.device = pool.device
        self.meta = ops.cuda_ops.upload(np.frombuffer(raw, dtype=np.uint8), self.index)
        first = next((s for s in scratch if s is not None), None)
        self.num_rows = 0 if first is None else int(first.shape[1])
        self.draft = 0 if first is None else int(first.shape[2])
        log.debug("sglang: %d slot records on %s (commit=%s)", self.num_meta, self.device, commit)

    def launch(self, pool: SglangMambaPool, slots: Any, **vectors: Any) -> None:
        """One guarded launch on the current stream: clear ``slots`` (no other vector) or commit
        (with ``steps`` and the optional ``rows``, ``track_slots``, ``track_steps``)."""
        torch = ops.cuda_ops.torch()
        op = "commit_after_verify" if self.commit else "clear_slots"
        args = {k: _int64(torch, pool, v, op, ARG_NAMES[k]) for k, v in vectors.items() if v is not None}
        slots = _int64(torch, pool, slots, op, "state_indices" if self.commit else "indices")
        requests = int(slots.shape[0]) if len(slots.shape) == 1 else 0
        table = dict(metas=int(self.meta.data_ptr()), num_meta=self.num_meta, max_bytes=self.max_bytes)
        sizes = dict(num_slots=pool.num_slots, num_rows=self.num_rows, draft=self.draft)
        _slot_launch(pool, requests, **table, **sizes, slots=slots, **args)


def _slot_launch(pool: SglangMambaPool, requests: int, **kwargs: Any) -> None:
    """One guarded launch of the slot kernel on the current stream (built and checked by the core),
    reporting into the pool's error word."""
    err = pool.slot_error
    err.alloc()  # allocated before the guarded call

    def write() -> None:
        kl = _core.sglang_slot_launch(device=pool.device, err=err.buf, **kwargs)
        err.reset(requests)
        if kl is not None:
            pool.launch_kernel(kl)

    pool.guarded(write)


#: The engine's names of the slot kernel's index vectors (what errors name).
ARG_NAMES = {
    "steps": "last_correct_step_indices",
    "rows": "src_indices",
    "track_slots": "track_indices",
    "track_steps": "steps_to_track",
}


def _int64(torch: Any, pool: SglangMambaPool, x: Any, op: str, arg: str) -> Any:
    """``x`` (the argument ``arg`` of ``op``) as a contiguous int64 vector on the pool's device
    (an int32 vector widened there, never read back)."""
    x = pool.on_device(x, op, arg)
    if x.dtype == torch.int32:  # widened on the device; any other dtype is the core's to refuse
        x = x.to(torch.int64)
    if len(x.shape) == 1 and x.shape[0] > 1 and x.stride()[0] != 1:
        x = x.contiguous()
    return x


def _bundle(parts: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Byte arrays laid end to end at 16-byte aligned offsets: the bytes and each part's offset."""
    offsets, total = _offsets([p.nbytes for p in parts])
    out = np.zeros(total, dtype=np.uint8)
    for p, o in zip(parts, offsets, strict=True):
        out[o : o + p.nbytes] = p.reshape(-1).view(np.uint8)
    return out, offsets


def _offsets(sizes: list[int]) -> tuple[list[int], int]:
    """The 16-byte aligned offsets of parts of ``sizes`` bytes laid end to end, and the total."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += (n + 15) // 16 * 16
    return offsets, max(at, 16)


def _stacked(pool: SglangMambaPool, n: int) -> list[tuple[Any, tuple[int, ...], int]]:
    """Per state tensor of SGLang's order (every conv tensor, then the temporal state): the tensor,
    its host copy's shape ``[layers, n, ...]`` and that copy's bytes."""
    out = []
    for t in [*pool.conv, pool.temporal]:
        shape = (int(t.shape[0]), n, *(int(x) for x in t.shape[2:]))
        out.append((t, shape, math.prod(shape) * t.element_size()))
    return out


def _run_table(
    pool: SglangMambaPool, dst: list[Any], src: list[Any], vectors: dict[str, np.ndarray], **sizes: int
) -> None:
    """One launch of the slot kernel over a table built for this call (``dst[i] <- src[i]``): the
    table and the index ``vectors`` go to the device in one upload."""
    torch = ops.cuda_ops.torch()
    raw, num_meta, max_bytes = _core.sglang_slot_table(states=dst, scratch=src)
    names = list(vectors)
    staged, offsets = _bundle([np.frombuffer(raw, dtype=np.uint8), *(vectors[k] for k in names)])
    dev = ops.cuda_ops.upload(staged, pool.placement.index)
    n = len(vectors["slots"])
    args = {k: _view(dev, o, 8 * n, torch.int64, (n,)) for k, o in zip(names, offsets[1:], strict=True)}
    _slot_launch(pool, n, metas=int(dev.data_ptr()), num_meta=num_meta, max_bytes=max_bytes, **args, **sizes)


def get_cpu_copy(pool: SglangMambaPool, ids: np.ndarray) -> tuple[list[Any], Any]:
    """HiCache's host copy on CUDA: one upload (the call's table and indices), one launch of the
    slot kernel that gathers every layer of every state tensor into one device buffer, one
    device-to-host copy of that buffer; the host tensors are views of it."""
    torch = ops.cuda_ops.torch()
    n = len(ids)
    index = pool.placement.index
    stacked = _stacked(pool, n)
    offsets, total = _offsets([b for _, _, b in stacked])
    dev_buf = ops.cuda_ops.empty_i32(total // 4, index).view(torch.uint8)  # the gather's destination
    views = [_view(dev_buf, o, b, t.dtype, s) for (t, s, b), o in zip(stacked, offsets, strict=True)]
    live = [k for k, (_, _, b) in enumerate(stacked) if b > 0]
    if n > 0 and live:
        vectors = {"slots": np.arange(n, dtype=np.int64), "steps": np.zeros(n, dtype=np.int64), "rows": ids}
        _run_table(
            pool,
            [views[k] for k in live],
            [stacked[k][0][:, :, None] for k in live],
            vectors,
            num_slots=n,
            num_rows=pool.num_slots,
            draft=1,
        )
    host = dev_buf.cpu()
    out = [_view(host, o, b, t.dtype, s) for (t, s, b), o in zip(stacked, offsets, strict=True)]
    return out[:-1], out[-1]


def load_cpu_copy(pool: SglangMambaPool, host: list[Any], ids: np.ndarray) -> None:
    """HiCache's load on CUDA: the host tensors laid end to end in one upload, then one upload of
    the call's table and indices and one launch of the slot kernel that scatters every layer of
    every state tensor into its slots."""
    torch = ops.cuda_ops.torch()
    n = len(ids)
    index = pool.placement.index
    stacked = _stacked(pool, n)
    live = [k for k, (_, _, b) in enumerate(stacked) if b > 0]
    if n == 0 or not live:
        return
    staged, offsets = _bundle([np.ascontiguousarray(h.contiguous().view(torch.uint8).numpy()) for h in host])
    dev = ops.cuda_ops.upload(staged, index)
    src = [_view(dev, offsets[k], stacked[k][2], stacked[k][0].dtype, stacked[k][1])[:, :, None] for k in live]
    vectors = {"slots": ids, "rows": np.arange(n, dtype=np.int64), "steps": np.zeros(n, dtype=np.int64)}
    _run_table(pool, [stacked[k][0] for k in live], src, vectors, num_slots=pool.num_slots, num_rows=n, draft=1)


def _view(buf: Any, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """``nbytes`` of a byte buffer from ``offset`` as a ``dtype`` tensor of ``shape``."""
    return buf[offset : offset + nbytes].view(dtype).view(*shape)
