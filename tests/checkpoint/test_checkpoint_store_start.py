"""The block a store's request runs in: the request's prefill writes it, so it must be a block of its
own, checked on a hit and on a miss alike. The hit's own block is refused too: copied onto itself
the checkpoint would be written in place by the prefill (the planner accepts that copy because it
writes nothing; the store is where it is known that the block is written next). A refused start
changes nothing: no use counted, nothing evicted at admission."""

from __future__ import annotations

import pytest
from recoverssm_rs import PlanError
from recoverssm_rs.checkpoints import CheckpointCache
from recoverssm_rs.checkpoints.store import CheckpointStore
from test_copy_on_write import NB, _planner

PROMPT = list(range(12))
OTHER = [7] * 12


def _store(policy: str = "sglang-lru") -> CheckpointStore:
    planner, _ = _planner()
    store = CheckpointStore(CheckpointCache(policy, block_size=8, granularity=4, budget=2), planner, [40, 41, 42])
    for prompt in (PROMPT, OTHER):
        store.finish(prompt, [5], store.start(prompt, 1), lambda p: 1)
    assert len(store.cache) == 2
    return store


def _state(store: CheckpointStore) -> tuple:
    return store.blocks(), sorted(store.planner.published()), len(store.cache), store.free_blocks


@pytest.mark.parametrize("policy", ["sglang-lru", "recoverssm"])
def test_a_start_into_the_hits_own_block_is_refused_and_changes_nothing(policy):
    store = _store(policy)
    longer = PROMPT + [5, 3]
    hit = store.cache.peek(longer)
    assert hit is not None
    own = store.block_of(hit)
    before = _state(store)
    with pytest.raises(PlanError, match=rf"running_block = {own} holds a published state"):
        store.start(longer, own)
    assert _state(store) == before
    plan = store.start(longer, 2)
    assert plan.hit_handle == hit and len(store.cache) == (1 if policy == "sglang-lru" else 2)


@pytest.mark.parametrize(
    ("block", "needle"),
    [
        (NB + 5, rf"running_block = {NB + 5} is outside 1 \.\.= {NB - 1}"),
        (0, r"running_block = 0 is outside"),
        (-3, rf"running_block = -3 is outside 1 \.\.= {NB - 1}"),
        (-(2**70), rf"running_block = {-(2**70)} is outside 1 \.\.= {NB - 1}"),
        ("2", r"running_block must be a host integer"),
        (True, r"running_block must be a host integer"),
        ("published", r"holds a published state"),
    ],
)
def test_a_miss_checks_the_running_block_too(block, needle):
    store = _store()
    if block == "published":
        block = sorted(store.blocks().values())[0]
    miss = [9, 9, 9]
    assert store.cache.peek(miss) is None
    before = _state(store)
    with pytest.raises(PlanError, match=needle):
        store.start(miss, block)
    assert _state(store) == before, "a refused start evicted at admission"


def test_check_running_block_names_a_bad_group():
    store = _store()
    with pytest.raises(PlanError, match="group 3 does not exist"):
        CheckpointCache.check_running_block(store.planner.core, 2, group=3)
    assert CheckpointCache.check_running_block(store.planner.core, 2) == 2


@pytest.mark.parametrize(
    ("reserved", "needle"),
    [
        ([40, 41, 40], r"blocks\[2\] = 40 repeats blocks\[0\]"),
        ([40, 0], r"blocks\[1\] = 0 is outside 1 \.\.= 47"),
        ([NB, 40], rf"blocks\[0\] = {NB} is outside 1 \.\.= 47"),
        ([40, -1], r"blocks\[1\] = -1 is outside 1 \.\.= 47"),
        ([40, "x"], r"blocks\[1\] must be a host integer"),
        ([True], r"blocks\[0\] must be a host integer"),
        ("published", r"blocks\[0\] = 5 holds a published state"),
        (40, r"blocks must be a sequence of block ids"),
    ],
)
def test_a_store_checks_its_reserved_blocks_when_made(reserved, needle):
    planner, _ = _planner()
    if reserved == "published":
        planner.publish([5])
        reserved = [5, 40]
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    with pytest.raises(PlanError, match=needle):
        CheckpointStore(cache, planner, reserved)
    assert len(cache) == 0


def test_a_store_takes_any_iterable_of_distinct_block_ids():
    planner, _ = _planner()
    store = CheckpointStore(CheckpointCache("recoverssm"), planner, range(40, 44))
    assert store.free_blocks == 4
    store = CheckpointStore(CheckpointCache("recoverssm"), planner, (b for b in [40, 41]))
    assert store.free_blocks == 2


def test_a_start_into_one_of_the_stores_free_reserved_blocks_is_refused():
    """A free reserved block is not published, so the planner would take it: the store's next
    checkpoint would then be copied into the block the request is writing (and the request's own
    block published as a checkpoint)."""
    planner, _ = _planner()
    store = CheckpointStore(CheckpointCache("recoverssm", block_size=8, granularity=4, budget=2), planner, [40, 41, 42])
    before = _state(store)
    with pytest.raises(PlanError, match=r"running_block = 40 is one of the checkpoint store's free reserved blocks"):
        store.start(PROMPT, 40)
    assert _state(store) == before
    store.finish(PROMPT, [5], store.start(PROMPT, 1), lambda p: 1)
    held = next(iter(store.blocks().values()))  # a reserved block now holding a checkpoint
    with pytest.raises(PlanError, match=rf"running_block = {held} holds a published state"):
        store.start(OTHER, held)
    free = min({40, 41, 42} - set(store.blocks().values()))  # a reserved block still free
    with pytest.raises(
        PlanError, match=rf"running_block = {free} is one of the checkpoint store's free reserved blocks"
    ):
        store.start(OTHER, free)
