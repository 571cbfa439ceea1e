"""Preparing a window for RecoverSSM: q/k normalisation, KDA / GDN gates, and the record width."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Concatenate, NamedTuple, ParamSpec, TypeVar

import torch
import torch.nn.functional as F

from ...errors import PlanError
from .inputs import Kind, check_device, check_shape, check_tensor, compute_dtype

P = ParamSpec("P")
R = TypeVar("R")

NORM_EPS: float = 1e-6
"""Epsilon inside the square root of the q/k L2 normalisation (vLLM's convention)."""


class Prepared(NamedTuple):
    """Normalised and gated window inputs, ready for :func:`verify` / :func:`sequential_decode`."""

    q_hat: torch.Tensor
    """Normalised, ``K**-0.5``-scaled queries ``[..., H, K]``."""
    k_hat: torch.Tensor
    """L2-normalised keys ``[..., H, K]``."""
    gate: torch.Tensor
    """Log-decay: ``[..., H, K]`` for KDA, ``[..., H]`` for GDN (decay is ``exp(gate)``)."""
    beta: torch.Tensor
    """Write strength ``sigmoid(raw_beta)``, ``[..., H]``."""


# ----------------------------------------------------------------------------------------------
# validation helpers


def normalize_qk(q: torch.Tensor, k: torch.Tensor, *, eps: float = NORM_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalise queries and keys over the last (key) dimension, in float32.

    ``k_hat = k / sqrt(sum(k^2) + eps)`` and ``q_hat = q / sqrt(sum(q^2) + eps) * K**-0.5``.
    ``q`` and ``k`` must have the same shape ``[..., K]``; the results are float32 (float64 when an
    input is float64).
    """
    check_tensor("q", q)
    check_tensor("k", k)
    if q.ndim < 1:
        raise PlanError(f"q: expected shape [..., K], got {list(q.shape)}")
    check_shape("k", k, [f"d{i}" for i in range(q.ndim - 1)] + ["K"], list(q.shape))
    check_device("k", k, q.device)
    cdt = compute_dtype(q, k)
    q32 = q.to(cdt)
    k32 = k.to(cdt)
    head_k_dim = q.shape[-1]
    k_hat = k32 * torch.rsqrt((k32 * k32).sum(-1, keepdim=True) + eps)
    q_hat = q32 * torch.rsqrt((q32 * q32).sum(-1, keepdim=True) + eps) * (head_k_dim**-0.5)
    return q_hat, k_hat


def kda_gate(raw_g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """KDA per-channel log-decay ``-exp(A_log[h]) * softplus(raw_g + dt_bias[h])``.

    ``raw_g`` is ``[..., H, K]``, ``A_log`` ``[H]`` and ``dt_bias`` ``[H, K]`` (as Kimi-K3 / the
    conformance vectors store it) or ``[H]``. Returns float32 ``[..., H, K]``; the decay is
    ``exp(gate)``.
    """
    check_tensor("raw_g", raw_g)
    check_tensor("A_log", A_log)
    check_tensor("dt_bias", dt_bias)
    if raw_g.ndim < 2:
        raise PlanError(f"raw_g: expected shape [..., H, K], got {list(raw_g.shape)}")
    num_heads, head_k_dim = raw_g.shape[-2], raw_g.shape[-1]
    check_shape("A_log", A_log, ["H"], [num_heads])
    if dt_bias.ndim == 1:
        check_shape("dt_bias", dt_bias, ["H"], [num_heads])
        bias = dt_bias[:, None]
    else:
        check_shape("dt_bias", dt_bias, ["H", "K"], [num_heads, head_k_dim])
        bias = dt_bias
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_device(name, t, raw_g.device)
    cdt = compute_dtype(raw_g, A_log, dt_bias)
    scale = torch.exp(A_log.to(cdt))[:, None]
    return -scale * F.softplus(raw_g.to(cdt) + bias.to(cdt))


def gdn_gate(raw_g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """GDN scalar log-decay per head ``-exp(A_log[h]) * softplus(raw_g + dt_bias[h])`` (Qwen3-Next).

    ``raw_g`` is ``[..., H]``, ``A_log`` and ``dt_bias`` ``[H]``. Returns float32 ``[..., H]``;
    the decay ``exp(gate)`` applies to every key column of the head.
    """
    check_tensor("raw_g", raw_g)
    check_tensor("A_log", A_log)
    check_tensor("dt_bias", dt_bias)
    if raw_g.ndim < 1:
        raise PlanError(f"raw_g: expected shape [..., H], got {list(raw_g.shape)}")
    num_heads = raw_g.shape[-1]
    check_shape("A_log", A_log, ["H"], [num_heads])
    check_shape("dt_bias", dt_bias, ["H"], [num_heads])
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_device(name, t, raw_g.device)
    cdt = compute_dtype(raw_g, A_log, dt_bias)
    return -torch.exp(A_log.to(cdt)) * F.softplus(raw_g.to(cdt) + dt_bias.to(cdt))


def prepare(
    kind: Kind,
    q: torch.Tensor,
    k: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    eps: float = NORM_EPS,
) -> Prepared:
    """Turn raw projections into ``(q_hat, k_hat, gate, beta)`` for ``kind`` ("gdn" or "kda").

    ``q``, ``k``: ``[..., H, K]``; ``raw_g``: ``[..., H, K]`` (KDA) or ``[..., H]`` (GDN);
    ``raw_beta``: ``[..., H]``; ``A_log``: ``[H]``; ``dt_bias``: ``[H, K]`` or ``[H]`` (KDA),
    ``[H]`` (GDN). All results are float32 (float64 for float64 inputs).
    """
    if kind not in ("gdn", "kda"):
        raise PlanError(f"kind: expected 'gdn' or 'kda', got {kind!r}")
    q_hat, k_hat = normalize_qk(q, k, eps=eps)
    if q.ndim < 2:
        raise PlanError(f"q: expected shape [..., H, K], got {list(q.shape)}")
    lead = list(q.shape[:-1])  # [..., H]
    lead_names = [f"d{i}" for i in range(len(lead) - 1)] + ["H"]
    check_tensor("raw_beta", raw_beta)
    check_shape("raw_beta", raw_beta, lead_names, lead)
    check_tensor("raw_g", raw_g)
    if kind == "kda":
        check_shape("raw_g", raw_g, lead_names + ["K"], list(q.shape))
        gate = kda_gate(raw_g, A_log, dt_bias)
    else:
        check_shape("raw_g", raw_g, lead_names, lead)
        gate = gdn_gate(raw_g, A_log, dt_bias)
    for name, t in (("raw_g", raw_g), ("raw_beta", raw_beta)):
        check_device(name, t, q.device)
    beta = torch.sigmoid(raw_beta.to(compute_dtype(raw_beta)))
    return Prepared(q_hat, k_hat, gate, beta)


def _of_kind(fn: Callable[Concatenate[Kind, P], R], kind: Kind, doc: str) -> Callable[P, R]:
    """``fn`` with its leading ``kind`` argument fixed: the rest of its signature is kept, for type
    checkers and for :func:`inspect.signature`."""

    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        return fn(kind, *args, **kwargs)

    sig = inspect.signature(fn)
    bound.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
    bound.__name__ = bound.__qualname__ = f"{fn.__name__}_{kind}"
    bound.__doc__ = doc
    return bound


prepare_kda = _of_kind(prepare, "kda", ":func:`prepare` for KDA: per-key-channel gate ``[..., H, K]``.")
prepare_gdn = _of_kind(prepare, "gdn", ":func:`prepare` for GDN: scalar gate per head ``[..., H]``.")


def keygate_width(kind: Kind, head_k_dim: int) -> int:
    """Last dimension of the key+gate record: ``2K`` for KDA, ``K + 1`` for GDN."""
    if kind == "kda":
        return 2 * head_k_dim
    if kind == "gdn":
        return head_k_dim + 1
    raise PlanError(f"kind: expected 'gdn' or 'kda', got {kind!r}")


# ----------------------------------------------------------------------------------------------
# verify / commit
