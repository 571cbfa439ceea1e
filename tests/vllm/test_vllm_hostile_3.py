"""Hostile callers of the vLLM surfaces, third part: ``ModelStateV2``'s own buffers moved under it
between half-steps (the ``num_accepted`` / ``state_idx`` views it hands to vLLM resized, or their
storage freed), and malformed fields of vLLM's mamba specs and KV-cache groups read by
``from_runner``. Each is the package's own error, naming what is wrong, and nothing is written or
launched."""

from __future__ import annotations

import re

import pytest
import torch
from recoverssm_rs.errors import BindingError, PlanError
from support import vllm_trace
from test_v2_refusals import _adapter, _v

I32 = torch.int32


#: How a caller moves a buffer the adapter's kernel writes: the views ModelStateV2 hands to vLLM
#: (``num_accepted_tokens_gpu``, ``_mamba_state_idx_gpu``) share the buffers' storages, so a
#: ``resize_`` of one reallocates the buffer and a storage resize frees it.
MOVES = {
    "num_accepted resized": lambda ms: ms.num_accepted.resize_(1 << 16),
    "state_idx storage freed": lambda ms: ms.state_idx.untyped_storage().resize_(0),
}


@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("half", ["pre", "post"])
def test_a_moved_adapter_buffer_is_refused_before_the_launch(fake_ops, recorder, launch_args, move, half):
    ms, _, table = _adapter()
    ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])  # the core step is made over the buffers
    launched = len(recorder.calls)
    MOVES[move](ms)
    name = move.split()[0]
    with pytest.raises(BindingError, match=rf"{name}.*(resized or freed|no longer points).*nothing was written"):
        if half == "pre":
            ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
        else:
            ms.postprocess_state(_v(1, 2), 1, _v(0, 5, 5, 0), [table])
    assert len(recorder.calls) == launched  # nothing launched over the old address


def _from_runner(which, cfg, ctx, funcs):
    from recoverssm_rs.vllm import VllmMambaStep
    from recoverssm_rs.vllm.model_state import ModelStateV2

    if which == "V2":
        return ModelStateV2.from_runner(cfg, ctx, funcs, max_num_reqs=4, device="cpu")
    return VllmMambaStep.from_runner(cfg, ctx, funcs, max_num_reqs=4)


@pytest.mark.parametrize("which", ["V1", "V2"])
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("block_size", None, r"GDN_ATTN: block_size must be a host integer \(a Python or numpy int\), got NoneType"),
        ("num_speculative_blocks", 2**40, r"GDN_ATTN: num_speculative_blocks = 1099511627776 is too large"),
        ("dtypes", None, r"GDN_ATTN: dtypes must be a list of dtypes, got NoneType"),
        ("layer_names", [5], r"group 0: layer name 5 must be a string, got int"),
        ("block_size", "missing", r"group 0: kv_cache_spec: AttributeError: .* no attribute 'block_size'"),
        ("mamba_cache_mode", "missing", r"group 0: kv_cache_spec: AttributeError: .* no attribute 'mamba_cache_mode'"),
    ],
)
def test_a_malformed_runner_field_is_a_layout_error(which, field, value, message):
    """A field of vLLM's mamba spec or KV-cache group the core reads, of a type or size no engine
    has: a LayoutError naming the backend (or group) and the field, from both runners' readers
    (it was torch's or PyO3's TypeError / OverflowError, which the vLLM plugin does not catch)."""
    from recoverssm_rs.errors import LayoutError

    cfg, ctx, funcs = vllm_trace.small_runner_objects([torch.randn(16, 5, 3), torch.randn(16, 2, 2)], fake=False)
    group = cfg.kv_cache_groups[0]
    if value == "missing":
        delattr(group.kv_cache_spec, field)
    else:
        setattr(group if field == "layer_names" else group.kv_cache_spec, field, value)
    with pytest.raises(LayoutError, match=message):
        _from_runner(which, cfg, ctx, funcs)


def _with_cache(seed: int = 0):
    """The adapter (request index 1 holds 4 tokens, running block 1..4 of its table) and a host
    RecoverSSM cache of random bytes, with the commit of batch row 0 (request index 1)."""
    import numpy as np
    from recoverssm_rs import layouts
    from recoverssm_rs.speculative.state_cache import StateCache
    from recoverssm_rs.vllm import RecoverSSMCommit

    torch.manual_seed(seed)  # the states too: two calls give the same bytes
    ms, states, table = _adapter()
    layout = layouts.kda(num_heads=2, head_dim=4, conv_kernel_size=3, num_spec=2, recover_ssm=True)
    cache = StateCache(layout, num_layers=1, num_blocks=12, max_requests=4)
    g = torch.Generator().manual_seed(seed)
    for b in cache.buffers().values():
        b.copy_(torch.randn(b.shape, generator=g).to(b.dtype))
    commit = RecoverSSMCommit(
        cache,
        request_indices=torch.tensor([0]),
        state_blocks=np.array([1]),
        num_computed_tokens=torch.tensor([4], dtype=I32),
        block_table=torch.arange(3, 6, dtype=I32).reshape(1, 3),
    )
    return ms, states, table, cache, commit


