"""Plan-driven NIXL transfers between two OS processes (CPU memory over UCX): the source instance
in a spawned process, the destination ranks here, every destination byte checked against the
reference. Skipped when NIXL is not importable, unless RECOVERSSM_REQUIRE_NIXL=1."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest
from recoverssm_rs.errors import BackendUnavailableError, LayoutError
from recoverssm_rs.transfer import nixl as rnixl
from support.transfer_ref import (
    FAMILIES,
    expected_destination,
    kernel_of,
    layout,
    make_truth,
    nixl_or_skip,
    paged_states,
    pool,
    serve_sources,
)

nixl_or_skip()

SRC_BLOCKS = [3, 1, 4, 2]
DST_BLOCKS = [2, 5, 1, 6]
LAYERS = 2


@pytest.mark.parametrize(
    "name,ptp,lp,sp,dtp,ld,sd",
    [
        ("gdn", 2, "SD", 3, 1, "DS", 0),
        ("kda_recoverssm", 1, "DS", 7, 2, "DS", 2),
        ("mamba2_g1", 4, "DS", 0, 2, "DS", 0),
        ("gdn_recoverssm", 2, "DS", 2, 4, "SD", 2),
    ],
)
def test_two_process_transfer_has_zero_mismatches(name, ptp, lp, sp, dtp, ld, sd):
    fam = FAMILIES[name]
    seed = 1234
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=serve_sources, args=(there, name, ptp, sp, lp, seed, SRC_BLOCKS, LAYERS))
    child.start()
    try:
        infos = here.recv()
        kernel = kernel_of(fam)
        truth = make_truth(fam, kernel - 1 + sp, len(SRC_BLOCKS), LAYERS, np.random.default_rng(seed))
        dlay = layout(fam, dtp, sd, ld)
        rng = np.random.default_rng(7)
        for d in range(dtp):
            bufs, st = paged_states(dlay, LAYERS, 8, rng)
            before = [b.copy() for b in bufs]
            ep = rnixl.NixlEndpoint(f"dst-{name}-{d}", pool(dlay, st, d))
            for info in infos:
                ep.connect(info)
            res = ep.pull(list(zip(SRC_BLOCKS, DST_BLOCKS)))
            assert res.ok and res.done == list(range(len(SRC_BLOCKS))), res.failed
            want = expected_destination(fam, dlay, before, truth, kernel - 1 + sp, dtp, d, DST_BLOCKS, kernel)
            mismatches = sum(int((a != b).sum()) for a, b in zip(bufs, want))
            assert mismatches == 0, f"rank {d}: {mismatches} bytes differ"
    finally:
        here.send("done")
        child.join(30)
    assert child.exitcode == 0


def _inproc(name="gdn", sp=0, sd=0, lp="SD", ld="SD", dst_progress_thread=True, **over):
    fam = FAMILIES[name]
    rng = np.random.default_rng(3)
    slay, dlay = layout(fam, 1, sp, lp), layout(fam, 1, sd, ld, **over)
    _, s = paged_states(slay, LAYERS, 8, rng)
    bufs, d = paged_states(dlay, LAYERS, 8, rng)
    src = rnixl.NixlEndpoint(f"s-{id(s)}", pool(slay, s, 0))
    dst = rnixl.NixlEndpoint(f"d-{id(d)}", pool(dlay, d, 0), progress_thread=dst_progress_thread)
    return src, dst, bufs


def test_handshake_rejects_an_incompatible_source_before_anything_moves():
    src, dst, bufs = _inproc(ssm_dtype="float16")
    before = [b.copy() for b in bufs]
    with pytest.raises(LayoutError, match="state 'temporal' dtype: source float32 vs destination float16"):
        dst.connect(src.info().to_bytes())
    assert not dst.peers
    assert all((a == b).all() for a, b in zip(before, bufs))


def test_failed_reads_are_reported_and_never_done(monkeypatch):
    # SD -> DS: the conv window is staged, so a failed request's staged state is never finished.
    src, dst, bufs = _inproc(lp="SD", ld="DS", sp=2)
    dst.connect(src.info())
    before = [b.copy() for b in bufs]
    real = dst.agent.initialize_xfer
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # the second request's transfer cannot be prepared
            raise RuntimeError("injected NIXL failure")
        return real(*a, **k)

    monkeypatch.setattr(dst.agent, "initialize_xfer", flaky)
    res = dst.pull([(1, 2), (3, 4), (5, 6)])
    assert res.done == [0, 2] and list(res.failed) == [1] and "injected" in res.failed[1]
    assert res.invalid_blocks == [4]
    page = bufs[0].size // 8
    for b, a in zip(bufs, before):
        assert (b.reshape(8, page)[4] == a.reshape(8, page)[4]).all(), "the failed request's block was written"
        assert not (b.reshape(8, page)[2] == a.reshape(8, page)[2]).all()


def test_cancelled_reads_are_reported_and_never_done(monkeypatch):
    src, dst, _ = _inproc()
    dst.connect(src.info())
    monkeypatch.setattr(dst.agent, "check_xfer_state", lambda h: "PROC")
    res = dst.pull([(1, 2), (3, 4)], timeout=0.05)
    assert res.done == [] and sorted(res.failed) == [0, 1] and "cancelled" in res.failed[0]
    assert res.invalid_blocks == [2, 4]


def test_missing_nixl_raises_backend_unavailable(monkeypatch):
    monkeypatch.setattr(rnixl, "_MODULES", ("recoverssm_no_such_nixl",))
    with pytest.raises(BackendUnavailableError, match="pip install nixl-cu12"):
        rnixl.import_nixl()
    assert not rnixl.nixl_available()


def test_batch_mode_moves_the_same_bytes_in_fewer_transfers():
    src, dst, bufs = _inproc(lp="DS", ld="SD", sp=1)
    dst.connect(src.info())
    reqs = [(1, 2), (3, 4), (5, 6)]
    before = [b.copy() for b in bufs]
    per = dst.pull(reqs)
    after_per = [b.copy() for b in bufs]
    assert any((a != b).any() for a, b in zip(before, after_per))
    for b, a in zip(bufs, before):
        b[:] = a
    batch = dst.pull(reqs, per_request=False)
    assert batch.done == per.done == [0, 1, 2] and batch.nbytes == per.nbytes
    assert all((a == b).all() for a, b in zip(after_per, bufs))
    assert batch.descriptors <= per.descriptors


def test_a_destination_without_a_progress_thread_progresses_its_own_pulls():
    # The pull's polling drives the reads: the same bytes land as with NIXL's progress thread.
    src, dst, bufs = _inproc(lp="SD", ld="DS", sp=2, dst_progress_thread=False)
    dst.connect(src.info())
    before = [b.copy() for b in bufs]
    res = dst.pull([(1, 2), (3, 4)], timeout=30)
    assert res.ok and res.done == [0, 1]
    got = [b.copy() for b in bufs]
    assert any((a != b).any() for a, b in zip(before, got))
    for b, a in zip(bufs, before):
        b[:] = a
    src2, dst2, bufs2 = _inproc(lp="SD", ld="DS", sp=2)
    dst2.connect(src2.info())
    for b, a in zip(bufs2, before):
        b[:] = a
    assert dst2.pull([(1, 2), (3, 4)], timeout=30).ok
    assert all((a == b).all() for a, b in zip(got, bufs2))


@pytest.mark.parametrize("per_request", [True, False])
def test_each_source_rank_is_told_which_of_its_blocks_were_read(per_request):
    src, dst, _ = _inproc()
    dst.connect(src.info())
    res = dst.pull([(1, 2), (3, 4), (5, 6)], per_request=per_request)
    assert res.ok
    notes: list[str] = []
    blocks: list[int] = []
    # The notices travel over the transport, one per polling sweep that finished requests (per
    # request, the batch may finish over several sweeps): wait for all of them, up to 10 s.
    for _ in range(1000):
        notes += src.notifications()
        assert all(n.startswith(f"recoverssm:{dst.name}:") for n in notes), notes
        blocks = sorted(int(b) for n in notes for b in n.rsplit(":", 1)[1].split(","))
        if len(blocks) >= 3:
            break
        time.sleep(0.01)
    assert blocks == [1, 3, 5], notes
