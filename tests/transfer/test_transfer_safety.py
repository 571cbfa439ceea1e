"""Transfers that fail safe without a transport: overflowing or inconsistent peer sizes, malformed
handshakes, negative blocks, swapped or mixed source pools, restores into another rank, and freed
tensors all end in the package's own error with nothing written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from recoverssm_rs.errors import BindingError, LayoutError, PlanError
from recoverssm_rs.transfer import HostOffload, LayoutFingerprint, LocalTransfer, PeerInfo, StatePool, plan_transfer
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

GDN = FAMILIES["gdn"]


def _conv_line(text: str, width: str, kernel: str) -> str:
    out = []
    for line in text.splitlines():
        t = line.split(" ")
        if t[0] == "conv":
            t[4], t[6] = width, kernel
        out.append(" ".join(t))
    return "\n".join(out)


@pytest.mark.parametrize("width", [2**61, 2**62 + 1, 2, 6])
def test_a_width_other_than_kernel_minus_one_plus_num_spec_is_refused(width):
    text = LayoutFingerprint(layout(GDN, 2, 1, "SD")).encode()
    with pytest.raises(LayoutError, match=f"conv window width {width} is not conv_kernel_size - 1 \\+ num_spec"):
        LayoutFingerprint.decode(_conv_line(text, str(width), "4"))


@pytest.mark.parametrize("size", [2**61, 2**62 + 1, 2**64 - 1])
def test_consistent_sizes_that_overflow_are_refused_not_wrapped(size):
    text = LayoutFingerprint(layout(GDN, 2, 1, "SD")).encode()
    with pytest.raises(LayoutError, match="overflows"):
        LayoutFingerprint.decode(_conv_line(text, str(size), str(size)))


def _peer_bytes() -> bytes:
    lay = layout(GDN, 2, 0, "SD")
    fp = LayoutFingerprint(lay, tp_rank=1)
    strides = [n + 8 for n in fp.state_nbytes] * 2
    return PeerInfo("src-1", b"\x00\x01meta", fp, (2, 6, strides), [4096, 8192, 12288, 16384]).to_bytes()


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda b: b"\xff\xfe" + b, "not UTF-8"),
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[:-4], "truncated"),
        (lambda b: b.replace(b"name src-1\n", b""), "no 'name' entry"),
        (lambda b: b.replace(b"geometry 2 6", b"geometry two 6"), "'two' is not a non-negative integer"),
        (lambda b: b.replace(b"addresses 4096", b"addresses -4096"), "'-4096' is not a non-negative integer"),
        (lambda b: b.replace(b"geometry 2 6", b"geometry 2 4611686018427387904"), "overflow"),
        (lambda b: b.replace(b"tp 2 1", b"tp 2 7"), "out of range"),
        (lambda b: b"{}", "not a peer handshake"),
    ],
)
def test_malformed_handshakes_are_layout_errors(mutate, needle):
    data = _peer_bytes()
    back = PeerInfo.from_bytes(data)
    assert (back.name, back.metadata, back.fingerprint.tp_rank, back.geometry[:2]) == (
        "src-1",
        b"\x00\x01meta",
        1,
        (2, 6),
    )
    with pytest.raises(LayoutError, match=needle):
        PeerInfo.from_bytes(mutate(data))


def _gdn_pools(tp, lay_name="SD", ranks=None, blocks=6, seed=0):
    lay = layout(GDN, tp, 0, lay_name)
    rng = np.random.default_rng(seed)
    out = {}
    for r in ranks if ranks is not None else range(tp):
        bufs, st = paged_states(lay, 2, blocks, rng)
        out[r] = (bufs, pool(lay, st, r))
    return lay, out


def test_negative_blocks_are_plan_errors_naming_the_request():
    _, src = _gdn_pools(1)
    bufs, dst = src[0]
    before = [b.copy() for b in bufs]
    off = HostOffload(dst)
    host = off.offload([1, 2])
    with pytest.raises(PlanError, match="request 1: destination block -3 must be >= 0"):
        off.restore(host, [1, -3])
    with pytest.raises(PlanError, match="request 0: source block -1 must be >= 0"):
        off.offload([-1])
    fp = dst.fingerprint
    with pytest.raises(PlanError, match="request 0: source block -1"):
        plan_transfer(fp, [dst.geometry], fp, dst.geometry, np.array([[-1, 2]]))
    assert all((a == b).all() for a, b in zip(before, bufs))


def test_swapped_and_mixed_source_pools_are_refused():
    _, sd = _gdn_pools(2, "SD")
    _, ds = _gdn_pools(2, "DS", seed=1)
    _, d = _gdn_pools(1, seed=2)
    dst = d[0][1]
    with pytest.raises(BindingError, match="source rank 0: the pool given for it holds rank 1 of 2"):
        LocalTransfer({0: sd[1][1], 1: sd[0][1]}, dst)
    with pytest.raises(BindingError, match="source rank 1 .*conv layout DS.* is not a rank of the same instance"):
        LocalTransfer({0: sd[0][1], 1: ds[1][1]}, dst)
    _, tp4 = _gdn_pools(4, ranks=[1], seed=3)
    with pytest.raises(BindingError, match="not a rank of the same instance"):
        LocalTransfer([sd[0][1], tp4[1][1]], dst)
    t = LocalTransfer({0: sd[0][1], 1: sd[1][1]}, dst)
    t.sources[0] = sd[1][1]  # a copy: the transfer keeps the pools it checked
    assert t.sources[0] is sd[0][1]


def test_restore_into_another_rank_of_the_same_tp_is_refused_with_nothing_written():
    _, src = _gdn_pools(2)
    host = HostOffload(src[0][1]).offload([1, 2])
    bufs, rank1 = src[1]
    before = [b.copy() for b in bufs]
    with pytest.raises(
        BindingError, match=r"reads source ranks \[1\] of tp_size 2, which were not given \(given: \[0\]\)"
    ):
        HostOffload(rank1).restore(host, [3, 4])
    assert all((a == b).all() for a, b in zip(before, bufs)), "rank 0's heads were written into rank 1's pool"


@pytest.mark.parametrize("name", ["gdn", "mamba2_g1"])
def test_restore_re_shards_rank_1_of_tp2_into_rank_2_of_tp4_and_both_ranks_into_tp1(name):
    fam = FAMILIES[name]
    kernel = kernel_of(fam)
    blocks = [3, 1]
    rng = np.random.default_rng(5)
    truth = make_truth(fam, kernel - 1, len(blocks), 2, rng)
    slay = layout(fam, 2, 0, "SD")
    saved = []
    for r in range(2):
        _, st = paged_states(slay, 2, 5, rng)
        write_rank(fam, slay, st, truth, 2, r, blocks)
        saved.append(HostOffload(pool(slay, st, r)).offload(blocks))
    for tp, rank, given in [(4, 2, [saved[1]]), (1, 0, saved)]:
        dlay = layout(fam, tp, 0, "DS")
        bufs, st = paged_states(dlay, 2, 6, rng)
        before = [b.copy() for b in bufs]
        HostOffload(pool(dlay, st, rank)).restore(given, [5, 2])
        want = expected_destination(fam, dlay, before, truth, kernel - 1, tp, rank, [5, 2], kernel)
        assert all((a == b).all() for a, b in zip(bufs, want)), f"tp {tp} rank {rank}: restore is not exact"


def _torch_pool(lay, rank=0, blocks=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    layers = [
        [torch.randn((blocks, *s.shape), generator=g).to(getattr(torch, s.dtype)) for s in lay.persistent]
        for _ in range(2)
    ]
    return layers, StatePool(lay, layers, tp_rank=rank)


def _snapshot(layers):
    return [[t.clone() for t in layer] for layer in layers]


def _same(a, b):
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for la, lb in zip(a, b) for x, y in zip(la, lb))


def test_freed_tensors_are_refused_before_offload_restore_and_run():
    lay = layout(GDN, 1, 0, "SD")
    src_layers, src = _torch_pool(lay, seed=1)
    dst_layers, dst = _torch_pool(lay, seed=2)
    off = HostOffload(dst)
    host = off.offload([1, 2])
    # run: a freed source tensor is never read; a freed destination tensor never written.
    src_layers[1][0].untyped_storage().resize_(0)
    before = _snapshot(dst_layers)
    with pytest.raises(BindingError, match=r"pool rank 0: layer 1, state 'conv': its storage was resized or freed"):
        LocalTransfer({0: src}, dst).run([(1, 3)])
    assert _same(before, dst_layers)
    # restore and offload: the pool's own tensor freed.
    dst_layers[0][1].untyped_storage().resize_(0)
    alive = [dst_layers[0][0].clone(), dst_layers[1][0].clone(), dst_layers[1][1].clone()]
    with pytest.raises(BindingError, match="layer 0, state 'temporal': its storage was resized or freed"):
        off.restore(host, [3, 4])
    with pytest.raises(BindingError, match="layer 0, state 'temporal'"):
        off.offload([1])
    now = [dst_layers[0][0], dst_layers[1][0], dst_layers[1][1]]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(alive, now))


def test_a_freed_host_copy_is_never_read():
    lay = layout(GDN, 1, 0, "SD")
    layers, p = _torch_pool(lay, seed=3)
    off = HostOffload(p)
    host = off.offload([1, 2])
    host.pool.tensors[0].untyped_storage().resize_(0)
    before = _snapshot(layers)
    with pytest.raises(BindingError, match="its storage was resized or freed"):
        off.restore(host, [3, 4])
    assert _same(before, layers)
    with pytest.raises(TypeError):
        p.tensors[0] = None  # type: ignore[index]
