"""Property test (seeded, small): random traces replayed through every policy as a serving engine
runs them, several requests in flight at once (planned, then finished in another order), through a
:class:`CheckpointStore` on a real planner. Next to the cache, an independent model keeps the exact
token prefix of every live checkpoint. After every call:

- the cache never holds more checkpoints than its budget, and agrees with the model;
- a hit names a live checkpoint whose tokens are exactly the prompt's first ``hit_position`` tokens,
  at most ``len - 1`` (a block boundary for ``vllm``), and the longest such;
- a plan's saves lie past the hit, within the prompt; writes hold computed prefixes, new handles;
  an eviction names a checkpoint that was live (or written by the same call);
- the store and the cache agree after every call, a start included (``sglang-lru``'s evictions at
  admission are named by the plan and retracted by the start, and no finish reports them again):
  the store publishes exactly the live checkpoints' blocks, one block each, and never a block a
  request in flight runs in; every reserved block is free or holds one checkpoint; a checkpoint's
  block keeps its bytes while it is live (no later write or eviction reuses it); a running block
  holds, until its request ends, the bytes its start copied there (no other request's end or
  eviction writes or frees it).
"""

from __future__ import annotations

import random

import pytest
from recoverssm_rs.checkpoints import POLICIES, CheckpointCache
from recoverssm_rs.checkpoints.store import CheckpointStore
from test_copy_on_write import RESERVED, _bytes, _planner

B, G = 4, 2


def _request(rng: random.Random, done: list[list[int]]) -> tuple[list[int], list[int]]:
    """Token ids over a 3-letter alphabet, often extending an earlier sequence (a later turn) or
    cut at a block boundary of one (a shared prefix ending exactly there)."""
    prompt: list[int] = []
    if done and rng.random() < 0.6:
        earlier = rng.choice(done)
        cut = rng.choice([len(earlier), len(earlier) // B * B, rng.randrange(len(earlier) + 1)])
        prompt = earlier[:cut]
    prompt += [rng.randrange(3) for _ in range(rng.randrange(0 if prompt else 1, 9))]
    return prompt, [rng.randrange(3) for _ in range(rng.randrange(0, 4))]


def _usable(policy: str, prompt: list[int], live: dict[int, list[int]]) -> int:
    """The longest live checkpoint usable for ``prompt`` (0 when none)."""
    n = len(prompt)
    cap = (n - 1) // B * B if policy == "vllm" else n - 1
    return max((len(t) for t in live.values() if len(t) <= cap and prompt[: len(t)] == t), default=0)


def _replay(policy: str, seed: int) -> int:
    rng = random.Random(seed)
    budget = rng.randint(1, 5)
    planner, states = _planner()
    cache = CheckpointCache(policy, block_size=B, granularity=G, budget=budget)
    store = CheckpointStore(cache, planner, RESERVED)
    live: dict[int, list[int]] = {}  # the model: handle -> the exact prefix it holds
    seen: set[int] = set()
    kept: dict[int, bytes] = {}  # a live checkpoint's block's bytes when first seen
    free = list(range(1, RESERVED.start))
    running: list[tuple[list[int], list[int], object, int, bytes]] = []
    done: list[list[int]] = []
    hits = 0

    def check(where: str) -> None:
        assert len(cache) == len(live) <= budget, (where, len(cache), len(live), budget)
        for h, tokens in live.items():
            assert cache.position(h) == len(tokens), (where, h)
        published = set(planner.published())
        assert published == set(store.blocks().values()), where
        assert set(store.blocks()) == set(live), where
        blocks = store.blocks()
        assert len(set(blocks.values())) == len(blocks), (where, "two checkpoints in one block", blocks)
        assert store.free_blocks + len(blocks) == len(RESERVED), (where, "a reserved block lost or freed twice")
        for h, block in blocks.items():
            held = kept.setdefault(h, _bytes(states, block))
            assert _bytes(states, block) == held, f"{where}: checkpoint {h}'s block {block} changed"
        for h in set(kept) - set(blocks):
            del kept[h]
        for _, _, _, block, copied in running:
            assert block not in published, (where, block)
            assert _bytes(states, block) == copied, f"{where}: running block {block} changed"

    for step in range(40):
        if len(running) < 3 and (not running or rng.random() < 0.6):
            prompt, output = _request(rng, done)
            block = free.pop()
            want = _usable(policy, prompt, live)
            hit = cache.peek(prompt)
            hit_block = store.block_of(hit) if hit is not None else None
            plan = store.start(prompt, block)
            where = f"{policy} seed {seed} step {step}: start of {prompt}"
            assert plan.hit_handle == hit, where
            # sglang-lru evicts at admission (the request's own state slot): the plan names those
            # evictions, and the store has retracted them by the time start returns.
            assert policy == "sglang-lru" or not plan.evicted, where
            for h in plan.evicted:
                assert h != hit and live.pop(h, None) is not None, (where, "evicted a checkpoint that was not live", h)
            if hit is not None:
                hits += 1
                assert hit in live and plan.hit_position == len(live[hit]) == want, where
                assert prompt[: plan.hit_position] == live[hit], where
                assert _bytes(states, block) == _bytes(states, hit_block), where
            else:
                assert want == 0 and plan.hit_position == 0, where
            if policy == "vllm":
                assert plan.hit_position % B == 0, where
            assert plan.saves == sorted(set(plan.saves)), where
            assert all(plan.hit_position < s <= len(prompt) for s in plan.saves), (where, plan.saves)
            running.append((prompt, output, plan, block, _bytes(states, block)))
            done.append(prompt + output)
            check(where)
            continue
        prompt, output, plan, block, _ = running.pop(rng.randrange(len(running)))
        seq = (prompt + output)[: len(prompt) + max(len(output), 1) - 1]
        written, evicted = store.finish(prompt, output, plan, lambda p, b=block: b)
        where = f"{policy} seed {seed} step {step}: end of {prompt} + {output}"
        # Evictions of checkpoints live before the call first (an older checkpoint of a prefix
        # this request writes again may be evicted by one of its earlier writes), then the writes,
        # then the evictions of checkpoints written by the call itself.
        mine = {h for _, h in written}
        for h in evicted:
            if h not in mine:
                assert live.pop(h, None) is not None, (where, "evicted a checkpoint that was not live", h)
        for position, h in written:
            assert 1 <= position <= len(seq) and h not in seen, (where, position, h)
            assert seq[:position] not in live.values(), (where, "a second checkpoint of one prefix")
            seen.add(h)
            live[h] = seq[:position]
        for h in evicted:
            if h in mine:
                del live[h]
        free.append(block)
        check(where)
    return hits


@pytest.mark.parametrize("policy", POLICIES)
def test_interleaved_requests_keep_every_invariant(policy: str) -> None:
    hits = sum(_replay(policy, seed) for seed in range(60))
    assert hits > 0, "no request hit: the traces test nothing"
