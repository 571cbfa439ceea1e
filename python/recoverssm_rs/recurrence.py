"""Torch reference of GDN / KDA RecoverSSM: prepare, verify, commit and conv-window compaction.

This module is the ground truth that the package's state cache, its CUDA commit kernel and its demo
are checked against, and the execution path used on CPU tensors. Every function works on tensors of
any device (CPU or CUDA), is vectorised over requests and heads (the only Python loop runs over the
short token window ``Q``) and accumulates in float32 (float64 when the state itself is float64).

Shapes (``B`` requests, ``Q`` window tokens, ``H`` heads, ``K`` key dim, ``V`` value dim):

* persistent recurrent state ``state``: ``[B, H, V, K]`` (V-major, as vLLM stores it);
* window inputs (token-major, as a model produces them): ``q_hat``, ``k_hat`` ``[B, Q, H, K]``,
  ``v`` ``[B, Q, H, V]``, ``beta`` ``[B, Q, H]``, log-decay ``gate`` ``[B, Q, H, K]`` for KDA or
  ``[B, Q, H]`` for GDN (a scalar per head). GQA-style key heads must be expanded to the ``H``
  value heads by the caller;
* workspace records of one layer: ``corrections`` ``[B, H, Q, V]`` (float32) and ``keygate``
  ``[B, H, Q, K + 1]`` for GDN or ``[B, H, Q, 2K]`` for KDA: ``k_hat`` in ``[..., :K]``, the
  log-decay gate in ``[..., K:]``. ``keygate`` may be in the model dtype (e.g. bfloat16).

One step of one head, state ``S`` ``[V, K]``::

    S   = S * exp(gate)[None, :]          # GDN: a scalar decay
    u   = beta * (v - S @ k_hat)          # correction, from the *decayed* state
    S   = S + outer(u, k_hat)
    out = S @ q_hat

Commit of ``n`` accepted tokens folds the first ``n`` records into the state,
``S_n = S_0 (.) A_{1..n} + sum_{t<=n} (u_t k_t^T) (.) A_{t+1..n}``, with a forward pass over the
records only (the window inputs are never re-run). :func:`verify` rounds ``k_hat`` and the gate
through the record dtype before using them, so a commit reproduces exactly the trajectory that the
verify outputs were computed on, whatever the record dtype.

Matrix-vector products are written as elementwise products and sums (never ``matmul``), so a
process-wide TF32 setting on CUDA cannot degrade this reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, Union

import torch
import torch.nn.functional as F

from .errors import PlanError

__all__ = [
    "Kind",
    "Prepared",
    "NORM_EPS",
    "normalize_qk",
    "kda_gate",
    "gdn_gate",
    "prepare",
    "prepare_kda",
    "prepare_gdn",
    "keygate_width",
    "verify",
    "commit",
    "state_at",
    "sequential_decode",
    "compact_conv_window",
    "record_bytes",
    "full_state_scratch_bytes",
]

Kind = Literal["gdn", "kda"]
ConvLayout = Literal["DS", "SD"]
"""Recurrence flavour: ``"gdn"`` (scalar gate per head) or ``"kda"`` (gate per key channel)."""

Counts = Union[torch.Tensor, Sequence[int], int]
"""Per-request token counts: an int (same for every request), a sequence or an integer tensor ``[B]``."""

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


def _fmt_shape(names: Sequence[str], dims: Sequence[int | None]) -> str:
    inner = ", ".join(n if d is None else f"{n}={d}" for n, d in zip(names, dims))
    return f"[{inner}]"


def _check_tensor(name: str, t: object, *, floating: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise PlanError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if floating and not t.is_floating_point():
        raise PlanError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    return t


def _check_shape(
    name: str, t: torch.Tensor, names: Sequence[str], dims: Sequence[int | None]
) -> None:
    """Raise PlanError unless ``t.shape`` matches ``dims`` (``None`` = any size)."""
    shape = tuple(t.shape)
    ok = len(shape) == len(dims) and all(d is None or s == d for s, d in zip(shape, dims))
    if not ok:
        raise PlanError(
            f"{name}: expected shape {_fmt_shape(names, dims)}, got {list(shape)}"
        )


def _check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise PlanError(f"{name}: expected a tensor on {device}, got one on {t.device}")


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any of ``tensors`` is float64, else float32 (never lower)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _counts_raw(name: str, counts: Counts, batch: int, device: torch.device) -> torch.Tensor:
    """Per-request counts as an int64 tensor ``[B]`` on ``device`` (not clamped)."""
    if isinstance(counts, bool):
        raise PlanError(f"{name}: expected an int, a sequence of ints or an integer tensor, got bool")
    if isinstance(counts, int):
        return torch.full((batch,), counts, dtype=torch.int64, device=device)
    if isinstance(counts, torch.Tensor):
        c = counts
    else:
        try:
            c = torch.as_tensor([int(x) for x in counts], dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise PlanError(
                f"{name}: expected an int, a sequence of ints or an integer tensor ({exc})"
            ) from None
    if c.dtype == torch.bool or c.is_floating_point() or c.is_complex():
        raise PlanError(f"{name}: expected an integer tensor, got dtype {c.dtype}")
    if c.ndim == 0:
        c = c.reshape(1).expand(batch)
    _check_shape(name, c, ["B"], [batch])
    return c.to(device=device, dtype=torch.int64)


def _counts(name: str, counts: Counts, batch: int, window: int, device: torch.device) -> torch.Tensor:
    """Per-request counts as an int64 tensor ``[B]`` on ``device``, clamped to ``[0, window]``."""
    return _counts_raw(name, counts, batch, device).clamp(0, window)


def _infer_kind_from_width(width: int, head_k_dim: int) -> Kind | None:
    # With K == 1 both layouts are [k_hat, gate] and the recurrences coincide: call it KDA.
    if width == 2 * head_k_dim:
        return "kda"
    if width == head_k_dim + 1:
        return "gdn"
    return None


# ----------------------------------------------------------------------------------------------
# prepare: normalisation and gates


def normalize_qk(
    q: torch.Tensor, k: torch.Tensor, *, eps: float = NORM_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalise queries and keys over the last (key) dimension, in float32.

    ``k_hat = k / sqrt(sum(k^2) + eps)`` and ``q_hat = q / sqrt(sum(q^2) + eps) * K**-0.5``.
    ``q`` and ``k`` must have the same shape ``[..., K]``; the results are float32 (float64 when an
    input is float64).
    """
    _check_tensor("q", q)
    _check_tensor("k", k)
    if q.ndim < 1:
        raise PlanError(f"q: expected shape [..., K], got {list(q.shape)}")
    _check_shape("k", k, [f"d{i}" for i in range(q.ndim - 1)] + ["K"], list(q.shape))
    _check_device("k", k, q.device)
    cdt = _compute_dtype(q, k)
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
    _check_tensor("raw_g", raw_g)
    _check_tensor("A_log", A_log)
    _check_tensor("dt_bias", dt_bias)
    if raw_g.ndim < 2:
        raise PlanError(f"raw_g: expected shape [..., H, K], got {list(raw_g.shape)}")
    num_heads, head_k_dim = raw_g.shape[-2], raw_g.shape[-1]
    _check_shape("A_log", A_log, ["H"], [num_heads])
    if dt_bias.ndim == 1:
        _check_shape("dt_bias", dt_bias, ["H"], [num_heads])
        bias = dt_bias[:, None]
    else:
        _check_shape("dt_bias", dt_bias, ["H", "K"], [num_heads, head_k_dim])
        bias = dt_bias
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        _check_device(name, t, raw_g.device)
    cdt = _compute_dtype(raw_g, A_log, dt_bias)
    scale = torch.exp(A_log.to(cdt))[:, None]
    return -scale * F.softplus(raw_g.to(cdt) + bias.to(cdt))


