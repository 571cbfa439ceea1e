"""Published states are immutable (copy-on-write; vLLM #57908).

A :class:`CheckpointStore` runs each policy over random traces on a real planner bound to numpy
states, as an engine would: requests start from a hit by copying it into their own block, commit
align steps into their own blocks, share blocks with forks (each sharer one holder of the
published block; a sharer that must write copies first), and the cache's evictions retract
checkpoints. Between steps, hostile plans aim at published blocks. After every step every
published block holds the bytes it had when it was published, a refused plan wrote nothing, and
the planner's published set is exactly what the store and the sharers hold.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from recoverssm_rs import PlanError, Planner, layouts
from recoverssm_rs.checkpoints import POLICIES, CheckpointCache
from recoverssm_rs.checkpoints.store import CheckpointStore

NB = 48
RESERVED = range(32, NB)  # checkpoint blocks; 1..31 are requests' running blocks


def _planner() -> tuple[Planner, list[list[np.ndarray]]]:
    layout = layouts.gdn(
        num_k_heads=1,
        num_v_heads=1,
        head_k_dim=4,
        head_v_dim=4,
        conv_kernel_size=4,
        num_spec=1,
        conv_layout="SD",
        dtype="float32",
        ssm_dtype="float32",
    )
    states = [
        [
            np.arange(NB * int(np.prod(s.shape)), dtype=np.float32).reshape(NB, *s.shape) + 1e5 * layer
            for s in layout.persistent
        ]
        for layer in range(2)
    ]
    return Planner(layout, states), states


def _bytes(states: list[list[np.ndarray]], block: int) -> bytes:
    return b"".join(t[block].tobytes() for layer in states for t in layer)


def _trace(rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
    out: list[tuple[list[int], list[int]]] = []
    for _ in range(n):
        prompt: list[int] = []
        if out and rng.random() < 0.5:
            p, o = rng.choice(out)
            prompt = p + o
        prompt += [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
        out.append((prompt, [rng.randrange(3) for _ in range(rng.randrange(0, 4))]))
    return out


class Engine:
    """The model engine: running blocks, sharers, and the published bytes to check."""

    def __init__(self, planner: Planner, states: list[list[np.ndarray]], store: CheckpointStore) -> None:
        self.planner, self.states, self.store = planner, states, store
        self.free = list(range(1, RESERVED.start))
        self.shared: dict[int, int] = {}  # block -> sharing requests holding it
        self.snap: dict[tuple[int, tuple[str, int]], bytes] = {}
        self.refused = 0

    def kernel_writes(self, block: int, rng: random.Random) -> None:
        """A forward pass writing the request's own (unpublished) block through the planner: an
        align step moving another block's state into it."""
        assert self.planner.holders(block) == 0
        src = rng.randrange(1, NB)
        self.planner.plan_align([[src, block]], [0], [1], [rng.randint(1, 2)]).execute()

    def hostile(self, rng: random.Random) -> None:
        """A plan aimed at a published block: refused, nothing written."""
        published = self.planner.published()
        if not published:
            return
        target = rng.choice(published)
        src = rng.choice([b for b in range(1, NB) if b != target])
        before = [t.copy() for layer in self.states for t in layer]
        attempt: Any = rng.choice(
            [
                lambda: self.planner.plan_copy([src], [target]),
                lambda: self.planner.plan_align([[src, target]], [0], [1], [1]),
                lambda: self.planner.plan_align([[target, src]], [0], [0], [2]),  # an in-place shift
            ]
        )
        with pytest.raises(PlanError, match=f"block {target} holds a published state"):
            attempt()
        self.refused += 1
        assert all(np.array_equal(a, t) for a, t in zip(before, (t for layer in self.states for t in layer)))
        self.check()

    def check(self) -> None:
        """Every published block holds the bytes it had when its current holder published it (a
        checkpoint block freed and reused within one request is a new checkpoint: keyed by handle)."""
        published = set(self.planner.published())
        owner = {b: ("checkpoint", h) for h, b in self.store.blocks().items()}
        owner.update({b: ("shared", b) for b in self.shared})
        assert published == set(owner), (published, owner)
        keys = {(b, owner[b]) for b in published}
        self.snap = {k: v for k, v in self.snap.items() if k in keys}
        for key in keys:
            self.snap.setdefault(key, _bytes(self.states, key[0]))
            assert _bytes(self.states, key[0]) == self.snap[key], f"published block {key} changed"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_published_checkpoints_never_change_until_evicted(policy: str, seed: int) -> None:
    rng = random.Random(seed * 31 + len(policy))
    planner, states = _planner()
    budget = rng.randint(2, 6)
    cache = CheckpointCache(policy, block_size=8, granularity=4, budget=budget)
    store = CheckpointStore(cache, planner, RESERVED)
    eng = Engine(planner, states, store)
    for prompt, output in _trace(rng, 30):
        block = eng.free.pop()
        plan = store.start(prompt, block)
        if plan.hit_handle is not None:
            assert _bytes(states, block) == _bytes(states, store.block_of(plan.hit_handle) or 0)
        eng.check()
        # Share: a forked request holds the block too, until one side must write (copy first).
        planner.publish([block, block])  # the owner and the fork: two holders
        eng.shared[block] = 2
        eng.check()
        eng.hostile(rng)
        fork = eng.free.pop()
        planner.plan_copy([block], [fork]).execute()
        planner.retract([block])  # the fork leaves the shared block
        eng.shared[block] -= 1
        eng.kernel_writes(fork, rng)  # the fork writes its own copy
        planner.retract([block])
        del eng.shared[block]
        eng.kernel_writes(block, rng)  # the owner commits in place once it alone holds the block
        eng.check()
        store.finish(prompt, output, plan, lambda p: block)
        eng.check()
        eng.hostile(rng)
        eng.free += [block, fork]
    assert eng.refused > 0
    assert len(planner.published()) == len(cache) <= budget


def test_publish_and_retract_are_checked_and_change_nothing_on_error() -> None:
    planner, states = _planner()
    planner.publish(np.array([3, 3, 5], dtype=np.int32))
    assert (planner.published(), planner.holders(3), planner.holders(4)) == ([3, 5], 2, 0)
    before = [t.copy() for layer in states for t in layer]
    with pytest.raises(PlanError, match=r"request 1, state 'conv' \(all 2 layers\): the destination block 5"):
        planner.plan_copy([1, 2], [2, 5])
    assert all(np.array_equal(a, t) for a, t in zip(before, (t for layer in states for t in layer)))
    with pytest.raises(PlanError, match=r"blocks\[3\] = 3: retracts block 3 3 time\(s\) but it has 2"):
        planner.retract([3, 5, 3, 3])
    with pytest.raises(PlanError, match=r"blocks\[1\] = 48 is outside 1 \.\.= 47"):
        planner.publish([4, NB])
    with pytest.raises(PlanError, match="group 1 does not exist"):
        planner.publish([4], group=1)
    assert planner.published() == [3, 5], "a refused call changes nothing"
    planner.retract([3, 3, 5])
    planner.plan_copy([1], [5]).execute()
    assert _bytes(states, 5) == _bytes(states, 1)
