"""One fused launch for every recurrent group (``Planner.launch``), without a GPU: the
groups' states are CPU tensors that claim to live on ``cuda:0``, the driver launch is recorded and
run through the host emulation of the real kernel source, and the bytes are compared with the host
multi-group plan of the same step, for both of vLLM's semantics."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import Planner  # noqa: E402
from recoverssm_rs.errors import PlanError  # noqa: E402
from support import generators  # noqa: E402
from support.device_fakes import FakeCuda, random_states  # noqa: E402
from support.generators import NSPEC, group_layouts  # noqa: E402

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")


def fake(x, dtype=torch.int32) -> FakeCuda:
    return FakeCuda(torch.as_tensor(np.asarray(x)).to(dtype))


def step(rng: np.random.Generator, R: int, cols: int, nb: int, groups: int):
    """One decision (src, dst, accepted) shared by the groups; group 0's table from the owned-step
    generator (aliased columns included), the others' of distinct blocks."""
    bt0, src, dst, acc = generators.owned_step(rng, R, cols, NSPEC + 1, nb)
    tables = [bt0] + [
        rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols) for _ in range(groups - 1)
    ]
    return tables, src, dst, acc


@needs_cxx
@pytest.mark.parametrize("semantics", ["pre_copy", "post_process"])
@pytest.mark.parametrize("seed", range(4))
def test_one_launch_for_every_group_equals_the_host_plan(fake_ops, emulator, semantics, seed):
    rng = np.random.default_rng(900 + seed)
    R, cols = int(rng.integers(1, 7)), 6
    nb = R * cols + 3
    lays = group_layouts()
    states = [random_states(lay, nb, 2, rng) for lay in lays]
    want = [[[t.clone() for t in layer] for layer in g] for g in states]
    tables, src, dst, acc = step(rng, R, cols, nb, len(lays))
    host = Planner.from_groups(list(zip(lays, want)), block_size=16)
    host.plan(tables, src, dst, acc, semantics).execute()
    dev = Planner.from_groups(
        [(lay, [[FakeCuda(t) for t in layer] for layer in g]) for lay, g in zip(lays, states)], block_size=16
    )
    assert dev.device == "cuda:0"
    stacked = FakeCuda(torch.from_numpy(np.stack(tables)))
    dtype = torch.int64 if seed % 2 else torch.int32
    dev.launch(stacked, fake(src, dtype), fake(dst, dtype), fake(acc, dtype), semantics)
    assert len(emulator.calls) == 1, "one launch copies every group"
    call = emulator.calls[0]
    assert call["decide"] is False and bool(call["flags"] & 4) == (semantics == "pre_copy")
    assert call["num_meta"] == sum(2 * len(lay.persistent) for lay in lays)
    assert dev.last_error().ok
    for g, (got_g, want_g) in enumerate(zip(states, want)):
        for l, (got_l, want_l) in enumerate(zip(got_g, want_g)):
            for i, (a, b) in enumerate(zip(got_l, want_l)):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"group {g}, layer {l}, state {i}"


def test_group_tables_and_host_states_are_checked(fake_ops, recorder):
    lays = group_layouts()
    rng = np.random.default_rng(1)
    states = [random_states(lay, 20, 1, rng) for lay in lays]
    dev = Planner.from_groups(
        [(lay, [[FakeCuda(t) for t in layer] for layer in g]) for lay, g in zip(lays, states)], block_size=16
    )
    i = fake([0])
    with pytest.raises(PlanError, match=r"block_table: expected a 3-D \[groups = 3, requests, cols\] tensor"):
        dev.launch(fake([[1, 2]]), i, i, i, "post_process")
    with pytest.raises(PlanError, match="semantics must be 'pre_copy' or 'post_process'"):
        dev.launch(fake(np.ones((3, 1, 2))), i, i, i, "both")
    with pytest.raises(PlanError, match="2 group tables for 3 recurrent groups|expected a 3-D"):
        dev.launch(fake(np.ones((2, 1, 2))), i, i, i, "post_process")
    assert not recorder.calls and fake_ops.uploads == 0  # refused before anything was bound or uploaded
    cpu = Planner.from_groups(list(zip(lays, states)), block_size=16)
    with pytest.raises(PlanError, match="bound to cpu tensors"):
        cpu.launch(fake(np.ones((3, 1, 2))), i, i, i, "post_process")
