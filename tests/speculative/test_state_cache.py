"""Tests of :class:`recoverssm_rs.speculative.state_cache.StateCache`: verify + commit against the plain
token-by-token recurrence, align-mode boundary states, padding, rejected commits, steady state
(no reallocation over 1,000 steps) and the memory report.

Tolerances: ``TOL_F32`` (atol = rtol = 1e-5) for recurrent states against
:func:`recurrence.sequential_decode` run on the same (record-dtype rounded) keys and gates: the
commit folds the same float32 operations in a different order, O(1) states, Q = 4, so the error is
~1e-7 and any convention error is >= 1e-3 (see ``tests/speculative/test_recurrence.py``). Conv windows are pure
data movement and are compared bit for bit. ``n = 0`` commits and untouched blocks: bit for bit.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
import torch
from recoverssm_rs import LayoutError, PlanError, layouts
from recoverssm_rs.speculative import recurrence
from recoverssm_rs.speculative.state_cache import StateCache

TOL_F32 = dict(atol=1e-5, rtol=1e-5)

H, K, KC, NSPEC = 2, 8, 4, 3
Q = NSPEC + 1

# (kind, conv layout, conv + key/gate record dtype); recurrent states are float32.
CONFIGS = [
    ("gdn", "SD", "float32"),
    ("gdn", "DS", "bfloat16"),
    ("kda", "DS", "bfloat16"),
    ("kda", "SD", "float32"),
]
IDS = [f"{k}-{c}-{d}" for k, c, d in CONFIGS]


# ----------------------------------------------------------------------------------------------
# helpers


def make_layout(
    kind: str, conv_layout: str = "DS", dtype: str = "float32", *, heads: int = H, dim: int = K, num_spec: int = NSPEC
):
    common = dict(
        conv_kernel_size=KC,
        num_spec=num_spec,
        conv_layout=conv_layout,
        dtype=dtype,
        ssm_dtype="float32",
        recover_ssm=True,
    )
    if kind == "gdn":
        return layouts.gdn(num_k_heads=heads, num_v_heads=heads, head_k_dim=dim, head_v_dim=dim, **common)
    return layouts.kda(num_heads=heads, head_dim=dim, **common)


def make_cache(
    cfg, *, num_layers: int = 3, num_blocks: int = 24, max_requests: int = 6, seed: int = 0, **kw
) -> StateCache:
    """A cache whose every block (null block included) holds random states."""
    kind, conv_layout, dtype = cfg
    cache = StateCache(
        make_layout(kind, conv_layout, dtype, **kw),
        num_layers=num_layers,
        num_blocks=num_blocks,
        max_requests=max_requests,
    )
    g = torch.Generator().manual_seed(seed)
    bufs = cache.buffers()
    bufs["recurrent"].copy_(torch.randn(bufs["recurrent"].shape, generator=g) * 0.5)
    bufs["conv"].copy_(torch.randn(bufs["conv"].shape, generator=g))
    return cache


def window(cache: StateCache, batch: int, g: torch.Generator):
    """Random prepared window inputs ``(q_hat, k_hat, v, gate, beta)`` for ``cache``'s kind."""
    geo = cache.geometry
    h, k, v = int(geo["heads"]), int(geo["head_k_dim"]), int(geo["head_v_dim"])
    q_raw = torch.randn(batch, Q, h, k, generator=g)
    k_raw = torch.randn(batch, Q, h, k, generator=g)
    gshape = (batch, Q, h, k) if cache.kind == "kda" else (batch, Q, h)
    raw_g = torch.randn(gshape, generator=g)
    raw_b = torch.randn(batch, Q, h, generator=g)
    a_log = torch.rand(h, generator=g).log()
    dt_bias = torch.rand((h, k) if cache.kind == "kda" else (h,), generator=g) - 2.0
    p = recurrence.prepare(cache.kind, q_raw, k_raw, raw_g, raw_b, a_log, dt_bias)
    vals = torch.randn(batch, Q, h, v, generator=g)
    return p.q_hat, p.k_hat, vals, p.gate, p.beta


def reference_states(cache: StateCache, layer: int, state0: torch.Tensor, inputs) -> torch.Tensor:
    """``[B, Q + 1, H, V, K]`` states of the plain recurrence, one token at a time, on the keys and
    gates as the records hold them (rounded through the key+gate record dtype)."""
    q_hat, k_hat, v, gate, beta = inputs
    kg = cache.workspace(layer)[1].dtype
    k_r, g_r = k_hat.to(kg).float(), gate.to(kg).float()
    states = [state0.float()]
    s = state0.float()
    for t in range(q_hat.shape[1]):
        sl = slice(t, t + 1)
        _, st = recurrence.sequential_decode(s, q_hat[:, sl], k_r[:, sl], v[:, sl], g_r[:, sl], beta[:, sl])
        s = st[:, 1]
        states.append(s)
    return torch.stack(states, dim=1)


