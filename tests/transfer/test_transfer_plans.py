"""Transfer plans against an independent reference: for every family, (source TP, rank) x
(destination TP, rank) with TP sizes in {1, 2, 4, 8}, both conv layouts on either side and mixed
num_spec (every TP pair with every pair of layouts and every pair of widths: see ``_cases``), every
rank of each pair, the full unsharded states are sharded with numpy the way vLLM shards them, the plans run
between strided paged pools, and every byte of the destination pages is compared."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from recoverssm_rs.transfer import LocalTransfer
from recoverssm_rs.transfer.local import run_staged
from support.transfer_ref import (
    FAMILIES,
    expected_destination,
    kernel_of,
    layout,
    make_truth,
    paged_states,
    pool,
    write_rank,
)

TPS = (1, 2, 4, 8)
NUM_LAYERS = 2
SRC_BLOCKS = [3, 1, 4]
DST_BLOCKS = [2, 5, 1]
NUM_BLOCKS = 6


LAYOUT_PAIRS = [("SD", "SD"), ("SD", "DS"), ("DS", "SD"), ("DS", "DS")]
SPEC_PAIRS = [(0, 0), (3, 3), (2, 0), (0, 5)]


def _cases():
    """(family, layouts, speculative widths, TP pairs): a family with both conv layouts and
    speculative widths runs each of its 16 (layouts, widths) cases over 4 of the 16 TP pairs, chosen
    so that every TP pair meets every pair of layouts once and every pair of widths once (pairwise
    coverage, a quarter of the full product's time); the other families run every TP pair."""
    tp_pairs = list(itertools.product(range(len(TPS)), repeat=2))
    for name, fam in FAMILIES.items():
        layouts_ = LAYOUT_PAIRS if fam.conv else [("SD", "SD")]
        specs = SPEC_PAIRS if fam.spec else [(0, 0)]
        for (li, (lp, ld)), (si, (sp, sd)) in itertools.product(enumerate(layouts_), enumerate(specs)):
            pairs = [
                (TPS[p], TPS[d])
                for p, d in tp_pairs
                if len(layouts_) == 1 or len(specs) == 1 or (p + d) % len(TPS) == (li + si) % len(TPS)
            ]
            yield pytest.param(name, lp, ld, sp, sd, pairs, id=f"{name}-{lp}{sp}-{ld}{sd}")


def test_the_cases_cover_every_tp_pair_with_every_layout_and_width_pair():
    for name, fam in FAMILIES.items():
        cases = [c.values for c in _cases() if c.values[0] == name]
        tp_pairs = set(itertools.product(TPS, TPS))
        with_layouts = {(c[1], c[2], pair) for c in cases for pair in c[5]}
        with_widths = {(c[3], c[4], pair) for c in cases for pair in c[5]}
        layouts_ = LAYOUT_PAIRS if fam.conv else [("SD", "SD")]
        specs = SPEC_PAIRS if fam.spec else [(0, 0)]
        assert with_layouts == {(lp, ld, pair) for lp, ld in layouts_ for pair in tp_pairs}, name
        assert with_widths == {(sp, sd, pair) for sp, sd in specs for pair in tp_pairs}, name


@pytest.mark.parametrize("name,lp,ld,sp,sd,tp_pairs", list(_cases()))
def test_every_tp_pair_rebuilds_the_destination_shard(name, lp, ld, sp, sd, tp_pairs):
    fam = FAMILIES[name]
    rng = np.random.default_rng(abs(hash((name, lp, ld, sp, sd))) % 2**32)
    kernel = kernel_of(fam)
    src_width = kernel - 1 + sp
    truth = make_truth(fam, src_width, len(SRC_BLOCKS), NUM_LAYERS, rng)
    for ptp, dtp in tp_pairs:
        slay = layout(fam, ptp, sp, lp)
        dlay = layout(fam, dtp, sd, ld)
        sources = {}
        for p in range(ptp):
            _, st = paged_states(slay, NUM_LAYERS, NUM_BLOCKS, rng)
            write_rank(fam, slay, st, truth, ptp, p, SRC_BLOCKS)
            sources[p] = pool(slay, st, p)
        for d in range(dtp):
            bufs, st = paged_states(dlay, NUM_LAYERS, NUM_BLOCKS, rng)
            before = [b.copy() for b in bufs]
            plan = LocalTransfer(sources, pool(dlay, st, d)).run(list(zip(SRC_BLOCKS, DST_BLOCKS)))
            want = expected_destination(fam, dlay, before, truth, src_width, dtp, d, DST_BLOCKS, kernel)
            for layer in range(NUM_LAYERS):
                bad = np.flatnonzero(bufs[layer] != want[layer])
                assert bad.size == 0, (
                    f"{name} P_TP={ptp} -> D_TP={dtp} rank {d}, layer {layer}: {bad.size} bytes differ "
                    f"(first at {bad[:4]}); plan {plan}"
                )
            # Exactly the destination rank's shard crosses the wire (plus whole source rows for a
            # staged DS window).
            if not plan.staging_bytes:
                per_req = sum(dlay.persistent[i].nbytes for i in range(len(dlay.persistent)))
                if fam.conv and src_width != kernel - 1 + sd:
                    spec = dlay.persistent[0]
                    dim = spec.shape[1] if spec.conv_layout == "SD" else spec.shape[0]
                    per_req -= spec.nbytes - (kernel - 1) * dim * spec.itemsize
                assert plan.nbytes == per_req * NUM_LAYERS * len(SRC_BLOCKS)


def test_equal_tp_and_layout_moves_each_state_in_one_read():
    fam = FAMILIES["gdn"]
    rng = np.random.default_rng(0)
    lay = layout(fam, 2, 3, "DS")
    _, s = paged_states(lay, NUM_LAYERS, NUM_BLOCKS, rng)
    _, d = paged_states(lay, NUM_LAYERS, NUM_BLOCKS, rng)
    plan = LocalTransfer({1: pool(lay, s, 1)}, pool(lay, d, 1)).plan(list(zip(SRC_BLOCKS, DST_BLOCKS)))
    assert plan.num_reads == 2 * NUM_LAYERS * len(SRC_BLOCKS)
    assert plan.source_ranks == [1] and plan.staging_bytes == 0


def test_source_ranks_follow_the_tp_ratio():
    fam = FAMILIES["gdn"]
    rng = np.random.default_rng(1)
    s4, d2 = layout(fam, 4, 0, "DS"), layout(fam, 2, 0, "DS")
    srcs = {p: pool(s4, paged_states(s4, 1, 4, rng)[1], p) for p in range(4)}
    plan = LocalTransfer(srcs, pool(d2, paged_states(d2, 1, 4, rng)[1], 1)).plan([(1, 1)])
    assert plan.source_ranks == [2, 3]
    dst4 = pool(s4, paged_states(s4, 1, 4, rng)[1], 3)
    src2 = {p: pool(d2, paged_states(d2, 1, 4, rng)[1], p) for p in range(2)}
    assert LocalTransfer(src2, dst4).plan([(1, 1)]).source_ranks == [1]


def _staged_reference(rows, staging, views, requests=None):
    """Item-by-item copies, one staged row at a time."""
    for r in rows.tolist():
        req, so, srs, scs, dt, do, drs, dcs, n_rows, n_cols, elem = r
        if requests is not None and req not in requests:
            continue
        for i in range(n_rows):
            for j in range(n_cols):
                s, d = so + i * srs + j * scs, do + i * drs + j * dcs
                views[dt][d : d + elem] = staging[s : s + elem]


@pytest.mark.parametrize("elem", [1, 2, 4, 3])
@pytest.mark.parametrize("spacing", ["even", "uneven", "odd"])
def test_vectorised_staged_copies_match_item_by_item_copies(elem, spacing):
    # Transposing (SD -> DS) and column-keeping (DS -> DS) copies into two tensors: evenly spaced
    # offsets (one strided view per side), uneven ones (index arrays), odd ones (unaligned items),
    # 3-byte items (no numpy integer type); then a subset of the requests.
    rng = np.random.default_rng(elem)
    rows_n, cols_n, page = 5, 3, 4096
    staging = rng.integers(0, 256, size=1 << 16, dtype=np.uint8)
    blocks = [3, 0, 6, 2] if spacing == "uneven" else [1, 2, 3, 4]
    gap = [0, 64, 8, 128] if spacing == "uneven" else [0, 0, 0, 0]
    shift = 1 if spacing == "odd" else 0
    rows, so = [], shift
    for q, b in enumerate(blocks):
        so += gap[q]
        rows.append([q, so, elem, rows_n * elem, 0, b * page + shift, 6 * elem, elem, rows_n, cols_n, elem])
        rows.append([q, so + 256, 6 * elem, elem, 1, b * page + 40, 6 * elem, elem, rows_n, cols_n, elem])
        so += 512
    rows = np.array(rows, dtype=np.uint64)
    for subset in (None, {0, 2}):
        want = [rng.integers(0, 256, size=8 * page, dtype=np.uint8) for _ in range(2)]
        got = [w.copy() for w in want]
        before = [w.copy() for w in want]
        _staged_reference(rows, staging, want, requests=subset)
        assert any((a != b).any() for a, b in zip(before, want))
        run_staged(rows, staging, got, requests=None if subset is None else sorted(subset))
        assert all((a == b).all() for a, b in zip(got, want))
