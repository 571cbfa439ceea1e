"""Every incompatible pair and every bad batch is rejected before a byte moves; host offload is
byte-exact and leaves workspace untouched."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs import Layout, layouts
from recoverssm_rs.errors import BindingError, LayoutError, PlanError
from recoverssm_rs.transfer import HostOffload, LayoutFingerprint, LocalTransfer, StatePool
from support.transfer_ref import FAMILIES, layout, paged_states, pool

GDN = FAMILIES["gdn"]


def _pair(slay, dlay, rng, sblocks=6, dblocks=6):
    sb, s = paged_states(slay, 2, sblocks, rng)
    db, d = paged_states(dlay, 2, dblocks, rng)
    return LocalTransfer({0: pool(slay, s, 0)}, pool(dlay, d, 0)), db


@pytest.mark.parametrize(
    "over,needle",
    [
        (dict(ssm_dtype="float16"), "state 'temporal' dtype: source float32 vs destination float16"),
        (dict(dtype="float32"), "state 'conv' dtype: source float16 vs destination float32"),
        (dict(conv_kernel_size=3), "state 'conv' conv_kernel_size: source 4 vs destination 3"),
        (dict(head_v_dim=2), "model dim head_v_dim: source 3 vs destination 2"),
        (dict(num_v_heads=8), "state 'temporal' heads: source 16 vs destination 8"),
    ],
)
def test_incompatible_pairs_are_rejected_naming_both_values(over, needle):
    rng = np.random.default_rng(0)
    t, dbufs = _pair(layout(GDN, 1, 0, "SD"), layout(GDN, 1, 0, "SD", **over), rng)
    before = [b.copy() for b in dbufs]
    with pytest.raises(LayoutError) as e:
        t.run([(1, 1)])
    assert needle in str(e.value)
    assert all((a == b).all() for a, b in zip(before, dbufs)), "a rejected transfer wrote bytes"


def test_other_family_is_rejected():
    kda = layouts.kda(num_heads=16, head_dim=2, conv_kernel_size=4, dtype="float16", ssm_dtype="float32")
    a = LayoutFingerprint(layout(GDN, 1, 0, "SD"))
    b = LayoutFingerprint(kda)
    with pytest.raises(LayoutError, match="family: source 'gdn' vs destination 'kda'"):
        a.check_compatible(b)


def test_fingerprint_round_trips_and_rejects_hand_built_layouts():
    fp = LayoutFingerprint(layout(GDN, 4, 3, "DS"), tp_rank=2, block_size=64)
    back = LayoutFingerprint.decode(fp.encode())
    assert back == fp and (back.tp_size, back.tp_rank, back.conv_layout, back.num_spec) == (4, 2, "DS", 3)
    assert fp.with_rank(3).tp_rank == 3
    with pytest.raises(LayoutError, match="out of range"):
        fp.with_rank(4)
    bare = Layout("GDN_ATTN", list(layout(GDN, 1, 0, "SD").states), 0)
    with pytest.raises(LayoutError, match="no tensor-parallel split"):
        LayoutFingerprint(bare)
    with pytest.raises(LayoutError, match="not a transfer fingerprint"):
        LayoutFingerprint.decode("{}")


@pytest.mark.parametrize(
    "requests,needle",
    [
        ([(0, 1)], "request 0: the source block is the null block 0"),
        ([(1, 0)], "request 0: the destination block is the null block 0"),
        ([(1, 2), (6, 3)], "request 1: source block 6 is out of range [1, 6)"),
        ([(1, 2), (2, 9)], "request 1: destination block 9 is out of range [1, 6)"),
        ([(1, 2), (3, 4), (5, 2)], "requests 0 and 2 both write destination block 2"),
    ],
)
def test_bad_batches_are_rejected_with_nothing_written(requests, needle):
    rng = np.random.default_rng(1)
    slay = layout(GDN, 2, 0, "SD")
    t, dbufs = _pair(slay, layout(GDN, 1, 2, "DS"), rng)
    t = LocalTransfer({0: t.sources[0], 1: pool(slay, paged_states(slay, 2, 6, rng)[1], 1)}, t.destination)
    before = [b.copy() for b in dbufs]
    with pytest.raises(PlanError) as e:
        t.run(requests)
    assert needle in str(e.value)
    assert all((a == b).all() for a, b in zip(before, dbufs))


def test_pool_tensors_are_checked_against_the_layout():
    lay = layout(GDN, 1, 0, "SD")
    rng = np.random.default_rng(2)
    _, s = paged_states(lay, 1, 4, rng)
    s[0][1] = s[0][1].astype(np.float64)
    with pytest.raises(BindingError, match="dtype is float64"):
        StatePool(lay, s)


@pytest.mark.parametrize("name", ["gdn_recoverssm", "kda_recoverssm", "mamba2_g1"])
def test_host_offload_round_trip_is_byte_exact_and_leaves_workspace(name):
    fam = FAMILIES[name]
    lay = layout(fam, 2, 3 if fam.spec else 0, "DS")
    rng = np.random.default_rng(3)
    bufs, states = paged_states(lay, 3, 8, rng)
    work = [[rng.standard_normal((8, *w.shape)).astype(w.dtype) for w in lay.workspace] for _ in range(3)]
    full = [st + wk for st, wk in zip(states, work)]
    p = StatePool(lay, full, tp_rank=1)
    off = HostOffload(p)
    blocks = [5, 2, 7]
    saved = [b.copy() for b in bufs]
    wsaved = [[w.copy() for w in layer] for layer in work]
    host = off.offload(blocks)
    assert host.nbytes == 3 * 3 * sum(s.nbytes for s in lay.persistent)
    for b in bufs:  # clobber the offloaded blocks (preemption reuses them)
        b[:] = rng.integers(0, 256, size=b.size, dtype=np.uint8)
    clobbered = [b.copy() for b in bufs]
    off.restore(host, [3, 1, 6])
    page = bufs[0].size // 8
    for layer in range(3):
        got = bufs[layer].reshape(8, page)
        want = clobbered[layer].reshape(8, page).copy()
        for src, dst in zip(blocks, [3, 1, 6]):
            n = sum((s.nbytes + 7) // 8 * 8 for s in lay.persistent)
            want[dst, :n] = saved[layer].reshape(8, page)[src, :n]
            # alignment gaps between states are not state bytes: they keep the clobbered values
            off_ = 0
            for s in lay.persistent:
                want[dst, off_ + s.nbytes : (off_ + s.nbytes + 7) // 8 * 8] = clobbered[layer].reshape(8, page)[
                    dst, off_ + s.nbytes : (off_ + s.nbytes + 7) // 8 * 8
                ]
                off_ = (off_ + s.nbytes + 7) // 8 * 8
        assert (got == want).all(), f"layer {layer}: restore is not byte-exact"
        for w, ws in zip(work[layer], wsaved[layer]):
            assert (w == ws).all(), "workspace changed"


def test_a_missing_source_rank_is_named():
    from recoverssm_rs.errors import BindingError

    rng = np.random.default_rng(4)
    s2, d1 = layout(GDN, 2, 0, "DS"), layout(GDN, 1, 0, "DS")
    bufs, d = paged_states(d1, 2, 4, rng)
    before = [b.copy() for b in bufs]
    t = LocalTransfer({0: pool(s2, paged_states(s2, 2, 4, rng)[1], 0)}, pool(d1, d, 0))
    with pytest.raises(BindingError, match=r"source ranks \[1\]"):
        t.run([(1, 1)])
    assert all((a == b).all() for a, b in zip(before, bufs))
