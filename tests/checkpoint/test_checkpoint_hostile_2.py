"""A refused start changes nothing: :meth:`CheckpointStore.start` whose running block is refused
or whose copy fails to run leaves the cache exactly as it was, so a store that saw refused starts
goes on exactly like one that never did (same hits, writes and evictions): the refused call
counted no use of the hit and evicted nothing at admission."""

from __future__ import annotations

import random

import pytest
from recoverssm_rs import PlanError
from recoverssm_rs.checkpoints import POLICIES, CheckpointCache
from recoverssm_rs.checkpoints.store import CheckpointStore
from test_copy_on_write import NB, _planner

RESERVED = [40, 41, 42, 43]


class _Boom(RuntimeError):
    pass


def _store(policy: str, run=None) -> CheckpointStore:
    planner, _ = _planner()
    cache = CheckpointCache(policy, block_size=8, granularity=4, budget=2)
    return CheckpointStore(cache, planner, RESERVED, run=run)


def _requests(seed: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    out: list[tuple[list[int], list[int]]] = []
    for _ in range(14):
        prompt: list[int] = []
        if out and rng.random() < 0.7:
            p, o = rng.choice(out)
            prompt = p + o
        prompt += [rng.randrange(3) for _ in range(rng.randrange(4, 20))]
        out.append((prompt, [rng.randrange(3) for _ in range(rng.randrange(1, 6))]))
    return out


def _refused_starts(store: CheckpointStore, prompt: list[int], hit: int) -> None:
    """Starts of a prompt with a hit whose running block is refused: out of range, the null block,
    a published block (the hit's own included)."""
    bad = [NB + 5, 0, *sorted(store.planner.published())]
    for block in bad:
        with pytest.raises(PlanError, match=f"block (id |= )?{block}"):
            store.start(prompt, block)


def _twins(policy: str, seed: int, hostile_start) -> int:
    """Replays a trace through two stores; before each request the second also sees
    ``hostile_start`` on earlier prompts that would hit (starts that must change nothing, of
    requests that then never run). Both must agree on every plan, write, eviction and block.
    Returns the hostile starts made."""
    calm, hostile = _store(policy), _store(policy)
    rng = random.Random(seed)
    seen: list[list[int]] = []
    tried = 0
    for prompt, output in _requests(seed):
        for earlier in rng.sample(seen, min(3, len(seen))):
            probe = earlier + [rng.randrange(3)]
            hit = hostile.cache.peek(probe)
            if hit is not None:
                tried += 1
                hostile_start(hostile, probe, hit)
        seen.append(prompt + output)
        a, b = calm.start(prompt, 1), hostile.start(prompt, 1)
        assert (a.hit_handle, a.hit_position, a.saves) == (b.hit_handle, b.hit_position, b.saves)
        assert calm.finish(prompt, output, a, lambda p: 1) == hostile.finish(prompt, output, b, lambda p: 1)
        assert calm.blocks() == hostile.blocks() and len(calm.cache) == len(hostile.cache)
        assert sorted(calm.planner.published()) == sorted(hostile.planner.published())
    return tried


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_a_start_whose_copy_is_refused_changes_nothing(policy, seed):
    assert _twins(policy, seed, _refused_starts), "no probe hit: nothing was refused"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_start_whose_copy_fails_to_run_changes_nothing(policy):
    def failing(store: CheckpointStore, prompt: list[int], hit: int) -> None:
        def boom(plan) -> None:
            raise _Boom("the engine's copy failed")

        run, store._run = store._run, boom
        try:
            with pytest.raises(_Boom):
                store.start(prompt, 1)
        finally:
            store._run = run

    assert _twins(policy, 0, failing)


def test_peek_counts_nothing_and_names_a_bad_prompt():
    cache = CheckpointCache("sglang-lru", block_size=8, granularity=4, budget=1)
    prompt = list(range(12))
    cache.finish(prompt, [5], cache.plan(prompt))
    longer = prompt + [5, 1]
    hit = cache.peek(longer)
    assert hit is not None and cache.peek(longer) == hit and len(cache) == 1
    assert cache.plan(longer).hit_handle == hit
    for bad in ([], "abc", [-1]):
        with pytest.raises(PlanError, match="prompt"):
            cache.peek(bad)


def test_a_hit_counted_by_a_refused_start_would_change_the_next_eviction():
    """The scenario the twins above rely on, spelled out under sglang-lru: a counted hit makes the
    other checkpoint the least recently used (and, at a full budget, evicts it at admission)."""
    store = _store("sglang-lru")
    first, second = list(range(12)), [7] * 12
    for prompt in (first, second):
        store.finish(prompt, [5], store.start(prompt, 1), lambda p: 1)
    assert len(store.cache) == 2
    with pytest.raises(PlanError, match=f"running_block = {NB + 5}"):
        store.start(first + [1, 2], NB + 5)
    assert len(store.cache) == 2, "the refused start evicted a checkpoint at admission"
    assert sorted(store.blocks().values()) == sorted(store.planner.published()) == [40, 41]
