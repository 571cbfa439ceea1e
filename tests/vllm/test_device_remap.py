"""The V1 device step's static buffers and its device-side remap of last step's counts: over a
random trace of batch reorders (rows kept, moved, new), ``DeviceStep.launch(PreCopyInputs(...), prev_rows=...)``
equals the same step given the counts remapped on the host (every state byte, every count, the
error word), and no step after the first allocates a device buffer or uploads anything."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import Planner  # noqa: E402
from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.vllm.decide import PostProcessInputs, PreCopyInputs  # noqa: E402
from recoverssm_rs.vllm.device_step import DeviceStep  # noqa: E402
from support.device_fakes import FakeCuda, random_states  # noqa: E402
from support.generators import NSPEC, group_layouts  # noqa: E402

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")
COLS = 24
MAX_REQS = 6


def fake(x, dtype=torch.int32) -> FakeCuda:
    return FakeCuda(torch.as_tensor(np.array(x)).to(dtype))


def host_remap(prev: list[int], prev_rows: np.ndarray) -> list[int]:
    """The runner's host-side remap: a row's count from its previous row, 1 for a new row."""
    return [prev[p] if 0 <= p < len(prev) else 1 for p in prev_rows.tolist()]


def planner(lays, states, bs):
    return Planner.from_groups(
        [(lay, [[FakeCuda(t) for t in layer] for layer in g]) for lay, g in zip(lays, states)], block_size=bs
    )


def same_states(a, b) -> bool:
    return all(
        torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for ga, gb in zip(a, b)
        for la, lb in zip(ga, gb)
        for x, y in zip(la, lb)
    )


@needs_cxx
@pytest.mark.parametrize("seed", range(3))
def test_remap_on_the_device_equals_the_host_remap_over_reorders(fake_ops, emulator, seed):
    rng = np.random.default_rng(3100 + seed)
    bs = int(rng.choice([2, 4]))
    lays = group_layouts()[: 1 + seed % 2]
    nb = len(lays) * MAX_REQS * COLS + 2
    states = [random_states(lay, nb, 2, rng) for lay in lays]
    twin = [[[t.clone() for t in layer] for layer in g] for g in states]
    remapped, given = DeviceStep(planner(lays, states, bs), MAX_REQS), DeviceStep(planner(lays, twin, bs), MAX_REQS)
    prev: list[int] = []
    allocs = ok = 0
    for step in range(8):
        r = int(rng.integers(1, MAX_REQS + 1))
        # This step's rows: some of last step's rows in a new order, the rest new (-1).
        kept = rng.permutation(len(prev))[: int(rng.integers(0, len(prev) + 1))]
        prev_rows = np.full(r, -1)
        at = rng.permutation(r)[: min(len(kept), r)]
        prev_rows[at] = kept[: len(at)]
        ids = rng.permutation(np.arange(1, nb))[: len(lays) * r * COLS].reshape(len(lays), r, COLS)
        tables = [t.astype(np.int64) for t in ids]
        c = rng.integers(0, 20, r)
        n = np.where(rng.random(r) < 0.6, 1 + rng.integers(0, NSPEC + 1, r), rng.integers(1, 9, r))
        run = np.where(
            (c > 0) & (rng.random(r) < 0.8), np.clip((c + n - 1) // bs + rng.integers(-2, 2, r), 0, None), -1
        )
        index = torch.int64 if step % 2 else torch.int32
        curr, got = remapped.launch(PreCopyInputs(tables, c, n, None, run), prev_rows=fake(prev_rows, index))
        curr_h, want = given.launch(PreCopyInputs(tables, c, n, fake(host_remap(prev, prev_rows)), run))
        # The counts the kernel read are last step's, remapped to this step's rows.
        assert remapped._out.t[2 * MAX_REQS : 2 * MAX_REQS + r].tolist() == host_remap(prev, prev_rows)
        assert curr.tolist() == curr_h.tolist() and got.t.tolist() == want.t.tolist()
        assert remapped.last_error() == given.last_error() and same_states(states, twin), f"step {step}"
        nd = np.minimum(rng.integers(0, NSPEC + 1, r), n - 1)
        acc = fake(1 + rng.integers(0, nd + 1))
        post = PostProcessInputs(tables, curr, c, n, nd, acc)
        _, out = remapped.launch(post)
        assert out.t.tolist() == given.launch(post)[1].t.tolist()
        assert remapped.last_error() == given.last_error() and same_states(states, twin), f"step {step}"
        ok += remapped.last_error().ok
        prev = out.t.tolist()
        if step == 0:
            allocs, uploads = fake_ops.allocs, fake_ops.uploads
        # Static buffers: nothing allocated or uploaded after the first step, whatever the batch.
        assert (fake_ops.allocs, fake_ops.uploads) == (allocs, uploads), f"step {step}"
    assert ok > 0, "some steps run clean"


def test_prev_rows_checks(fake_ops, recorder):
    lays = group_layouts()[:1]
    rng = np.random.default_rng(5)
    nb = COLS + 2
    step = DeviceStep(planner(lays, [random_states(lays[0], nb, 1, rng)], 4), 4)
    table = [np.arange(1, COLS + 1, dtype=np.int64)[None, :]]
    args = PreCopyInputs(table, np.array([4]), np.array([1]), None, np.array([0]))
    for given, prev_rows, msg in [
        (fake([1]), fake([0]), "not both"),
        (None, fake([0.0], torch.float32), "prev_rows: expected an int32 or int64 tensor"),
        (None, fake(np.zeros(0, np.int64)), "1 at least"),
        (None, FakeCuda(torch.zeros(1, dtype=torch.int32), 1), "prev_rows is on cuda:1"),
        (None, None, "num_accepted is None: pass the counts"),
    ]:
        with pytest.raises(PlanError, match=msg):
            step.launch(args._replace(num_accepted=given), prev_rows=prev_rows)
    post = PostProcessInputs(table, np.array([1]), np.array([4]), np.array([1]), np.array([0]), fake([1]))
    with pytest.raises(PlanError, match="prev_rows remaps the counts of a pre-copy"):
        step.launch(post, prev_rows=fake([0]))
    with pytest.raises(PlanError, match="step must be a PostProcessInputs \\(7 fields\\), got tuple"):
        step.launch((table, [1]))
    assert not recorder.calls, "nothing is launched on a refused step"
    # No post-process yet: every row is new and reads 1.
    step.launch(args, prev_rows=fake([3]))
    assert step._out.t[8:9].tolist() == [1] and len(recorder.calls) == 1


def test_the_host_path_refuses_prev_rows():
    """The remap runs on the device only: host states refuse ``prev_rows`` before anything moves
    (no slot taken, no state written)."""
    from recoverssm_rs.vllm import VllmMambaStep
    from support.vllm_trace import GroupCfg, Req, Side, Sim, scheduler_output

    sim = Sim([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", seed=0, num_blocks=64)
    side = Side(sim, sim.make_states(), None)
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=4)
    r = Req("a", prompt=9, cols=[{}])
    sim.ensure_cols(r, 9)
    side.load_batch([r])
    before = [t.clone() for g in side.states for layer in g for t in layer]
    with pytest.raises(PlanError, match="the planner's states are on the host"):
        step.preprocess(
            scheduler_output([r], {"a": (9, 0)}, set(), set(), set()),
            side.input_batch,
            side.requests,
            prev_rows=fake([-1]),
        )
    after = [t for g in side.states for layer in g for t in layer]
    assert repr(step).endswith("live=0)") and all(torch.equal(a, b) for a, b in zip(before, after))


def test_the_core_reads_each_field_of_a_step_by_its_position(fake_ops, recorder):
    """The core reads a half-step's ``PreCopyInputs`` / ``PostProcessInputs`` by position (its own
    list of their fields): a bad value in each field is named by that field's name, so the two
    lists keep one order."""
    lays = group_layouts()[:1]
    rng = np.random.default_rng(5)
    step = DeviceStep(planner(lays, [random_states(lays[0], COLS + 2, 1, rng)], 4), 4)
    table = [np.arange(1, COLS + 1, dtype=np.int64)[None, :]]
    pre = PreCopyInputs(table, np.array([4]), np.array([1]), np.array([1]), np.array([0]))
    post = PostProcessInputs(table, np.array([1]), np.array([4]), np.array([1]), np.array([0]), np.array([1]))
    for inputs in (pre, post):
        assert inputs._fields[-1] == "req_ids"  # names, which any value spells
        for name in inputs._fields[:-1]:
            with pytest.raises(PlanError, match=f"^{name} must be an int32 or int64 array"):
                step.launch(inputs._replace(**{name: np.array([0.5])}))
    assert not recorder.calls, "nothing is launched on a refused step"


def test_device_counts_whose_storage_is_gone_are_named_as_such(fake_ops, recorder):
    """Device counts whose storage was freed: refused naming num_accepted and the storage (the
    message advised host arrays for a caller already on the device path)."""
    lays = group_layouts()[:1]
    rng = np.random.default_rng(5)
    step = DeviceStep(planner(lays, [random_states(lays[0], COLS + 2, 1, rng)], 4), 4)
    table = [np.arange(1, COLS + 1, dtype=np.int64)[None, :]]
    acc = fake([1])
    acc.untyped_storage().resize_(0)
    args = PreCopyInputs(table, np.array([4]), np.array([1]), acc, np.array([0]))
    with pytest.raises(PlanError, match=r"num_accepted: its storage was freed .*nothing was read or written"):
        step.launch(args)
    assert not recorder.calls
