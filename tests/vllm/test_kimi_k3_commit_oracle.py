"""The Kimi-K3 RecoverSSM commit over vLLM's own tensors against vLLM 0.33.0's
(``KimiK3KDAMetadata.commit_recoverssm_state`` -> ``KDARecoverSSMCommitContext.commit``, its
Triton kernels run by Triton's interpreter on CPU; see :mod:`support.vllm_kimi_k3_oracle`).

Random small shapes and multi-step traces (padding rows, counts of 0 and beyond the query, query
lengths shorter than the window, a row -> request map, align mode with block boundaries crossed or
landed on, null block-table entries, both conv layouts, raw records in float32 and bfloat16, with
and without the gate's lower bound): vLLM's commit and the package's
(:class:`recoverssm_rs.speculative.kimi_k3.KimiK3Commit`) run on equal copies of the layers'
tensors. The conv states must be equal byte for byte (the compaction is a copy), the set of state
blocks written must be the same, every block not written byte-equal, and the written states
within ``1e-5`` (absolute and relative; the tolerance the V2 RecoverSSM oracle uses between the
package's commit kernel and its torch reference). Why not byte-equal: the fold evaluates ``exp``,
``log`` and ``1/sqrt`` of float32 values and a sum over the key channels; under Triton's
interpreter vLLM's kernel evaluates them with numpy (its own SIMD ``exp`` / ``log``, pairwise
summation), the package with torch (SLEEF ``exp`` / ``log``, its vectorised reduction): the two
libraries' float32 ``exp`` differ in the last bit on ~40% of inputs, so a result can differ by an
ulp per token folded (compiled Triton on a GPU uses yet another ``exp``). Every other operation
is done in vLLM's order (newest token first, each update scaled by the later decays), so the
differences stay at that rounding level; a wrong count, block, gate or boundary moves states by
far more (checked: :func:`test_the_comparison_sees_an_off_by_one_count`).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np
import pytest
import torch
from recoverssm_rs import BindingError, PlanError
from recoverssm_rs.speculative.kimi_k3 import KimiK3Commit
from support import vllm_kimi_k3_oracle, vllm_oracle

TOL = 1e-5


@pytest.fixture(scope="module")
def oracle() -> Any:
    return vllm_oracle.load_or_skip(vllm_kimi_k3_oracle.load, "vLLM 0.33.0")


@dataclasses.dataclass
class Shape:
    layers: int
    blocks: int
    heads: int
    v: int
    k: int
    q: int
    hist: int
    conv_dim: int
    max_reqs: int
    kg_dtype: torch.dtype
    lower_bound: float | None
    dim_first: bool


def random_shape(rng: np.random.Generator) -> Shape:
    return Shape(
        layers=int(rng.integers(1, 3)),
        blocks=48,
        heads=int(rng.integers(1, 3)),
        v=int(rng.choice([4, 6, 8])),
        k=int(rng.choice([4, 5, 8])),
        q=int(rng.integers(2, 5)),
        hist=int(rng.integers(2, 4)),  # conv kernel 3 or 4 (Kimi-K3: 4)
        conv_dim=int(rng.choice([3, 8])),
        max_reqs=6,
        kg_dtype=torch.bfloat16 if rng.random() < 0.5 else torch.float32,
        lower_bound=None if rng.random() < 0.5 else -5.0,
        dim_first=bool(rng.random() < 0.5),
    )


def make_layers(s: Shape, ops: Any, gen: torch.Generator) -> list[Any]:
    """Two equal sets of KDA layers (vLLM's attributes) with random contents."""
    sets: list[list[Any]] = [[], []]
    L = s.hist + s.q - 1
    for _ in range(s.layers):
        conv_shape = (s.blocks, s.conv_dim, L) if s.dim_first else (s.blocks, L, s.conv_dim)
        tensors = dict(
            conv=torch.randn(conv_shape, generator=gen),
            state=torch.randn(s.blocks, s.heads, s.v, s.k, generator=gen),
            corr=torch.randn(s.max_reqs, s.heads, s.q, s.v, generator=gen) * 0.5,
            kg=(torch.randn(s.max_reqs, s.heads, s.q, 2 * s.k, generator=gen)).to(s.kg_dtype),
            A_log=torch.randn(s.heads, generator=gen) * 0.5,
            dt_bias=torch.randn(s.heads * s.k, generator=gen),
        )
        for out in sets:
            t = {n: x.clone() for n, x in tensors.items()}
            out.append(_layer(ops, t, s))
    return sets


def _layer(ops: Any, t: dict[str, torch.Tensor], s: Shape) -> Any:
    return types.SimpleNamespace(
        kv_cache=[t["conv"], t["state"]],
        recoverssm_records=ops.KDARecoverSSMRecords(t["corr"], t["kg"]),
        A_log=t["A_log"],
        dt_bias=t["dt_bias"],
        local_num_heads=s.heads,
        head_dim=s.k,
        gate_lower_bound=s.lower_bound,
    )


@dataclasses.dataclass
class Step:
    num_accepted: torch.Tensor
    state_indices: torch.Tensor  # [n, 1 + num_spec_blocks] as vLLM's spec state indices
    query_start_loc: torch.Tensor
    request_indices: torch.Tensor | None
    align: tuple[torch.Tensor, torch.Tensor, int] | None


def random_step(s: Shape, rng: np.random.Generator, align: bool) -> Step:
    """One step's metadata: rows of distinct requests, each request owning distinct blocks (its
    block table row; its running block inside it or apart), some padding rows and null entries."""
    n = int(rng.integers(0, s.max_reqs + 1))
    num_reqs = s.max_reqs + 2
    reqs = rng.permutation(num_reqs)[:n]
    qlens = rng.integers(0, s.q + 1, size=n)
    qsl = np.concatenate([[0], np.cumsum(qlens)])
    num_accepted = torch.tensor(rng.integers(-1, s.q + 3, size=num_reqs), dtype=torch.int32)
    cols = 4
    blocks = rng.permutation(np.arange(1, s.blocks))[: num_reqs * (cols + 1)].reshape(num_reqs, cols + 1)
    bs = int(rng.integers(s.q, s.q + 4))
    computed = rng.integers(0, bs * (cols - 1), size=num_reqs)
    table = blocks[:, :cols].copy()
    table[rng.random(table.shape) < 0.1] = 0  # null entries: nothing written there
    src = blocks[:, cols].copy()
    if align:  # the running state in the block of the last computed token, or apart
        at = np.maximum(computed - 1, 0) // bs
        inside = rng.random(num_reqs) < 0.5
        src = np.where(inside & (table[np.arange(num_reqs), at] > 0), table[np.arange(num_reqs), at], src)
    si = src[reqs].copy()
    si[rng.random(n) < 0.15] = 0  # padding rows
    state_indices = torch.tensor(np.stack([si, np.zeros_like(si)], axis=1), dtype=torch.int32)
    use_map = align or rng.random() < 0.7
    return Step(
        num_accepted=num_accepted,
        state_indices=state_indices,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        request_indices=torch.tensor(reqs, dtype=torch.int32) if use_map else None,
        align=(torch.tensor(table, dtype=torch.int32), torch.tensor(computed, dtype=torch.int32), bs)
        if align
        else None,
    )


def metadata(oracle: Any, step: Step, context: Any) -> Any:
    m = oracle.meta
    align = None
    if step.align is not None:
        align = m.KDARecoverSSMAlignMetadata(
            block_table=step.align[0], num_computed_tokens=step.align[1], block_size=step.align[2]
        )
    commit = m.KDARecoverSSMCommitMetadata(
        state_indices=step.state_indices,
        query_start_loc=step.query_start_loc,
        request_indices=step.request_indices,
        align=align,
    )
    return m.KimiK3KDAMetadata(
        num_spec_decodes=int(step.state_indices.shape[0]), recoverssm_commit=commit, recoverssm_context=context
    )


def snapshot(layers: list[Any]) -> list[list[torch.Tensor]]:
    return [[layer.kv_cache[0].clone(), layer.kv_cache[1].clone()] for layer in layers]


def compare(before: list[list[torch.Tensor]], vl: list[Any], ours: list[Any], where: str) -> int:
    """Conv states byte-equal; the same state blocks written; unwritten blocks byte-equal; written
    ones within TOL. Returns the number of state blocks written (over all layers)."""
    written = 0
    for i, (b, lv, lo) in enumerate(zip(before, vl, ours, strict=True)):
        assert torch.equal(lv.kv_cache[0], lo.kv_cache[0]), f"{where}: layer {i}: conv states differ"
        sv, so = lv.kv_cache[1], lo.kv_cache[1]
        moved_v = (sv != b[1]).flatten(1).any(1)
        moved_o = (so != b[1]).flatten(1).any(1)
        assert torch.equal(moved_v, moved_o), (
            f"{where}: layer {i}: blocks written: vLLM {moved_v.nonzero().flatten().tolist()}, "
            f"ours {moved_o.nonzero().flatten().tolist()}"
        )
        assert torch.equal(sv[~moved_v], so[~moved_v]), f"{where}: layer {i}: an unwritten block differs"
        assert torch.allclose(sv, so, atol=TOL, rtol=TOL), (
            f"{where}: layer {i}: states differ by {(sv - so).abs().max().item():.3g}"
        )
        written += int(moved_v.sum())
    return written


def sync(vl: list[Any], ours: list[Any]) -> None:
    """Our states := vLLM's (each step then starts from equal bytes)."""
    for lv, lo in zip(vl, ours, strict=True):
        lo.kv_cache[1].copy_(lv.kv_cache[1])


def new_records(vl: list[Any], ours: list[Any], gen: torch.Generator) -> None:
    for lv, lo in zip(vl, ours, strict=True):
        for name in ("correction", "key_gate"):
            t = getattr(lv.recoverssm_records, name)
            t.copy_((torch.randn(t.shape, generator=gen) * 0.5).to(t.dtype))
            getattr(lo.recoverssm_records, name).copy_(t)


@pytest.mark.parametrize("seed", range(6))
def test_commit_matches_vllm(oracle: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    s = random_shape(rng)
    oracle.conv.dim_first = s.dim_first
    vl, ours = make_layers(s, oracle.ops, gen)
    ctx = oracle.ops.KDARecoverSSMCommitContext.create(vl, spec_query_len=s.q, max_num_reqs=s.max_reqs)
    pkg = KimiK3Commit.from_layers(ours, spec_query_len=s.q, conv_dim_first=s.dim_first)
    written = boundaries = 0
    for step_no in range(6):
        align = bool(seed % 2) or step_no % 3 == 2
        step = random_step(s, rng, align)
        new_records(vl, ours, gen)
        before = snapshot(vl)
        with vllm_kimi_k3_oracle.integer_masks():
            got_v = metadata(oracle, step, ctx).commit_recoverssm_state(step.num_accepted)
        got_o = pkg.commit_metadata(metadata(oracle, step, None), step.num_accepted)
        assert (got_v is None) == (got_o is None)
        written += compare(before, vl, ours, f"seed {seed}, step {step_no} (align {align})")
        plan = pkg.plan(
            step.num_accepted,
            step.state_indices[:, 0],
            step.query_start_loc,
            step.request_indices,
            *(step.align if step.align is not None else (None, None, None)),
        )
        boundaries += sum(1 for b in plan[5] if b > 0)
        sync(vl, ours)
    assert written > 0, "the trace wrote nothing: it checks nothing"
    if seed % 2:  # every step in align mode: some boundary states were written and compared
        assert boundaries > 0


def _one(oracle: Any, seed: int = 3) -> tuple[Shape, list[Any], list[Any], KimiK3Commit, Step]:
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    s = random_shape(rng)
    oracle.conv.dim_first = s.dim_first
    vl, ours = make_layers(s, oracle.ops, gen)
    pkg = KimiK3Commit.from_layers(ours, spec_query_len=s.q, conv_dim_first=s.dim_first)
    step = random_step(s, rng, True)
    while int((step.state_indices[:, 0] > 0).sum()) == 0:
        step = random_step(s, rng, True)
    return s, vl, ours, pkg, step


def test_the_comparison_sees_an_off_by_one_count(oracle: Any) -> None:
    """A commit of one token fewer than vLLM's is caught (the tolerance is not loose)."""
    s, vl, ours, pkg, step = _one(oracle)
    n = int(step.state_indices.shape[0])
    step.query_start_loc = torch.arange(n + 1, dtype=torch.int32) * s.q  # full windows (Q >= 2)
    step.num_accepted = torch.full_like(step.num_accepted, 2)
    ctx = oracle.ops.KDARecoverSSMCommitContext.create(vl, spec_query_len=s.q, max_num_reqs=s.max_reqs)
    before = snapshot(vl)
    with vllm_kimi_k3_oracle.integer_masks():
        metadata(oracle, step, ctx).commit_recoverssm_state(step.num_accepted)
    pkg.commit_metadata(metadata(oracle, step, None), step.num_accepted - 1)
    with pytest.raises(AssertionError):
        compare(before, vl, ours, "planted fault")


def _all(layers: list[Any]) -> list[torch.Tensor]:
    out = []
    for layer in layers:
        out += [layer.kv_cache[0], layer.kv_cache[1], layer.recoverssm_records.correction]
        out += [layer.recoverssm_records.key_gate]
    return [t.clone() for t in out]


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("state_out_of_range", ["row 0", "state index 48 is outside 0 ..= 47"]),
        ("request_out_of_range", ["row 0 (request 99)", "outside 0 ..= "]),
        ("duplicate_row", ["both write block"]),
        ("short_query_start_loc", ["query_start_loc needs batch + 1"]),
        ("small_block_size", ["block_size 1 must cover one speculative window"]),
        ("negative_computed", ["num_computed_tokens -4 is negative"]),
    ],
)
def test_bad_metadata_is_refused_and_writes_nothing(oracle: Any, fault: str, words: list[str]) -> None:
    s, _, ours, pkg, step = _one(oracle)
    si = step.state_indices[:, 0].clone()
    qsl, ri = step.query_start_loc.clone(), step.request_indices.clone()  # type: ignore[union-attr]
    bt, nc, bs = step.align  # type: ignore[misc]
    na = step.num_accepted.clamp(min=1)
    first = int((si > 0).nonzero()[0])
    si, qsl, ri = si[first:], qsl[first:] - qsl[first], ri[first:]
    if fault == "state_out_of_range":
        si[0] = s.blocks
    elif fault == "request_out_of_range":
        ri[0] = 99
    elif fault == "duplicate_row":
        si, ri = torch.cat([si[:1], si[:1]]), torch.cat([ri[:1], ri[:1]])
        qsl = torch.tensor([0, s.q, 2 * s.q], dtype=torch.int32)
    elif fault == "short_query_start_loc":
        qsl = qsl[:-1]
    elif fault == "small_block_size":
        bs = 1
    elif fault == "negative_computed":
        nc = nc.clone()
        nc[int(ri[0])] = -4
    before = _all(ours)
    with pytest.raises(PlanError) as e:
        pkg.commit(na, si, qsl, ri, bt, nc, bs)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(before, _all(ours), strict=True)), "a refused commit wrote"