def gdn_gate(raw_g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """GDN scalar log-decay per head ``-exp(A_log[h]) * softplus(raw_g + dt_bias[h])`` (Qwen3-Next).

    ``raw_g`` is ``[..., H]``, ``A_log`` and ``dt_bias`` ``[H]``. Returns float32 ``[..., H]``;
    the decay ``exp(gate)`` applies to every key column of the head.
    """
    _check_tensor("raw_g", raw_g)
    _check_tensor("A_log", A_log)
    _check_tensor("dt_bias", dt_bias)
    if raw_g.ndim < 1:
        raise PlanError(f"raw_g: expected shape [..., H], got {list(raw_g.shape)}")
    num_heads = raw_g.shape[-1]
    _check_shape("A_log", A_log, ["H"], [num_heads])
    _check_shape("dt_bias", dt_bias, ["H"], [num_heads])
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        _check_device(name, t, raw_g.device)
    cdt = _compute_dtype(raw_g, A_log, dt_bias)
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
    _check_tensor("raw_beta", raw_beta)
    _check_shape("raw_beta", raw_beta, lead_names, lead)
    _check_tensor("raw_g", raw_g)
    if kind == "kda":
        _check_shape("raw_g", raw_g, lead_names + ["K"], list(q.shape))
        gate = kda_gate(raw_g, A_log, dt_bias)
    else:
        _check_shape("raw_g", raw_g, lead_names, lead)
        gate = gdn_gate(raw_g, A_log, dt_bias)
    for name, t in (("raw_g", raw_g), ("raw_beta", raw_beta)):
        _check_device(name, t, q.device)
    beta = torch.sigmoid(raw_beta.to(_compute_dtype(raw_beta)))
    return Prepared(q_hat, k_hat, gate, beta)


def prepare_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    eps: float = NORM_EPS,
) -> Prepared:
    """:func:`prepare` for KDA: per-key-channel gate ``[..., H, K]``."""
    return prepare("kda", q, k, raw_g, raw_beta, A_log, dt_bias, eps=eps)


