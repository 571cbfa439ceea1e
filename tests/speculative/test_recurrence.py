"""Tests of the torch RecoverSSM reference (``recoverssm_rs.speculative.recurrence``).

Tolerances used below and why:

* ``TOL_F32`` (atol = rtol = 1e-5): float32 paths against float32/float64 references. States are
  O(1) (unit-norm keys, beta < 1, decays < 1) and the windows are short (Q <= 8, K, V <= 16), so
  float32 rounding of the differently ordered sums stays around 1e-7 .. 1e-6 (the conformance
  vectors agree to 3e-7 with a float64 recomputation); 1e-5 leaves a 10-30x margin while any
  convention error (normalisation, gate, decay order) shows up as >= 1e-3.
* ``TOL_F64`` (1e-10): float64 paths against a float64 closed form.
* ``TOL_BF16`` (atol = rtol = 1e-2): commit from bfloat16 key+gate records against the exact
  float32 recurrence. bf16 keeps 8 significant bits (relative rounding <= 2^-9 ~ 2e-3) on k_hat and
  on the log-decay gate; over Q <= 8 steps on O(1) states a sweep of 600 random windows peaked at
  ~5e-3, so 1e-2 has a 2x margin. Against the recurrence run on the *same* rounded keys/gates, the
  bf16 path must agree to ``TOL_F32``.
* Conv compaction and ``n = 0`` commits are data movement / identities: checked bit for bit.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from recoverssm_rs.errors import PlanError
from recoverssm_rs.speculative.recurrence import (
    Prepared,
    commit,
    compact_conv_window,
    full_state_scratch_bytes,
    gdn_gate,
    kda_gate,
    keygate_width,
    normalize_qk,
    prepare,
    prepare_gdn,
    prepare_kda,
    record_bytes,
    sequential_decode,
    state_at,
    verify,
)

DATA = Path(__file__).parents[1] / "data" / "kda_recoverssm.npz"

TOL_F32 = dict(atol=1e-5, rtol=1e-5)
TOL_F64 = dict(atol=1e-10, rtol=1e-10)
TOL_BF16 = dict(atol=1e-2, rtol=1e-2)

HYP = settings(max_examples=25, deadline=None, derandomize=True)


# ----------------------------------------------------------------------------------------------
# helpers


def _window(
    kind: str,
    B: int,
    Q: int,
    H: int,
    K: int,
    V: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, Prepared, torch.Tensor]:
    """A random persistent state, prepared window inputs and values."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    state = r(B, H, V, K)
    q, k = r(B, Q, H, K), r(B, Q, H, K)
    v = r(B, Q, H, V)
    raw_beta = r(B, Q, H)
    A_log = r(H, scale=0.5)
    if kind == "kda":
        prep = prepare_kda(q, k, r(B, Q, H, K), raw_beta, A_log, r(H, K, scale=0.5))
    else:
        prep = prepare_gdn(q, k, r(B, Q, H), raw_beta, A_log, r(H, scale=0.5))
    return state, prep, v


