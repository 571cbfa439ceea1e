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

Commit with accepted count ``n`` folds the first ``n`` records into the state,
``S_n = S_0 (.) A_{1..n} + sum_{t<=n} (u_t k_t^T) (.) A_{t+1..n}``, with a forward pass over the
records only (the window inputs are never re-run). :func:`verify` rounds ``k_hat`` and the gate
through the record dtype before using them, so a commit reproduces exactly the trajectory that the
verify outputs were computed on, whatever the record dtype.

Matrix-vector products are written as elementwise products and sums (never ``matmul``), so a
process-wide TF32 setting on CUDA cannot degrade this reference.
"""

from .commit import commit, commit_rows, sequential_decode, state_at
from .conv import compact_conv_window, conv_verify
from .gates import (
    NORM_EPS,
    Prepared,
    gdn_gate,
    kda_gate,
    keygate_width,
    normalize_qk,
    prepare,
    prepare_gdn,
    prepare_kda,
)
from .inputs import ConvLayout, Counts, Kind
from .memory import full_state_scratch_bytes, record_bytes
from .verify import verify

__all__ = [
    "Kind",
    "ConvLayout",
    "Counts",
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
    "commit_rows",
    "state_at",
    "sequential_decode",
    "compact_conv_window",
    "conv_verify",
    "record_bytes",
    "full_state_scratch_bytes",
]
