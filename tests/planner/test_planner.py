"""Planner / CopyPlan on CPU tensors, executed by the host executor.

* Property tests (hypothesis): random layouts, pools (separate tensors or strided page views into
  one byte buffer) and steps; every executed plan is compared byte for byte with a naive reference
  written from docs/design.md section 3, and a model of the validation rules predicts exactly which
  steps the planner rejects (and which request the message names). A rejected step moves nothing.
* Targeted tests for every PlanError rule, hazard ordering (waves), in-block conv shifts, inputs.
* Plan inspection: the zero-copy record views, coalescing, tiles, compact rows, reprs.
* Steady state: segment buffers come from a small pool.
"""

from __future__ import annotations

import gc
import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from recoverssm_rs import Layout, PlanError, StateSpec  # noqa: E402
from recoverssm_rs.plan_format import MOVE_ROW_DTYPE, SEGMENT_DTYPE, TILE_DTYPE  # noqa: E402
from recoverssm_rs.planner import CopyPlan, Planner  # noqa: E402

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "uint8": torch.uint8}


# ------------------------------------------------------------------------------------------------
# Pools: separate tensors, or strided views into one byte buffer of pages
# ------------------------------------------------------------------------------------------------


def dense_strides(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def random_bytes(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


def separate_states(layout, num_layers, num_blocks, seed):
    """One freshly allocated, random-filled tensor per (layer, persistent state)."""
    states = []
    for l in range(num_layers):
        layer = []
        for j, s in enumerate(layout.persistent):
            raw = random_bytes((num_blocks, s.nbytes), seed * 1009 + l * 31 + j)
            layer.append(raw.view(TORCH_DTYPES[s.dtype]).view(num_blocks, *s.shape))
        states.append(layer)
    return states


def page_offsets(layout, num_layers, gaps):
    """Offsets of every (layer, state) inside one page (16-byte aligned, optional gaps)."""
    offs, pos, g = [], 0, iter(gaps)
    for _ in range(num_layers):
        row = []
        for s in layout.persistent:
            pos += 16 * next(g, 0)
            row.append(pos)
            pos += -(-s.nbytes // 16) * 16
        offs.append(row)
    page = pos + 16 * next(g, 0)
    return offs, max(page, 16)


def page_view(buf, off, spec):
    """``[num_blocks, *spec.shape]`` view of ``buf[:, off:off + nbytes]`` (``.view(dtype)`` on the
    byte slice, then ``as_strided``)."""
    nb, page = buf.shape
    isz = spec.itemsize
    v = buf[:, off : off + spec.nbytes].view(TORCH_DTYPES[spec.dtype])
    return v.as_strided([nb, *spec.shape], [page // isz, *dense_strides(spec.shape)], v.storage_offset())


def paged_states(layout, num_layers, num_blocks, seed, gaps=()):
    """A uint8 buffer ``[num_blocks, page_bytes]``: per block, every layer's states one after
    another; the states are strided views into it."""
    offs, page = page_offsets(layout, num_layers, gaps)
    buf = random_bytes((num_blocks, page), seed)
    states = [[page_view(buf, offs[l][j], s) for j, s in enumerate(layout.persistent)] for l in range(num_layers)]
    return buf, offs, states


def snapshot(states):
    return [[t.view(torch.uint8).clone() for t in layer] for layer in states]


def assert_unchanged(states, snap):
    for l, layer in enumerate(states):
        for j, t in enumerate(layer):
            assert torch.equal(t.view(torch.uint8), snap[l][j]), f"layer {l}, state {j} changed"


def assert_bytes_equal(states, expected):
    for l, layer in enumerate(states):
        for j, t in enumerate(layer):
            got = t.view(torch.uint8)
            if not torch.equal(got, expected[l][j]):
                bad = (got != expected[l][j]).reshape(got.shape[0], -1).any(dim=1).nonzero().flatten()
                raise AssertionError(f"layer {l}, state {j}: blocks {bad.tolist()} differ from the reference")


# ------------------------------------------------------------------------------------------------
# The reference (docs/design.md section 3, torch indexing on byte views) and a model of the rules
# ------------------------------------------------------------------------------------------------


def reference_align(layout, snap, bt, sc, dc, na):
    """Expected bytes of every persistent state after an align step: per request (padding rows and
    null-block rows skipped), every copy reads the snapshot taken before the step.

    Byte views: SD conv ``[nb, width, dim*isz]``, DS conv ``[nb, dim, width*isz]``, temporal
    ``[nb, ..., last*isz]``.
    """
    exp = [[s.clone() for s in layer] for layer in snap]
    for i in range(bt.shape[0]):
        s, d, a = int(sc[i]), int(dc[i]), int(na[i])
        if s < 0 or d < 0:
            continue  # padding
        if bt[i, s] == 0 and bt[i, d] == 0:
            continue  # null-block row
        if s == d and a == 1:
            continue  # no-op
        k = a - 1
        dst = int(bt[i, d])
        for l in range(len(snap)):
            for j, spec in enumerate(layout.persistent):
                old, new = snap[l][j], exp[l][j]
                if spec.copy == "conv":
                    src = int(bt[i, s])
                    if src == dst and k == 0:
                        continue  # nothing to shift: no-op for this kind
                    if spec.conv_layout == "SD":
                        w = spec.shape[0]
                        # state[bt[dst_col], :w-(a-1)] = state[bt[src_col], a-1:]
                        new[dst, : w - k] = old[src, k:]
                    else:
                        w, isz = spec.shape[1], spec.itemsize
                        new[dst, :, : (w - k) * isz] = old[src, :, k * isz :]
                else:
                    # state[bt[dst_col]] = state[bt[src_col + a - 1]]
                    src = int(bt[i, s + k])
                    if src != dst:
                        new[dst] = old[src]
    return exp


def reference_copy(snap, src, dst):
    exp = [[s.clone() for s in layer] for layer in snap]
    for s, d in zip(src, dst):
        if s >= 0 and d >= 0 and s != d:
            for l in range(len(snap)):
                for j in range(len(snap[l])):
                    exp[l][j][int(d)] = snap[l][j][int(s)]
    return exp


def hazards(moves):
    """Hazards of one kind's moves ``(request, src, dst, shift)``: ``("dup", {block: {requests}})``
    (every doubly written block), ``("cycle", [{requests} of every cycle])`` or ``None``; else the
    wave (depth in the read-before-write order) of every move."""
    by_dst = {}
    for idx, m in enumerate(moves):
        by_dst.setdefault(m[2], []).append(idx)
    dups = {d: {moves[i][0] for i in v} for d, v in by_dst.items() if len(v) > 1}
    if dups:
        return ("dup", dups), None
    # nxt[i]: the move overwriting the block move i reads (it must run after i).
    nxt = []
    for i, m in enumerate(moves):
        j = by_dst.get(m[1], [None])[0]
        nxt.append(j if j != i else None)
    cycles = []
    for i in range(len(moves)):
        seen, k = [], i
        while k is not None and k not in seen:
            seen.append(k)
            k = nxt[k]
        if k == i:
            cycles.append({moves[j][0] for j in seen})
    if cycles:
        return ("cycle", cycles), None
    depth = {}

    def wave(j):
        if j not in depth:
            preds = [i for i in range(len(moves)) if nxt[i] == j]
            depth[j] = max((wave(i) + 1 for i in preds), default=0)
        return depth[j]

    return None, [wave(j) for j in range(len(moves))]


def kinds_of(layout):
    conv = sum(1 for s in layout.persistent if s.copy == "conv")
    temporal = sum(1 for s in layout.persistent if s.copy == "temporal")
    return conv, temporal


def finish(conv, temp, has_conv, has_temp):
    waves = {}
    for name, moves, used in (("conv", conv, has_conv), ("temporal", temp, has_temp)):
        if not used:
            continue
        err, w = hazards(moves)
        if err:
            return err
        waves[name] = w
    return ("ok", conv, temp, waves.get("conv", []), waves.get("temporal", []))


def model_align(layout, nb, bt, sc, dc, na):
    """Predicts the planner: ``("request", i)`` (a per-request rule, in request order), a hazard,
    or ``("ok", conv_moves, temporal_moves, conv_waves, temporal_waves)``."""
    n_conv, n_temp = kinds_of(layout)
    num_spec = layout.num_spec
    conv, temp = [], []
    cols = bt.shape[1]
    for i in range(bt.shape[0]):
        s, d, a = int(sc[i]), int(dc[i]), int(na[i])
        if s < 0 or d < 0:
            continue
        if s >= cols or d >= cols:
            return ("request", i)
        sid, did = int(bt[i, s]), int(bt[i, d])
        if sid == 0 and did == 0:
            continue
        if not 1 <= a <= 1 + num_spec:
            return ("request", i)
        if s == d and a == 1:
            continue
        if not 0 < did < nb:
            return ("request", i)
        if n_conv:
            if not 0 < sid < nb:
                return ("request", i)
            if not (sid == did and a == 1):
                conv.append((i, sid, did, a - 1))
        if n_temp:
            t = s + a - 1
            if t >= cols:
                return ("request", i)
            tid = int(bt[i, t])
            if not 0 < tid < nb:
                return ("request", i)
            if tid != did:
                temp.append((i, tid, did, 0))
    return finish(conv, temp, n_conv > 0, n_temp > 0)


def model_copy(layout, nb, src, dst):
    n_conv, n_temp = kinds_of(layout)
    moves = []
    for i, (s, d) in enumerate(zip(src, dst)):
        s, d = int(s), int(d)
        if s < 0 or d < 0:
            continue
        if not (0 < d < nb and 0 < s < nb):
            return ("request", i)
        if s != d:
            moves.append((i, s, d, 0))
    return finish(moves if n_conv else [], moves if n_temp else [], n_conv > 0, n_temp > 0)


def check_rejection(err, expect):
    msg = str(err)
    if expect[0] == "request":
        # Range / column / accepted-count rules name "request N" ("copy N" for plan_copy's
        # null-block rule).
        assert re.search(rf"\b(request|copy) {expect[1]}\b", msg), msg
    elif expect[0] == "dup":
        # Which doubly written block is named is the planner's choice; it must be a real one.
        m = re.search(r"requests (\d+) and (\d+) both write block (\d+) of state", msg)
        assert m, msg
        a, b, block = map(int, m.groups())
        assert a < b and block in expect[1] and {a, b} <= expect[1][block], (msg, expect)
    else:
        assert "cycle" in msg and "cannot be ordered without staging" in msg, msg
        assert {int(r) for r in re.findall(r"request (\d+) \(", msg)} in expect[1], (msg, expect)


def check_plan_against_model(plan, layout, num_layers, expect):
    _, conv, temp, conv_waves, temp_waves = expect
    n_conv, n_temp = kinds_of(layout)
    assert len(plan) == num_layers * (len(conv) * n_conv + len(temp) * n_temp)
    waves = max([w + 1 for w in conv_waves] + [w + 1 for w in temp_waves], default=0)
    assert plan.num_waves == waves
    segs = plan.segments
    assert plan.nbytes == int((segs["rows"].astype(np.uint64) * segs["row_bytes"]).sum())
    ws = plan.waves
    assert len(ws) == plan.num_waves + 1 and ws[0] == 0 and ws[-1] == len(segs)
    for w in range(plan.num_waves):
        assert (segs["wave"][ws[w] : ws[w + 1]] == w).all()
    # Compact rows: one per request that moves something, merging its conv and temporal move.
    want = {}
    for (r, s, d, k), w in zip(conv, conv_waves):
        want[r] = dict(request=r, shift=k, conv_src=s, temporal_src=-1, dst=d, conv_wave=w, temporal_wave=0)
    for (r, s, d, _), w in zip(temp, temp_waves):
        row = want.setdefault(r, dict(request=r, shift=0, conv_src=-1, dst=d, conv_wave=0))
        row.update(temporal_src=s, dst=d, temporal_wave=w)
    rows = plan.rows
    assert rows.dtype == MOVE_ROW_DTYPE and plan.num_requests == len(rows) == len(want)
    for row, r in zip(rows, sorted(want)):
        for f, v in want[r].items():
            assert int(row[f]) == v, (f, row, want[r])


# ------------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------------


def mostly(common, rare):
    """``common`` 9 times in 10. (Hypothesis favours small draws; this keeps the interesting
    case the common one.)"""
    return st.integers(0, 9).flatmap(lambda c: common if c < 9 else rare)


@st.composite
def layouts(draw):
    num_spec = draw(st.integers(0, 3))
    kinds = draw(st.sampled_from(["both", "both", "both", "conv", "temporal"]))
    states = []
    if kinds in ("both", "conv"):
        orient = draw(st.sampled_from(["SD", "DS"]))
        width = draw(st.integers(num_spec + 1, num_spec + 4))
        dim = draw(st.integers(1, 5))
        shape = (width, dim) if orient == "SD" else (dim, width)
        states.append(StateSpec("conv", shape, draw(st.sampled_from(list(TORCH_DTYPES))), "persistent", "conv", orient))
    if kinds in ("both", "temporal"):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        states.append(StateSpec("temporal", shape, draw(st.sampled_from(list(TORCH_DTYPES))), "persistent", "temporal"))
    for w in range(draw(st.integers(0, 2))):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
        states.append(StateSpec(f"ws{w}", shape, draw(st.sampled_from(list(TORCH_DTYPES))), "workspace"))
    return Layout("GDN_ATTN", states, num_spec=num_spec)


@st.composite
def align_steps(draw, num_blocks, num_spec):
    """``(block_table, src_col, dst_col, num_accepted)``: mostly valid, sometimes colliding or
    invalid ids, padding rows (-1) and null-block rows."""
    R = draw(mostly(st.integers(1, 8), st.just(0)))
    cols = draw(mostly(st.integers(2, num_spec + 3), st.just(1)))
    n_ids = R * cols
    mode = draw(st.sampled_from(["few", "distinct", "random", "few"]))
    if mode == "distinct" and n_ids <= num_blocks - 1:
        ids = draw(st.permutations(range(1, num_blocks)))[:n_ids]  # distinct: no hazards
    else:
        # "few": ids from a handful of blocks, so chains, cycles and collisions are common
        top = min(num_blocks - 1, 3) if mode == "few" else num_blocks - 1

        def one_id():
            c = draw(st.integers(0, 59))
            if c < 59:
                return draw(st.integers(1, top))
            return draw(st.sampled_from([0, num_blocks, -2]))

        ids = [one_id() for _ in range(n_ids)]
    bt = np.array(ids, dtype=np.int64).reshape(R, cols)
    sc, dc, na = [], [], []
    for i in range(R):
        c = draw(st.integers(0, 19))  # 0..14: a valid row (hypothesis favours small draws)
        if c == 15:  # padding row: a negative column, anything in the other fields
            pad, other = draw(st.integers(-3, -1)), draw(st.integers(-1, cols))
            first = draw(st.booleans())
            sc.append(pad if first else other)
            dc.append(other if first else pad)
            na.append(draw(st.integers(-1, 9)))
            continue
        s = draw(st.integers(0, cols - 1))
        a = draw(st.integers(1, max(1, min(num_spec + 1, cols - s))))
        d = (s + 1 + draw(st.integers(0, max(0, cols - 2)))) % cols  # another column, if any
        if c == 16:
            s = cols  # column outside the row
        elif c == 17:
            a = draw(st.sampled_from([0, num_spec + 2, num_spec + 1]))
        elif c == 18:
            bt[i, :] = 0  # null-block row
        elif c == 19:
            d = s  # in-block: a conv shift where the window allows one (else a no-op)
            hi = max(1, min(num_spec + 1, cols - s))
            a = draw(st.integers(min(2, hi), hi))
        sc.append(s)
        dc.append(d)
        na.append(a)
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return (bt.astype(dtype), np.array(sc, dtype), np.array(dc, dtype), np.array(na, dtype))


def bind(layout, num_layers, num_blocks, paged, gaps, seed, workspace_requests=3):
    """States (plus workspace tensors for the planner) and the objects to check afterwards."""
    if paged:
        buf, offs, states = paged_states(layout, num_layers, num_blocks, seed, gaps)
    else:
        buf, offs, states = None, None, separate_states(layout, num_layers, num_blocks, seed)
    ws = [
        [
            random_bytes((workspace_requests, s.nbytes), seed + 7 * l + j)
            .view(TORCH_DTYPES[s.dtype])
            .view(workspace_requests, *s.shape)
            for j, s in enumerate(layout.workspace)
        ]
        for l in range(num_layers)
    ]
    planner = Planner(layout, [states[l] + ws[l] for l in range(num_layers)])
    return planner, buf, offs, states, ws


def check_executed(layout, buf, offs, states, before, expected, buf_before):
    if buf is None:
        assert_bytes_equal(states, expected)
        return
    # Page views: rebuild the expected buffer, so bytes between the views are checked too.
    want = buf_before.clone()
    for l in range(len(states)):
        for j, s in enumerate(layout.persistent):
            page_view(want, offs[l][j], s).view(torch.uint8).copy_(expected[l][j])
    assert torch.equal(buf, want)
    assert_bytes_equal(states, expected)


PROPS = settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@PROPS
@given(data=st.data())
def test_align_matches_reference(data):
    layout = data.draw(layouts(), "layout")
    num_layers = data.draw(st.integers(1, 3), "num_layers")
    num_blocks = data.draw(mostly(st.integers(5, 24), st.integers(2, 4)), "num_blocks")
    paged = data.draw(st.booleans(), "paged")
    gaps = data.draw(st.lists(st.integers(0, 2), max_size=8), "gaps") if paged else ()
    planner, buf, offs, states, ws = bind(
        layout, num_layers, num_blocks, paged, gaps, data.draw(st.integers(0, 2**20), "seed")
    )
    bt, sc, dc, na = data.draw(align_steps(num_blocks, layout.num_spec), "step")
    before, ws_before = snapshot(states), snapshot(ws)
    buf_before = None if buf is None else buf.clone()
    expect = model_align(layout, num_blocks, bt, sc, dc, na)
    event(f"outcome: {expect[0]}")
    try:
        plan = planner.plan_align(bt, sc, dc, na)
    except PlanError as e:
        assert expect[0] != "ok", f"unexpected rejection: {e}"
        check_rejection(e, expect)
        assert_unchanged(states, before)
        return
    assert expect[0] == "ok", f"accepted, but the model expects {expect}"
    check_plan_against_model(plan, layout, num_layers, expect)
    event(f"waves: {min(plan.num_waves, 3)}")
    event(f"in-block conv shifts: {any(m[1] == m[2] for m in expect[1])}")
    plan.execute()
    check_executed(layout, buf, offs, states, before, reference_align(layout, before, bt, sc, dc, na), buf_before)
    assert_unchanged(ws, ws_before)  # workspace tensors are never copied


@PROPS
@given(data=st.data())
def test_plan_copy_matches_reference(data):
    layout = data.draw(layouts(), "layout")
    num_layers = data.draw(st.integers(1, 3), "num_layers")
    num_blocks = data.draw(mostly(st.integers(5, 16), st.integers(2, 4)), "num_blocks")
    paged = data.draw(st.booleans(), "paged")
    planner, buf, offs, states, _ = bind(
        layout, num_layers, num_blocks, paged, (), data.draw(st.integers(0, 2**20), "seed")
    )
    n = data.draw(st.integers(0, 8), "n")
    ids = mostly(
        mostly(st.integers(1, num_blocks - 1), st.integers(1, min(3, num_blocks - 1))),
        st.sampled_from([-1, 0, num_blocks]),
    )
    if data.draw(st.booleans(), "distinct") and 2 * n <= num_blocks - 1:
        perm = data.draw(st.permutations(range(1, num_blocks)), "perm")
        src, dst = perm[:n], perm[n : 2 * n]
    else:
        src, dst = data.draw(st.lists(ids, min_size=n, max_size=n)), data.draw(st.lists(ids, min_size=n, max_size=n))
    dtype = data.draw(st.sampled_from([np.int32, np.int64]), "dtype")
    src, dst = np.array(src, dtype), np.array(dst, dtype)
    before = snapshot(states)
    buf_before = None if buf is None else buf.clone()
    expect = model_copy(layout, num_blocks, src, dst)
    event(f"outcome: {expect[0]}")
    try:
        plan = planner.plan_copy(src, dst)
    except PlanError as e:
        assert expect[0] != "ok", f"unexpected rejection: {e}"
        check_rejection(e, expect)
        assert_unchanged(states, before)
        return
    assert expect[0] == "ok", f"accepted, but the model expects {expect}"
    check_plan_against_model(plan, layout, num_layers, expect)
    plan.execute()
    check_executed(layout, buf, offs, states, before, reference_copy(before, src, dst), buf_before)


# ------------------------------------------------------------------------------------------------
# Targeted rules
# ------------------------------------------------------------------------------------------------

NUM_SPEC = 2
WIDTH, DIM = 5, 3  # a conv window of K-1+num_spec = 5 columns of 3 channels
NB = 10


def small_layout(orient="SD", workspace=False):
    conv_shape = (WIDTH, DIM) if orient == "SD" else (DIM, WIDTH)
    states = [
        StateSpec("conv", conv_shape, "float32", "persistent", "conv", orient),
        StateSpec("temporal", (2, 3), "float32", "persistent", "temporal"),
    ]
    if workspace:
        states.append(StateSpec("records", (4,), "float32", "workspace"))
    return Layout("GDN_ATTN", states, num_spec=NUM_SPEC)


def numbered_states(layout, num_layers=2, num_blocks=NB):
    """Every element holds 10000*layer + 1000*block + its flat index inside the block."""
    out = []
    for l in range(num_layers):
        layer = []
        for s in layout.persistent:
            n = math.prod(s.shape)
            v = 10000 * l + 1000 * torch.arange(num_blocks, dtype=torch.float32)[:, None] + torch.arange(n)
            layer.append(v.view(num_blocks, *s.shape).contiguous())
        out.append(layer)
    return out


def small_planner(orient="SD", num_layers=2, num_blocks=NB):
    layout = small_layout(orient)
    states = numbered_states(layout, num_layers, num_blocks)
    return layout, Planner(layout, states), states


def i32(*v):
    return np.array(v, dtype=np.int32)


def rejected(planner, states, *step, match):
    """The step raises PlanError whose message contains every string of ``match``; nothing moved."""
    before = snapshot(states)
    with pytest.raises(PlanError) as e:
        planner.plan_align(*step)
    for m in match:
        assert m in str(e.value), str(e.value)
    assert_unchanged(states, before)
    return str(e.value)


def accepted(layout, planner, states, bt, sc, dc, na):
    before = snapshot(states)
    plan = planner.plan_align(bt, sc, dc, na)
    plan.execute()
    assert_bytes_equal(states, reference_align(layout, before, bt, sc, dc, na))
    return plan


def test_block_id_outside_the_pool():
    _, p, states = small_planner()
    bt = np.array([[1, 2], [3, 4], [5, NB]], np.int32)
    m = rejected(
        p,
        states,
        bt,
        i32(0, 0, 0),
        i32(1, 1, 1),
        i32(1, 1, 1),
        match=["request 2", "destination block id 10 (column 1)", "outside 0 ..= 9"],
    )
    assert m.startswith("GDN_ATTN: ") and "all 2 layers" in m
    bt = np.array([[1, 2], [NB + 3, 4]], np.int64)
    rejected(
        p,
        states,
        bt,
        i32(0, 0),
        i32(1, 1),
        i32(1, 1),
        match=["request 1", "state 'conv'", "source block id 13 (column 0)", "outside 0 ..= 9"],
    )
    bt = np.array([[1, 2], [-5, 4]], np.int64)
    rejected(p, states, bt, i32(0, 0), i32(1, 1), i32(1, 1), match=["request 1", "source block id -5"])
    # The temporal source (the accepted token's column) is checked too.
    bt = np.array([[1, 2, 99]], np.int64)
    rejected(
        p, states, bt, i32(0), i32(1), i32(3), match=["request 0", "state 'temporal'", "source block id 99 (column 2)"]
    )


def test_null_block_as_destination():
    _, p, states = small_planner()
    rejected(
        p,
        states,
        np.array([[1, 2], [3, 0]], np.int32),
        i32(0, 0),
        i32(1, 1),
        i32(1, 1),
        match=["request 1", "destination (column 1) is the null block 0", "never written"],
    )


def test_null_block_as_source():
    _, p, states = small_planner()
    rejected(
        p,
        states,
        np.array([[1, 2], [0, 4]], np.int32),
        i32(0, 0),
        i32(1, 1),
        i32(1, 1),
        match=["request 1", "state 'conv'", "source (column 0) is the null block 0"],
    )
    # conv source valid, but the accepted token's temporal source is the null block
    rejected(
        p,
        states,
        np.array([[1, 0, 2]], np.int32),
        i32(0),
        i32(2),
        i32(2),
        match=["request 0", "state 'temporal'", "source (column 1) is the null block 0"],
    )


@pytest.mark.parametrize("a", [0, NUM_SPEC + 2, -1])
def test_num_accepted_outside_range(a):
    _, p, states = small_planner()
    bt = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    rejected(
        p,
        states,
        bt,
        i32(0, 0),
        i32(3, 3),
        i32(1, a),
        match=["request 1", f"num_accepted = {a} is outside 1 ..= {NUM_SPEC + 1}", "num_spec = 2"],
    )


@pytest.mark.parametrize("which", ["src_col", "dst_col"])
def test_column_outside_the_row(which):
    _, p, states = small_planner()
    bt = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    sc, dc = i32(0, 0), i32(1, 1)
    (sc if which == "src_col" else dc)[1] = 3
    rejected(
        p, states, bt, sc, dc, i32(1, 1), match=["request 1", f"{which} = 3 is outside the block-table row (3 columns)"]
    )


def test_accepted_column_outside_the_row():
    _, p, states = small_planner()
    bt = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    rejected(
        p,
        states,
        bt,
        i32(0, 1),
        i32(2, 0),
        i32(1, 3),
        match=[
            "request 1",
            "state 'temporal'",
            "src_col + num_accepted - 1 = 1 + 3 - 1 = 3",
            "outside the block-table row (3 columns)",
        ],
    )


def test_two_requests_writing_the_same_block():
    _, p, states = small_planner()
    bt = np.array([[1, 7], [2, 3], [4, 7]], np.int32)
    rejected(
        p,
        states,
        bt,
        i32(0, 0, 0),
        i32(1, 1, 1),
        i32(1, 1, 1),
        match=["requests 0 and 2 both write block 7 of state 'conv'"],
    )


def test_swap_cycle_is_rejected():
    _, p, states = small_planner()
    bt = np.array([[3, 4], [4, 3]], np.int32)  # 3 -> 4 and 4 -> 3
    rejected(
        p,
        states,
        bt,
        i32(0, 0),
        i32(1, 1),
        i32(1, 1),
        match=["cycle", "request 0 (3 -> 4)", "request 1 (4 -> 3)", "state 'conv'"],
    )


def test_chain_is_ordered_into_waves_reading_old_values():
    layout, p, states = small_planner()
    A, B, C = 2, 5, 8
    bt = np.array([[A, B], [B, C]], np.int32)  # request 0: A -> B, request 1: B -> C
    before = snapshot(states)
    plan = accepted(layout, p, states, bt, i32(0, 0), i32(1, 1), i32(1, 1))
    assert plan.num_waves == 2
    segs, ws = plan.segments, plan.waves
    assert ws.tolist() == [0, 4, 8]  # 2 layers x 2 states per wave, nothing coalesced
    assert (segs["wave"] == np.repeat([0, 1], 4)).all()
    # Wave 0 reads B before wave 1 overwrites it.
    for w, (src, dst) in enumerate([(B, C), (A, B)]):
        for seg, t in zip(segs[ws[w] : ws[w + 1]], [t for layer in states for t in layer]):
            stride = t.stride(0) * t.element_size()
            assert (int(seg["src"]), int(seg["dst"])) == (t.data_ptr() + src * stride, t.data_ptr() + dst * stride)
    assert [(int(r["request"]), int(r["conv_wave"]), int(r["temporal_wave"])) for r in plan.rows] == [
        (0, 1, 1),
        (1, 0, 0),
    ]
    # C holds the old B, B the old A.
    for l in range(2):
        for j in range(2):
            assert torch.equal(states[l][j].view(torch.uint8)[C], before[l][j][B])
            assert torch.equal(states[l][j].view(torch.uint8)[B], before[l][j][A])


def test_longer_chain_gets_one_wave_per_link():
    layout, p, states = small_planner()
    # 1 -> 2 -> 3 -> 4 -> 5, listed in an order that needs sorting
    bt = np.array([[3, 4], [1, 2], [4, 5], [2, 3]], np.int32)
    plan = accepted(layout, p, states, bt, i32(0, 0, 0, 0), i32(1, 1, 1, 1), i32(1, 1, 1, 1))
    assert plan.num_waves == 4
    assert {int(r["request"]): int(r["conv_wave"]) for r in plan.rows} == {2: 0, 0: 1, 3: 2, 1: 3}


@pytest.mark.parametrize("orient", ["SD", "DS"])
def test_in_block_conv_shift(orient):
    layout, p, states = small_planner(orient)
    before = [[t.clone() for t in layer] for layer in states]
    blk, k = 5, 2
    bt = np.array([[blk, 6, 7]], np.int32)
    plan = p.plan_align(bt, i32(0), i32(0), i32(k + 1))  # src_col == dst_col, 3 accepted
    conv_segs = plan.segments[[0, 2]]  # layer-major: conv, temporal per layer
    assert (conv_segs["mode"] == (1 if orient == "SD" else 2)).all()
    assert (plan.segments["mode"][[1, 3]] == 0).all()
    plan.execute()
    for l in range(2):
        old, new = before[l][0][blk], states[l][0][blk]
        base = 10000 * l + 1000 * blk
        if orient == "SD":  # [width, dim]: rows 0..width-k get rows k.., the last k rows are kept
            want = torch.tensor(
                [[base + (c + k if c < WIDTH - k else c) * DIM + d for d in range(DIM)] for c in range(WIDTH)],
                dtype=torch.float32,
            )
        else:  # [dim, width]: every channel's window shifted left by k, last k columns kept
            want = torch.tensor(
                [[base + d * WIDTH + (c + k if c < WIDTH - k else c) for c in range(WIDTH)] for d in range(DIM)],
                dtype=torch.float32,
            )
        assert torch.equal(new, want), (orient, old, new)
        # temporal: the accepted token's state (column 0 + 3 - 1 = 2, block 7) lands in block 5
        assert torch.equal(states[l][1][blk], before[l][1][7])
        # nothing else moved
        for j in range(2):
            others = [b for b in range(NB) if b != blk]
            assert torch.equal(states[l][j][others], before[l][j][others])


def test_padding_null_rows_and_no_ops_move_nothing():
    layout, p, states = small_planner()
    bt = np.array([[1, 2, 3], [99, -7, 0], [0, 0, 0], [4, 5, 6], [7, 7, 8]], np.int32)
    sc = i32(-1, 1, 0, 2, 0)
    dc = i32(0, -1, 1, 2, 1)
    na = i32(99, 0, 42, 1, 1)  # garbage on padding and null rows is ignored
    before = snapshot(states)
    plan = p.plan_align(bt, sc, dc, na)
    # row 4: blocks 7 -> 7 with nothing to shift: a per-kind no-op
    assert len(plan) == 0 and plan.num_segments == 0 and plan.num_waves == 0 and plan.nbytes == 0
    assert len(plan.rows) == 0 and plan.waves.tolist() == [0]
    plan.execute()
    assert_unchanged(states, before)


def test_rows_are_compact_records_of_requests_that_move():
    layout, p, states = small_planner()
    bt = np.array([[1, 2, 3], [0, 0, 0], [4, 5, 6], [7, 8, 9]], np.int32)
    sc, dc, na = i32(0, 0, 1, 0), i32(2, 1, 1, 0), i32(2, 1, 1, 3)
    plan = accepted(layout, p, states, bt, sc, dc, na)
    rows = plan.rows
    assert rows.dtype == MOVE_ROW_DTYPE and plan.num_requests == 2
    got = [tuple(int(r[f]) for f in ("request", "shift", "conv_src", "temporal_src", "dst")) for r in rows]
    # request 0: conv 1 -> 3 shifted by 1, temporal from column 1 (block 2); request 2 is a no-op;
    # request 3: in-block conv shift of block 7 by 2, temporal from column 2 (block 9).
    assert got == [(0, 1, 1, 2, 3), (3, 2, 7, 9, 7)]


def test_float_inputs_are_rejected():
    _, p, states = small_planner()
    bt, sc, dc, na = np.array([[1, 2]], np.int32), i32(0), i32(1), i32(1)
    args = [bt, sc, dc, na]
    for i, name in enumerate(["block_table", "src_col", "dst_col", "num_accepted"]):
        bad = list(args)
        bad[i] = args[i].astype(np.float32)
        rejected(p, states, *bad, match=[name, "must be an int32 or int64 array"])
    bad = list(args)
    bad[0] = torch.tensor([[1.0, 2.0]])
    rejected(p, states, *bad, match=["block_table", "int32 or int64"])
    with pytest.raises(PlanError, match="src_blocks must be an int32 or int64"):
        p.plan_copy(np.array([1.0]), np.array([2]))


def test_bad_input_shapes_are_rejected():
    _, p, states = small_planner()
    rejected(p, states, i32(1, 2), i32(0), i32(1), i32(1), match=["block_table must be 2-D", "[2]"])
    rejected(p, states, np.ones((1, 2, 2), np.int32), i32(0), i32(1), i32(1), match=["2-D"])
    rejected(
        p,
        states,
        np.array([[1, 2], [3, 4]], np.int32),
        i32(0, 0),
        i32(1),
        i32(1, 1),
        match=["one entry per request", "got 2, 1 and 2"],
    )
    rejected(
        p,
        states,
        np.array([[1, 2], [3, 4]], np.int32),
        i32(0),
        i32(1),
        i32(1),
        match=["block_table must be [requests = 1"],
    )
    rejected(p, states, np.zeros((1, 0), np.int32), i32(0), i32(1), i32(1), match=["cols >= 1"])
    with pytest.raises(PlanError, match="same length; got 2 and 1"):
        p.plan_copy(i32(1, 2), i32(3))
    bt = np.array([[1, 2]], np.int32)
    rejected(p, states, bt, np.array([[0]], np.int32), i32(1), i32(1), match=["src_col must be 1-D", "[1, 1]"])
    rejected(
        p,
        states,
        bt,
        i32(0),
        i32(1),
        torch.tensor([1], dtype=torch.bfloat16),
        match=["num_accepted must be an int32 or int64 array", "bfloat16"],
    )


def test_byte_swapped_inputs_are_rejected():
    _, p, states = small_planner()
    bt = np.array([[1, 2]], np.int32)
    rejected(p, states, bt, i32(0), np.array([1], ">i8"), i32(1), match=["dst_col must be in native byte order"])
    rejected(p, states, bt.astype(">i4"), i32(0), i32(1), i32(1), match=["block_table must be in native byte order"])


def test_host_ints_accept_lists_tensors_and_strided_arrays():
    layout, p, states = small_planner()
    bt = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    want = p.plan_align(bt, i32(0, 0), i32(2, 2), i32(1, 2)).segments.copy()
    for b in (bt.tolist(), torch.from_numpy(bt), np.asfortranarray(bt), np.repeat(bt, 2, axis=1)[:, ::2]):
        got = p.plan_align(b, [0, 0], torch.tensor([2, 2]), np.array([1, 2], np.int32)).segments
        assert np.array_equal(got, want)


class FakeCudaTensor:
    """Looks like a CUDA tensor to the planner; copying it to the host would be a bug."""

    device = torch.device("cuda", 0)

    def numpy(self):
        raise AssertionError("a device input must not be copied to the host")


def test_cuda_inputs_are_rejected():
    _, p, states = small_planner()
    args = [np.array([[1, 2]], np.int32), i32(0), i32(1), i32(1)]
    for i, name in enumerate(["block_table", "src_col", "dst_col", "num_accepted"]):
        bad = list(args)
        bad[i] = torch.zeros(1, device="cuda", dtype=torch.int32) if torch.cuda.is_available() else FakeCudaTensor()
        rejected(p, states, *bad, match=[f"{name} is on cuda:0", "host inputs", "synchronise"])
    with pytest.raises(PlanError, match="src_blocks is on cuda:0"):
        p.plan_copy(FakeCudaTensor(), i32(1))


def test_host_executor_refuses_cuda_states():
    """States bound as CUDA tensors (descriptors only; the address is a CPU buffer we own, so
    nothing could be harmed): a plan is built, but the host executor refuses to run it."""
    from recoverssm_rs import _core

    layout = small_layout()
    backing = [torch.zeros(NB, *s.shape) for s in layout.persistent]
    from support.fakes import FakeDeviceArray

    on_cuda = [
        FakeDeviceArray(t.data_ptr(), tuple(t.shape), tuple(x * 4 for x in t.stride()), dtype="float32")
        for t in backing
    ]
    core = _core.Planner([(layout, [on_cuda])])
    assert core.device == "cuda:0"
    plan = core.plan(block_table=np.array([[1, 2]], np.int32), src_col=i32(0), dst_col=i32(1), num_accepted=i32(1))
    assert plan.num_copies == 2
    with pytest.raises(PlanError, match="host executor runs plans over CPU tensors"):
        plan.execute_host()
    assert all(bool((t == 0).all()) for t in backing)


# ------------------------------------------------------------------------------------------------
# Plan inspection
# ------------------------------------------------------------------------------------------------


def tensor_span(t):
    es = t.element_size()
    return t.data_ptr(), t.data_ptr() + (t.shape[0] - 1) * t.stride(0) * es + math.prod(t.shape[1:]) * es


def mixed_plan(orient="SD", num_layers=2):
    """Cross-block copies with and without a shift, an in-block shift and a temporal copy."""
    layout, p, states = small_planner(orient, num_layers)
    bt = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.int32)
    plan = p.plan_align(bt, i32(0, 0, 0), i32(2, 1, 0), i32(1, 3, 2))
    return layout, p, states, plan


def test_segments_are_a_read_only_zero_copy_view():
    layout, p, states, plan = mixed_plan()
    segs = plan.segments
    assert isinstance(plan, CopyPlan) and segs.dtype == SEGMENT_DTYPE
    assert segs.flags.writeable is False
    with pytest.raises(ValueError):
        segs["rows"][0] = 7
    with pytest.raises(ValueError):
        segs.setflags(write=True)
    assert segs is plan.segments
    # zero copy: every export of the records is the same memory
    again = np.frombuffer(plan._plan.segments(), dtype=SEGMENT_DTYPE)
    assert again.ctypes.data == segs.ctypes.data and len(again) == plan.num_segments
    with pytest.raises(TypeError):
        memoryview(plan._plan.segments()).cast("B")[0:1] = b"x"
    spans = [tensor_span(t) for layer in states for t in layer]
    for s in segs:
        ext = (int(s["rows"]) - 1) * int(s["pitch"]) + int(s["row_bytes"])
        for addr in (int(s["src"]), int(s["dst"])):
            assert any(lo <= addr and addr + ext <= hi for lo, hi in spans), s
    assert plan.nbytes == int((segs["rows"].astype(np.uint64) * segs["row_bytes"]).sum())
    assert len(plan) == 2 * (3 + 3)  # 2 layers x (3 conv + 3 temporal moves)
    # the bytes: conv (5-0)+(5-2)+(5-1) rows of 3 fp32; temporal 3 x 6 fp32; per layer
    assert plan.nbytes == 2 * ((5 + 3 + 4) * 3 * 4 + 3 * 6 * 4)
    assert plan.rows.dtype == MOVE_ROW_DTYPE and plan.waves.dtype == np.uint32
    assert plan.planner is p


def test_plan_keeps_its_records_after_the_python_plan_is_gone():
    _, p, states, plan = mixed_plan()
    segs, rows = plan.segments, plan.rows
    want = segs.copy(), rows.copy()
    del plan
    gc.collect()
    p.plan_align(np.array([[1, 2]], np.int32), i32(0), i32(1), i32(1))  # may reuse pooled buffers
    assert np.array_equal(segs, want[0]) and np.array_equal(rows, want[1])


def test_consecutive_blocks_coalesce():
    layout, p, states = small_planner()
    before = snapshot(states)
    plan = p.plan_copy(i32(1, 2, 3), i32(5, 6, 7))
    assert len(plan) == 2 * 2 * 3
    assert plan.num_segments <= 2 * 2
    per_block = sum(s.nbytes for s in layout.persistent)
    assert plan.nbytes == 2 * 3 * per_block
    assert sorted(plan.segments["row_bytes"].tolist()) == sorted([3 * s.nbytes for s in layout.persistent] * 2)
    plan.execute()
    assert_bytes_equal(states, reference_copy(before, [1, 2, 3], [5, 6, 7]))
    # Page views (block stride > state) cannot coalesce.
    buf, _, pstates = paged_states(layout, 2, NB, seed=3)
    pp = Planner(layout, pstates)
    pplan = pp.plan_copy(i32(1, 2, 3), i32(5, 6, 7))
    assert pplan.num_segments == len(pplan) == 12


def check_tiles(plan, tile_bytes):
    tt = plan.tiles(tile_bytes)
    tiles, segs, ws = tt.tiles, plan.segments, plan.waves
    assert tiles.dtype == TILE_DTYPE and tt.tile_bytes == tile_bytes
    assert len(tt.wave_starts) == plan.num_waves + 1 and tt.wave_starts[-1] == len(tiles)
    for w in range(plan.num_waves):
        t = tiles[tt.wave_starts[w] : tt.wave_starts[w + 1]]
        assert ((t["segment"] >= ws[w]) & (t["segment"] < ws[w + 1])).all()
    for i, s in enumerate(segs):
        byte_units = s["rows"] == 1 or s["mode"] == 1
        n = int(s["row_bytes"]) if byte_units else int(s["rows"])
        cover = np.zeros(n, np.int64)
        mine = tiles[tiles["segment"] == i]
        assert len(mine) > 0
        whole_row = s["rows"] == 1 and s["mode"] == 2
        if whole_row:  # one row overlapping itself: never cut
            assert len(mine) == 1, (s, mine)
        for k, t in enumerate(mine):
            b, c = int(t["begin"]), int(t["count"])
            assert c > 0 and b + c <= n
            cover[b : b + c] += 1
            if byte_units and k > 0:
                assert (int(s["dst"]) + b) % 16 == 0, (s, t)
            if byte_units and not whole_row:  # about tile_bytes of work per tile
                assert c * int(s["rows"]) <= max(tile_bytes, 16 * int(s["rows"])) + 16 * int(s["rows"])
        assert (cover == 1).all(), (i, s, cover)


@pytest.mark.parametrize("orient", ["SD", "DS"])
@pytest.mark.parametrize("tile_bytes", [16, 32, 48, 64, 160, 65536])
def test_tiles_cover_every_byte_once(orient, tile_bytes):
    _, _, _, plan = mixed_plan(orient)
    assert set(plan.segments["mode"].tolist()) == {0, 1 if orient == "SD" else 2}
    check_tiles(plan, tile_bytes)
    # with waves, and at an odd (non-16-aligned) destination: page views at 4-byte offsets
    layout = small_layout(orient)
    buf = torch.zeros(NB, 1 + (WIDTH * DIM + 6) + 3, dtype=torch.float32)
    conv = buf[:, 1 : 1 + WIDTH * DIM].unflatten(1, layout.persistent[0].shape)
    temp = buf[:, 1 + WIDTH * DIM : 1 + WIDTH * DIM + 6].unflatten(1, (2, 3))
    p = Planner(layout, [[conv, temp]])
    plan = p.plan_align(np.array([[1, 2, 3], [2, 4, 5]], np.int32), i32(0, 0), i32(1, 1), i32(3, 2))
    assert plan.num_waves == 2
    check_tiles(plan, tile_bytes)


def test_tiles_reject_bad_sizes():
    _, _, _, plan = mixed_plan()
    for bad in (0, 8, 17, 100):
        with pytest.raises(PlanError, match="multiple of 16"):
            plan.tiles(bad)
    assert plan.tiles().tile_bytes == 64 * 1024


@pytest.mark.parametrize("tile_bytes", [16, 64, 65536])
def test_single_overlapping_row_is_one_tile(tile_bytes):
    """A DS conv with one channel: an in-block shift is one row that overlaps itself, which one
    worker must copy whole (copy_tiles.cu: two CTAs would race on the overlap). Cut into several
    tiles by the core before 24c3f11."""
    layout = Layout("GDN_ATTN", [StateSpec("conv", (1, 64), "float32", "persistent", "conv", "DS")], num_spec=3)
    p = Planner(layout, [[torch.zeros(4, 1, 64)]])
    plan = p.plan_align(np.array([[1, 2]], np.int32), i32(0), i32(0), i32(2))
    (seg,) = plan.segments
    assert (int(seg["rows"]), int(seg["mode"]), int(seg["row_bytes"])) == (1, 2, 63 * 4)
    check_tiles(plan, tile_bytes)
    (tile,) = plan.tiles(tile_bytes).tiles
    assert (int(tile["begin"]), int(tile["count"])) == (0, 63 * 4)


def test_reprs():
    layout, p, states, plan = mixed_plan()
    assert repr(p) == "Planner('GDN_ATTN', layers=2, blocks=10, device='cpu')"
    assert repr(plan) == (
        f"CopyPlan(copies=12, segments={plan.num_segments}, requests=3, waves=1, bytes={plan.nbytes})"
    )
    assert p.num_layers == 2 and p.num_blocks == NB and p.device == "cpu"
    assert p.layout == layout and p.states[0][0][0] is states[0][0]
    meta = p.state_meta
    assert len(meta) == 4 and meta["base"][0] == states[0][0].data_ptr()
    assert meta["kind"].tolist() == [1, 0, 1, 0] and meta["width"][0] == WIDTH and meta["dim"][0] == DIM


def test_planning_from_several_threads_gives_the_serial_plans():
    """Plans are built with the GIL released and pooled buffers behind a lock: concurrent callers
    get the same plans as serial ones."""
    from concurrent.futures import ThreadPoolExecutor

    layout, p, states = small_planner(num_layers=3, num_blocks=200)
    rng = np.random.default_rng(5)
    steps = []
    for _ in range(64):
        ids = (rng.permutation(199)[:40] + 1).astype(np.int32).reshape(8, 5)
        steps.append(
            (ids, np.zeros(8, np.int32), np.full(8, 4, np.int32), rng.integers(1, NUM_SPEC + 2, 8).astype(np.int32))
        )
    want = [p.plan_align(*s).segments.copy() for s in steps]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda s: p.plan_align(*s).segments.copy(), steps * 4))
    for i, g in enumerate(got):
        assert np.array_equal(g, want[i % len(steps)])


# ------------------------------------------------------------------------------------------------
# Steady state
# ------------------------------------------------------------------------------------------------


def test_steady_state_reuses_pooled_segment_buffers():
    layout, p, states = small_planner(num_layers=3, num_blocks=64)
    rng = np.random.default_rng(0)
    addrs = []
    for _ in range(1000):
        ids = rng.permutation(np.arange(1, 64))[: 5 * 6].reshape(6, 5).astype(np.int32)
        na = rng.integers(1, NUM_SPEC + 2, 6).astype(np.int32)
        plan = p.plan_align(ids, np.zeros(6, np.int32), np.full(6, 4, np.int32), na)
        assert 0 < plan.num_segments <= 3 * 2 * 6 and len(plan) == 3 * 2 * 6
        addrs.append(plan.segments.ctypes.data)
        del plan  # the next plan is created after this one is gone
    steady = set(addrs[5:])
    assert len(steady) <= 4, f"{len(steady)} distinct segment buffers"
    assert len(set(addrs)) <= 8
