"""The host offload tier: capacity accounting from the layout, least-recently-used eviction, spill
to disk and restore from it, byte-exact."""

from __future__ import annotations

import gc
import os

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


def _tree(root):
    """Every path under ``root`` (links not followed): its kind and, for a file, its bytes; for a
    link, its target."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("dir", None)
        else:
            out[rel] = ("file", p.read_bytes())
    return out


def _spilling_cache(disk_dir):
    """A cache over ``disk_dir`` that has spilled two entries; returns it and its private directory."""
    lay, _, p = _pool()
    per = 2 * sum(s.nbytes for s in lay.persistent)
    cache = HostCache(p, 2 * per, disk_dir=disk_dir)
    for k, b in (("a", [1]), ("b", [2]), ("c", [3, 4])):
        cache.put(k, b)
    (private,) = [d for d in disk_dir.iterdir() if d.name.startswith("recoverssm-spill-")]
    assert len(list(private.glob("entry-*.safetensors"))) == 2
    return cache, private


def test_a_dropped_cache_removes_its_spill_directory_and_nothing_of_the_users(tmp_path):
    user = tmp_path / "user"
    (user / "sub").mkdir(parents=True)
    (user / "keep.txt").write_bytes(b"mine")
    (user / "sub" / "entry-0.safetensors").write_bytes(b"also mine")
    (user / "link").symlink_to(user / "keep.txt")
    before = _tree(user)
    cache, private = _spilling_cache(user)
    del cache
    gc.collect()
    assert not private.exists()
    assert _tree(user) == before  # the user's directory as it was, its own files untouched


def test_a_dropped_cache_follows_no_link_in_its_spill_directory(tmp_path):
    """Only the files the cache wrote are removed (a link put in a spill file's place is not
    followed), then its directory when nothing else is left in it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data").write_bytes(b"keep")
    user = tmp_path / "user"
    user.mkdir()
    cache, private = _spilling_cache(user)
    spilled = sorted(private.glob("entry-*.safetensors"))
    spilled[0].unlink()
    spilled[0].symlink_to(victim / "data")
    (private / "planted").symlink_to(victim, target_is_directory=True)
    del cache
    gc.collect()
    assert _tree(victim) == {"data": ("file", b"keep")}
    assert not spilled[1].exists()  # the file the cache wrote is gone
    # what the cache did not write stays, and so does the directory holding it
    assert sorted(p.name for p in private.iterdir()) == sorted([spilled[0].name, "planted"])
