"""The transfer tiers under hostile inputs: a pool's layout, fingerprint and geometry cannot be
reassigned after the pool was bound (a transfer then still checks blocks against the tensors it
holds, and writes nothing on a refusal)."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs.errors import PlanError
from recoverssm_rs.transfer import LocalTransfer, StatePool
from support.transfer_ref import FAMILIES, layout, paged_states


def _pools():
    lay = layout(FAMILIES["mamba2"], 2, 1, "SD")
    _, a = paged_states(lay, 2, 10, np.random.default_rng(0))
    _, b = paged_states(lay, 2, 10, np.random.default_rng(1))
    return lay, b, StatePool(lay, a), StatePool(lay, b)


def _bytes(states):
    return [np.asarray(t).view(np.uint8).copy() for layer in states for t in layer]


@pytest.mark.parametrize("attr", ["num_blocks", "num_layers", "fingerprint", "layout", "device"])
def test_a_pools_binding_cannot_be_reassigned(attr):
    lay, states, src, dst = _pools()
    value = {"num_blocks": 100, "num_layers": 5, "fingerprint": src.fingerprint.with_rank(1)}.get(attr, None)
    with pytest.raises(AttributeError):
        setattr(dst, attr, value)
    assert dst.num_blocks == 10 and dst.num_layers == 2 and dst.fingerprint.tp_rank == 0


def test_a_block_past_the_bound_tensors_is_refused_with_nothing_written():
    lay, states, src, dst = _pools()
    try:
        dst.num_blocks = 100  # refused: the pool is bound to its tensors' 10 blocks
    except AttributeError:
        pass
    before = _bytes(states)
    with pytest.raises(PlanError, match="request 1: destination block 50 is out of range"):
        LocalTransfer([src], dst).run([(1, 2), (1, 50)])
    assert all((x == y).all() for x, y in zip(before, _bytes(states))), "request 0 was written"
