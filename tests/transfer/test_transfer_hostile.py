"""The host tier under hostile call orders: a prefetch handle outlived by its entry, and refused
restores that must change nothing (counters and recency included)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from recoverssm_rs.errors import BindingError, LayoutError, PlanError
from recoverssm_rs.transfer import HostCache, HostOffload, LocalTransfer, StatePool, load_states, save_states
from support.transfer_ref import FAMILIES, layout, paged_states


def _pool(seed=0):
    lay = layout(FAMILIES["mamba2"], 1, 1, "SD")
    _, states = paged_states(lay, 2, 10, np.random.default_rng(seed))
    return lay, states, StatePool(lay, states)


def _rows(states, block):
    return [np.asarray(t)[block].view(np.uint8).copy() for layer in states for t in layer]


def _per_request(p):
    return HostCache(p, 10**9).bytes_per_request


def _same(a, b):
    return all((x == y).all() for x, y in zip(a, b))


def test_a_handle_prefetched_before_its_key_was_put_again_is_refused():
    _, states, p = _pool()
    cache = HostCache(p, 10**9)
    cache.put("a", [1])
    stale = cache.prefetch("a", [7])  # copies block 1's states into block 7
    cache.put("a", [2])  # the key now holds block 2's states
    before = _rows(states, 7)
    with pytest.raises(PlanError, match="prefetched for another key, not key 'a'"):
        cache.restore("a", [7], handle=stale)
    assert _same(_rows(states, 7), before)
    fresh = cache.prefetch("a", [7])
    assert cache.restore("a", [7], handle=fresh)
    assert _same(_rows(states, 7), _rows(states, 2)), "the restore holds the entry now under the key"


def test_replacing_a_key_keeps_the_tier_consistent(tmp_path):
    lay, states, p = _pool()
    cache = HostCache(p, _per_request(p) * 2, disk_dir=tmp_path)
    cache.put("a", [1])
    cache.put("b", [2])
    cache.put("a", [3])  # replaces 'a' in place: nothing evicted
    assert (len(cache), cache.evictions, cache.used_bytes) == (2, 0, _per_request(p) * 2)
    cache.put("c", [4])  # evicts the least recently used: 'b'
    assert cache.evictions == 1 and "a" in cache and "b" in cache and "c" in cache
    assert cache.restore("a", [8]) and _same(_rows(states, 8), _rows(states, 3))
    assert cache.restore("b", [9]) and _same(_rows(states, 9), _rows(states, 2))  # from disk
    spilled = set(tmp_path.rglob("*.safetensors"))
    cache.put("b", [5])  # a spilled key put again: its file goes (and 'a' or 'c' spills)
    assert len(spilled) == 1 and not spilled & set(tmp_path.rglob("*.safetensors"))
    assert len(list(tmp_path.rglob("*.safetensors"))) == cache.index.counters().on_disk == 1
    assert cache.restore("b", [9]) and _same(_rows(states, 9), _rows(states, 5))


@pytest.mark.parametrize("bad", [[99], [4, 5]], ids=["out-of-range", "two-blocks-for-one-request"])
@pytest.mark.parametrize("call", ["restore", "prefetch"])
def test_a_refused_restore_counts_nothing_and_keeps_the_lru_order(call, bad):
    lay, states, p = _pool()
    cache = HostCache(p, _per_request(p) * 2)
    cache.put("a", [1])
    cache.put("b", [2])  # 'a' is now the least recently used
    before = [_rows(states, b) for b in range(1, 10)]
    with pytest.raises(PlanError):
        getattr(cache, call)("a", bad)
    assert (cache.hits, cache.misses) == (0, 0), "a refused call counts no hit"
    assert all(_same(_rows(states, b), want) for b, want in zip(range(1, 10), before)), "nothing written"
    cache.put("c", [3])  # evicts the least recently used: still 'a'
    assert "a" not in cache and "b" in cache


def test_a_tampered_spill_file_is_refused_without_counting_a_hit(tmp_path):
    _, states, p = _pool()
    cache = HostCache(p, _per_request(p), disk_dir=tmp_path)
    cache.put("a", [1])
    cache.put("b", [2])  # spills 'a'
    (path,) = tmp_path.rglob("*.safetensors")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    before = _rows(states, 7)
    for call in (cache.restore, cache.prefetch):
        with pytest.raises(LayoutError):
            call("a", [7])
    assert (cache.hits, cache.misses) == (0, 0) and _same(_rows(states, 7), before)


def test_a_damaged_file_is_named_by_its_path_and_a_spill_file_by_its_key(tmp_path):
    lay, _, p = _pool()
    path = tmp_path / "s.safetensors"
    save_states(HostOffload(p).offload([1, 2]), path)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(LayoutError, match=f"saved states file {re.escape(str(path))}: request 1 .*checksum"):
        load_states(path, lay)
    cache = HostCache(p, _per_request(p), disk_dir=tmp_path)
    cache.put(("req", 7), [1])
    cache.put("b", [2])  # spills ('req', 7)
    (spill,) = (tmp_path / next(tmp_path.glob("recoverssm-spill-*")).name).glob("*.safetensors")
    raw = bytearray(spill.read_bytes())
    raw[-1] ^= 0x01
    spill.write_bytes(bytes(raw))
    with pytest.raises(LayoutError, match=re.escape(f"saved states file {spill} (key ('req', 7)): request 0")):
        cache.restore(("req", 7), [7])


# ---- a transfer inside one pool ---------------------------------------------------------------


def _all(states):
    return [np.asarray(t).view(np.uint8).copy() for layer in states for t in layer]


@pytest.mark.parametrize("same_object", [True, False], ids=["one-pool", "two-pools-over-one-memory"])
def test_a_block_both_read_and_written_by_one_transfer_is_refused(same_object):
    lay, states, p = _pool()
    dst = p if same_object else StatePool(lay, states)
    t = LocalTransfer([p], dst)
    before = _all(states)
    # Request 0 writes block 2, which request 1 reads: the result would depend on the copy order
    # (block 3 received block 1's state, not block 2's).
    with pytest.raises(PlanError, match=r"requests? 0 .*writes .*request 1 reads|request 1 reads .*request 0 writes"):
        t.run([(1, 2), (2, 3)])
    assert all((a == b).all() for a, b in zip(_all(states), before)), "nothing written"
    want = [_rows(states, b) for b in (1, 2)]
    t.run([(1, 4), (2, 5)])  # disjoint sources and destinations in one pool: fine
    assert _same(_rows(states, 4), want[0]) and _same(_rows(states, 5), want[1])
    t.run([(6, 6)])  # a block onto itself changes nothing


def test_offloading_no_block_is_a_plan_error_naming_the_blocks():
    _, _, p = _pool()
    off = HostOffload(p)
    cache = HostCache(p, 10**9)
    cache.put("a", [1])
    for call in (off.offload, off.offload_async, lambda b: cache.put("a", b), lambda b: cache.put("new", b)):
        with pytest.raises(PlanError, match="blocks is empty: offload at least one block"):
            call([])
    assert "new" not in cache and len(cache) == 1 and cache.restore("a", [7])


@pytest.mark.parametrize("call", ["drop", "put"])
def test_a_spill_file_that_cannot_be_removed_leaves_the_tier_as_it_was(tmp_path, call):
    _, states, p = _pool()
    cache = HostCache(p, _per_request(p), disk_dir=tmp_path)
    cache.put("a", [1])
    cache.put("b", [2])  # spills 'a'
    (spill,) = tmp_path.rglob("*.safetensors")
    spill.unlink()
    spill.mkdir()  # a directory planted where 'a''s spill file was
    before = (len(cache), cache.evictions, cache.used_bytes)
    with pytest.raises(BindingError, match="cannot remove .*entry"):
        cache.drop("a") if call == "drop" else cache.put("a", [3])
    assert (len(cache), cache.evictions, cache.used_bytes) == before and "a" in cache
    assert sorted(tmp_path.rglob("*.safetensors")) == [spill], "no spill file left behind"
    with pytest.raises(BindingError, match="is not a regular file"):
        cache.restore("a", [7])  # the tier still knows where 'a' was: its error, not a KeyError
    assert cache.restore("b", [8]) and _same(_rows(states, 8), _rows(states, 2))
    spill.rmdir()
    cache.drop("a")
    assert "a" not in cache and len(cache) == 1


# ---- saving host states whose fields were changed ---------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("num_requests", 0, r"states.num_requests = 0 must be >= 1"),
        ("num_requests", -1, r"states.num_requests = -1 must be >= 0"),
        ("num_requests", "2", r"states.num_requests must be a host integer"),
        ("num_requests", 3, r"states.num_requests = 3 .*holds 2"),
        ("num_requests", 1, r"states.source_blocks has 2 entries for states.num_requests = 1"),
        ("source_blocks", [1], r"states.source_blocks has 1 entries for states.num_requests = 2"),
        ("source_blocks", [-1, 2], r"states.source_blocks\[0\] = -1 must be >= 0"),
        ("source_blocks", [1, 2**70], r"states.source_blocks\[1\] = .* is too large"),
        ("source_blocks", 7, r"states.source_blocks must be"),
    ],
)
def test_saving_host_states_with_a_bad_field_is_refused_before_any_file(tmp_path, field, value, needle):
    lay, _, p = _pool()
    states = HostOffload(p).offload([1, 2])
    setattr(states, field, value)
    path = tmp_path / "s.safetensors"
    with pytest.raises(PlanError, match=needle):
        save_states(states, path)
    assert list(tmp_path.iterdir()) == [], "no file, no temporary"


# ---- a handle used on another pool -------------------------------------------------------------


def test_a_handle_prefetched_into_another_pool_is_refused():
    _, s1, p = _pool(seed=0)
    _, s2, q = _pool(seed=1)
    into_p, into_q = HostOffload(p), HostOffload(q)
    saved = into_p.offload([1, 2])
    handle = into_p.prefetch(saved, [5, 6])  # the copies went into p's blocks 5 and 6
    before = [_rows(s2, b) for b in (5, 6)]
    with pytest.raises(PlanError, match="was not prefetched .*by this HostOffload"):
        into_q.restore(saved, [5, 6], handle=handle)  # q's blocks were never written
    assert all(_same(_rows(s2, b), x) for b, x in zip((5, 6), before))
    into_p.restore(saved, [5, 6], handle=handle)
    assert _same(_rows(s1, 5), _rows(s1, 1))
    # The same through two host tiers: an entry of the same key and id in each.
    a, b = HostCache(p, 10**9), HostCache(q, 10**9)
    a.put("k", [1])
    b.put("k", [2])
    ha = a.prefetch("k", [7])
    before = _rows(s2, 7)
    with pytest.raises(PlanError, match="was not prefetched .*by this HostOffload"):
        b.restore("k", [7], handle=ha)
    assert _same(_rows(s2, 7), before)
    assert b.restore("k", [7]) and _same(_rows(s2, 7), _rows(s2, 2))