def test_layers_that_do_not_make_one_commit(oracle: Any) -> None:
    s, _, ours, _, _ = _one(oracle)
    ours[-1].gate_lower_bound = 1.5 if s.lower_bound is None else None
    with pytest.raises(BindingError, match=f"layer {len(ours) - 1}: gate_lower_bound"):
        KimiK3Commit.from_layers(ours, spec_query_len=s.q, conv_dim_first=s.dim_first)
    ours[-1].gate_lower_bound = s.lower_bound
    with pytest.raises(BindingError, match=rf"layer 0: correction must be \[max_num_reqs, H={s.heads}, Q={s.q + 1}"):
        KimiK3Commit.from_layers(ours, spec_query_len=s.q + 1, conv_dim_first=s.dim_first)
    records = ours[0].recoverssm_records
    ours[0].recoverssm_records = type(records)(records.correction.double(), records.key_gate)
    with pytest.raises(BindingError, match="layer 0: correction must be float32"):
        KimiK3Commit.from_layers(ours, spec_query_len=s.q, conv_dim_first=s.dim_first)


def test_a_repointed_state_is_refused(oracle: Any) -> None:
    s, _, ours, pkg, step = _one(oracle)
    ours[0].kv_cache[1].set_(ours[0].kv_cache[1].clone())
    with pytest.raises(BindingError, match="Kimi-K3 layer 0 state"):
        bt, nc, bs = step.align  # type: ignore[misc]
        pkg.commit(
            step.num_accepted.clamp(min=1),
            step.state_indices[:, 0],
            step.query_start_loc,
            step.request_indices,
            bt,
            nc,
            bs,
        )
