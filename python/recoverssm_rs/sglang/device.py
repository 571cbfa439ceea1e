"""The SGLang shell's translation helpers: the engine's index vectors as int64 vectors on the pool's
device, what a slot-kernel launch (``rs_slot_scatter``: clearing, the commit, HiCache's copies)
runs on the current stream, and HiCache's host copies. Each write is one core call: its arguments
and the pool's tensors checked, the launch built (and a HiCache call's buffer laid out and staged)
or, on host states, the bytes moved by the core, the write recorded (docs/design.md section 10)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _core
from ..cuda import ops

if TYPE_CHECKING:
    from .pool import SglangMambaPool

__all__ = ["ARG_NAMES", "host_copy", "ids_on_device", "runner"]

#: The engine's names of the slot kernel's index vectors (what errors name).
ARG_NAMES = {
    "slots": "state_indices",
    "steps": "last_correct_step_indices",
    "rows": "src_indices",
    "track_slots": "track_indices",
    "track_steps": "steps_to_track",
}


def runner(pool: SglangMambaPool, requests: int) -> Any:
    """What a guarded slot-kernel call runs: ``run(launch)`` zeroes the error word for ``requests``
    and queues the launch (``None``: nothing to launch)."""

    def run(kl: Any) -> None:
        pool.slot_error.reset(requests)
        if kl is not None:
            pool.launch_kernel(kl)

    return run


def ids_on_device(pool: SglangMambaPool, x: Any, op: str, arg: str, bits: int = 64) -> Any:
    """``x`` (the argument ``arg`` of ``op``) as a contiguous vector of ``bits``-bit ids on the
    pool's device: a CUDA tensor of the other of int32 and int64 converted there, never read back
    (the copy kernel reads int32 slot ids, the slot kernel int64; any other dtype is the core's to
    refuse), anything else read as host ids (``_core.sglang_ids``) and copied there."""
    torch = ops.cuda_ops.torch()
    if getattr(getattr(x, "device", None), "type", None) != "cuda":
        x = ops.cuda_ops.ids_i64(_core.sglang_ids(op, arg, x), pool.placement.index)
    if bits == 32 and x.dtype == torch.int64:
        return ops.cuda_ops.as_i32(x)  # saturating: an id beyond int32 stays out of range
    if bits == 64 and x.dtype == torch.int32:
        x = x.to(torch.int64)
    if len(x.shape) == 1 and x.shape[0] > 1 and x.stride()[0] != 1:
        x = x.contiguous()
    return x


def host_copy(pool: SglangMambaPool, op: str, indices: Any, mamba_cache_cpu: Any = None) -> Any:
    """HiCache's host copy, ``op`` of the slots ``indices`` (``load_cpu_copy``: of the host copies
    ``mamba_cache_cpu``), one core call that checks them and moves the bytes. A get's states come
    back in one buffer that the core lays out, and the host tensors (returned as ``(conv_cpu,
    temporal_cpu)``) are views of it. On CUDA the core stages the call (the blocks, slot table and
    indices: one host-to-device copy) for one launch of the slot kernel; a get's blocks then come
    back in one device-to-host copy."""
    torch, index = ops.cuda_ops.torch(), pool.placement.index

    def stage(buf: Any, staged: bytes, at: int, kl: Any, requests: int) -> None:  # on the launch's stream
        if staged:
            with ops.cuda_ops.context(index, None):
                ops.cuda_ops.stage_i32(staged, buf[at:])
        runner(pool, requests)(kl)

    if pool.placement.is_cuda:
        device = dict(alloc=lambda n: ops.cuda_ops.empty_i32(n, index), run=stage, err=pool.slot_error.alloc())
    else:
        device = dict(alloc=lambda n: torch.empty(n, dtype=torch.int32))
    done = pool.tensors.host_copy(op, indices, mamba_cache_cpu=mamba_cache_cpu, **device)
    if done is None:
        return None
    buf, blocks = done
    raw = buf[: (blocks[-1][0] + blocks[-1][1] + 3) // 4].cpu().view(torch.uint8)
    # Each block as the core bound its state (dtype, shape), not as the Python tensor reads now.
    out = [raw[o : o + b].view(getattr(torch, d)).view(*s) for o, b, s, d in blocks]
    return out[:-1], out[-1]
