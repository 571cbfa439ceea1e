"""The checkpoint store and cache under hostile input: a request's end that cannot be
materialised (no free reserved block, a bad state block) leaves the cache and the store agreeing
on every live checkpoint; handles that are not ints in range, and workload parameters that are
not counts, ranges or finite numbers, are the package's error naming them; an empty trace is
refused however it is given."""

from __future__ import annotations

import re

import pytest
from recoverssm_rs import PlanError
from recoverssm_rs._core import check_checkpoint_trace
from recoverssm_rs.checkpoints import CheckpointCache, read_trace, simulate
from recoverssm_rs.checkpoints import workloads as w
from recoverssm_rs.checkpoints.store import CheckpointStore
from test_copy_on_write import NB, _bytes, _planner

PROMPT = list(range(12))
OUTPUT = [5, 6, 7, 8, 9]


def _agree(cache, store, planner):
    """Every live checkpoint of the cache has a published block of the store, and no more."""
    live = store.blocks()
    assert len(cache) == len(live), (len(cache), live)
    assert all(cache.position(h) is not None for h in live)
    assert sorted(planner.published()) == sorted(live.values())


@pytest.mark.parametrize(
    ("reserved", "state_at", "needle"),
    [
        ([40], lambda p: 1, "no reserved block is free"),
        ([40, 41, 42], lambda p: NB + 5, f"source block id {NB + 5} is outside"),
        ([40, 41, 42], lambda p: 1 if p < 12 else 0, "null block|source block"),
    ],
    ids=["too-few-blocks", "state-block-out-of-range", "null-state-block"],
)
def test_a_finish_that_cannot_be_materialised_leaves_cache_and_store_agreeing(reserved, state_at, needle):
    planner, states = _planner()
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    store = CheckpointStore(cache, planner, reserved)
    before = {b: _bytes(states, b) for b in reserved}
    plan = store.start(PROMPT, 1)
    with pytest.raises(PlanError, match=needle):
        store.finish(PROMPT, OUTPUT, plan, state_at)
    _agree(cache, store, planner)
    assert store.free_blocks == len(reserved)
    assert all(_bytes(states, b) == before[b] for b in reserved), "no reserved block written"
    # The next turn starts from what the cache holds: no checkpoint without a block.
    nxt = store.start(PROMPT + OUTPUT + [3, 3, 3], 2)
    assert nxt.hit_handle is None or store.block_of(nxt.hit_handle) is not None
    plan = store.start(PROMPT, 3)
    written, _ = store.finish(PROMPT, OUTPUT, plan, lambda p: 3) if len(reserved) > 1 else ([], [])
    _agree(cache, store, planner)
    assert all(store.block_of(h) is not None for _, h in written)


def test_a_failed_finish_keeps_the_checkpoints_written_before():
    planner, states = _planner()
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    store = CheckpointStore(cache, planner, [40, 41])
    plan = store.start(PROMPT, 1)
    first, _ = store.finish(PROMPT, [5], plan, lambda p: 1)
    assert first and all(store.block_of(h) is not None for _, h in first)
    kept = store.blocks()
    other = [9, 9, 9, 9, 9, 9, 9, 9, 9]
    plan = store.start(other, 2)
    with pytest.raises(PlanError):
        store.finish(other, OUTPUT, plan, lambda p: 10**6)
    _agree(cache, store, planner)
    assert all(store.blocks().get(h) == b for h, b in kept.items() if cache.position(h) is not None)


def test_a_store_over_a_cache_that_already_holds_checkpoints_is_refused():
    planner, _ = _planner()
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    cache.finish(PROMPT, OUTPUT, cache.plan(PROMPT))
    with pytest.raises(PlanError, match=r"cache already holds \d+ checkpoint"):
        CheckpointStore(cache, planner, [40, 41])


@pytest.mark.parametrize("handle", [-1, 2**64, 2**70, "1", 1.0, None])
def test_a_handle_that_is_not_an_int_in_range_is_a_plan_error(handle):
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    written, _ = cache.finish(PROMPT, OUTPUT, cache.plan(PROMPT))
    with pytest.raises(PlanError, match="handle"):
        cache.position(handle)
    assert cache.position(written[0][1]) == written[0][0] and cache.position(12345) is None


# ---- workload generators ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gen", "params", "needle"),
    [
        (w.multi_turn, dict(user=(250, 40)), r"user = \(250, 40\)"),
        (w.agent_loop, dict(tool=(-5, 3)), r"tool = \(-5, 3\)"),
        (w.multi_turn, dict(output=(1, 2, 3)), "output = "),
        (w.rag, dict(documents=0), "documents = 0"),
        (w.rag, dict(zipf=float("nan")), "zipf = nan"),
        (w.rag, dict(zipf=-1.0), "zipf = -1.0"),
        (w.shared_prompt, dict(vocab=2.5), "vocab = 2.5"),
        (w.shared_prompt, dict(requests=2.5), "requests = 2.5"),
        (w.shared_prompt, dict(requests=-1), "requests = -1"),
        (w.shared_prompt, dict(requests=0), "requests = 0"),
        (w.few_shot, dict(shared=-5), "shared = -5"),
        (w.shared_prompt, dict(requests=True), "requests = True"),
        (w.shared_prompt, dict(rate=float("inf")), "rate = inf"),
        (w.shared_prompt, dict(shared=0, suffix=0), "prompt"),
        (w.shared_prompt, dict(seed=[1]), r"seed = \[1\] must be an int"),
        (w.mix, dict(seed=1.5), r"seed = 1.5 must be an int"),
    ],
)
def test_bad_workload_parameters_are_plan_errors_naming_them(gen, params, needle):
    with pytest.raises(PlanError, match=needle):
        gen(**params)


def test_an_unknown_workload_parameter_is_named():
    with pytest.raises(PlanError, match=r"workload 'mix'.*'requests'"):
        w.generate("mix", requests=3)
    with pytest.raises(PlanError, match=r"workload 'shared-short'.*'turns'"):
        w.generate("shared-short", turns=3)
    assert len(w.generate("shared-short", requests=3)) == 3
    assert all(len(r.prompt) == 1500 + 60 for r in w.generate("shared-short", requests=2))


# ---- empty traces -------------------------------------------------------------------------------


def test_an_empty_trace_is_refused_by_every_entry_point(tmp_path):
    with pytest.raises(PlanError, match="holds no request"):
        simulate([], "vllm")
    with pytest.raises(PlanError, match="holds no request"):
        simulate(iter(()), "recoverssm", budget_checkpoints=2)
    with pytest.raises(PlanError, match="holds no request"):
        check_checkpoint_trace([])
    path = tmp_path / "blank.jsonl"
    path.write_text("\n   \n")
    for call in (read_trace, lambda p: simulate(p, "vllm")):
        with pytest.raises(PlanError, match=f"trace {re.escape(repr(str(path)))} holds no request"):
            call(path)


def test_a_finish_that_could_not_be_materialised_is_not_finished_again():
    planner, _ = _planner()
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    store = CheckpointStore(cache, planner, [40, 41, 42])
    plan = store.start(PROMPT, 1)
    with pytest.raises(PlanError, match="source block"):
        store.finish(PROMPT, OUTPUT, plan, lambda p: NB + 5)
    with pytest.raises(PlanError, match="this plan was already finished"):
        store.finish(PROMPT, OUTPUT, plan, lambda p: 1)
    _agree(cache, store, planner)
    assert len(cache) == 0 and store.free_blocks == 3