def conv_head(cache: StateCache, layer: int, blocks) -> torch.Tensor:
    """``[B, dim, K-1]`` conv history (first ``K-1`` window columns) of ``blocks``, DS order."""
    win = cache.conv_state(layer)[torch.as_tensor(blocks)]
    if cache.conv_layout == "SD":
        win = win.transpose(1, 2)
    return win[:, :, : cache.conv_kernel_size - 1].clone()


def conv_inputs(cache: StateCache, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    dim = int(cache.geometry["conv_dim"])
    x = torch.randn(batch, Q, dim, generator=g).to(cache.conv_state(0).dtype)
    w = torch.randn(dim, cache.conv_kernel_size, generator=g)
    return x, w


def snapshot(cache: StateCache) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in cache.buffers().items()}


def assert_buffers_equal(cache: StateCache, before: dict[str, torch.Tensor]) -> None:
    for name, buf in cache.buffers().items():
        assert torch.equal(buf, before[name]), f"{name} changed"


# ----------------------------------------------------------------------------------------------
# verify + commit == sequential decoding


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_verify_commit_matches_sequential_decoding(cfg):
    """Several layers, several steps, accepted counts covering 0 (nothing) .. Q (everything)."""
    cache = make_cache(cfg)
    g = torch.Generator().manual_seed(1)
    blocks = np.array([3, 7, 1, 12, 5])
    counts = [np.array([0, 1, Q, 2, 3]), np.array([Q, 0, 2, 1, Q]), np.array([2, Q, 0, 3, 1])]
    for n in counts:
        expected = []
        for layer in range(cache.num_layers):
            state0 = cache.recurrent_state(layer)[torch.as_tensor(blocks)].clone()
            inputs = window(cache, len(blocks), g)
            cache.verify(layer, blocks, *inputs)
            ref = reference_states(cache, layer, state0, inputs)
            expected.append((state0, ref[torch.arange(len(blocks)), torch.as_tensor(n)]))
        rows = cache.commit(n, blocks)
        assert list(rows["count"]) == list(n)
        for layer, (state0, want) in enumerate(expected):
            got = cache.recurrent_state(layer)[torch.as_tensor(blocks)]
            torch.testing.assert_close(got, want, **TOL_F32)
            zero = n == 0
            assert torch.equal(got[torch.as_tensor(zero)], state0[torch.as_tensor(zero)]), (
                "a commit of 0 tokens must leave the state unchanged bit for bit"
            )


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_conv_verify_and_commit_match_a_plain_conv(cfg):
    """Engine semantics (num_accepted in 1..Q): conv outputs and compacted windows against a plain
    causal conv over the accepted inputs, every layer, several steps."""
    cache = make_cache(cfg)
    g = torch.Generator().manual_seed(2)
    blocks = np.array([2, 9, 4, 11])
    for n in (np.array([1, Q, 2, 3]), np.array([Q, 1, 3, 2]), np.array([2, 2, Q, 1])):
        want_heads = []
        for layer in range(cache.num_layers):
            hist = conv_head(cache, layer, blocks)  # [B, dim, K-1]
            x, w = conv_inputs(cache, len(blocks), g)
            y = cache.conv_verify(layer, blocks, x, w)
            seq = torch.cat([hist, x.transpose(1, 2)], dim=2)  # [B, dim, K-1+Q]
            y_ref = (seq.float().unfold(2, KC, 1) * w[None, :, None, :]).sum(-1).transpose(1, 2)
            torch.testing.assert_close(y, y_ref, **TOL_F32)
            want_heads.append(torch.stack([seq[b, :, int(c) : int(c) + KC - 1] for b, c in enumerate(n)]))
            cache.verify(layer, blocks, *window(cache, len(blocks), g))
        cache.commit(n, blocks)
        for layer, want in enumerate(want_heads):
            assert torch.equal(conv_head(cache, layer, blocks), want)


