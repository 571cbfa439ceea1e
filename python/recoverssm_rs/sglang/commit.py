"""The speculative commit after verify over an SGLang pool (see
:meth:`SglangMambaPool.commit_after_verify`): one gather-scatter per state tensor, every index
checked before the first byte moves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import PlanError
from .pool import _host_ids

if TYPE_CHECKING:
    from .pool import SglangMambaPool


def _selection(name: str, dst: Any, steps: Any, rows: Any, num_slots: int, num_rows: int, draft: int) -> Any:
    """The requests that write (step and slot not negative), after checking their indices."""
    import numpy as np

    if not (len(dst) == len(steps) == len(rows)):
        raise PlanError(
            f"{name}: slots, steps and rows must have one length; got {len(dst)}, {len(steps)}, {len(rows)}"
        )
    take = np.flatnonzero((steps >= 0) & (dst >= 0))
    for r in take:
        if steps[r] >= draft:
            raise PlanError(f"{name}: request {r}: step {steps[r]} is past the draft (0..{draft - 1})")
        if dst[r] >= num_slots:
            raise PlanError(f"{name}: request {r}: slot {dst[r]} is outside 0..{num_slots - 1}")
        if not 0 <= rows[r] < num_rows:
            raise PlanError(f"{name}: request {r}: scratch row {rows[r]} is outside 0..{num_rows - 1}")
    if len(np.unique(dst[take])) != len(take):
        raise PlanError(f"{name}: two requests write one slot: {sorted(dst[take].tolist())}")
    return take


def commit_after_verify(
    pool: SglangMambaPool,
    state_indices: Any,
    last_correct_step_indices: Any,
    track_indices: Any,
    steps_to_track: Any,
    src_indices: Any,
) -> None:
    import numpy as np
    import torch

    scratch = []
    if pool.temporal is not None and pool.temporal.numel() > 0:
        if pool.intermediate_ssm is None:
            raise PlanError("commit_after_verify: the pool has no intermediate_ssm (not a speculative pool)")
        scratch.append((pool.temporal, pool.intermediate_ssm))
    windows = pool.intermediate_conv_window
    live = [i for i, c in enumerate(pool.conv) if c.numel() > 0]
    if live and (windows is None or len(windows) != len(pool.conv)):
        raise PlanError("commit_after_verify: the pool has no intermediate_conv_window per conv tensor")
    scratch += [(pool.conv[i], windows[i]) for i in live]  # type: ignore[index]
    if not scratch:
        return
    steps = _host_ids(last_correct_step_indices)
    rows = np.arange(len(steps), dtype=np.int64) if src_indices is None else _host_ids(src_indices)
    passes = [("commit", _host_ids(state_indices), steps)]
    if track_indices is not None:
        if steps_to_track is None:
            raise PlanError("commit_after_verify: track_indices given without steps_to_track")
        passes.append(("track", _host_ids(track_indices), _host_ids(steps_to_track)))
    num_rows, draft = int(scratch[0][1].shape[1]), int(scratch[0][1].shape[2])
    chosen = [(_selection(name, dst, st, rows, pool.num_slots, num_rows, draft), dst, st) for name, dst, st in passes]
    device = scratch[0][0].device
    for state, inter in scratch:
        for take, dst, st in chosen:
            if len(take) == 0:
                continue
            r = torch.as_tensor(rows[take], device=device)
            s = torch.as_tensor(st[take], device=device)
            state.index_copy_(1, torch.as_tensor(dst[take], device=device), inter[:, r, s])
