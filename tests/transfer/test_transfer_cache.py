"""The host offload tier: capacity accounting from the layout, least-recently-used eviction, spill
to disk and restore from it, byte-exact."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs._core import HostCacheIndex
from recoverssm_rs.errors import PlanError
from recoverssm_rs.transfer import HostCache, StatePool
from support.transfer_ref import FAMILIES, layout, paged_states


def _pool(seed=0):
    lay = layout(FAMILIES["mamba2"], 2, 1, "SD")
    _, states = paged_states(lay, 2, 10, np.random.default_rng(seed))
    return lay, states, StatePool(lay, states, tp_rank=1)


def _blocks(states, blocks):
    return [[np.asarray(t).view(np.uint8)[blocks].copy() for t in layer] for layer in states]


def _same(states, blocks, want):
    return all(
        (np.asarray(t).view(np.uint8)[blocks] == w).all() for layer, ws in zip(states, want) for t, w in zip(layer, ws)
    )


@pytest.mark.parametrize("spill", [False, True])
def test_lru_eviction_within_capacity_and_byte_exact_restores(tmp_path, spill):
    lay, states, p = _pool()
    per = 2 * sum(s.nbytes for s in lay.persistent)
    cache = HostCache(p, 4 * per, disk_dir=tmp_path if spill else None)
    assert cache.bytes_per_request == per
    want = {k: _blocks(states, b) for k, b in {"a": [1, 2], "b": [3], "c": [4]}.items()}
    cache.put("a", [1, 2])
    cache.put("b", [3])
    assert cache.used_bytes == 3 * per
    assert cache.restore("a", [7, 8])  # "a" is now the most recently used
    assert _same(states, [7, 8], want["a"])
    cache.put("c", [4, 5])  # needs 2: evicts "b", the least recently used
    assert cache.evictions == 1 and cache.used_bytes == 4 * per
    assert ("b" in cache) == spill and "a" in cache and "c" in cache
    if spill:
        assert cache.restore("b", [9]) and _same(states, [9], want["b"])
        assert len(list(tmp_path.rglob("*.safetensors"))) == 1
        cache.drop("b")
        assert not list(tmp_path.rglob("*.safetensors"))
    before = _blocks(states, [9])
    assert not cache.restore("b", [9]) and _same(states, [9], before)
    assert (cache.hits, cache.misses) == ((2, 1) if spill else (1, 1))
    with pytest.raises(PlanError, match="more than the capacity"):
        cache.put("big", [1, 2, 3, 4, 5])
    assert "HostCache(entries=2" in repr(cache)


def test_the_core_keeps_the_tier_rules(tmp_path):
    lay, _, p = _pool()
    per = 2 * sum(s.nbytes for s in lay.persistent)
    for bad in (0, -5):
        with pytest.raises(PlanError, match="capacity_bytes must be > 0"):
            HostCache(p, bad)
    idx = HostCacheIndex(p.fingerprint, 2, 3 * per, disk_dir=tmp_path)
    assert idx.counters().bytes_per_request == per == p.fingerprint.request_nbytes(2) and idx.need(3) == 3 * per
    assert idx.put(10, 2) == [] and idx.put(11, 1) == []
    assert idx.lookup(10) == "memory" and idx.lookup(99) is None
    assert idx.put(12, 1) == [(11, True)]  # 11 is the least recently used: spilled
    assert idx.location(11) == "disk" and idx.counters().used_bytes == 3 * per
    with pytest.raises(PlanError, match="more than the capacity"):
        idx.put(13, 2**62)
    c = idx.counters()
    assert (len(idx), c.evictions, c.hits, c.misses, c.in_memory, c.on_disk) == (3, 1, 1, 1, 2, 1)
    assert idx.drop(11) == "disk" and idx.drop(11) is None
    assert "HostCacheIndex(entries=2" in repr(idx)
