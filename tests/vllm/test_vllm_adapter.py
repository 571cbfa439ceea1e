"""recoverssm_rs.vllm: building the step from vLLM-shaped runner objects, its checks and errors
(no vLLM needed: the objects are the duck-typed stand-ins of tests/support)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import LayoutError, PlanError  # noqa: E402
from recoverssm_rs.vllm import PostProcessInputs, PreCopyInputs, VllmMambaStep, copy_kind, mamba_groups  # noqa: E402
from support.vllm_trace import GroupCfg, Req, Side, Sim, scheduler_output  # noqa: E402


def _side(groups, nsb=2, layout="SD"):
    sim = Sim(groups, 4, nsb, layout, seed=0, num_blocks=64)
    return sim, Side(sim, sim.make_states(), None)


def test_importing_the_adapter_does_not_import_vllm():
    code = "import sys, recoverssm_rs.vllm; assert 'vllm' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_from_runner_binds_each_groups_persistent_prefix():
    sim, side = _side([GroupCfg("GDN_ATTN", 2), GroupCfg("SHORT_CONV", 3)])
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=8)
    assert [len(g) for g in step.planner.states] == [2, 3]
    assert [len(layer) for layer in step.planner.states[0]] == [2, 2]  # the extra ring tensor is left alone
    assert [lo.backend for lo in step.planner.layouts] == ["GDN_ATTN", "SHORT_CONV"]
    assert "groups=[0, 1]" in repr(step) and "path='host'" in repr(step)
    assert [g for g, _, _ in mamba_groups(side.kv_cache_config)] == [0, 1]
    assert copy_kind("get_conv_copy_spec") == "conv"


def test_mamba_groups_reads_per_layer_specs_by_value_and_names_a_bad_config():
    import types

    spec = types.SimpleNamespace  # compared by value (==), as vLLM's frozen dataclasses
    a, a2, b = (
        spec(mamba_type="GDN_ATTN", shapes=((1,),)),
        spec(mamba_type="GDN_ATTN", shapes=((1,),)),
        spec(mamba_type="MAMBA2", shapes=((2,),)),
    )
    attention = spec(block_size=16)  # no mamba_type: skipped
    per_layer = types.SimpleNamespace(kv_cache_specs={"l0": a, "l1": a2, "l2": b, "l3": attention})
    cfg = types.SimpleNamespace(
        kv_cache_groups=[
            types.SimpleNamespace(kv_cache_spec=attention, layer_names=["attn"]),
            types.SimpleNamespace(kv_cache_spec=per_layer, layer_names=["l0", "l1", "l2", "l3"]),
        ]
    )
    groups = mamba_groups(cfg)
    assert [(g, s, names) for g, s, names in groups] == [(1, a, ["l0", "l1"]), (1, b, ["l2"])]
    assert groups[0][1] is a  # the first of equal specs
    cfg.kv_cache_groups[1].kv_cache_spec = a  # one spec for the group: kv_cache_specs absent ...
    a.kv_cache_specs = None  # ... or None, as getattr(spec, "kv_cache_specs", None) reads it
    assert [(g, names) for g, _, names in mamba_groups(cfg)] == [(1, ["l0", "l1", "l2", "l3"])]
    cfg.kv_cache_groups[1].kv_cache_spec = per_layer
    per_layer.kv_cache_specs = {"l0": a}  # a layer without its spec
    with pytest.raises(LayoutError, match=r"^kv_cache_config \(vLLM's KVCacheConfig\): KeyError: 'l1'$"):
        mamba_groups(cfg)
    with pytest.raises(LayoutError, match="no mamba group"):
        mamba_groups(types.SimpleNamespace(kv_cache_groups=cfg.kv_cache_groups[:1]))


def test_from_runner_runs_the_contract_check():
    sim, side = _side([GroupCfg("GDN_ATTN", 1)])
    with pytest.raises(LayoutError, match="GDN_ATTN"):
        VllmMambaStep.from_runner(
            side.kv_cache_config,
            side.forward_context,
            {"GDN_ATTN": ("get_temporal_copy_spec", "get_conv_copy_spec")},
            max_num_reqs=4,
        )
    with pytest.raises(LayoutError, match="missing state copy funcs"):
        VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, {"MAMBA2": ("conv",)}, max_num_reqs=4)


def test_only_align_mode_is_accepted():
    import dataclasses

    sim, side = _side([GroupCfg("GDN_ATTN", 1)])
    group = side.kv_cache_config.kv_cache_groups[0]
    group.kv_cache_spec = dataclasses.replace(group.kv_cache_spec, mamba_cache_mode="none")
    with pytest.raises(LayoutError, match="mamba_cache_mode is 'none'"):
        VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=4)
    with pytest.raises(LayoutError, match="conv_layout must be 'SD' or 'DS'"):
        group.kv_cache_spec = dataclasses.replace(group.kv_cache_spec, mamba_cache_mode="align")
        VllmMambaStep.from_runner(
            side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=4, conv_layout="XY"
        )


def _one_step(sim, side, step, reqs, sched, ensure=True, **so):
    for r in reqs:
        if ensure:
            sim.ensure_cols(r, sched[r.rid][0])
    side.load_batch(reqs)
    out = scheduler_output(reqs, sched, so.get("finished", set()), so.get("preempted", set()), set())
    step.preprocess(out, side.input_batch, side.requests)


def test_a_prefix_hit_without_recurrent_state_names_the_request():
    sim, side = _side([GroupCfg("GDN_ATTN", 1)])
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=8)
    # An attention hit of 8 tokens; the window (columns 2..=4) is allocated, column 1 is not.
    r = Req("req-hit", prompt=20, computed=8, cols=[{2: 10, 3: 11, 4: 12}])
    before = [t.clone() for t in side.states[0][0]]
    with pytest.raises(PlanError, match=r"request req-hit \(row 0\): prefix-cache hit of 8 computed tokens"):
        _one_step(sim, side, step, [r], {"req-hit": (4, 0)}, ensure=False)
    assert repr(step).endswith("live=0)")  # no slot left behind
    assert all(torch.equal(a, b) for a, b in zip(before, side.states[0][0]))
    r.cols[0][1] = 13  # with the recurrent state at column 1 the step runs
    _one_step(sim, side, step, [r], {"req-hit": (4, 0)}, ensure=False)
    assert step.mamba_state_idx.max() == 2


def test_mamba_state_idxumns_live_in_an_array_and_are_released():
    sim, side = _side([GroupCfg("GDN_ATTN", 1)])
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=2)
    a, b = Req("a", prompt=9, cols=[{}]), Req("b", prompt=5, cols=[{}])
    _one_step(sim, side, step, [a, b], {"a": (9, 0), "b": (5, 0)})
    assert sorted(step.mamba_state_idx.tolist()) == [1, 2]  # (9 - 1) // 4, (5 - 1) // 4
    c = Req("c", prompt=3, cols=[{}])
    with pytest.raises(PlanError, match="more live requests than max_num_reqs = 2"):
        _one_step(sim, side, step, [c], {"c": (3, 0)})
    _one_step(sim, side, step, [c], {"c": (3, 0)}, finished={"a", "b"})
    assert sorted(step.mamba_state_idx.tolist()) == [-1, 0]


def test_a_stale_mamba_state_idxumn_is_an_error():
    sim, side = _side([GroupCfg("GDN_ATTN", 1)])
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=4)
    step.mamba_state_idx[3] = 5  # left behind by a request that finished without release()
    bt = np.arange(1, 9, dtype=np.int64).reshape(1, 8)
    with pytest.raises(PlanError, match="stale"):
        step.pre_copy([bt], [3], [0], [4], [1], fresh=[1])
    assert step.mamba_state_idx[3] == 5  # nothing changed


def test_postprocess_needs_a_preprocess():
    sim, side = _side([GroupCfg("GDN_ATTN", 1)])
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=4)
    with pytest.raises(PlanError, match="preprocess first"):
        step.postprocess(np.ones(1, np.int64))


def test_the_device_path_checks_on_the_host_before_queueing(fake_ops, recorder):
    """CUDA states (stand-ins): the host-side checks of the device path raise before anything is
    staged or launched, and the host path's array forms are refused."""
    import types

    from support.device_fakes import FakeCuda

    sim, side = _side([GroupCfg("GDN_ATTN", 1), GroupCfg("SHORT_CONV", 1)])
    ctx = {
        k: types.SimpleNamespace(kv_cache=[FakeCuda(t) for t in v.kv_cache]) for k, v in side.forward_context.items()
    }
    step = VllmMambaStep.from_runner(side.kv_cache_config, ctx, side.copy_funcs(None), max_num_reqs=4)
    dev = step.device_step
    assert dev is not None and "cuda:0" in repr(dev) and "path='device cuda:0'" in repr(step)
    tables = [np.arange(1, 17, dtype=np.int64).reshape(2, 8)] * 2
    one = np.ones(2, np.int64)
    with pytest.raises(PlanError, match="runs the host path, but the states are on cuda:0"):
        step.pre_copy(tables, [0, 1], one, one, one)
    with pytest.raises(PlanError, match="group 1: tables is on cuda:0; host plans read host inputs"):
        dev.launch(PreCopyInputs([tables[0], FakeCuda(torch.from_numpy(tables[1]))], one, one, one, [-1, -1]))
    with pytest.raises(PlanError, match="request 1: num_scheduled = 0"):
        dev.launch(PreCopyInputs(tables, one, np.array([1, 0]), one, [-1, -1]))
    with pytest.raises(PlanError, match="stale column"):
        dev.launch(PreCopyInputs(tables, [0, 0], one, one, [-1, 3], fresh=[0, 1]))
    with pytest.raises(PlanError, match="request 1: num_accepted = 4294967296 is outside 1 ..= 3"):
        dev.launch(PreCopyInputs(tables, one, one, np.array([1, 1 << 32]), [-1, -1]))  # host counts: every host check
    with pytest.raises(PlanError, match=r"request 0: num_accepted = 2 is outside 1 ..= 1 \(1 \+ num_draft = 0\)"):
        dev.launch(PostProcessInputs(tables, [0, 0], one, one, [0, 0], np.array([2, 1])))
    with pytest.raises(PlanError, match=r"request 0: group 0's block table, column 1: block id = 4294967296"):
        dev.launch(PreCopyInputs([np.array([[1, 1 << 32, 5, 6], [3, 4, 7, 8]])] * 2, [0, 0], one, one, [-1, -1]))
    wide = FakeCuda(torch.ones((2, 9), dtype=torch.int32))
    with pytest.raises(PlanError, match=r"group 1's device block table is \[.., 9\] int32, group 0's \[.., 8\]"):
        dev.launch(
            PreCopyInputs(tables, one, one, one, [-1, -1]),
            device_tables=[FakeCuda(torch.ones((2, 8), dtype=torch.int32)), wide],
        )
    with pytest.raises(PlanError, match="1 device block tables for 2 recurrent groups"):
        dev.launch(PreCopyInputs(tables, one, one, one, [-1, -1]), device_tables=[wide])
    with pytest.raises(PlanError, match="5 requests in the step, more than max_num_reqs = 4"):
        dev.launch(PreCopyInputs([np.ones((5, 8), np.int64)] * 2, np.ones(5), np.ones(5), np.ones(5), -np.ones(5)))
    assert not recorder.calls and fake_ops.staged == 0
    # A valid step: one launch, the counts as a device vector of the step's rows.
    curr, counts = dev.launch(PreCopyInputs(tables, one, one, FakeCuda(torch.ones(2, dtype=torch.int32)), [-1, -1]))
    assert curr.tolist() == [0, 0] and isinstance(counts, FakeCuda) and tuple(counts.shape) == (2,)
    assert len(recorder.calls) == 1 and fake_ops.staged == 1
    assert recorder.calls[0]["table"] == [t.tolist() for t in tables[0]]  # the staged host table
    # With the engine's device tables, only the vectors are staged and the kernel reads the stack.
    dt = [FakeCuda(torch.from_numpy(t.astype(np.int32) + 100)) for t in tables]
    dev.launch(PreCopyInputs(tables, one, one, one, [-1, -1]), device_tables=dt)
    assert recorder.calls[1]["table"] == [(t + 100).tolist() for t in tables[0]]
    assert dev.last_error().ok


def test_device_path_equals_host_path_without_the_oracle(fake_ops, emulator):
    """The GPU test's harness (tests/vllm/test_gpu_vllm_step.py) on the host: the adapter's device path,
    emulated, against its host path over the same trace (no vLLM wheel needed)."""
    import shutil

    from support import vllm_trace
    from support.device_fakes import FakeCuda

    if shutil.which("g++") is None:
        pytest.skip("host emulation needs a C++ compiler")
    mode = vllm_trace.DeviceMode(place=lambda t: t, bind=FakeCuda, vector=lambda a: FakeCuda(torch.from_numpy(a)))
    stats = vllm_trace.run_trace(
        None,
        [GroupCfg("GDN_ATTN", 1), GroupCfg("SHORT_CONV", 1, conv_dim=5)],
        block_size=2,
        nsb=3,
        conv_layout="SD",
        seed=8,
        steps=25,
        device=mode,
        device_tables=True,
    )
    assert stats.pre_copies > 0 and stats.post_copies > 0 and stats.preempted > 0
    assert len(emulator.calls) == 2 * stats.busy_steps
