"""Different groups may share memory; the states of one group may not.

vLLM's hybrid allocator lays one layer of each KV-cache group over one raw tensor and gives each
group its own blocks from one pool, so two groups' states alias page for page while the same block
id never holds both at once. ``Planner.from_groups`` binds such groups (its docstring once
promised a BindingError for them); the plan runs one group's copies after the other's, and each
group's copies land in its own blocks of the shared pages. Two states of one group over the same
memory are still refused, naming the group."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs import PlanError, Planner
from recoverssm_rs.errors import BindingError
from test_groups import NB, _group, _layout, _reference


def _shared_pages(layout, layers: int, rng):
    """One raw page buffer per layer index, each state a strided view into every page (as vLLM's
    ``_reshape_kv_cache_tensors`` makes them); the same views serve every group."""
    shapes = [s.shape for s in layout.persistent]
    sizes = [int(np.prod(s)) for s in shapes]
    page = sum(sizes)
    out = []
    for _ in range(layers):
        raw = rng.standard_normal((NB, page)).astype(np.float32)
        views, at = [], 0
        for shape, n in zip(shapes, sizes):
            views.append(raw[:, at : at + n].reshape(NB, *shape))
            at += n
        out.append(views)
    return out


@pytest.mark.parametrize("semantics", ["pre_copy", "post_process"])
def test_groups_over_one_raw_buffer_bind_and_copy_into_their_own_blocks(semantics):
    rng = np.random.default_rng(5)
    la = _layout("gdn", (4, 6), (2, 3, 3), num_spec=2)
    states = _shared_pages(la, 2, rng)
    before = [[t.copy() for t in layer] for layer in states]
    mp = Planner.from_groups([(la, states), (la, states)], block_size=4)
    assert mp.num_groups == 2
    # Group 0 uses blocks 1..10, group 1 blocks 21..30: one pool, no block in both.
    bta = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], np.int64)
    btb = bta + 20
    src, dst, acc = np.array([0, 1]), np.array([2, 1]), np.array([2, 3])
    mp.plan([bta, btb], src, dst, acc, semantics).execute()
    want = _reference(_reference(before, bta, src, dst, acc, semantics), btb, src, dst, acc, semantics)
    for layer_got, layer_want in zip(states, want):
        for t, w in zip(layer_got, layer_want):
            np.testing.assert_array_equal(t, w)


def test_two_states_of_one_group_over_the_same_memory_are_refused_naming_the_group():
    rng = np.random.default_rng(6)
    la = _layout("gdn", (4, 6), (2, 3, 3), num_spec=2)
    ok = _shared_pages(la, 2, rng)
    aliased = [ok[0], ok[0]]  # layers 0 and 1 of one group over one page buffer
    with pytest.raises(BindingError, match=r"group 1 \(gdn\): layer 0, state 0 \('conv'\) and layer 1, state 0"):
        Planner.from_groups([(la, ok), (la, aliased)], block_size=4)


def test_from_groups_documents_cross_group_sharing_as_allowed():
    doc = Planner.from_groups.__doc__ or ""
    raises = doc.split("Raises:", 1)[1]
    assert "groups sharing memory" not in raises
    assert "Different groups may share memory" in doc


# ---- a block table whose storage was freed or shrunk (host plan) --------------------------------


@pytest.mark.parametrize("how", ["freed", "shrunk"])
def test_a_host_plan_refuses_a_block_table_whose_storage_is_gone(how):
    """``numpy()`` of a CPU tensor whose storage was freed hands out a new uninitialised buffer,
    of a shrunk one a view reading past its end: the plan refuses the table (PlanError naming it)
    and nothing is read or written."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    la = _layout("gdn", (4, 6), (2, 3, 3), num_spec=2)
    states = _group(la, 1, rng)
    before = [t.copy() for t in states[0]]
    planner = Planner(la, states)
    bt = torch.arange(1, 11, dtype=torch.int64).reshape(2, 5)
    bt.untyped_storage().resize_(0 if how == "freed" else 4)
    needle = "was freed" if how == "freed" else "holds 4 bytes"
    with pytest.raises(PlanError, match=rf"^tables: its storage {needle}.*nothing was read"):
        planner.plan(bt, [0, 1], [2, 1], [1, 1], "pre_copy")
    assert all(np.array_equal(t, b) for t, b in zip(states[0], before))
    # Views of a live storage (offset, strided, transposed) are read as they are.
    base = torch.arange(0, 40, dtype=torch.int64).reshape(4, 10)
    for live in (base[1:3, ::2], base.T[2:7].T[:2].contiguous(), base.T.T[2:4, 3:8]):
        plan = planner.plan(live, [0, 1], [2, 1], [1, 1], "pre_copy")
        assert plan is not None
