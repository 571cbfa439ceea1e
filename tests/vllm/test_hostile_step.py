"""VllmMambaStep as a hostile caller drives it: foreign slots, duplicate request ids, a second
postprocess, missing requests or layers, sizes no engine has. Each is the package's own error
(a RecoverSSMError naming the request, slot or value) and nothing is written."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import BindingError, LayoutError, PlanError  # noqa: E402
from recoverssm_rs.vllm import VllmMambaStep  # noqa: E402
from support.vllm_trace import GroupCfg, Req, Side, Sim, scheduler_output  # noqa: E402


def _side():
    sim = Sim([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", seed=0, num_blocks=64)
    return sim, Side(sim, sim.make_states(), None)


def _step(side, max_num_reqs=4):
    return VllmMambaStep.from_runner(
        side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=max_num_reqs
    )


def _snapshot(side):
    return [t.clone() for g in side.states for layer in g for t in layer]


def _unchanged(side, before):
    return all(torch.equal(a, b) for a, b in zip(before, _snapshot(side)))


def _batch(sim, side, reqs, sched):
    for r in reqs:
        sim.ensure_cols(r, sched[r.rid][0])
    side.load_batch(reqs)
    return scheduler_output(reqs, sched, set(), set(), set())


@pytest.mark.parametrize("slot", [-1, 4, 2**40])
def test_a_foreign_slot_is_refused_before_anything_moves(slot):
    sim, side = _side()
    step = _step(side)
    step.mamba_state_idx[:] = [1, -1, -1, 3]
    bt = np.arange(1, 9, dtype=np.int64).reshape(1, 8)
    before = _snapshot(side)
    with pytest.raises(
        PlanError, match=rf"request r0 \(row 0\): request index {slot} is outside the mamba_state_idx table \(0 ..= 3\)"
    ):
        step.pre_copy([bt], [slot], [4], [4], [1], req_ids=["r0"])
    assert step.mamba_state_idx.tolist() == [1, -1, -1, 3] and _unchanged(side, before)


def test_two_requests_on_one_slot_are_refused():
    sim, side = _side()
    step = _step(side)
    bt = np.arange(1, 17, dtype=np.int64).reshape(2, 8)
    with pytest.raises(PlanError, match="request 0 and request 1 share request index 2"):
        step.pre_copy([bt], [2, 2], [0, 0], [4, 4], [1, 1])
    assert (step.mamba_state_idx == -1).all()


def test_a_duplicate_request_id_is_refused_and_leaves_no_slot():
    sim, side = _side()
    step = _step(side)
    out = _batch(sim, side, [Req("a", prompt=9, cols=[{}])], {"a": (9, 0)})
    side.input_batch.req_ids = ["a", "a"]
    before = _snapshot(side)
    with pytest.raises(PlanError, match=r"request a is listed twice in the batch \(rows 0 and 1\)"):
        step.preprocess(out, side.input_batch, side.requests)
    assert repr(step).endswith("live=0)") and _unchanged(side, before)


def test_postprocess_runs_once_per_step():
    sim, side = _side()
    step = _step(side)
    out = _batch(sim, side, [Req("a", prompt=9, cols=[{}])], {"a": (9, 0)})
    step.preprocess(out, side.input_batch, side.requests)
    step.postprocess(np.ones(1, np.int64))
    before = _snapshot(side)
    with pytest.raises(PlanError, match="runs once per step"):
        step.postprocess(np.ones(1, np.int64))
    assert _unchanged(side, before)


@pytest.mark.parametrize("where", ["requests", "num_scheduled_tokens"])
def test_a_request_missing_from_the_runners_maps_is_named(where):
    sim, side = _side()
    step = _step(side)
    out = _batch(sim, side, [Req("a", prompt=9, cols=[{}])], {"a": (9, 0)})
    if where == "requests":
        side.requests = {}
    else:
        out.num_scheduled_tokens = {}
    before = _snapshot(side)
    with pytest.raises(PlanError, match=rf"request a \(row 0\): not in .*{where}"):
        step.preprocess(out, side.input_batch, side.requests)
    assert repr(step).endswith("live=0)") and _unchanged(side, before)


def test_float_request_values_are_refused_not_truncated():
    sim, side = _side()
    step = _step(side)
    out = _batch(sim, side, [Req("a", prompt=9, cols=[{}])], {"a": (9, 0)})
    side.requests["a"].num_computed_tokens = 8.5
    with pytest.raises(PlanError, match="num_computed"):
        step.preprocess(out, side.input_batch, side.requests)
    assert (step.mamba_state_idx == -1).all()


def test_a_layer_missing_from_the_forward_context_is_a_binding_error():
    sim, side = _side()
    with pytest.raises(BindingError, match="group 0, layer 'g0.l0': not in the forward context"):
        VllmMambaStep.from_runner(side.kv_cache_config, {}, side.copy_funcs(None), max_num_reqs=4)


@pytest.mark.parametrize("max_num_reqs", [-1, 0, 2**40, 2**64])
def test_max_num_reqs_out_of_range(max_num_reqs):
    sim, side = _side()
    with pytest.raises(PlanError, match="max_num_reqs"):
        _step(side, max_num_reqs)
    with pytest.raises(PlanError, match="max_num_reqs must be a host integer"):
        _step(side, 4.0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_speculative_blocks", -1, "GDN_ATTN: num_speculative_blocks = -1 must be >= 0"),
        ("block_size", 2**64, "GDN_ATTN: block_size = 18446744073709551616 is too large"),
        ("block_size", 4.0, "GDN_ATTN: block_size must be a host integer"),
    ],
)
def test_spec_values_no_engine_has_are_layout_errors(field, value, message):
    sim, side = _side()
    group = side.kv_cache_config.kv_cache_groups[0]
    group.kv_cache_spec = dataclasses.replace(group.kv_cache_spec, **{field: value})
    with pytest.raises(LayoutError, match=message):
        _step(side)


def test_sizes_given_to_the_constructors_directly():
    import recoverssm_rs as rs

    spec = rs.StateSpec("t", (4,), "float32", copy="temporal")
    with pytest.raises(LayoutError, match="num_spec = -1 must be >= 0"):
        rs.Layout("X", [spec], num_spec=-1)
    assert rs.Layout("X", [spec]).num_spec == 0
    with pytest.raises(BindingError, match="block_size = 18446744073709551616 is too large"):
        rs.Planner(rs.Layout("X", [spec]), [[torch.zeros(4, 4)]], block_size=2**64)


@pytest.mark.parametrize(("value", "message"), [(0, "must be in 1 ..= 2\\*\\*24"), (4.5, "must be a host integer")])
def test_the_device_steps_capacity_is_checked_by_the_core(value, message):
    from recoverssm_rs._core import VllmSlots

    with pytest.raises(PlanError, match=f"max_num_reqs.*{message}"):
        VllmSlots.check_capacity(value)
    assert VllmSlots.check_capacity(2**24) == 2**24


def test_a_request_id_that_cannot_be_a_key_is_named():
    sim, side = _side()
    step = _step(side)
    out = _batch(sim, side, [Req("a", prompt=9, cols=[{}])], {"a": (9, 0)})
    side.input_batch.req_ids = [["a"]]
    with pytest.raises(PlanError, match=r"request \['a'\] \(row 0\): not in requests"):
        step.preprocess(out, side.input_batch, side.requests)
    assert repr(step).endswith("live=0)")