def prepare_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    eps: float = NORM_EPS,
) -> Prepared:
    """:func:`prepare` for GDN: scalar gate per head ``[..., H]``."""
    return prepare("gdn", q, k, raw_g, raw_beta, A_log, dt_bias, eps=eps)


def keygate_width(kind: Kind, head_k_dim: int) -> int:
    """Last dimension of the key+gate record: ``2K`` for KDA, ``K + 1`` for GDN."""
    if kind == "kda":
        return 2 * head_k_dim
    if kind == "gdn":
        return head_k_dim + 1
    raise PlanError(f"kind: expected 'gdn' or 'kda', got {kind!r}")


# ----------------------------------------------------------------------------------------------
# verify / commit


def _decay_view(decay: torch.Tensor, kind: Kind) -> torch.Tensor:
    """Decay ``[B, H, K]`` (KDA) or ``[B, H]`` (GDN) shaped to broadcast over a state ``[B, H, V, K]``."""
    return decay.unsqueeze(-2) if kind == "kda" else decay[..., None, None]


def verify(
    state: torch.Tensor,
    q_hat: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor,
    beta: torch.Tensor,
    corrections_out: torch.Tensor,
    keygate_out: torch.Tensor,
    *,
    query_lens: Counts | None = None,
) -> torch.Tensor:
    """Run a window of ``Q`` tokens from ``state`` without modifying it; write the records.

    ``state`` ``[B, H, V, K]``; ``q_hat``, ``k_hat`` ``[B, Q, H, K]``; ``v`` ``[B, Q, H, V]``;
    ``gate`` ``[B, Q, H, K]`` (KDA) or ``[B, Q, H]`` (GDN) — the kind is taken from its rank;
    ``beta`` ``[B, Q, H]``. Writes, in place, ``corrections_out`` ``[B, H, Q, V]`` (float32 or
    float64) and ``keygate_out`` ``[B, H, Q, 2K]`` (KDA) / ``[B, H, Q, K + 1]`` (GDN), any floating
    dtype (both may be strided views of the workspace). ``k_hat`` and the gate are rounded through
    ``keygate_out.dtype`` before use, so the outputs belong to the same trajectory that
    :func:`commit` reconstructs from the records.

    ``query_lens`` (optional, ``[B]``, clamped to ``[0, Q]``) gives each request's window length:
    tokens at or beyond it are ignored (their inputs may be garbage): their outputs are zero and
    their records neutral (``u = 0``, ``k_hat = 0``, ``gate = 0``), so committing past a request's
    length equals committing its length, and a request of length 0 is never changed by a commit.

    Returns the outputs ``[B, Q, H, V]`` in float32 (float64 when ``state`` is float64).
    """
    _check_tensor("state", state)
    _check_shape("state", state, ["B", "H", "V", "K"], [None] * 4)
    B, H, V, K = state.shape
    _check_tensor("q_hat", q_hat)
    if q_hat.ndim != 4:
        _check_shape("q_hat", q_hat, ["B", "Q", "H", "K"], [B, None, H, K])
    Q = q_hat.shape[1]
    _check_shape("q_hat", q_hat, ["B", "Q", "H", "K"], [B, Q, H, K])
    _check_shape("k_hat", _check_tensor("k_hat", k_hat), ["B", "Q", "H", "K"], [B, Q, H, K])
    _check_shape("v", _check_tensor("v", v), ["B", "Q", "H", "V"], [B, Q, H, V])
    _check_shape("beta", _check_tensor("beta", beta), ["B", "Q", "H"], [B, Q, H])
    _check_tensor("gate", gate)
    kind: Kind
    if gate.ndim == 4:
        kind = "kda"
        _check_shape("gate", gate, ["B", "Q", "H", "K"], [B, Q, H, K])
    elif gate.ndim == 3:
        kind = "gdn"
        _check_shape("gate", gate, ["B", "Q", "H"], [B, Q, H])
    else:
        raise PlanError(
            f"gate: expected shape {_fmt_shape(['B', 'Q', 'H', 'K'], [B, Q, H, K])} (KDA) or "
            f"{_fmt_shape(['B', 'Q', 'H'], [B, Q, H])} (GDN), got {list(gate.shape)}"
        )
    _check_tensor("corrections_out", corrections_out)
    _check_shape("corrections_out", corrections_out, ["B", "H", "Q", "V"], [B, H, Q, V])
    if corrections_out.dtype not in (torch.float32, torch.float64):
        raise PlanError(
            f"corrections_out: expected dtype torch.float32 (or torch.float64), "
            f"got {corrections_out.dtype}"
        )
    _check_tensor("keygate_out", keygate_out)
    width = keygate_width(kind, K)
    _check_shape(
        "keygate_out",
        keygate_out,
        ["B", "H", "Q", "2K" if kind == "kda" else "K+1"],
        [B, H, Q, width],
    )
    for name, x in (
        ("q_hat", q_hat),
        ("k_hat", k_hat),
        ("v", v),
        ("gate", gate),
        ("beta", beta),
        ("corrections_out", corrections_out),
        ("keygate_out", keygate_out),
    ):
        _check_device(name, x, state.device)

    cdt = _compute_dtype(state)
    rec_dt = keygate_out.dtype
    # Round k_hat and the gate through the record dtype: commit sees exactly these values.
    k_r = k_hat.to(rec_dt).to(cdt)
    g_r = gate.to(rec_dt).to(cdt)
    q_c = q_hat.to(cdt)
    v_c = v.to(cdt)
    b_c = beta.to(cdt)
    valid: torch.Tensor | None = None
    if query_lens is not None:
        lens = _counts("query_lens", query_lens, B, Q, state.device)
        valid = torch.arange(Q, device=state.device)[None, :] < lens[:, None]  # [B, Q]
        zero = torch.zeros((), dtype=cdt, device=state.device)
        v4 = valid[:, :, None, None]
        k_r = torch.where(v4, k_r, zero)
        q_c = torch.where(v4, q_c, zero)
        v_c = torch.where(v4, v_c, zero)
        g_r = torch.where(v4 if kind == "kda" else valid[:, :, None], g_r, zero)
        b_c = torch.where(valid[:, :, None], b_c, zero)

    S = state.to(cdt, copy=True)  # never alias the persistent state
    outs = torch.empty((B, Q, H, V), dtype=cdt, device=state.device)
    corr = torch.empty((B, H, Q, V), dtype=cdt, device=state.device)
    for t in range(Q):
        k_t = k_r[:, t]  # [B, H, K]
        S.mul_(_decay_view(torch.exp(g_r[:, t]), kind))
        sk = (S * k_t.unsqueeze(-2)).sum(-1)  # [B, H, V]
        u = b_c[:, t, :, None] * (v_c[:, t] - sk)
        S.addcmul_(u.unsqueeze(-1), k_t.unsqueeze(-2))
        outs[:, t] = (S * q_c[:, t].unsqueeze(-2)).sum(-1)
        corr[:, :, t] = u
    if valid is not None:
        zero = torch.zeros((), dtype=cdt, device=state.device)
        outs = torch.where(valid[:, :, None, None], outs, zero)
        corr = torch.where(valid[:, None, :, None], corr, zero)

    corrections_out.copy_(corr)
    keygate_out[..., :K].copy_(k_r.permute(0, 2, 1, 3))
    if kind == "kda":
        keygate_out[..., K:].copy_(g_r.permute(0, 2, 1, 3))
    else:
        keygate_out[..., K].copy_(g_r.permute(0, 2, 1))
    return outs


