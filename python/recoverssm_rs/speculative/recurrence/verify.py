"""RecoverSSM verify: run a speculative window from the persistent state without writing it, and
write the per-token records (corrections, key + gate)."""

from __future__ import annotations

import torch

from ...errors import PlanError
from .gates import keygate_width
from .inputs import (
    Counts,
    check_device,
    check_shape,
    check_tensor,
    check_window,
    compute_dtype,
    decay_view,
    window_counts,
)


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
    kind, B, H, V, K, Q = check_window(state, (q_hat, k_hat, v, gate, beta))
    check_tensor("corrections_out", corrections_out)
    check_shape("corrections_out", corrections_out, ["B", "H", "Q", "V"], [B, H, Q, V])
    if corrections_out.dtype not in (torch.float32, torch.float64):
        raise PlanError(
            f"corrections_out: expected dtype torch.float32 (or torch.float64), got {corrections_out.dtype}"
        )
    check_tensor("keygate_out", keygate_out)
    width = keygate_width(kind, K)
    check_shape(
        "keygate_out",
        keygate_out,
        ["B", "H", "Q", "2K" if kind == "kda" else "K+1"],
        [B, H, Q, width],
    )
    for name, x in (("corrections_out", corrections_out), ("keygate_out", keygate_out)):
        check_device(name, x, state.device)

    cdt = compute_dtype(state)
    rec_dt = keygate_out.dtype
    # Round k_hat and the gate through the record dtype: commit sees exactly these values.
    k_r = k_hat.to(rec_dt).to(cdt)
    g_r = gate.to(rec_dt).to(cdt)
    q_c = q_hat.to(cdt)
    v_c = v.to(cdt)
    b_c = beta.to(cdt)
    valid: torch.Tensor | None = None
    if query_lens is not None:
        lens = window_counts("query_lens", query_lens, B, Q, state.device)
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
        S.mul_(decay_view(torch.exp(g_r[:, t]), kind))
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
