"""Memory figures of RecoverSSM: record bytes per request and the full-state scratch a window
would need without records."""

from __future__ import annotations

import torch

from ...errors import PlanError
from .gates import keygate_width
from .inputs import Kind


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def record_bytes(
    kind: Kind,
    num_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    window: int,
    keygate_dtype: torch.dtype = torch.float32,
) -> int:
    """Bytes of RecoverSSM records per request and layer.

    ``H * Q * V * 4`` (float32 corrections) plus ``H * Q * (2K | K + 1) * itemsize(keygate_dtype)``.
    """
    _check_dims(num_heads=num_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim, window=window)
    corr = num_heads * window * head_v_dim * 4
    kg = num_heads * window * keygate_width(kind, head_k_dim) * itemsize(keygate_dtype)
    return corr + kg


def full_state_scratch_bytes(
    num_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    window: int,
    state_dtype: torch.dtype = torch.float32,
) -> int:
    """Bytes per request and layer of the alternative that keeps one full state per window token.

    ``Q * H * V * K * itemsize(state_dtype)`` — what :func:`record_bytes` is compared against.
    """
    _check_dims(num_heads=num_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim, window=window)
    return window * num_heads * head_v_dim * head_k_dim * itemsize(state_dtype)


def _check_dims(**dims: object) -> None:
    """Each of ``dims`` an ``int >= 0`` (not a bool), else a :class:`PlanError` naming it."""
    for name, val in dims.items():
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise PlanError(f"{name}: expected an int >= 0, got {val!r}")