def test_conv_window_after_zero_accepted_is_unchanged():
    cache = make_cache(("kda", "DS", "float32"), num_layers=1)
    g = torch.Generator().manual_seed(3)
    blocks = np.array([3])
    before = conv_head(cache, 0, blocks)
    x, w = conv_inputs(cache, 1, g)
    cache.conv_verify(0, blocks, x, w)
    cache.verify(0, blocks, *window(cache, 1, g))
    cache.commit([0], blocks)
    assert torch.equal(conv_head(cache, 0, blocks), before)


# ----------------------------------------------------------------------------------------------
# align mode


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]], ids=[IDS[0], IDS[2]])
def test_align_mode_writes_boundary_states(cfg):
    bs = 8
    cache = make_cache(cfg, num_blocks=32)
    g = torch.Generator().manual_seed(4)
    blocks = np.array([1, 2, 3, 4, 5, 6])
    seq_lens = np.array([6, 13, 16, 3, 4, 15])
    n = np.array([3, 2, Q, 1, Q, 1])
    # crossings: r0 6+3 -> 8 after 2 tokens (col 0); r4 4+4 -> 8 after 4 (col 0);
    # r5 15+1 -> 16 after 1 (col 1); r1 (15), r2 (20: 16 is not > 16), r3 (4): none.
    want_bnd = {0: (0, 2), 4: (0, 4), 5: (1, 1)}
    table = np.arange(10, 10 + 6 * 3).reshape(6, 3)
    before = snapshot(cache)
    expect = {}
    for layer in range(cache.num_layers):
        hist = conv_head(cache, layer, blocks)
        x, w = conv_inputs(cache, len(blocks), g)
        cache.conv_verify(layer, blocks, x, w)
        seq = torch.cat([hist, x.transpose(1, 2)], dim=2)
        state0 = cache.recurrent_state(layer)[torch.as_tensor(blocks)].clone()
        inputs = window(cache, len(blocks), g)
        cache.verify(layer, blocks, *inputs)
        expect[layer] = (reference_states(cache, layer, state0, inputs), seq)
    rows = cache.commit(n, blocks, seq_lens=seq_lens, block_table=table, block_size=bs)
    got_bnd = {
        int(r["request"]): (int(r["boundary_block"]), int(r["boundary_len"])) for r in rows if r["boundary_block"] >= 0
    }
    assert got_bnd == {r: (int(table[r, c]), m) for r, (c, m) in want_bnd.items()}
    written = {int(table[r, c]) for r, (c, _m) in want_bnd.items()}
    for layer, (ref, seq) in expect.items():
        # running states: the state after n tokens; conv: the history after n inputs
        got = cache.recurrent_state(layer)[torch.as_tensor(blocks)]
        torch.testing.assert_close(got, ref[torch.arange(6), torch.as_tensor(n)], **TOL_F32)
        for r, (c, m) in want_bnd.items():
            bb = int(table[r, c])
            torch.testing.assert_close(cache.recurrent_state(layer)[bb], ref[r, m], **TOL_F32)
            assert torch.equal(conv_head(cache, layer, [bb])[0], seq[r, :, m : m + KC - 1])
        # every other block-table block (non-crossing requests included) is untouched
        for b in table.flatten().tolist():
            if b not in written:
                assert torch.equal(cache.recurrent_state(layer)[b], before["recurrent"][layer, b])
                assert torch.equal(cache.conv_state(layer)[b], before["conv"][layer, b])


# ----------------------------------------------------------------------------------------------
# padding and rejected commits


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[2]], ids=[IDS[1], IDS[2]])
def test_padding_rows_leave_every_state_untouched(cfg):
    cache = make_cache(cfg)
    g = torch.Generator().manual_seed(5)
    # rows: real, block -1, null block 0, real block with query_len 0, real
    blocks = np.array([4, -1, 0, 6, 8])
    qlens = np.array([Q, Q, Q, 0, 3])
    n = np.array([2, 3, Q, 2, 3])
    seq_lens = np.array([7, 7, 7, 7, 0])  # the padding rows would cross 8 if they were real
    table = np.arange(12, 22).reshape(5, 2)
    before = snapshot(cache)
    ref = {}
    for layer in range(cache.num_layers):
        state0 = cache.recurrent_state(layer)[torch.as_tensor(blocks)].clone()
        inputs = window(cache, len(blocks), g)
        cache.verify(layer, blocks, *inputs, query_lens=qlens)
        ref[layer] = reference_states(cache, layer, state0, inputs)
    rows = cache.commit(n, blocks, qlens, seq_lens=seq_lens, block_table=table, block_size=8)
    assert [int(r["request"]) for r in rows] == [0, 4]
    assert [int(r["boundary_block"]) for r in rows] == [12, -1]
    changed = {4, 8, 12}  # the two real running blocks and row 0's boundary block
    for layer in range(cache.num_layers):
        torch.testing.assert_close(cache.recurrent_state(layer)[4], ref[layer][0, 2], **TOL_F32)
        torch.testing.assert_close(cache.recurrent_state(layer)[8], ref[layer][4, 3], **TOL_F32)
        for b in range(cache.num_blocks):
            if b not in changed:
                assert torch.equal(cache.recurrent_state(layer)[b], before["recurrent"][layer, b]), b
                assert torch.equal(cache.conv_state(layer)[b], before["conv"][layer, b]), b