def _snapshot(ms, states, cache):
    return [t.clone() for t in (*states, ms._state, ms._acc, *cache.buffers().values())]


@pytest.mark.parametrize("via", ["stage", "post"])
@pytest.mark.parametrize("what", ["no commit", "no cache"])
def test_a_recoverssm_commit_that_is_not_one_is_a_plan_error(fake_ops, recorder, launch_args, via, what):
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm import RecoverSSMCommit

    ms, states, table, cache, good = _with_cache()
    ms.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 1), [table])
    launched, before = len(recorder.calls), _snapshot(ms, states, cache)
    # Not a commit (neither a RecoverSSMCommit nor a bool), or a commit without a cache.
    bad = object() if what == "no commit" else RecoverSSMCommit(None, [0], [1], [4], [[3, 4, 5]])
    name = (
        r"recoverssm: AttributeError: .*'cache'"
        if what == "no commit"
        else r"recoverssm.cache \(a RecoverSSM state cache\): AttributeError"
    )
    with pytest.raises(PlanError, match=name):
        if via == "stage":
            ms.stage_recoverssm(bad)
        else:
            ms.postprocess_state(_v(1), _v(3), _v(0, 6, 4, 0), [table], recoverssm=bad)
    assert len(recorder.calls) == launched
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(ms, states, cache)))
    with pytest.raises(PlanError, match="no RecoverSSM commit is staged"):  # nothing was staged
        ms.postprocess_state(_v(1), _v(3), _v(0, 6, 4, 0), [table], recoverssm=True)


def test_a_staged_commit_runs_as_staged_after_its_object_changes(fake_ops, emulator, launch_args):
    """The commit's fields are read when it is staged: the object changed afterwards (a field
    replaced before ``postprocess_state(recoverssm=True)``) commits what was staged and checked,
    as an unchanged one does."""
    runs = []
    for change in (False, True):
        ms, states, table, cache, commit = _with_cache()
        ms.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 1), [table])
        ms.stage_recoverssm(commit)
        if change:
            commit.request_indices, commit.num_computed_tokens = None, "four"
        ms.postprocess_state(_v(1), _v(3), _v(0, 6, 4, 0), [table], recoverssm=True)
        assert ms.last_error().ok
        runs.append(_snapshot(ms, states, cache))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    ms, states, _, cache, _ = _with_cache()
    fresh = _snapshot(ms, states, cache)
    written = [not torch.equal(a, b) for a, b in zip(fresh, runs[0])]
    assert written[-len(cache.buffers()) :].count(True) > 0  # the commit wrote cache bytes


def test_a_launch_that_fails_after_the_host_commit_does_not_commit_twice(fake_ops, emulator, launch_args, monkeypatch):
    """A host cache's commit runs inside the post-process's guarded write, before its launch; when
    the launch then fails (the driver refuses it), the step stays open and its stage stays for the
    retry, which launches without committing the cache again: the result equals one post-process
    that never failed."""
    from recoverssm_rs.cuda import module

    runs = []
    for fail in (False, True):
        ms, states, table, cache, commit = _with_cache()
        ms.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 1), [table])
        ms.stage_recoverssm(commit)
        if fail:
            launch = module.launch

            def refused(*args, **kwargs):
                monkeypatch.setattr(module, "launch", launch)  # once
                raise RuntimeError("the driver refused the launch")

            monkeypatch.setattr(module, "launch", refused)
            with pytest.raises(RuntimeError, match="refused the launch"):
                ms.postprocess_state(_v(1), _v(3), _v(0, 6, 4, 0), [table], recoverssm=True)
        ms.postprocess_state(_v(1), _v(3), _v(0, 6, 4, 0), [table], recoverssm=True)
        assert ms.last_error().ok
        runs.append(_snapshot(ms, states, cache))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("device_tables", [5, object()])
def test_device_tables_that_are_not_a_list_are_a_plan_error(fake_ops, recorder, device_tables):
    """The V1 device step's ``device_tables`` (the engine's device block tables): anything not a
    list of tables is the package's PlanError naming it, and nothing is launched."""
    import numpy as np
    from recoverssm_rs import Planner
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm.decide import PreCopyInputs
    from recoverssm_rs.vllm.device_step import DeviceStep
    from support.device_fakes import FakeCuda, random_states
    from support.generators import group_layouts

    lay = group_layouts()[0]
    states = random_states(lay, 50, 2, np.random.default_rng(0))
    step = DeviceStep(Planner.from_groups([(lay, [[FakeCuda(t) for t in layer] for layer in states])], block_size=4), 4)
    tables = [np.arange(1, 17, dtype=np.int64).reshape(2, 8)]
    counts = FakeCuda(torch.ones(2, dtype=I32))
    with pytest.raises(PlanError, match="device_tables"):
        step.launch(PreCopyInputs(tables, [0, 4], [3, 2], counts, [-1, 0]), device_tables=device_tables)
    assert recorder.calls == []


