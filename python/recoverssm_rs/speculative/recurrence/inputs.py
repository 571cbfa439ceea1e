"""Input checks and small shared helpers of the RecoverSSM torch reference."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Literal

import torch

from ...errors import PlanError

Kind = Literal["gdn", "kda"]
ConvLayout = Literal["DS", "SD"]
"""Recurrence flavour: ``"gdn"`` (scalar gate per head) or ``"kda"`` (gate per key channel)."""

Counts = torch.Tensor | Sequence[int] | int
"""Per-request token counts: an int (same for every request), a sequence or an integer tensor ``[B]``."""


def fmt_shape(names: Sequence[str], dims: Sequence[int | None]) -> str:
    inner = ", ".join(n if d is None else f"{n}={d}" for n, d in zip(names, dims))
    return f"[{inner}]"


def check_tensor(name: str, t: object, *, floating: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise PlanError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if floating and not t.is_floating_point():
        raise PlanError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    return t


def check_shape(name: str, t: torch.Tensor, names: Sequence[str], dims: Sequence[int | None]) -> None:
    """Raise PlanError unless ``t.shape`` matches ``dims`` (``None`` = any size)."""
    shape = tuple(t.shape)
    ok = len(shape) == len(dims) and all(d is None or s == d for s, d in zip(shape, dims))
    if not ok:
        raise PlanError(f"{name}: expected shape {fmt_shape(names, dims)}, got {list(shape)}")


def check_state(name: str, state: object) -> tuple[int, int, int, int]:
    """``(B, H, V, K)`` of a floating ``[B, H, V, K]`` state tensor (else :class:`PlanError`)."""
    t = check_tensor(name, state)
    check_shape(name, t, ["B", "H", "V", "K"], [None] * 4)
    B, H, V, K = t.shape
    return B, H, V, K


def check_sized(name: str, t: object, names: Sequence[str], dims: Sequence[int | None]) -> int:
    """The one size ``dims`` leaves open (``None``) of a floating tensor whose other sizes must be
    ``dims`` (else :class:`PlanError`, naming the open size only when the rank is wrong)."""
    x = check_tensor(name, t)
    if x.ndim != len(dims):
        check_shape(name, x, names, dims)
    axis = list(dims).index(None)
    size = int(x.shape[axis])
    check_shape(name, x, names, [size if i == axis else d for i, d in enumerate(dims)])
    return size


def check_window(state: torch.Tensor, window: Sequence[torch.Tensor]) -> tuple[Kind, int, int, int, int, int]:
    """Validate a window's inputs ``(q_hat, k_hat, v, gate, beta)`` against ``state`` ``[B, H, V,
    K]`` (shapes and devices, as :func:`~recoverssm_rs.speculative.recurrence.verify` documents);
    returns ``(kind, B, H, V, K, Q)``, the kind taken from the rank of ``gate``."""
    q_hat, k_hat, v, gate, beta = window
    B, H, V, K = check_state("state", state)
    Q = check_sized("q_hat", q_hat, ["B", "Q", "H", "K"], [B, None, H, K])
    check_shape("k_hat", check_tensor("k_hat", k_hat), ["B", "Q", "H", "K"], [B, Q, H, K])
    check_shape("v", check_tensor("v", v), ["B", "Q", "H", "V"], [B, Q, H, V])
    check_shape("beta", check_tensor("beta", beta), ["B", "Q", "H"], [B, Q, H])
    check_tensor("gate", gate)
    kind: Kind
    if gate.ndim == 4:
        kind = "kda"
        check_shape("gate", gate, ["B", "Q", "H", "K"], [B, Q, H, K])
    elif gate.ndim == 3:
        kind = "gdn"
        check_shape("gate", gate, ["B", "Q", "H"], [B, Q, H])
    else:
        raise PlanError(
            f"gate: expected shape {fmt_shape(['B', 'Q', 'H', 'K'], [B, Q, H, K])} (KDA) or "
            f"{fmt_shape(['B', 'Q', 'H'], [B, Q, H])} (GDN), got {list(gate.shape)}"
        )
    for name, x in zip(("q_hat", "k_hat", "v", "gate", "beta"), window, strict=True):
        check_device(name, x, state.device)
    return kind, B, H, V, K, Q


def check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise PlanError(f"{name}: expected a tensor on {device}, got one on {t.device}")


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any of ``tensors`` is float64, else float32 (never lower)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _count(x: Any) -> int:
    """One count of a list: an integer (a bool or a float is refused with a ``TypeError``)."""
    if isinstance(x, bool):
        raise TypeError("a bool is not a count")
    return operator.index(x)


def raw_counts(name: str, counts: Counts, batch: int, device: torch.device) -> torch.Tensor:
    """Per-request counts as an int64 tensor ``[B]`` on ``device`` (not clamped)."""
    if isinstance(counts, bool):
        raise PlanError(f"{name}: expected an int, a sequence of ints or an integer tensor, got bool")
    if isinstance(counts, torch.Tensor):
        c = counts
    else:
        try:
            # operator.index: integers only (a float is refused, never truncated).
            if isinstance(counts, int):
                return torch.full((batch,), counts, dtype=torch.int64, device=device)
            c = torch.as_tensor([_count(x) for x in counts], dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise PlanError(f"{name}: expected an int, a sequence of ints or an integer tensor ({exc})") from None
    if c.dtype == torch.bool or c.is_floating_point() or c.is_complex():
        raise PlanError(f"{name}: expected an integer tensor, got dtype {c.dtype}")
    if c.device.type == "meta":
        raise PlanError(f"{name}: a tensor on the meta device holds no counts; pass them on {device} or the host")
    if c.ndim == 0:
        c = c.reshape(1).expand(batch)
    check_shape(name, c, ["B"], [batch])
    return c.to(device=device, dtype=torch.int64)


def window_counts(name: str, counts: Counts, batch: int, window: int, device: torch.device) -> torch.Tensor:
    """Per-request counts as an int64 tensor ``[B]`` on ``device``, clamped to ``[0, window]``."""
    return raw_counts(name, counts, batch, device).clamp(0, window)


def infer_kind_from_width(width: int, head_k_dim: int) -> Kind | None:
    # With K == 1 both layouts are [k_hat, gate] and the recurrences coincide: call it KDA.
    if width == 2 * head_k_dim:
        return "kda"
    if width == head_k_dim + 1:
        return "gdn"
    return None


# ----------------------------------------------------------------------------------------------
# prepare: normalisation and gates


def decay_view(decay: torch.Tensor, kind: Kind) -> torch.Tensor:
    """Decay ``[B, H, K]`` (KDA) or ``[B, H]`` (GDN) shaped to broadcast over a state ``[B, H, V, K]``."""
    return decay.unsqueeze(-2) if kind == "kda" else decay[..., None, None]


def check_records(state: torch.Tensor, corrections: torch.Tensor, keygate: torch.Tensor) -> tuple[Kind, int]:
    """Validate ``state`` / records; return the kind (from the key+gate width) and ``Q``."""
    B, H, V, K = check_state("state", state)
    Q = check_sized("corrections", corrections, ["B", "H", "Q", "V"], [B, H, None, V])
    check_sized("keygate", keygate, ["B", "H", "Q", "2K|K+1"], [B, H, Q, None])
    kind = infer_kind_from_width(keygate.shape[-1], K)
    if kind is None:
        raise PlanError(
            f"keygate: expected shape [B={B}, H={H}, Q={Q}, 2K={2 * K}] (KDA) or "
            f"[B={B}, H={H}, Q={Q}, K+1={K + 1}] (GDN), got {list(keygate.shape)}"
        )
    check_device("corrections", corrections, state.device)
    check_device("keygate", keygate, state.device)
    return kind, Q


def check_out(name: str, out: torch.Tensor, state: torch.Tensor) -> None:
    check_tensor(name, out)
    check_shape(name, out, ["B", "H", "V", "K"], list(state.shape))
    check_device(name, out, state.device)
