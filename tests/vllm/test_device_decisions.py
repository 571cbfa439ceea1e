"""The step's decisions on the device equal the core's host decisions: random batches run through
the host path (``align_pre_copy`` / ``align_post_process`` and their multi-group plans) and through
one fused launch each (``Planner.launch`` with vLLM's pre-copy semantics,
``Planner.launch_post_process`` deciding on the device), emulated on the host from the
real kernel source. Every state byte and every accepted count written by the kernel
(``num_accepted_out``) must be equal."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import Planner  # noqa: E402
from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.vllm.decide import (  # noqa: E402
    PostProcessInputs,
    PreCopyInputs,
    align_post_process,
    align_pre_copy,
    plan,
)
from support.device_fakes import FakeCuda, random_states  # noqa: E402
from support.generators import NSPEC, group_layouts  # noqa: E402

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")
COLS = 24


def fake(x, dtype=torch.int32) -> FakeCuda:
    return FakeCuda(torch.as_tensor(np.array(x)).to(dtype))


def batch(rng: np.random.Generator, r: int, bs: int, groups: int, nb: int):
    """A random step every request of which owns its blocks (distinct ids per request and group):
    new requests, prefix hits, running columns behind, at and after the new one, spec decode."""
    c = rng.integers(0, 30, r)
    n = np.where(rng.random(r) < 0.5, 1 + rng.integers(0, NSPEC + 1, r), rng.integers(1, 9, r))
    curr = (c + n - 1) // bs
    run = np.where(rng.random(r) < 0.75, np.clip(curr + rng.integers(-2, 2, r), 0, None), -1)
    run = np.where(c == 0, -1, run)
    a = rng.integers(1, NSPEC + 2, r)
    ids = rng.permutation(np.arange(1, nb))[: groups * r * COLS].reshape(groups, r, COLS)
    return [t.astype(np.int64) for t in ids], c, n, a, run


def clone(states):
    return [[[t.clone() for t in layer] for layer in g] for g in states]


def assert_same(got, want):
    for g, (got_g, want_g) in enumerate(zip(got, want)):
        for li, (got_l, want_l) in enumerate(zip(got_g, want_g)):
            for i, (x, y) in enumerate(zip(got_l, want_l)):
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"group {g}, layer {li}, state {i}"


@needs_cxx
@pytest.mark.parametrize("seed", range(6))
def test_pre_copy_and_post_process_on_the_device_equal_the_host(fake_ops, emulator, seed):
    rng = np.random.default_rng(4200 + seed)
    bs = int(rng.choice([2, 3, 4]))
    lays = group_layouts()[: 1 + seed % 3]
    r = int(rng.integers(1, 10))
    nb = len(lays) * r * COLS + 2
    tables, c, n, a, run = batch(rng, r, bs, len(lays), nb)
    states = [random_states(lay, nb, 2, rng) for lay in lays]
    want = clone(states)
    host = Planner.from_groups(list(zip(lays, want)), block_size=bs)
    dev = Planner.from_groups(
        [(lay, [[FakeCuda(t) for t in layer] for layer in g]) for lay, g in zip(lays, states)], block_size=bs
    )
    table = FakeCuda(torch.from_numpy(np.stack(tables).astype(np.int32)))

    # Pre-copy: the host decides the columns; the device applies the counts and resets them.
    d, copies = plan(host, PreCopyInputs(tables, c, n, a, run))
    copies.execute()
    assert (d.src_col >= 0).any(), "the batch moves some state"
    out = fake(np.full(r, -7))
    dev.launch(table, fake(d.src_col), fake(d.curr), fake(a, torch.int64), "pre_copy", num_accepted_out=out)
    assert dev.last_error().ok
    assert out.t.tolist() == d.num_accepted.tolist()
    assert_same(states, want)

    # Post-process: the device decides from running, the state column and the accepted counts.
    nd = np.minimum(rng.integers(0, NSPEC + 1, r), n - 1)
    acc = 1 + rng.integers(0, nd + 1)
    p, copies = plan(host, PostProcessInputs(tables, d.curr, c, n, nd, acc))
    copies.execute()
    out = fake(np.full(r, -7))
    dev.launch_post_process(table, fake(d.curr), fake(c + n - nd), fake(acc), num_accepted_out=out)
    assert dev.last_error().ok
    assert out.t.tolist() == p.num_accepted.tolist()
    assert_same(states, want)
    calls = emulator.calls
    assert len(calls) == 2 and not calls[0]["decide"] and calls[1]["decide"] and calls[1]["block_size"] == bs


@needs_cxx
def test_the_counts_over_many_rows(fake_ops, emulator):
    """Hundreds of rows at every block size: the kernel's counts equal the core's decisions (no
    states, so only the counts are compared; the rows' blocks are live and owned)."""
    rng = np.random.default_rng(77)
    lays = group_layouts()[:1]
    for bs in (1, 2, 4, 16):
        r = 300
        nb = r * COLS + 2
        tables, c, n, a, run = batch(rng, r, bs, 1, nb)
        c = c % max(1, (COLS - NSPEC - 1) * bs - 8)  # keep every window inside the row
        n = np.minimum(n, 8)
        run = np.where(c == 0, -1, np.clip(run, -1, (c + n - 1) // bs + 1))
        states = [random_states(lay, nb, 1, rng) for lay in lays]
        dev = Planner.from_groups([(lays[0], [[FakeCuda(t) for t in layer] for layer in states[0]])], block_size=bs)
        d = align_pre_copy(PreCopyInputs(tables, c, n, a, run), block_size=bs, num_spec_blocks=NSPEC)
        out = fake(np.zeros(r))
        dev.launch(
            FakeCuda(torch.from_numpy(tables[0].astype(np.int32))),
            fake(d.src_col),
            fake(d.curr),
            fake(a),
            "pre_copy",
            num_accepted_out=out,
        )
        assert out.t.tolist() == d.num_accepted.tolist()
        nd = np.minimum(rng.integers(0, NSPEC + 1, r), n - 1)
        acc = 1 + rng.integers(0, nd + 1)
        p = align_post_process(PostProcessInputs(tables, d.curr, c, n, nd, acc), block_size=bs, num_spec_blocks=NSPEC)
        dev.launch_post_process(
            FakeCuda(torch.from_numpy(tables[0].astype(np.int32))),
            fake(d.curr),
            fake(c + n - nd),
            fake(acc),
            num_accepted_out=out,
        )
        assert out.t.tolist() == p.num_accepted.tolist()
        assert ((acc > 1) & (p.num_accepted == 1)).any() and (p.num_accepted > 1).any()  # resets and keeps
        assert ((a > 1) & (d.num_accepted == 1)).any()
        assert dev.last_error().ok


def test_an_output_that_aliases_an_input_is_refused(fake_ops, recorder):
    lays = group_layouts()[:1]
    rng = np.random.default_rng(3)
    states = random_states(lays[0], 30, 1, rng)
    dev = Planner.from_groups([(lays[0], [[FakeCuda(t) for t in layer] for layer in states])], block_size=4)
    bt = fake(np.arange(1, 9).reshape(2, 4))
    acc = fake([1, 2])
    with pytest.raises(PlanError, match="num_accepted_out overlaps num_accepted"):
        dev.launch(bt, fake([0, 1]), fake([1, 2]), acc, "pre_copy", num_accepted_out=acc)
    with pytest.raises(PlanError, match="num_accepted_out has 1 elements for 2 requests"):
        dev.launch_post_process(bt, fake([0, 1]), fake([4, 5]), acc, num_accepted_out=fake([0]))
    with pytest.raises(PlanError, match="num_accepted_out: expected int32, got torch.int64"):
        dev.launch_post_process(bt, fake([0, 1]), fake([4, 5]), acc, num_accepted_out=fake([0, 0], torch.int64))
    assert not recorder.calls


@needs_cxx
def test_the_step_error_word_covers_both_halves(fake_ops, emulator):
    """A count the kernel rejects in the pre-copy stays reported after the post-process (one error
    word per step, zeroed by the next pre-copy); the rejected request's state is not written."""
    from recoverssm_rs.vllm.device_step import DeviceStep

    lays = group_layouts()[:2]
    rng = np.random.default_rng(9)
    nb = 2 * 2 * COLS + 2
    tables, _, _, _, _ = batch(rng, 2, 4, len(lays), nb)
    states = [random_states(lay, nb, 1, rng) for lay in lays]
    before = clone(states)
    dev = Planner.from_groups(
        [(lay, [[FakeCuda(t) for t in layer] for layer in g]) for lay, g in zip(lays, states)], block_size=4
    )
    step = DeviceStep(dev, 4)
    c, n, run = np.array([4, 4]), np.array([4, 4]), np.array([0, 1])  # request 0 moves 0 -> 1; request 1 stays
    curr, counts = step.launch(PreCopyInputs(tables, c, n, fake([0, 2]), run))  # a count of 0 for the moving request
    word = step.last_error()
    assert not word.ok and "accepted" in str(word) and counts.t.tolist() == [0, 2]
    assert_same(states, before)  # the rejected move wrote nothing; request 1 does not move
    step.launch(PostProcessInputs(tables, curr, c, n, np.zeros(2, np.int64), fake([1, 1])))
    assert not step.last_error().ok, "the post-process must not erase the pre-copy's report"
    step.launch(PreCopyInputs(tables, c, n, fake([1, 1]), run))
    assert step.last_error().ok
