"""The engine-step decisions and the multi-group planner (recoverssm_rs.groups)."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs import Layout, PlanError, Planner, StateSpec
from recoverssm_rs.errors import BindingError
from recoverssm_rs.vllm.decide import PostProcessInputs, PreCopyInputs, align_post_process, align_pre_copy, plan

NB = 40


def _layout(name: str, conv_shape, temporal_shape, num_spec: int, conv_layout: str = "SD") -> Layout:
    states = [StateSpec("conv", conv_shape, "float32", copy="conv", conv_layout=conv_layout)]
    if temporal_shape is not None:
        states.append(StateSpec("temporal", temporal_shape, "float32", copy="temporal"))
    return Layout(name, states, num_spec=num_spec)


def _group(layout: Layout, layers: int, rng, extra: int = 0):
    states = []
    for _ in range(layers):
        ts = [rng.standard_normal((NB, *s.shape)).astype(np.float32) for s in layout.persistent]
        ts += [np.zeros(3, np.float32) for _ in range(extra)]  # tensors no copy function covers
        states.append(ts)
    return states


def _reference(states, bt, src, dst, acc, semantics):
    """Apply moves to copies of the states in numpy (requests never interfere in these tests)."""
    out = [[t.copy() for t in layer] for layer in states]
    for r in range(len(src)):
        s, d, a = int(src[r]), int(dst[r]), int(acc[r])
        if s < 0 or d < 0 or (semantics == "pre_copy" and s == d):
            continue
        for li, layer in enumerate(states):
            conv = layer[0]
            w = conv.shape[1]  # SD: (width, dim)
            out[li][0][bt[r, d], : w - (a - 1)] = conv[bt[r, s], a - 1 :]
            if len(layer) > 1 and isinstance(layer[1], np.ndarray) and layer[1].ndim == 4:
                out[li][1][bt[r, d]] = layer[1][bt[r, s + a - 1]]
    return out


def test_decisions_are_vllms_formulas():
    bt = np.arange(1, 5 * 8 + 1, dtype=np.int64).reshape(5, 8)
    step = PreCopyInputs([bt], [0, 8, 10, 12, 12], [5, 4, 3, 2, 1], [1, 1, 3, 2, 2], [-1, -1, 2, 3, 4])
    d = align_pre_copy(step, block_size=4, num_spec_blocks=2)
    assert d.curr.tolist() == [1, 2, 3, 3, 3]
    assert d.src_col.tolist() == [-1, 1, 2, -1, 4]
    assert d.num_accepted.tolist() == [1, 1, 1, 2, 1]
    p = align_post_process(
        PostProcessInputs([bt], [1, 2], [5, 6], [3, 3], [2, 2], [3, 2]), block_size=4, num_spec_blocks=2
    )
    assert p.dest.tolist() == [1, 1] and p.bias.tolist() == [2, 1]
    assert p.src_col.tolist() == [1, 2] and p.num_accepted.tolist() == [1, 2]


def test_errors_name_the_request():
    bt = np.arange(1, 9, dtype=np.int64).reshape(1, 8)
    bt[0, 1] = 0
    with pytest.raises(PlanError, match=r"request req-7 \(row 0\): prefix-cache hit of 8 computed tokens"):
        align_pre_copy(PreCopyInputs([bt], [8], [4], [1], [-1], req_ids=["req-7"]), block_size=4, num_spec_blocks=2)
    with pytest.raises(PlanError, match="stale"):
        align_pre_copy(PreCopyInputs([bt], [0], [4], [1], [5], fresh=[1]), block_size=4, num_spec_blocks=2)


@pytest.mark.parametrize("semantics", ["pre_copy", "post_process"])
def test_one_plan_over_groups_with_different_layouts(semantics):
    rng = np.random.default_rng(0)
    la = _layout("gdn", (4, 6), (2, 3, 3), num_spec=2)
    lb = _layout("short_conv", (4, 5), None, num_spec=2)
    ga, gb = _group(la, 3, rng, extra=1), _group(lb, 2, rng)
    want_a = [[t.copy() for t in layer] for layer in ga]
    want_b = [[t.copy() for t in layer] for layer in gb]
    mp = Planner.from_groups([(la, ga), (lb, gb)], block_size=4)
    assert mp.num_groups == 2 and "groups=2" in repr(mp)
    # Request 0 moves 0 -> 2 with 2 accepted; request 1 has equal columns and 3 accepted.
    bta = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], np.int64)
    btb = bta + 20
    src, dst, acc = np.array([0, 1]), np.array([2, 1]), np.array([2, 3])
    plan = mp.plan([bta, btb], src, dst, acc, semantics)
    plan.execute()
    ref_a = _reference(want_a, bta, src, dst, acc, semantics)
    ref_b = _reference(want_b, btb, src, dst, acc, semantics)
    for got, ref in ((ga, ref_a), (gb, ref_b)):
        for layer_got, layer_ref in zip(got, ref):
            for t, r in zip(layer_got, layer_ref):
                np.testing.assert_array_equal(t, r)
    # Pre-copy: request 1 (equal columns) moves nothing; post-process shifts it in place.
    moving = 1 if semantics == "pre_copy" else 2
    assert [c for c, *_ in plan.group_stats()] == [3 * 2 * moving, 2 * 1 * moving]
    assert len(plan) == 3 * 2 * moving + 2 * moving


def test_pre_copy_call_runs_the_decision_and_its_copies():
    rng = np.random.default_rng(1)
    la = _layout("gdn", (6, 4), (2, 2, 2), num_spec=2)
    ga = _group(la, 2, rng)
    before = [[t.copy() for t in layer] for layer in ga]
    mp = Planner.from_groups([(la, ga)], block_size=4)
    bt = np.arange(1, 2 * 8 + 1, dtype=np.int64).reshape(2, 8)
    d, copies = plan(mp, PreCopyInputs([bt], [10, 4], [3, 1], [3, 1], [2, 1]))
    assert d.src_col.tolist() == [2, -1] and d.curr.tolist() == [3, 1]
    copies.execute()
    ref = _reference(before, bt, d.src_col, d.curr, d.bias + 1, "pre_copy")
    for lg, lr in zip(ga, ref):
        for t, r in zip(lg, lr):
            np.testing.assert_array_equal(t, r)


def test_binding_errors_name_the_group():
    rng = np.random.default_rng(2)
    la = _layout("gdn", (4, 6), (2, 3, 3), num_spec=2)
    lb = _layout("gdn2", (4, 6), (2, 3, 3), num_spec=1)
    with pytest.raises(BindingError, match=r"group 1 \(gdn2\): its layout has num_spec = 1"):
        Planner.from_groups([(la, _group(la, 1, rng)), (lb, _group(lb, 1, rng))], block_size=4)
    bad = _group(la, 2, rng)
    bad[1][1] = bad[1][1][:, :1]
    with pytest.raises(BindingError, match=r"group 1 \(gdn\): layer 1, state 1 \('temporal'\)"):
        Planner.from_groups([(la, _group(la, 2, rng)), (la, bad)], block_size=4)
    mp = Planner.from_groups([(la, _group(la, 1, rng))], block_size=4)
    with pytest.raises(PlanError, match="one block table per group"):
        mp.plan([], [0], [1], [1], "pre_copy")
    with pytest.raises(PlanError, match="semantics must be"):
        mp.plan([np.ones((1, 4), np.int64)], [0], [1], [1], "align")