def _check_records(
    state: torch.Tensor, corrections: torch.Tensor, keygate: torch.Tensor
) -> tuple[Kind, int]:
    """Validate ``state`` / records; return the kind (from the key+gate width) and ``Q``."""
    _check_tensor("state", state)
    _check_shape("state", state, ["B", "H", "V", "K"], [None] * 4)
    B, H, V, K = state.shape
    _check_tensor("corrections", corrections)
    if corrections.ndim != 4:
        _check_shape("corrections", corrections, ["B", "H", "Q", "V"], [B, H, None, V])
    Q = corrections.shape[2]
    _check_shape("corrections", corrections, ["B", "H", "Q", "V"], [B, H, Q, V])
    _check_tensor("keygate", keygate)
    if keygate.ndim != 4:
        _check_shape("keygate", keygate, ["B", "H", "Q", "2K|K+1"], [B, H, Q, None])
    _check_shape("keygate", keygate, ["B", "H", "Q", "2K|K+1"], [B, H, Q, keygate.shape[-1]])
    kind = _infer_kind_from_width(keygate.shape[-1], K)
    if kind is None:
        raise PlanError(
            f"keygate: expected shape [B={B}, H={H}, Q={Q}, 2K={2 * K}] (KDA) or "
            f"[B={B}, H={H}, Q={Q}, K+1={K + 1}] (GDN), got {list(keygate.shape)}"
        )
    _check_device("corrections", corrections, state.device)
    _check_device("keygate", keygate, state.device)
    return kind, Q


