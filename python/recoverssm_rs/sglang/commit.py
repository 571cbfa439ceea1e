"""The speculative commit after verify over an SGLang pool (:meth:`SglangMambaPool.commit_after_verify`,
docs/design.md section 10): host states, the core selects the requests that write, then one strided
copy per (state tensor, pass, request); CUDA states, one launch of the slot kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .device import ARG_NAMES, host_ids

if TYPE_CHECKING:
    from .pool import SglangMambaPool


def commit_after_verify(
    pool: SglangMambaPool,
    state_indices: Any,
    last_correct_step_indices: Any,
    track_indices: Any,
    steps_to_track: Any,
    src_indices: Any,
) -> None:
    scratch = pool.verify_scratch()
    if not scratch:
        return
    if pool.placement.is_cuda:
        # One launch of the slot kernel: every tensor, both passes; the indices stay on the device.
        pool.slot_launch(
            True,
            state_indices,
            steps=last_correct_step_indices,
            rows=src_indices,
            track_slots=track_indices,
            track_steps=steps_to_track,
        )
        return
    op = "commit_after_verify"
    steps = host_ids(last_correct_step_indices, op, "last_correct_step_indices")
    slots = host_ids(state_indices, op, "state_indices")
    # The optional vectors under the core's names (``rows`` defaults to each request's own scratch row).
    optional = dict(rows=src_indices, track_slots=track_indices, track_steps=steps_to_track)
    ids: dict[str, Any] = {k: None if x is None else host_ids(x, op, ARG_NAMES[k]) for k, x in optional.items()}
    rows = ids["rows"]
    if rows is None:
        rows = ids["rows"] = np.arange(len(steps), dtype=np.int64)
    _, depth, draft = scratch[0][1].shape[:3]
    selected = _core.sglang_commit_selection(
        slots=slots, steps=steps, **ids, num_slots=pool.num_slots, num_rows=int(depth), draft=int(draft)
    )
    track, track_steps = ids["track_slots"], ids["track_steps"]
    passes = [(slots, steps)] + ([] if track is None else [(track, track_steps)])
    chosen = [(np.asarray(take, dtype=np.int64), dst, st) for take, (dst, st) in zip(selected, passes, strict=True)]

    def write() -> None:
        # One strided copy per (tensor, pass, request): no gathered temporary.
        for state, inter in scratch:
            for take, dst, st in chosen:
                for r in take.tolist():
                    state[:, int(dst[r])].copy_(inter[:, int(rows[r]), int(st[r])])

    pool.guarded(write)