def test_conv_verify_padding_rows_leave_every_state_untouched():
    cache = make_cache(("gdn", "SD", "float32"), num_layers=1, num_blocks=8)
    g = torch.Generator().manual_seed(6)
    before = snapshot(cache)
    x, w = conv_inputs(cache, 2, g)
    cache.conv_verify(0, np.array([5, -1]), x, w)
    cache.verify(0, np.array([5, -1]), *window(cache, 2, g))
    cache.commit([2, 2], np.array([5, -1]))
    for b in range(cache.num_blocks):
        if b != 5:
            assert torch.equal(cache.conv_state(0)[b], before["conv"][0, b]), f"block {b}"


REJECTED = {
    # name: (state_blocks, num_accepted, query_lens, seq_lens, block_table, message)
    "same state block": ([3, 5, 3], [2, 2, 2], [Q, Q, Q], None, None, "requests 0 and 2 both write block 3"),
    "query_len above the window": ([3, 5], [2, 2], [Q, Q + 1], None, None, f"request 1: query_len = {Q + 1}"),
    "negative query_len": ([3, 5], [2, 2], [-1, Q], None, None, "request 0: query_len = -1"),
    "block outside the pool": ([3, 99], [1, 1], [Q, Q], None, None, "request 1: state block 99"),
    "boundary block is the running block": (
        [3, 5],
        [2, 2],
        [Q, Q],
        [0, 7],
        [[9, 10], [5, 11]],
        "request 1: the boundary block (column 0) is the request's running state block 5",
    ),
    "boundary block shared": ([3, 5], [2, 2], [Q, Q], [7, 7], [[9, 10], [9, 11]], "both write block 9"),
    "boundary block is the null block": (
        [3, 5],
        [2, 2],
        [Q, Q],
        [7, 0],
        [[0, 10], [9, 11]],
        "request 0: the boundary block (column 0) is 0",
    ),
}


@pytest.mark.parametrize("case", list(REJECTED), ids=list(REJECTED))
def test_rejected_commit_raises_and_changes_nothing(case):
    sb, n, ql, seq, table, msg = REJECTED[case]
    cache = make_cache(("kda", "DS", "bfloat16"), num_layers=2)
    g = torch.Generator().manual_seed(7)
    blocks = np.arange(1, len(sb) + 1)  # distinct running blocks: verify itself checks them
    for layer in range(cache.num_layers):  # fill the workspace rows
        cache.verify(layer, blocks, *window(cache, len(sb), g))
    before = snapshot(cache)
    align = {} if seq is None else dict(seq_lens=seq, block_table=np.array(table), block_size=8)
    with pytest.raises(PlanError, match="request") as info:
        cache.commit(n, sb, ql, **align)
    assert msg in str(info.value)
    assert_buffers_equal(cache, before)


def test_align_mode_needs_all_three_inputs():
    cache = make_cache(("gdn", "SD", "float32"), num_layers=1)
    before = snapshot(cache)
    with pytest.raises(PlanError, match="all three or none"):
        cache.commit([1], [3], seq_lens=[0])
    assert_buffers_equal(cache, before)


# ----------------------------------------------------------------------------------------------
# steady state