def _records(
    state: torch.Tensor, kind: str, Q: int, keygate_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, V, K = state.shape
    corr_dtype = torch.float64 if state.dtype == torch.float64 else torch.float32
    corr = torch.full((B, H, Q, V), float("nan"), dtype=corr_dtype)
    kg = torch.full((B, H, Q, keygate_width(kind, K)), float("nan"), dtype=keygate_dtype)  # type: ignore[arg-type]
    return corr, kg


def _verify(
    state: torch.Tensor,
    prep: Prepared,
    v: torch.Tensor,
    kind: str,
    keygate_dtype: torch.dtype = torch.float32,
    **kw: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    corr, kg = _records(state, kind, v.shape[1], keygate_dtype)
    out = verify(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta, corr, kg, **kw)  # type: ignore[arg-type]
    return out, corr, kg


def _closed_form(state: torch.Tensor, corr: torch.Tensor, kg: torch.Tensor, n: int, kind: str) -> torch.Tensor:
    """``S_n = S_0 (.) A_{1..n} + sum_t (u_t k_t^T) (.) A_{t+1..n}`` in float64, literally."""
    K = state.shape[-1]
    S0 = state.double()
    u = corr.double()
    k = kg[..., :K].double()
    gate = kg[..., K:].double() if kind == "kda" else kg[..., K : K + 1].double().expand_as(k)
    log_a = gate  # [B, H, Q, K]

    def A(lo: int, hi: int) -> torch.Tensor:  # prod of decays of tokens lo..hi (1-based)
        return torch.exp(log_a[:, :, lo - 1 : hi].sum(2))  # [B, H, K]

    S = S0 * A(1, n)[:, :, None, :]
    for t in range(1, n + 1):
        S = S + (u[:, :, t - 1, :, None] * k[:, :, t - 1, None, :]) * A(t + 1, n)[:, :, None, :]
    return S


# ----------------------------------------------------------------------------------------------
# conformance vectors (vLLM 0.33 Kimi-K3 KDA)


def _vector_cases() -> list[int]:
    with np.load(DATA) as d:
        return list(range(int(d["Q"]) + 1))


@pytest.mark.parametrize("n", _vector_cases())
def test_kda_vectors(n: int) -> None:
    with np.load(DATA) as d:
        f = {k.split("_", 1)[1]: torch.from_numpy(d[k]) for k in d.files if k.startswith(f"accepted{n}_")}
        Q = int(d["Q"])
    H, V, K = f["S0"].shape
    assert f["dt_bias"].shape == (H, K)  # the vectors carry a per-channel dt_bias for KDA
    prep = prepare_kda(f["q"], f["k"], f["raw_g"], f["raw_beta"], f["A_log"], f["dt_bias"])
    batch = Prepared(*(x.unsqueeze(0) for x in prep))
    state = f["S0"].unsqueeze(0).clone()
    out, corr, kg = _verify(state, batch, f["v"].unsqueeze(0), "kda")
    torch.testing.assert_close(out[0], f["out"], **TOL_F32)
    assert torch.equal(state[0], f["S0"])  # verify leaves the persistent state alone

    committed = commit(state, corr, kg, [n], out=state)  # in place
    assert committed.data_ptr() == state.data_ptr()
    torch.testing.assert_close(state[0], f["S_committed"], **TOL_F32)
    if n == 0:
        assert torch.equal(state[0], f["S0"])

    conv = f["conv_window"]
    width = conv.shape[1]
    k_conv = width - (Q - 1) + 1
    compacted = compact_conv_window(conv.unsqueeze(0), [n], k_conv, "DS")
    assert torch.equal(compacted[0], f["conv_committed"])
    # This vector's conv window is plain float32 (not bf16-representable); a bf16 copy compacts
    # to the bf16 cast of the expected window, bit for bit.
    c16 = compact_conv_window(conv.unsqueeze(0).bfloat16(), [n], k_conv, "DS")
    assert torch.equal(c16[0], f["conv_committed"].bfloat16())
    # The same compaction in SD orientation is the transpose.
    sd = compact_conv_window(conv.T.unsqueeze(0).contiguous(), [n], k_conv, "SD")
    assert torch.equal(sd[0].T, f["conv_committed"])


# ----------------------------------------------------------------------------------------------
# verify + commit against the sequential recurrence


shapes = st.tuples(
    st.sampled_from(["gdn", "kda"]),
    st.integers(1, 3),  # B
    st.integers(1, 6),  # Q
    st.integers(1, 3),  # H
    st.integers(1, 16),  # K
    st.integers(1, 16),  # V
    st.integers(0, 2**31 - 1),  # seed
)


@HYP
@given(shapes, st.data())
def test_verify_commit_matches_sequential(case: tuple, data: st.DataObject) -> None:
    kind, B, Q, H, K, V, seed = case
    state, prep, v = _window(kind, B, Q, H, K, V, seed)
    n = data.draw(st.lists(st.integers(0, Q), min_size=B, max_size=B))
    ref_out, ref_states = sequential_decode(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    out, corr, kg = _verify(state, prep, v, kind)
    torch.testing.assert_close(out, ref_out, **TOL_F32)
    got = commit(state, corr, kg, n)
    want = ref_states[torch.arange(B), torch.tensor(n)]
    torch.testing.assert_close(got, want, **TOL_F32)
    # Independent check of the math: the closed form, in float64, from the same records.
    for b in range(B):
        closed = _closed_form(state[b : b + 1], corr[b : b + 1], kg[b : b + 1], n[b], kind)
        torch.testing.assert_close(got[b : b + 1].double(), closed, **TOL_F32)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("which", ["none", "all"])
def test_commit_none_and_all(kind: str, which: str) -> None:
    B, Q, H, K, V = 3, 5, 2, 8, 6
    state, prep, v = _window(kind, B, Q, H, K, V, seed=7)
    _, ref_states = sequential_decode(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    _, corr, kg = _verify(state, prep, v, kind)
    n = 0 if which == "none" else Q
    got = commit(state, corr, kg, n)
    if n == 0:
        assert torch.equal(got, state)  # bit for bit
    else:
        torch.testing.assert_close(got, ref_states[:, Q], **TOL_F32)
    # Counts beyond the window are clamped.
    torch.testing.assert_close(commit(state, corr, kg, [Q + 3] * B), ref_states[:, Q], **TOL_F32)
    assert torch.equal(commit(state, corr, kg, torch.tensor([-2] * B)), state)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_commit_reproduces_verify_trajectory_exactly(kind: str) -> None:
    """Commit and verify apply the same float32 ops in the same order: the states agree bit for bit."""
    B, Q, H, K, V = 2, 4, 2, 8, 8
    state, prep, v = _window(kind, B, Q, H, K, V, seed=3)
    out, corr, kg = _verify(state, prep, v, kind)
    for n in range(1, Q + 1):
        S = commit(state, corr, kg, n)
        # Output of token n recomputed from the committed state equals verify's output.
        o = (S * prep.q_hat[:, n - 1].unsqueeze(-2)).sum(-1)
        assert torch.equal(o, out[:, n - 1])


def test_float64_state_matches_closed_form() -> None:
    kind, B, Q, H, K, V = "kda", 2, 6, 2, 5, 7
    state, prep, v = _window(kind, B, Q, H, K, V, seed=11, dtype=torch.float64)
    assert prep.k_hat.dtype == torch.float64
    out, corr, kg = _verify(state, prep, v, kind, keygate_dtype=torch.float64)
    assert out.dtype == torch.float64
    _, ref_states = sequential_decode(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    for n in range(Q + 1):
        got = commit(state, corr, kg, n)
        torch.testing.assert_close(got, _closed_form(state, corr, kg, n, kind), **TOL_F64)
        torch.testing.assert_close(got, ref_states[:, n], **TOL_F64)


def test_gdn_equals_kda_with_uniform_gate() -> None:
    """A scalar GDN gate behaves like a KDA gate that is the same on every key channel."""
    B, Q, H, K, V = 2, 4, 3, 6, 5
    state, prep, v = _window("gdn", B, Q, H, K, V, seed=5)
    kda_prep = prep._replace(gate=prep.gate[..., None].expand(B, Q, H, K).contiguous())
    out_g, corr_g, kg_g = _verify(state, prep, v, "gdn")
    out_k, corr_k, kg_k = _verify(state, kda_prep, v, "kda")
    torch.testing.assert_close(out_g, out_k, **TOL_F32)
    for n in range(Q + 1):
        torch.testing.assert_close(commit(state, corr_g, kg_g, n), commit(state, corr_k, kg_k, n), **TOL_F32)


@HYP
@given(shapes)
def test_bf16_keygate_records(case: tuple) -> None:
    kind, B, Q, H, K, V, seed = case
    state, prep, v = _window(kind, B, Q, H, K, V, seed)
    out, corr, kg = _verify(state, prep, v, kind, keygate_dtype=torch.bfloat16)
    assert corr.dtype == torch.float32 and kg.dtype == torch.bfloat16
    exact_out, exact_states = sequential_decode(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    rounded = prep._replace(k_hat=prep.k_hat.bfloat16().float(), gate=prep.gate.bfloat16().float())
    r_out, r_states = sequential_decode(state, rounded.q_hat, rounded.k_hat, v, rounded.gate, rounded.beta)
    torch.testing.assert_close(out, r_out, **TOL_F32)
    torch.testing.assert_close(out, exact_out, **TOL_BF16)
    for n in range(Q + 1):
        got = commit(state, corr, kg, n)
        torch.testing.assert_close(got, r_states[:, n], **TOL_F32)
        torch.testing.assert_close(got, exact_states[:, n], **TOL_BF16)


def test_bf16_state() -> None:
    """A bfloat16 state is computed in float32 and rounded once on the way out."""
    kind, B, Q, H, K, V = "kda", 2, 3, 2, 4, 4
    state, prep, v = _window(kind, B, Q, H, K, V, seed=9)
    state16 = state.bfloat16()
    _, corr, kg = _verify(state16, prep, v, kind)
    _, ref_states = sequential_decode(state16.float(), prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    got = commit(state16, corr, kg, 2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref_states[:, 2].bfloat16(), atol=1e-2, rtol=1e-2)
    assert torch.equal(commit(state16, corr, kg, 0), state16)


# ----------------------------------------------------------------------------------------------
# boundary / intermediate states


@HYP
@given(shapes, st.data())
def test_boundary_state_matches_sequential(case: tuple, data: st.DataObject) -> None:
    kind, B, Q, H, K, V, seed = case
    state, prep, v = _window(kind, B, Q, H, K, V, seed)
    n = data.draw(st.lists(st.integers(0, Q), min_size=B, max_size=B))
    m = [data.draw(st.integers(-1, Q)) for _ in range(B)]
    _, ref_states = sequential_decode(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    _, corr, kg = _verify(state, prep, v, kind)
    sentinel = torch.full_like(state, 123.0)
    boundary = sentinel.clone()
    persistent = state.clone()
    commit(persistent, corr, kg, n, out=persistent, boundary_counts=m, boundary_out=boundary)
    torch.testing.assert_close(persistent, ref_states[torch.arange(B), torch.tensor(n)], **TOL_F32)
    for b in range(B):
        if m[b] < 0:
            assert torch.equal(boundary[b], sentinel[b])  # no boundary: row untouched
        else:
            pos = min(m[b], n[b])  # a boundary never contains rejected tokens
            torch.testing.assert_close(boundary[b], ref_states[b, pos], **TOL_F32)
    # state_at reads any intermediate state without committing.
    pos_t = torch.tensor([max(x, 0) for x in m])
    torch.testing.assert_close(state_at(state, corr, kg, pos_t), ref_states[torch.arange(B), pos_t], **TOL_F32)


def test_boundary_arguments_come_together() -> None:
    state, prep, v = _window("gdn", 1, 2, 1, 2, 2, seed=1)
    _, corr, kg = _verify(state, prep, v, "gdn")
    with pytest.raises(PlanError, match="boundary_out"):
        commit(state, corr, kg, 1, boundary_counts=[1])
    with pytest.raises(PlanError, match="boundary_counts"):
        commit(state, corr, kg, 1, boundary_out=state.clone())


# ----------------------------------------------------------------------------------------------
# state isolation and per-request query lengths


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_verify_does_not_modify_inputs(kind: str) -> None:
    state, prep, v = _window(kind, 2, 4, 2, 8, 8, seed=2)
    before = [t.clone() for t in (state, *prep, v)]
    _verify(state, prep, v, kind)
    for a, b in zip(before, (state, *prep, v)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_query_lens(kind: str) -> None:
    B, Q, H, K, V = 3, 5, 2, 8, 4
    lens = [0, 2, Q]
    state, prep, v = _window(kind, B, Q, H, K, V, seed=4)
    # Garbage (NaN) beyond each request's length must not leak anywhere.
    valid = torch.arange(Q)[None, :] < torch.tensor(lens)[:, None]

    def poison(x: torch.Tensor) -> torch.Tensor:
        mask = valid.reshape(B, Q, *([1] * (x.ndim - 2)))
        return torch.where(mask, x, torch.tensor(float("nan")))

    padded = Prepared(*(poison(x) for x in prep))
    out, corr, kg = _verify(state, padded, poison(v), kind, query_lens=lens)
    full_out, _, _ = _verify(state, prep, v, kind)
    _, ref_states = sequential_decode(state, prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)
    assert not out.isnan().any() and not corr.isnan().any() and not kg.isnan().any()
    for b, L in enumerate(lens):
        # Causality: outputs within the length equal the full-window ones; the rest are zero.
        torch.testing.assert_close(out[b, :L], full_out[b, :L], **TOL_F32)
        assert torch.equal(out[b, L:], torch.zeros_like(out[b, L:]))
    for n in range(Q + 1):
        got = commit(state, corr, kg, n)
        assert torch.equal(got[0], state[0])  # padding row: untouched whatever n says
        for b, L in enumerate(lens):
            torch.testing.assert_close(got[b], ref_states[b, min(n, L)], **TOL_F32)


# ----------------------------------------------------------------------------------------------
# prepare


def test_prepare_formulas() -> None:
    g = torch.Generator().manual_seed(0)
    B, Q, H, K = 2, 3, 2, 4
    q, k = torch.randn(B, Q, H, K, generator=g), torch.randn(B, Q, H, K, generator=g)
    q_hat, k_hat = normalize_qk(q, k)
    torch.testing.assert_close(k_hat, k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(q_hat, q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K**-0.5)
    A_log, raw_gs = torch.randn(H, generator=g), torch.randn(B, Q, H, generator=g)
    dt_h = torch.randn(H, generator=g)
    want = -torch.exp(A_log) * torch.log1p(torch.exp(raw_gs + dt_h))
    torch.testing.assert_close(gdn_gate(raw_gs, A_log, dt_h), want)
    raw_gk = torch.randn(B, Q, H, K, generator=g)
    dt_hk = torch.randn(H, K, generator=g)
    want_k = -torch.exp(A_log)[:, None] * torch.log1p(torch.exp(raw_gk + dt_hk))
    torch.testing.assert_close(kda_gate(raw_gk, A_log, dt_hk), want_k)
    # A per-head dt_bias broadcasts over K.
    torch.testing.assert_close(kda_gate(raw_gk, A_log, dt_h), kda_gate(raw_gk, A_log, dt_h[:, None].expand(H, K)))
    raw_beta = torch.randn(B, Q, H, generator=g)
    p = prepare("gdn", q, k, raw_gs, raw_beta, A_log, dt_h)
    torch.testing.assert_close(p.beta, torch.sigmoid(raw_beta))
    assert p.gate.shape == (B, Q, H) and p.k_hat.dtype == torch.float32
    p16 = prepare_kda(q.bfloat16(), k.bfloat16(), raw_gk.bfloat16(), raw_beta.bfloat16(), A_log, dt_hk)
    assert all(t.dtype == torch.float32 for t in p16)


# ----------------------------------------------------------------------------------------------
# conv window compaction


@HYP
@given(
    st.integers(1, 3),  # B
    st.integers(1, 6),  # dim
    st.integers(1, 5),  # conv kernel size
    st.integers(1, 6),  # Q
    st.sampled_from(["DS", "SD"]),
    st.data(),
)
def test_compact_conv_window(B: int, dim: int, kc: int, Q: int, layout: str, data: st.DataObject) -> None:
    W = kc - 1 + Q - 1
    ds = torch.arange(B * dim * W, dtype=torch.float32).reshape(B, dim, W)
    n = data.draw(st.lists(st.integers(0, Q), min_size=B, max_size=B))
    want = ds.clone()
    for b in range(B):
        if n[b] >= 1:
            want[b, :, : kc - 1] = ds[b, :, n[b] - 1 : n[b] - 1 + kc - 1]
    window = ds if layout == "DS" else ds.transpose(1, 2).contiguous()
    got = compact_conv_window(window, n, kc, layout)  # type: ignore[arg-type]
    got_ds = got if layout == "DS" else got.transpose(1, 2)
    assert torch.equal(got_ds, want)
    # In place (out aliases the window) gives the same.
    inplace = window.clone()
    compact_conv_window(inplace, torch.tensor(n), kc, layout, out=inplace)  # type: ignore[arg-type]
    assert torch.equal(inplace, got)


# ----------------------------------------------------------------------------------------------
# bad input


def _good() -> dict[str, torch.Tensor]:
    state, prep, v = _window("kda", 2, 3, 2, 4, 5, seed=0)
    corr, kg = _records(state, "kda", 3)
    return dict(
        state=state,
        q_hat=prep.q_hat,
        k_hat=prep.k_hat,
        v=v,
        gate=prep.gate,
        beta=prep.beta,
        corrections_out=corr,
        keygate_out=kg,
    )


@pytest.mark.parametrize("name", ["state", "q_hat", "k_hat", "v", "gate", "beta", "corrections_out", "keygate_out"])
def test_verify_bad_shape_names_argument(name: str) -> None:
    args = _good()
    bad = args[name]
    if name == "state":  # the state defines B, H, V, K: break its rank instead
        args[name] = bad[0]
    else:
        args[name] = torch.zeros(*bad.shape[:-1], bad.shape[-1] + 1, dtype=bad.dtype)
    with pytest.raises(PlanError, match=rf"^{name}: expected shape \[.*\], got \[") as exc:
        verify(**args)  # type: ignore[arg-type]
    assert str(list(args[name].shape)) in str(exc.value)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("name", ["state", "q_hat", "k_hat", "v", "gate", "beta"])
@pytest.mark.parametrize("how", ["size", "rank"])
def test_sequential_decode_checks_the_window_as_verify(name: str, how: str) -> None:
    """Both take a window the same way: a bad input is the same PlanError from either."""
    args = _good()
    bad = args[name]
    if how == "rank":
        args[name] = bad[0]
    else:
        args[name] = torch.zeros(*bad.shape[:-1], bad.shape[-1] + 1, dtype=bad.dtype)
    window = {k: args[k] for k in ("state", "q_hat", "k_hat", "v", "gate", "beta")}
    with pytest.raises(PlanError, match=r"^\w+: expected shape") as want:
        verify(**args)  # type: ignore[arg-type]
    with pytest.raises(PlanError) as got:
        sequential_decode(**window)
    assert str(got.value) == str(want.value)


def test_prepare_per_kind_is_prepare() -> None:
    """``prepare_kda`` / ``prepare_gdn``: ``prepare``'s signature without ``kind``, and its results."""
    params = list(inspect.signature(prepare).parameters.values())
    q = torch.randn(3, 2, 4)
    args = (q, q + 1, torch.randn(3, 2, 4), torch.randn(3, 2), torch.rand(2), torch.rand(2, 4))
    for kind, fn in (("kda", prepare_kda), ("gdn", prepare_gdn)):
        assert list(inspect.signature(fn).parameters.values()) == params[1:]
        assert fn.__name__ == f"prepare_{kind}" and fn.__doc__
        gate_args = args if kind == "kda" else (q, q + 1, args[3], args[3], args[4], args[4])
        for a, b in zip(fn(*gate_args, eps=1e-3), prepare(kind, *gate_args, eps=1e-3), strict=True):
            assert torch.equal(a, b)


def test_verify_bad_dtypes() -> None:
    args = _good()
    args["corrections_out"] = args["corrections_out"].bfloat16()
    with pytest.raises(PlanError, match="^corrections_out: expected dtype"):
        verify(**args)  # type: ignore[arg-type]
    args = _good()
    args["state"] = args["state"].to(torch.int32)
    with pytest.raises(PlanError, match="^state: expected a floating-point tensor"):
        verify(**args)  # type: ignore[arg-type]
    args = _good()
    args["keygate_out"] = torch.zeros(2, 2, 3, 4 + 1)  # GDN width for a KDA gate
    with pytest.raises(PlanError, match=r"^keygate_out: expected shape \[B=2, H=2, Q=3, 2K=8\]"):
        verify(**args)  # type: ignore[arg-type]


def test_commit_bad_input_names_argument() -> None:
    a = _good()
    state, corr, kg = a["state"], a["corrections_out"], a["keygate_out"]
    with pytest.raises(PlanError, match=r"^keygate: expected shape .*2K=8.*K\+1=5.*got \[2, 2, 3, 7\]"):
        commit(state, corr, torch.zeros(2, 2, 3, 7), 1)
    with pytest.raises(PlanError, match=r"^corrections: expected shape \[B=2, H=2, Q=3, V=5\], got \[2, 2, 3, 4\]"):
        commit(state, corr[..., :4], kg, 1)
    with pytest.raises(PlanError, match=r"^num_accepted: expected shape \[B=2\], got \[3\]"):
        commit(state, corr, kg, [1, 2, 3])
    with pytest.raises(PlanError, match="^num_accepted: expected an integer tensor"):
        commit(state, corr, kg, torch.tensor([1.0, 2.0]))
    with pytest.raises(PlanError, match=r"^out: expected shape \[B=2, H=2, V=5, K=4\]"):
        commit(state, corr, kg, 1, out=state[:1])


def test_prepare_and_conv_bad_input() -> None:
    q = torch.zeros(3, 2, 4)
    with pytest.raises(PlanError, match="^k: expected shape"):
        normalize_qk(q, torch.zeros(3, 2, 5))
    with pytest.raises(PlanError, match=r"^dt_bias: expected shape \[H=2, K=4\], got \[2, 3\]"):
        kda_gate(torch.zeros(3, 2, 4), torch.zeros(2), torch.zeros(2, 3))
    with pytest.raises(PlanError, match=r"^raw_g: expected shape"):
        prepare("gdn", q, q, torch.zeros(3, 2, 4), torch.zeros(3, 2), torch.zeros(2), torch.zeros(2))
    with pytest.raises(PlanError, match="^kind"):
        prepare("mamba", q, q, q, torch.zeros(3, 2), torch.zeros(2), torch.zeros(2))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="^window: expected"):
        compact_conv_window(torch.zeros(1, 4, 2), [1], 4, "DS")
    with pytest.raises(PlanError, match="^layout"):
        compact_conv_window(torch.zeros(1, 4, 6), [1], 4, "XY")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="^conv_kernel_size"):
        compact_conv_window(torch.zeros(1, 4, 6), [1], 0, "DS")


# ----------------------------------------------------------------------------------------------
# memory accounting


def test_record_bytes() -> None:
    # Kimi-K3-like KDA layer: 32 heads x 128 x 128, 8-token window.
    assert record_bytes("kda", 32, 128, 128, 8) == 32 * 8 * 128 * 4 + 32 * 8 * 256 * 4
    assert record_bytes("gdn", 32, 128, 128, 8, torch.bfloat16) == 32 * 8 * 128 * 4 + 32 * 8 * 129 * 2
    full = full_state_scratch_bytes(32, 128, 128, 8)
    assert full == 8 * 32 * 128 * 128 * 4
    assert full // record_bytes("gdn", 32, 128, 128, 8) >= 60  # one to two orders of magnitude
    with pytest.raises(PlanError, match="^num_heads"):
        record_bytes("kda", -1, 1, 1, 1)


# ----------------------------------------------------------------------------------------------
# GPU (skipped without CUDA)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_cuda_matches_cpu(kind: str) -> None:
    B, Q, H, K, V = 4, 6, 4, 32, 32
    state, prep, v = _window(kind, B, Q, H, K, V, seed=21)
    out, corr, kg = _verify(state, prep, v, kind)
    n = [0, 1, 3, Q]
    want = commit(state, corr, kg, n)
    dev = torch.device("cuda")
    s_d = state.to(dev)
    corr_d = torch.empty_like(corr, device=dev)
    kg_d = torch.empty_like(kg, device=dev)
    out_d = verify(s_d, *(x.to(dev) for x in (prep.q_hat, prep.k_hat, v, prep.gate, prep.beta)), corr_d, kg_d)
    torch.testing.assert_close(out_d.cpu(), out, **TOL_F32)
    got = commit(s_d, corr_d, kg_d, torch.tensor(n, device=dev), out=s_d)
    torch.testing.assert_close(got.cpu(), want, **TOL_F32)
