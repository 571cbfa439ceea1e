"""``sglang-lru`` evicts when a request is admitted (its plan takes a state slot of its own from the
budget), not only when one ends. The plan names those evictions (:attr:`CheckpointPlan.evicted`),
and a :class:`CheckpointStore` retracts them as soon as it has the plan: between a request's start
and any later finish the store lists exactly the cache's live checkpoints, publishes exactly their
blocks, and has the evicted checkpoints' blocks free again. Each eviction is reported once: the
plan's are not reported again by a finish."""

from __future__ import annotations

from recoverssm_rs.checkpoints import CheckpointCache
from recoverssm_rs.checkpoints.store import CheckpointStore
from test_copy_on_write import _planner

RESERVED = [40, 41, 42]
FIRST, SECOND, MISS = [1] * 6, [2] * 6, [3] * 6


def _full_store() -> tuple[CheckpointStore, dict[int, int]]:
    """A store over an ``sglang-lru`` cache of budget 2 holding two checkpoints (one per ended
    request), and those checkpoints' blocks."""
    planner, _ = _planner()
    store = CheckpointStore(CheckpointCache("sglang-lru", block_size=4, granularity=2, budget=2), planner, RESERVED)
    for prompt in (FIRST, SECOND):
        store.finish(prompt, [5], store.start(prompt, 1), lambda p: 1)
    held = store.blocks()
    assert len(held) == 2 == len(store.cache)
    return store, held


def _agrees(store: CheckpointStore) -> None:
    """The store holds exactly the cache's live checkpoints, publishes exactly their blocks, and
    every other reserved block is free."""
    blocks = store.blocks()
    gone = [h for h in blocks if store.cache.position(h) is None]
    assert not gone, f"the store still holds checkpoints {gone} that the cache evicted"
    assert len(blocks) == len(store.cache)
    assert sorted(store.planner.published()) == sorted(blocks.values())
    assert store.free_blocks == len(RESERVED) - len(blocks)


def test_a_start_retracts_the_checkpoints_its_admission_evicted() -> None:
    store, held = _full_store()
    plan = store.start(MISS, 2)
    _agrees(store)
    evicted = [h for h in held if store.cache.position(h) is None]
    assert len(evicted) == 1, "a full sglang-lru budget evicts one checkpoint at admission"
    assert plan.evicted == evicted
    assert store.block_of(evicted[0]) is None
    # The request's end is written into a reserved block (possibly the one just freed), and its
    # finish does not report the admission's eviction a second time.
    written, again = store.finish(MISS, [5], plan, lambda p: 2)
    assert len(written) == 1 and not set(again) & set(evicted)
    _agrees(store)


def test_a_hit_is_kept_and_a_plan_that_evicts_nothing_says_so() -> None:
    store, held = _full_store()
    # A hit on FIRST's checkpoint keeps it; the other one is evicted for the request's slot.
    plan = store.start(FIRST + [5, 7], 2)
    assert plan.hit_handle in held and plan.evicted == [h for h in held if h != plan.hit_handle]
    _agrees(store)
    unlimited = CheckpointCache("sglang-lru", block_size=4, granularity=2)
    assert unlimited.plan(FIRST).evicted == []
    assert "evicted=[]" in repr(unlimited.plan(SECOND))


def test_the_bare_cache_reports_admission_evictions_on_the_plan_only() -> None:
    cache = CheckpointCache("sglang-lru", block_size=4, granularity=2, budget=1)
    first = cache.plan(FIRST)
    (written,), evicted = cache.finish(FIRST, [5], first)
    assert evicted == [] and first.evicted == []
    second = cache.plan(SECOND)
    assert second.evicted == [written[1]] and cache.position(written[1]) is None
    _, evicted = cache.finish(SECOND, [5], second)
    assert evicted == [], "an admission's eviction is reported by its plan, not again by a finish"