def test_steady_state_1000_steps_reallocates_nothing():
    cache = make_cache(("gdn", "SD", "float32"), num_layers=1, num_blocks=16, max_requests=2, heads=1, dim=4)
    g = torch.Generator().manual_seed(8)
    bufs = cache.buffers()
    ptrs = {k: v.data_ptr() for k, v in bufs.items()}
    nbufs = len(bufs)
    views = [t.data_ptr() for t in (*cache.workspace(0), cache.conv_state(0), cache.recurrent_state(0))]
    blocks = np.array([1, 2])
    table = np.array([[3, 4, 5], [6, 7, 8]])
    x, w = conv_inputs(cache, 2, g)
    inputs = window(cache, 2, g)
    seg_ptrs: set[int] = set()
    grown = []

    for step in range(1000):
        if step == 100:
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        cache.conv_verify(0, blocks, x, w)
        cache.verify(0, blocks, *inputs)
        seq = np.array([(3 * step) % 8, (5 * step) % 8])
        rows = cache.commit(
            np.array([1 + step % Q, 1 + (step // 2) % Q]), blocks, seq_lens=seq, block_table=table, block_size=4
        )
        plan = cache.planner.plan_copy(np.array([1, 2]), np.array([9 + step % 3, 12]))
        seg_ptrs.add(plan.segments.ctypes.data)
        plan.execute()
        del plan, rows
        assert {k: v.data_ptr() for k, v in cache.buffers().items()} == ptrs
        assert len(cache.buffers()) == nbufs
        if step >= 100 and step % 100 == 99:
            gc.collect()
            grown.append(tracemalloc.get_traced_memory()[0] - base)
    tracemalloc.stop()
    assert [t.data_ptr() for t in (*cache.workspace(0), cache.conv_state(0), cache.recurrent_state(0))] == views
    # Copy plans' segment tables come from a few recycled buffers, not a growing set of
    # allocations. (Commit plans' 32-byte rows are fresh small allocations each step, so their
    # addresses churn; that they are released is what the tracemalloc bound below checks: each
    # plan's buffer object is a tracked Python object.)
    assert len(seg_ptrs) <= 4, len(seg_ptrs)
    # Python-side memory does not grow with the number of steps.
    assert max(grown) < 64 * 1024, grown
    assert grown[-1] <= grown[0] + 16 * 1024, grown


# ----------------------------------------------------------------------------------------------
# memory report and layout checks


def test_memory_report_of_the_kimi_k3_like_preset():
    p = layouts.PRESETS["kimi-k3-like-recoverssm"]
    layout = p.layout()
    g = layout.recover_geometry()
    h, v, k, q = g["heads"], g["head_v_dim"], g["head_k_dim"], g["window"]
    assert (h, v, k, q) == (32, 128, 128, 8) and p.num_layers == 48
    records = h * q * (v * 4 + 2 * k * 2)  # fp32 corrections + bf16 key+gate [H, Q, 2K]
    scratch = q * h * v * k * 4  # one fp32 state per window token
    assert records == 262_144 and scratch == 16_777_216
    assert layout.workspace_bytes_per_request == records
    assert recurrence.record_bytes("kda", h, k, v, q, torch.bfloat16) == records
    assert recurrence.full_state_scratch_bytes(h, k, v, q, torch.float32) == scratch
    assert scratch // records == 64
    # whole model, 256 requests: 3 GiB of records instead of 192 GiB of full states
    assert records * 48 * 256 == 3 * 2**30 and scratch * 48 * 256 == 192 * 2**30

    cache = StateCache(layout, num_layers=2, num_blocks=2, max_requests=3)
    rep = cache.memory_report()
    conv = 12288 * 10 * 2
    state = 32 * 128 * 128 * 4
    assert rep.persistent_bytes_per_block == 2 * (conv + state) == 2 * 2_342_912
    assert rep.pool_bytes == 2 * rep.persistent_bytes_per_block
    # the workspace: the layout's records plus each request's verified conv window
    assert rep.record_bytes_per_request == 2 * records
    assert rep.workspace_bytes_per_request == 2 * (records + conv)
    assert rep.workspace_bytes == 3 * 2 * (records + conv)
    assert rep.full_state_scratch_bytes == 3 * 2 * scratch
    assert rep.scratch_ratio == scratch / (records + conv)
    assert rep.window == 8
    assert rep.as_dict()["scratch_ratio"] == rep.scratch_ratio
    # the workspace is allocated as reported
    ws = cache.buffers()
    assert ws["corrections"].nbytes + ws["keygate"].nbytes + ws["conv_window"].nbytes == rep.workspace_bytes


@pytest.mark.parametrize(
    "layout",
    [
        layouts.kda(num_heads=2, head_dim=8, conv_kernel_size=4, num_spec=3),
        layouts.gdn(num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, conv_kernel_size=4, num_spec=3),
        layouts.mamba1(intermediate_size=8, state_size=4, conv_kernel=4),
    ],
    ids=["kda-plain", "gdn-plain", "mamba1"],
)
def test_non_recover_ssm_layout_is_rejected(layout):
    with pytest.raises(LayoutError, match="not a RecoverSSM layout"):
        StateCache(layout, num_layers=1, num_blocks=4, max_requests=2)