BIG = 2**63 - 1


@pytest.mark.parametrize(
    ("computed", "scheduled", "accepted", "column", "block_size", "message"),
    [
        # the stored column at the int64 limit, moved with an offset: was a Rust panic (slice index)
        (4, 4, 2, BIG, 4, r"the running state's source columns .*: columns 9223372036854775807 \.\.= .* are outside"),
        # the step's columns at the limit with speculative blocks after them: was a Rust panic
        (
            BIG - 1,
            1,
            1,
            -1,
            1,
            r"the step's running and speculative columns: columns 9223372036854775806 \.\.= .* are outside",
        ),
        # computed + scheduled past the limit: was refused with wrapped (negative) columns
        (BIG - 3, 4, 1, -1, 4, r"num_computed = 9223372036854775804 and num_scheduled = 4 add up past 2\*\*63 - 1"),
    ],
)
def test_a_pre_copy_near_the_int64_limit_is_a_plan_error(computed, scheduled, accepted, column, block_size, message):
    import numpy as np
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm.decide import PreCopyInputs, align_pre_copy

    step = PreCopyInputs([np.arange(1, 9).reshape(1, 8)], [computed], [scheduled], [accepted], [column])
    with pytest.raises(PlanError, match=rf"request 0: {message}"):
        align_pre_copy(step, block_size=block_size, num_spec_blocks=2)


def test_a_post_process_whose_tokens_pass_the_int64_limit_is_a_plan_error():
    """num_computed + num_scheduled past 2**63 - 1 with the wrapped column as state_col: a decision
    of negative token counts was returned (running = -2**63 + 1); now refused, naming the counts."""
    import numpy as np
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm.decide import PostProcessInputs, align_post_process

    step = PostProcessInputs([np.arange(1, 9).reshape(1, 8)], [-(2**61)], [BIG], [2], [0], [1])
    with pytest.raises(PlanError, match=r"request 0: num_computed = 9223372036854775807 and num_scheduled = 2 add up"):
        align_post_process(step, block_size=4, num_spec_blocks=2)


