"""vLLM's align-mode half-step decisions, taken by the core with its checks (docs/design.md
section 3): :func:`align_pre_copy` (vLLM's ``preprocess_mamba``), :func:`align_post_process` (its
``postprocess_mamba_fused_kernel``) and :func:`plan` (a decision and its copies over every group, one
call into the core). A half-step's per-request vectors are one :class:`PreCopyInputs` /
:class:`PostProcessInputs`; a decision holds int64 arrays, one entry per request row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar, overload

import numpy as np

from .. import _core
from ..errors import PlanError, _reading
from ..planner import CopyPlan, Planner

__all__ = [
    "PreCopyDecision",
    "PostProcessDecision",
    "PreCopyInputs",
    "PostProcessInputs",
    "align_pre_copy",
    "align_post_process",
    "plan",
]


class PreCopyDecision(NamedTuple):
    """vLLM's pre-copy decision per request (int64 arrays, one entry per request)."""

    prev: np.ndarray
    """Column the running state is read from (``-1``: a fresh state)."""
    curr: np.ndarray
    """The new running column ``(computed + scheduled - 1) // block_size``: vLLM's
    ``mamba_state_idx`` for the request; store it."""
    src_col: np.ndarray
    """``prev`` where the state moves, else ``-1``."""
    bias: np.ndarray
    """Accepted-token offset of the move (``num_accepted - 1``), 0 where nothing moves."""
    num_accepted: np.ndarray
    """``num_accepted`` after the reset (1 where the state moved)."""


class PostProcessDecision(NamedTuple):
    """vLLM's post-process decision per request (int64 arrays)."""

    running: np.ndarray
    """Tokens the running state covers (``computed + scheduled - drafts``)."""
    aligned: np.ndarray
    """Tokens after acceptance, rounded down to a block boundary."""
    dest: np.ndarray
    """Column that must hold the state after ``aligned`` tokens."""
    bias: np.ndarray
    """Offset of that state from the running state (``aligned - running``)."""
    src_col: np.ndarray
    """The running column where a save copies anything, else ``-1``."""
    num_accepted: np.ndarray
    """``num_accepted`` for the next step (1 where the state was shifted in place)."""


class PreCopyInputs(NamedTuple):
    """A pre-copy's per-request inputs (``[R]`` vectors), under the core's keywords (vLLM's names)."""

    tables: Sequence[Any]
    """One ``[>= R, cols]`` integer block table per group (null block 0)."""
    num_computed: Any
    """Tokens computed before this step."""
    num_scheduled: Any
    """Tokens scheduled this step, drafts included."""
    num_accepted: Any
    """The previous step's accepted count (bonus included)."""
    mamba_state_idx: Any
    """The stored running column (vLLM's ``mamba_state_idx``), ``-1`` where none is stored."""
    fresh: Any = None
    """Optional mask of rows new or resumed this step."""
    req_ids: Sequence[Any] | None = None
    """Optional request names for error messages."""


class PostProcessInputs(NamedTuple):
    """A post-process's per-request inputs (``[R]`` vectors), under the core's keywords."""

    tables: Sequence[Any]
    """One ``[>= R, cols]`` integer block table per group (null block 0)."""
    state_col: Any
    """This step's running column (the pre-copy's ``curr``)."""
    num_computed: Any
    """Tokens computed before this step."""
    num_scheduled: Any
    """Tokens scheduled this step, drafts included."""
    num_draft: Any
    """Draft tokens scheduled this step."""
    num_accepted: Any
    """This step's accepted count (bonus included)."""
    req_ids: Sequence[Any] | None = None
    """Optional request names for error messages."""


D = TypeVar("D", PreCopyDecision, PostProcessDecision)


def decision(raw: Any, cls: type[D]) -> D:
    """The decision ``cls`` from the core's int64 rows (zero-copy views)."""
    rows = np.frombuffer(raw, dtype=np.int64).reshape(len(cls._fields), -1)
    return cls(*rows)


def fields(step: PreCopyInputs | PostProcessInputs) -> dict[str, Any]:
    """``step``'s vectors under the core's keywords; anything but a half-step's inputs is a
    :class:`~recoverssm_rs.PlanError` naming ``step``."""
    with _reading("step", PlanError):
        return step._asdict()


@overload
def plan(planner: Planner, step: PreCopyInputs, host_only: str | None = None) -> tuple[PreCopyDecision, CopyPlan]: ...
@overload
def plan(
    planner: Planner, step: PostProcessInputs, host_only: str | None = None
) -> tuple[PostProcessDecision, CopyPlan]: ...
def plan(
    planner: Planner, step: PreCopyInputs | PostProcessInputs, host_only: str | None = None
) -> tuple[Any, CopyPlan]:
    """The decision for ``step`` (the half by its kind) and its copies over every group of
    ``planner``, in one call into the core; run them with :meth:`CopyPlan.execute
    <recoverssm_rs.CopyPlan.execute>`. ``host_only``: the caller's name for a host-path call, a
    :class:`~recoverssm_rs.PlanError` on CUDA states."""
    pre = isinstance(step, PreCopyInputs)
    half = _core.vllm_pre_copy if pre else _core.vllm_post_process
    raw, copies = half(planner.core, host_only=host_only, **fields(step))
    d = decision(raw, PreCopyDecision) if pre else decision(raw, PostProcessDecision)
    return d, CopyPlan(copies, planner)


def align_pre_copy(step: PreCopyInputs, *, block_size: int, num_spec_blocks: int) -> PreCopyDecision:
    """vLLM's align-mode pre-copy decision, without copies (docs/design.md sections 3.1 and 3.8):
    the state moves ``prev -> curr`` with offset ``num_accepted - 1`` iff ``prev != -1 and prev !=
    curr``, and then the accepted count resets to 1.

    Raises:
        PlanError: naming the request (a bad vector, length or count, a stale column, a
            prefix-cache hit without state, a column outside a row or on the null block).
    """
    raw = _core.align_pre_copy(**fields(step), block_size=block_size, num_spec_blocks=num_spec_blocks)
    return decision(raw, PreCopyDecision)


def align_post_process(step: PostProcessInputs, *, block_size: int, num_spec_blocks: int) -> PostProcessDecision:
    """vLLM's align-mode post-process decision, without copies (docs/design.md section 3.6): the
    state after ``aligned`` tokens is saved at ``dest``; an in-place shift resets the count to 1.

    Raises:
        PlanError: naming the request: ``state_col`` not this step's running column, drafts or
            accepted counts out of range, a saved state's columns outside a row or null.
    """
    raw = _core.align_post_process(**fields(step), block_size=block_size, num_spec_blocks=num_spec_blocks)
    return decision(raw, PostProcessDecision)
