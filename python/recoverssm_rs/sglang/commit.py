"""The speculative commit after verify over an SGLang pool (:meth:`SglangMambaPool.commit_after_verify`,
docs/design.md section 10): host states, the core checks every index and returns the moves, then
one strided copy per (state tensor, move); CUDA states, one launch of the slot kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _core
from .device import ARG_NAMES, host_ids

if TYPE_CHECKING:
    from .pool import SglangMambaPool


def commit_after_verify(pool: SglangMambaPool, slots: Any, steps: Any, **optional: Any) -> None:
    """``optional``: the core's ``rows``, ``track_slots``, ``track_steps`` (``None``: not given)."""
    scratch = pool.verify_scratch()
    if not scratch:
        return
    if pool.placement.is_cuda:  # one launch: every tensor, both passes; the indices stay on the device
        pool.slot_launch(True, slots, steps=steps, **optional)
        return
    given, op = dict(steps=steps, slots=slots, **optional), "commit_after_verify"
    ids = {
        k: host_ids(x, op, ARG_NAMES[k]) if x is not None or k in ("steps", "slots") else None for k, x in given.items()
    }
    _, depth, draft = scratch[0][1].shape[:3]
    moves = _core.sglang_commit_selection(**ids, num_slots=pool.num_slots, num_rows=int(depth), draft=int(draft))

    def write() -> None:
        # One strided copy per (tensor, move), commit pass then track pass: no gathered temporary.
        for state, inter in scratch:
            for slot, row, step in moves:
                state[:, slot].copy_(inter[:, row, step])

    pool.guarded(write)