def _check_out(name: str, out: torch.Tensor, state: torch.Tensor) -> None:
    _check_tensor(name, out)
    _check_shape(name, out, ["B", "H", "V", "K"], list(state.shape))
    _check_device(name, out, state.device)


def commit(
    state: torch.Tensor,
    corrections: torch.Tensor,
    keygate: torch.Tensor,
    num_accepted: Counts,
    *,
    out: torch.Tensor | None = None,
    boundary_counts: Counts | None = None,
    boundary_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fold the first ``num_accepted[b]`` records of each request into its state.

    ``state`` ``[B, H, V, K]`` is the persistent state the window was verified from;
    ``corrections`` ``[B, H, Q, V]`` and ``keygate`` ``[B, H, Q, 2K | K + 1]`` are the records
    :func:`verify` wrote (the kind follows from the key+gate width). ``num_accepted`` (int, sequence
    or tensor ``[B]``) is clamped to ``[0, Q]``; 0 leaves a request's state unchanged (bit for bit).
    Only the records and ``state`` are read: ``S_n = S_0 (.) A_{1..n} + sum_t (u_t k_t^T) (.)
    A_{t+1..n}``, accumulated by a forward pass in float32 (float64 for a float64 state).

    The result is written into ``out`` when given (it may alias ``state``), else into a new tensor,
    in ``out``'s / ``state``'s dtype, and returned.

    Align mode: with ``boundary_counts`` (``[B]``, values ``m``) the state after
    ``min(max(m, 0), n)`` tokens — a boundary state never contains rejected tokens — is written
    into ``boundary_out`` ``[B, H, V, K]`` (required then) in the same pass; rows with ``m < 0``
    have no boundary and their ``boundary_out`` row is left untouched. ``boundary_out`` must not
    overlap ``out``.
    """
    kind, Q = _check_records(state, corrections, keygate)
    B, H, V, K = state.shape
    if out is not None:
        _check_out("out", out, state)
    n = _counts("num_accepted", num_accepted, B, Q, state.device)
    m: torch.Tensor | None = None
    if boundary_counts is not None:
        if boundary_out is None:
            raise PlanError("boundary_out: required when boundary_counts is given, got None")
        _check_out("boundary_out", boundary_out, state)
        # Negative = no boundary; otherwise clamp to [0, n] (no rejected token in a boundary).
        m_raw = _counts_raw("boundary_counts", boundary_counts, B, state.device)
        m = torch.where(m_raw < 0, torch.full_like(m_raw, -1), torch.minimum(m_raw.clamp(max=Q), n))
    elif boundary_out is not None:
        raise PlanError("boundary_counts: required when boundary_out is given, got None")

    cdt = _compute_dtype(state)
    S = state.to(cdt, copy=True)
    u_all = corrections.to(cdt)  # [B, H, Q, V]
    k_all = keygate[..., :K].to(cdt)  # [B, H, Q, K]
    g_all = keygate[..., K:].to(cdt) if kind == "kda" else keygate[..., K].to(cdt)
    zero = torch.zeros((), dtype=cdt, device=state.device)
    one = torch.ones((), dtype=cdt, device=state.device)

    def snapshot(position: int) -> None:
        assert boundary_out is not None and m is not None
        hit = (m == position)[:, None, None, None]
        boundary_out.copy_(torch.where(hit, S.to(boundary_out.dtype), boundary_out))

    if m is not None:
        snapshot(0)
    for t in range(Q):
        live = t < n  # [B]; tokens past n are folded as identity (decay 1, no update)
        l3 = live[:, None, None]
        k_t = torch.where(l3, k_all[:, :, t], zero)  # [B, H, K]
        u_t = torch.where(l3, u_all[:, :, t], zero)  # [B, H, V]
        g_t = g_all[:, :, t]
        decay = torch.where(l3 if kind == "kda" else live[:, None], torch.exp(g_t), one)
        S.mul_(_decay_view(decay, kind))
        S.addcmul_(u_t.unsqueeze(-1), k_t.unsqueeze(-2))
        if m is not None:
            snapshot(t + 1)

    if out is None:
        return S.to(state.dtype, copy=True) if S.dtype != state.dtype else S
    out.copy_(S)
    return out


def state_at(
    state: torch.Tensor,
    corrections: torch.Tensor,
    keygate: torch.Tensor,
    positions: Counts,
) -> torch.Tensor:
    """State after ``positions[b]`` tokens of the verified window, as a new tensor (non-destructive).

    Same as ``commit(state, corrections, keygate, positions)``: useful to read an intermediate
    (e.g. block-boundary) state without committing anything.
    """
    return commit(state, corrections, keygate, positions)


def sequential_decode(
    state: torch.Tensor,
    q_hat: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain token-by-token recurrence (the ground truth), without records.

    Same input shapes as :func:`verify` (``gate`` ``[B, Q, H, K]`` for KDA, ``[B, Q, H]`` for GDN).
    Computes in float32, or float64 when any input is float64 (pass float64 inputs for a
    high-precision reference). Returns ``(out [B, Q, H, V], states [B, Q + 1, H, V, K])`` where
    ``states[:, t]`` is the state after ``t`` tokens (``states[:, 0]`` is ``state``). ``state`` is
    not modified.
    """
    _check_tensor("state", state)
    _check_shape("state", state, ["B", "H", "V", "K"], [None] * 4)
    B, H, V, K = state.shape
    _check_tensor("q_hat", q_hat)
    Q = q_hat.shape[1] if q_hat.ndim == 4 else None
    _check_shape("q_hat", q_hat, ["B", "Q", "H", "K"], [B, Q, H, K])
    _check_shape("k_hat", _check_tensor("k_hat", k_hat), ["B", "Q", "H", "K"], [B, Q, H, K])
    _check_shape("v", _check_tensor("v", v), ["B", "Q", "H", "V"], [B, Q, H, V])
    _check_shape("beta", _check_tensor("beta", beta), ["B", "Q", "H"], [B, Q, H])
    _check_tensor("gate", gate)
    per_channel = gate.ndim == 4
    if per_channel:
        _check_shape("gate", gate, ["B", "Q", "H", "K"], [B, Q, H, K])
    else:
        _check_shape("gate", gate, ["B", "Q", "H"], [B, Q, H])
    for name, x in (("q_hat", q_hat), ("k_hat", k_hat), ("v", v), ("gate", gate), ("beta", beta)):
        _check_device(name, x, state.device)
    assert Q is not None

    cdt = _compute_dtype(state, q_hat, k_hat, v, gate, beta)
    S = state.to(cdt)
    qc, kc, vc, gc, bc = (x.to(cdt) for x in (q_hat, k_hat, v, gate, beta))
    outs = []
    states = [S]
    for t in range(Q):
        decay = torch.exp(gc[:, t])
        decay = decay[:, :, None, :] if per_channel else decay[:, :, None, None]
        S = S * decay
        k_t = kc[:, t][:, :, None, :]  # [B, H, 1, K]
        u = bc[:, t][:, :, None] * (vc[:, t] - (S * k_t).sum(-1))  # [B, H, V]
        S = S + u[:, :, :, None] * k_t
        outs.append((S * qc[:, t][:, :, None, :]).sum(-1))
        states.append(S)
    return torch.stack(outs, dim=1), torch.stack(states, dim=1)


# ----------------------------------------------------------------------------------------------
# conv window


def compact_conv_window(
    window: torch.Tensor,
    num_accepted: Counts,
    conv_kernel_size: int,
    layout: ConvLayout = "DS",
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compact verified conv windows after accepting ``num_accepted[b]`` tokens.

    ``window`` is ``[B, dim, W]`` (``layout="DS"``) or ``[B, W, dim]`` (``"SD"``) with
    ``W = conv_kernel_size - 1 + Q - 1``. For ``n >= 1`` the first ``conv_kernel_size - 1`` columns
    become columns ``n - 1 .. n - 1 + conv_kernel_size - 2`` of the verified window and the other
    columns are unchanged; ``n = 0`` (and ``n = 1``) leave the window unchanged. ``num_accepted`` is
    clamped to ``[0, Q]``. Pure data movement (exact in any dtype). Written into ``out`` when given
    (it may be ``window`` itself, but must not partially overlap it), else into a copy; returned.
    """
    _check_tensor("window", window, floating=False)
    if layout not in ("DS", "SD"):
        raise PlanError(f"layout: expected 'DS' or 'SD', got {layout!r}")
    if isinstance(conv_kernel_size, bool) or not isinstance(conv_kernel_size, int) or conv_kernel_size < 1:
        raise PlanError(f"conv_kernel_size: expected an int >= 1, got {conv_kernel_size!r}")
    names = ["B", "dim", "W"] if layout == "DS" else ["B", "W", "dim"]
    _check_shape("window", window, names, [None, None, None])
    B = window.shape[0]
    width = window.shape[2] if layout == "DS" else window.shape[1]
    hist = conv_kernel_size - 1
    Q = width - hist + 1
    if Q < 1:
        raise PlanError(
            f"window: expected W = conv_kernel_size - 1 + Q - 1 >= {hist} columns (Q >= 1) in "
            f"{layout} layout {_fmt_shape(names, [None, None, None])}, got {list(window.shape)}"
        )
    if out is not None:
        _check_tensor("out", out, floating=False)
        _check_shape("out", out, names, list(window.shape))
        _check_device("out", out, window.device)
        if out.dtype != window.dtype:
            raise PlanError(f"out: expected dtype {window.dtype}, got {out.dtype}")
    n = _counts("num_accepted", num_accepted, B, Q, window.device)
    # Gather the new head columns first: ``out`` may alias ``window``.
    shift = (n - 1).clamp(min=0)  # [B]; n = 0 and n = 1 both keep the head as it is
    idx = shift[:, None] + torch.arange(hist, device=window.device)[None, :]  # [B, hist]
    if layout == "DS":
        head = torch.gather(window, 2, idx[:, None, :].expand(B, window.shape[1], hist))
    else:
        head = torch.gather(window, 1, idx[:, :, None].expand(B, hist, window.shape[2]))
    if out is None:
        dst = window.clone()
    else:
        dst = out
        if not _same_storage_view(out, window):
            out.copy_(window)
    if layout == "DS":
        dst[:, :, :hist] = head
    else:
        dst[:, :hist, :] = head
    return dst


def _same_storage_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are the very same view (same storage, offset, shape and strides)."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


# ----------------------------------------------------------------------------------------------
# memory accounting


def _itemsize(dtype: torch.dtype) -> int:
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
    for name, val in (
        ("num_heads", num_heads),
        ("head_k_dim", head_k_dim),
        ("head_v_dim", head_v_dim),
        ("window", window),
    ):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise PlanError(f"{name}: expected an int >= 0, got {val!r}")
    corr = num_heads * window * head_v_dim * 4
    kg = num_heads * window * keygate_width(kind, head_k_dim) * _itemsize(keygate_dtype)
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
    for name, val in (
        ("num_heads", num_heads),
        ("head_k_dim", head_k_dim),
        ("head_v_dim", head_v_dim),
        ("window", window),
    ):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise PlanError(f"{name}: expected an int >= 0, got {val!r}")
    return window * num_heads * head_v_dim * head_k_dim * _itemsize(state_dtype)
