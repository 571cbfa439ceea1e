"""RecoverSSM commit: fold the accepted records into the persistent state (and, in align mode,
the state at a crossed block boundary); the state at any token, and plain sequential decoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...errors import PlanError
from .conv import compact_conv_window
from .inputs import (
    ConvLayout,
    Counts,
    check_out,
    check_records,
    check_window,
    compute_dtype,
    decay_view,
    raw_counts,
    window_counts,
)


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
    kind, Q = check_records(state, corrections, keygate)
    B, H, V, K = state.shape
    if out is not None:
        check_out("out", out, state)
    n = window_counts("num_accepted", num_accepted, B, Q, state.device)
    m: torch.Tensor | None = None
    if boundary_counts is not None:
        if boundary_out is None:
            raise PlanError("boundary_out: required when boundary_counts is given, got None")
        check_out("boundary_out", boundary_out, state)
        # Negative = no boundary; otherwise clamp to [0, n] (no rejected token in a boundary).
        m_raw = raw_counts("boundary_counts", boundary_counts, B, state.device)
        m = torch.where(m_raw < 0, torch.full_like(m_raw, -1), torch.minimum(m_raw.clamp(max=Q), n))
    elif boundary_out is not None:
        raise PlanError("boundary_counts: required when boundary_out is given, got None")

    cdt = compute_dtype(state)
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
        S.mul_(decay_view(decay, kind))
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
    kind, _, _, _, _, Q = check_window(state, (q_hat, k_hat, v, gate, beta))
    per_channel = kind == "kda"

    cdt = compute_dtype(state, q_hat, k_hat, v, gate, beta)
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


def commit_rows(
    rows: Any,
    *,
    recurrent: torch.Tensor,
    conv: torch.Tensor,
    corrections: torch.Tensor,
    keygate: torch.Tensor,
    conv_window: torch.Tensor,
    conv_kernel_size: int,
    conv_layout: ConvLayout,
) -> None:
    """Execute a commit plan (``COMMIT_ROW_DTYPE`` records from the core) on a stack of layers:
    ``recurrent`` / ``conv`` ``[layers, num_blocks, ...]`` pools, ``corrections`` / ``keygate`` /
    ``conv_window`` ``[layers, max_requests, ...]`` workspace. Per row, the first ``count`` records
    are folded into ``state_block`` (and the conv window compacted by ``count``; a count of 0 keeps
    the block's window); a ``boundary_block >= 0`` receives the state and window after
    ``boundary_len`` tokens. The torch path of :meth:`~recoverssm_rs.StateCache.commit`."""
    dev = recurrent.device
    req = torch.as_tensor(rows["request"].astype(np.int64), device=dev)
    sb = torch.as_tensor(rows["state_block"].copy(), device=dev)
    counts = torch.as_tensor(rows["count"].astype(np.int64), device=dev)
    has_b = rows["boundary_block"] >= 0
    bmask = torch.as_tensor(has_b, device=dev)
    bb = torch.as_tensor(rows["boundary_block"][has_b].copy(), device=dev)
    bcounts = torch.as_tensor(np.where(has_b, rows["boundary_len"].astype(np.int64), -1), device=dev)
    any_b = bool(has_b.any())
    moved_np = rows["count"] > 0
    moved = torch.as_tensor(moved_np, device=dev)
    moved_all, moved_any = bool(moved_np.all()), bool(moved_np.any())
    for layer in range(recurrent.shape[0]):
        rec = recurrent[layer]
        s0 = rec[sb]
        bout = torch.empty_like(s0) if any_b else None
        new = commit(
            s0,
            corrections[layer][req],
            keygate[layer][req],
            counts,
            boundary_counts=bcounts if any_b else None,
            boundary_out=bout,
        )
        if bout is not None:
            rec[bb] = bout[bmask]
        rec[sb] = new
        pool = conv[layer]
        win = conv_window[layer][req]
        if any_b:
            pool[bb] = compact_conv_window(win[bmask], bcounts[bmask], conv_kernel_size, conv_layout)
        # A commit of 0 tokens keeps the block's window as it was before the verify.
        if moved_all:
            pool[sb] = compact_conv_window(win, counts, conv_kernel_size, conv_layout)
        elif moved_any:
            pool[sb[moved]] = compact_conv_window(win[moved], counts[moved], conv_kernel_size, conv_layout)
