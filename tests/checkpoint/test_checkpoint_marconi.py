"""Marconi saves a state at the exact branch point a new prompt creates in the radix tree, at token
granularity, also where the earlier sequence it branches from ends within the chunk after the
last full chunk they share (the index keeps whole chunks; the tokens of a sequence past its last
full chunk count for the branch point too)."""

from __future__ import annotations

import pytest
from recoverssm_rs.checkpoints import CheckpointCache


@pytest.mark.parametrize("g", [4, 8])
@pytest.mark.parametrize("shared_extra", [1, 2])
def test_the_branch_point_inside_an_earlier_sequences_last_partial_chunk(g, shared_extra):
    cache = CheckpointCache("marconi", block_size=8, granularity=g)
    earlier = list(range(2 * g + g - 1))  # two full chunks, then g - 1 tokens
    cache.finish(earlier, [], cache.plan(earlier))
    branch = 2 * g + shared_extra
    prompt = earlier[:branch] + [1000 + t for t in range(5)]
    assert cache.plan(prompt).saves == [branch]
    # Once the branch point is a checkpoint, a third prompt branching there starts from it.
    cache.finish(prompt, [7], cache.plan(prompt))
    assert cache.plan(earlier[:branch] + [3000, 3001]).hit_position == branch


def test_the_longest_tail_counts_among_several_ending_in_one_chunk():
    cache = CheckpointCache("marconi", block_size=8, granularity=4)
    for seq in (list(range(8)) + [30], list(range(8)) + [40, 41, 42], list(range(11))):
        cache.finish(seq, [], cache.plan(seq))
    # Shares 10 tokens with range(11) (whose end, at 11, is no prefix of it), fewer with the others.
    assert cache.plan(list(range(10)) + [60, 61]).saves == [10]
