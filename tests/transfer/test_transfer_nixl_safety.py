"""NIXL transfers that fail safe: a source process killed mid-transfer ends in a per-request result
(done requests exact, failed ones' blocks as before), malformed or mixed handshakes are the
package's errors, a freed destination tensor stops a pull before anything moves, and endpoints
listen on loopback unless told otherwise. Skipped when NIXL is not importable, unless
RECOVERSSM_REQUIRE_NIXL=1."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
import torch
from recoverssm_rs.errors import BindingError, LayoutError
from recoverssm_rs.transfer import PeerInfo, StatePool
from recoverssm_rs.transfer import nixl as rnixl
from support.transfer_ref import (
    FAMILIES,
    expected_destination,
    kernel_of,
    layout,
    make_truth,
    nixl_or_skip,
    page_bytes,
    paged_states,
    pool,
    serve_sources,
)

nixl_or_skip()

GDN = FAMILIES["gdn"]


@pytest.mark.parametrize("kill_after", [0, 3])
def test_a_source_killed_mid_transfer_ends_in_a_result_per_request(kill_after):
    name, tp, sp, lp = "gdn", 2, 0, "SD"
    fam = FAMILIES[name]
    blocks = list(range(1, 9))
    dst_blocks = list(range(2, 10))
    seed = 99
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=serve_sources, args=(there, name, tp, sp, lp, seed, blocks, 2))
    child.start()
    try:
        infos = here.recv()
        kernel = kernel_of(fam)
        truth = make_truth(fam, kernel - 1 + sp, len(blocks), 2, np.random.default_rng(seed))
        dlay = layout(fam, 1, 0, "DS")
        bufs, st = paged_states(dlay, 2, 12, np.random.default_rng(1))
        before = [b.copy() for b in bufs]
        ep = rnixl.NixlEndpoint("dst-killed", pool(dlay, st, 0))
        for info in infos:
            ep.connect(info)
        posted = {"n": 0}
        real = ep.agent.transfer

        def transfer_then_kill(h):  # the source process dies after `kill_after` posted transfers
            if posted["n"] == kill_after:
                child.kill()
                child.join(30)
            posted["n"] += 1
            return real(h)

        ep.agent.transfer = transfer_then_kill
        res = ep.pull(list(zip(blocks, dst_blocks)), timeout=30)
    finally:
        if child.is_alive():
            child.kill()
        child.join(30)
    assert sorted(res.done + list(res.failed)) == list(range(len(blocks))), res
    assert res.failed, "the source was killed: some request must fail"
    assert res.invalid_blocks == sorted(dst_blocks[r] for r in res.failed)
    want = expected_destination(fam, dlay, before, truth, kernel - 1 + sp, 1, 0, dst_blocks, kernel)
    page = page_bytes(dlay)
    for layer, (got, ok, old) in enumerate(zip(bufs, want, before)):
        got, ok, old = (x.reshape(-1, page) for x in (got, ok, old))
        for r, b in enumerate(dst_blocks):
            ref = old if r in res.failed else ok
            assert (got[b] == ref[b]).all(), f"layer {layer}, request {r}: block {b} is half-written"
        untouched = sorted(set(range(got.shape[0])) - set(dst_blocks))
        assert (got[untouched] == old[untouched]).all()


def _endpoint(name, lay, rank, seed, **kw):
    _, st = paged_states(lay, 2, 8, np.random.default_rng(seed))
    return rnixl.NixlEndpoint(name, pool(lay, st, rank), **kw)


def test_malformed_and_foreign_handshakes_are_package_errors():
    lay = layout(GDN, 1, 0, "SD")
    src, dst = _endpoint("hs-src", lay, 0, 1), _endpoint("hs-dst", lay, 0, 2)
    data = src.info().to_bytes()
    for bad in (data[:-10], b"\xff" + data, data.replace(b"name hs-src", b"name")):
        with pytest.raises(LayoutError, match="peer handshake"):
            dst.connect(bad)
    with pytest.raises(LayoutError, match="a peer's handshake is bytes or a PeerInfo, got str"):
        dst.connect(data.decode())  # type: ignore[arg-type]
    info = src.info()
    junk = PeerInfo(info.name, b"not nixl metadata", info.fingerprint, info.geometry, info.addresses)
    with pytest.raises(BindingError, match="was refused by NIXL"):
        dst.connect(junk)
    assert not dst.peers


def test_a_source_rank_of_another_layout_is_refused_at_connect():
    sd, ds = layout(GDN, 2, 0, "SD"), layout(GDN, 2, 0, "DS")
    dst = _endpoint("mix-dst", layout(GDN, 1, 0, "SD"), 0, 3)
    src0, src1 = _endpoint("mix-src0", sd, 0, 4), _endpoint("mix-src1", ds, 1, 5)
    dst.connect(src0.info())
    with pytest.raises(BindingError, match="source rank 1 .*conv layout DS.* is not a rank of the same instance"):
        dst.connect(src1.info())
    assert sorted(dst.peers) == [0]


def test_a_freed_destination_tensor_stops_the_pull_before_anything_moves():
    lay = layout(GDN, 1, 0, "SD")
    src = _endpoint("free-src", lay, 0, 6)
    g = torch.Generator().manual_seed(0)
    layers = [
        [torch.randn((8, *s.shape), generator=g).to(getattr(torch, s.dtype)) for s in lay.persistent] for _ in range(2)
    ]
    dst = rnixl.NixlEndpoint("free-dst", StatePool(lay, layers))
    dst.connect(src.info())
    assert dst.pull([(1, 2)]).ok
    layers[1][1].untyped_storage().resize_(0)
    keep = [t.clone() for t in (layers[0][0], layers[0][1], layers[1][0])]
    with pytest.raises(BindingError, match="layer 1, state 'temporal': its storage was resized or freed"):
        dst.pull([(3, 4)])
    same = (
        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        for a, b in zip(keep, (layers[0][0], layers[0][1], layers[1][0]))
    )
    assert all(same)


def _listeners() -> dict[int, str]:
    """This process's listening TCP sockets: inode -> local IPv4 / IPv6 address (hex, as the
    kernel lists it)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(int(link[8:-1]))
    out = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[9]) in mine:  # LISTEN
                    out[int(cols[9])] = cols[1].rsplit(":", 1)[0]
    return out


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


@pytest.mark.parametrize("interfaces", ["lo", "127.0.0.1", ["lo"]])
def test_endpoints_listen_on_loopback_unless_told(interfaces):
    lay = layout(GDN, 1, 0, "SD")
    old = set(_listeners())
    ep = _endpoint(f"listen-{len(old)}-{interfaces!s:.3}", lay, 0, 7, interfaces=interfaces)
    new = {k: v for k, v in _listeners().items() if k not in old}
    assert new and set(new.values()) <= LOOPBACK, f"listening beyond loopback: {new}"
    assert ep.interfaces == "lo" and "interfaces='lo'" in repr(ep)
    with pytest.raises(BindingError, match="no network interface has the address 203.0.113.77"):
        rnixl.net_devices("203.0.113.77")
    assert rnixl.net_devices("all") is None and rnixl.net_devices("lo, eth0") == "lo,eth0"