@pytest.mark.parametrize(("value", "message"), [(4.5, "must be a host integer"), ("8", "must be a host integer")])
def test_the_v1_plugins_max_num_reqs_is_the_cores_to_check_not_truncated(value, message):
    """The V1 plugin reads the input batch's ``max_num_reqs`` for the step it builds: a value that
    is not an integer is refused by the core (the runner falls back to vLLM, the reason names it),
    not truncated by ``int()`` into a table of 4 request indices."""
    import types

    from recoverssm_rs.vllm import plugin

    cfg, ctx, funcs = vllm_trace.small_runner_objects([torch.randn(16, 5, 3), torch.randn(16, 2, 2)], fake=False)
    p = plugin._Plugin(types.ModuleType("mamba_utils"), {})
    a = {
        "cache_config": types.SimpleNamespace(enable_prefix_caching=True),
        "kv_cache_config": cfg,
        "forward_context": ctx,
        "mamba_state_copy_funcs": funcs,
        "input_batch": types.SimpleNamespace(max_num_reqs=value),
    }
    runner = p._build(a)
    assert runner.step is None and f"max_num_reqs {message}" in str(runner.reason)
    a["input_batch"] = types.SimpleNamespace(max_num_reqs=4)
    assert repr(p._build(a).step).startswith("VllmMambaStep(")


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("preempted_req_ids", 5, "scheduler_output.preempted_req_ids"),
        ("resumed_req_ids", "b", r"scheduler_output.scheduled_cached_reqs.resumed_req_ids"),
        ("finished_req_ids", None, "scheduler_output.finished_req_ids"),
    ],
)
def test_a_malformed_list_of_released_requests_frees_nothing(field, value, named):
    """vLLM's finished, preempted and resumed request ids are read before any is released: one
    list of the wrong kind is a PlanError naming it (not "req_ids"), and the request indices of
    the others stay where they were (a well-formed finished list was released before)."""
    import numpy as np
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm import VllmMambaStep
    from support.vllm_trace import GroupCfg, Req, Side, Sim, scheduler_output

    sim = Sim([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", seed=0, num_blocks=64)
    side = Side(sim, sim.make_states(), None)
    step = VllmMambaStep.from_runner(side.kv_cache_config, side.forward_context, side.copy_funcs(None), max_num_reqs=4)
    a = Req("a", prompt=9, cols=[{}])
    sim.ensure_cols(a, 9)
    side.load_batch([a])
    step.preprocess(scheduler_output([a], {"a": (9, 0)}, set(), set(), set()), side.input_batch, side.requests)
    step.postprocess(np.ones(1, np.int64))
    columns = step.mamba_state_idx.copy()
    side.load_batch([])
    out = scheduler_output([], {}, {"a"}, set(), set())  # "a" finished ...
    target = out.scheduled_cached_reqs if field == "resumed_req_ids" else out
    setattr(target, field, value)  # ... and one list malformed
    with pytest.raises(PlanError, match=rf"{named} must be a list of request ids"):
        step.preprocess(out, side.input_batch, side.requests)
    assert repr(step).endswith("live=1)") and np.array_equal(step.mamba_state_idx, columns)


def test_a_block_size_the_kernel_cannot_take_is_refused_when_model_state_v2_is_made():
    """The slot kernel reads the block size as int32: a planner whose block size is past 2**31 - 1
    is refused by the constructor (it was refused only at the first half-step, after the model
    state had been built and served, and add_request had seeded columns with it)."""
    from recoverssm_rs.errors import PlanError

    cfg, ctx, funcs = vllm_trace.small_runner_objects([torch.randn(16, 5, 3), torch.randn(16, 2, 2)], fake=True)
    cfg.kv_cache_groups[0].kv_cache_spec.block_size = 2**40
    with pytest.raises(PlanError, match=r"block_size must be in 1 \.\.= 2\*\*31 - 1, got 1099511627776"):
        _from_runner("V2", cfg, ctx, funcs)


def test_a_buffer_freed_before_the_first_half_step_is_refused(fake_ops, recorder, launch_args):
    """The core step is made over the adapter's buffers at the first half-step: a buffer whose
    storage was freed before then (resized to 0 bytes: a null address) is refused there, not taken
    as the address the kernel writes."""
    ms, _, table = _adapter()
    MOVES["state_idx storage freed"](ms)
    with pytest.raises(
        BindingError, match=r"state_idx: its storage was freed \(untyped_storage\(\)\.resize_\(0\)\): the 16 bytes"
    ):
        ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
    assert recorder.calls == []


@pytest.mark.parametrize("gone", ["shrunk", "freed"])
@pytest.mark.parametrize(
    "name", ["idx_mapping", "num_computed_tokens", "query_start_loc", "block_tables[0]", "num_sampled"]
)
def test_a_runner_tensor_whose_storage_is_gone_is_refused(fake_ops, recorder, launch_args, name, gone):
    """A runner tensor the kernel reads on the device, whose storage was shrunk or freed after the
    tensor was made (it keeps its shape, so the launch would read past the allocation): a PlanError
    naming it, before anything is launched."""
    ms, _, table = _adapter()
    if name == "num_sampled":
        ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
    args = {"idx_mapping": _v(1, 2), "num_computed_tokens": _v(0, 4, 4, 0), "query_start_loc": _v(0, 1, 2)}
    args |= {"block_tables[0]": table, "num_sampled": _v(1, 1)}
    args[name].untyped_storage().resize_(2 if gone == "shrunk" else 0)
    launched = len(recorder.calls)
    what = r"holds 2 bytes at .*shrunk since" if gone == "shrunk" else r"was freed .*are gone"
    with pytest.raises(PlanError, match=rf"{re.escape(name)}: its storage {what}.*nothing was read or written"):
        if name == "num_sampled":
            ms.postprocess_state(_v(1, 2), args["num_sampled"], _v(0, 5, 5, 0), [table])
        else:
            ms.preprocess_state(
                args["idx_mapping"], args["num_computed_tokens"], args["query_start_loc"], [args["block_tables[0]"]]
            )
    assert len(recorder.calls) == launched


def test_a_state_whose_storage_shrank_is_refused_when_bound():
    """A state tensor whose storage was shrunk before it is bound: a BindingError naming the layer
    and state (its shape alone would let every copy write past the allocation)."""
    import recoverssm_rs as rs
    from recoverssm_rs import layouts

    gdn = layouts.gdn(
        num_k_heads=1, num_v_heads=1, head_k_dim=4, head_v_dim=4, conv_kernel_size=2, num_spec=0, dtype="float32"
    )
    states = [[torch.zeros(8, *s.shape, dtype=getattr(torch, s.dtype)) for s in gdn.persistent] for _ in range(2)]
    states[1][1].untyped_storage().resize_(16)
    with pytest.raises(
        BindingError, match=r"layer 1.*its storage holds 16 bytes at .* not the \d+ bytes at .*shrunk since"
    ):
        rs.Planner(gdn, states)
