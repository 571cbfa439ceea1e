"""The transfer tiers fail safe: temporaries that cannot be pre-placed, records signed whole and
spill files bound to their entry, refused calls that change nothing, handles and counters that
cannot be misused, and every bad argument refused with the package's own error naming it."""

from __future__ import annotations

import inspect
import json
import os
import struct

import numpy as np
import pytest
import torch
from recoverssm_rs.errors import BindingError, LayoutError, PlanError
from recoverssm_rs.transfer import (
    HostCache,
    HostOffload,
    LocalTransfer,
    StatePool,
    disk,
    load_states,
    local,
    nixl,
    offload,
    pool,
    save_states,
)
from recoverssm_rs.transfer import cache as cache_mod
from support.transfer_ref import FAMILIES, layout, paged_states


def _pool(seed=0, rank=0, tp=1):
    lay = layout(FAMILIES["mamba2"], tp, 1, "SD")
    _, states = paged_states(lay, 2, 10, np.random.default_rng(seed))
    return lay, states, StatePool(lay, states, tp_rank=rank)


def _memory(states):
    return [np.asarray(t).view(np.uint8).copy() for layer in states for t in layer]


def _unchanged(states, before):
    return all((np.asarray(t).view(np.uint8) == b).all() for t, b in zip([t for x in states for t in x], before))


def _spill_files(root):
    return sorted(root.rglob("*.safetensors"))


# ---- the disk tier's files -------------------------------------------------------------------


def test_a_link_planted_at_the_old_temporary_name_is_not_followed(tmp_path):
    lay, _, p = _pool()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "states.safetensors"
    # The name the temporary had: '.<name>.<pid>.tmp' beside the target.
    os.symlink(victim, tmp_path / f".{target.name}.{os.getpid()}.tmp")
    save_states(HostOffload(p).offload([1, 2]), target)
    assert victim.read_bytes() == b"precious", "the write followed a planted link"
    assert not target.is_symlink() and load_states(target, lay).num_requests == 2
    # A link at the target itself is replaced, not written through.
    link = tmp_path / "link.safetensors"
    os.symlink(victim, link)
    save_states(HostOffload(p).offload([3]), link)
    assert victim.read_bytes() == b"precious" and not link.is_symlink()


def test_world_writable_directories_without_the_sticky_bit_are_refused(tmp_path):
    _, _, p = _pool()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(BindingError, match="disk_dir: .* writable by every user and has no sticky bit"):
        HostCache(p, 10**9, disk_dir=open_dir)
    with pytest.raises(BindingError, match="path: .* writable by every user"):
        save_states(HostOffload(p).offload([1]), open_dir / "s.safetensors")
    assert not list(open_dir.iterdir())
    open_dir.chmod(0o1777)  # sticky, like /tmp: accepted
    cache = HostCache(p, 10**9, disk_dir=open_dir)
    cache.put("a", [1])
    assert not list(open_dir.iterdir()), "the private directory is made at the first spill only"


def test_spill_files_live_in_a_private_directory(tmp_path):
    lay, _, p = _pool()
    cache = HostCache(p, lay.persistent_bytes_per_block * 2, disk_dir=tmp_path)
    cache.put("a", [1])
    cache.put("b", [2])  # evicts "a" to disk
    (f,) = _spill_files(tmp_path)
    assert f.parent.parent == tmp_path and f.parent.stat().st_mode & 0o777 == 0o700
    assert f.stat().st_mode & 0o777 == 0o600


# ---- signed records, spill files bound to their key -------------------------------------------


def _edit_meta(path, **changes):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8 : 8 + n])
    h["__metadata__"].update(changes)
    hb = json.dumps(h).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n :])


def test_tampered_block_map_is_refused(tmp_path):
    lay, _, p = _pool()
    path = tmp_path / "s.safetensors"
    save_states(HostOffload(p).offload([1, 2]), path)
    _edit_meta(path, source_blocks="2,1")
    with pytest.raises(LayoutError, match=r"record digest .*\(block map"):
        load_states(path, lay)


def test_a_spill_file_swapped_with_another_entrys_is_refused_naming_the_key(tmp_path):
    lay, states, p = _pool()
    cache = HostCache(p, lay.persistent_bytes_per_block * 2, disk_dir=tmp_path)
    cache.put("a", [1])
    cache.put("b", [2])
    cache.put("c", [3])  # "a" and "b" are on disk now
    fa, fb = _spill_files(tmp_path)
    ra, rb = fa.read_bytes(), fb.read_bytes()
    fa.write_bytes(rb)
    fb.write_bytes(ra)
    before = _memory(states)
    for key in ("a", "b"):
        with pytest.raises(LayoutError, match=f"key '{key}': the spill file holds .*swapped"):
            cache.restore(key, [7])
    assert _unchanged(states, before), "a refused restore wrote"
    # Put back, the files restore; a file another tier wrote (a valid record, another tier's
    # entry and keys) is refused.
    fa.write_bytes(ra)
    fb.write_bytes(rb)
    assert cache.restore("a", [7])
    other = HostCache(p, lay.persistent_bytes_per_block * 2, disk_dir=tmp_path)
    for k in ("a", "b", "c"):
        other.put(k, [4])
    (theirs,) = [f for f in _spill_files(tmp_path) if f not in (fa, fb)][:1]
    fb.write_bytes(theirs.read_bytes())
    with pytest.raises(LayoutError, match="key 'b': the spill file holds 'host tier"):
        cache.restore("b", [7])


# ---- a refused put changes nothing ------------------------------------------------------------


@pytest.mark.parametrize("spill", [False, True])
def test_a_refused_put_keeps_the_entry_and_evicts_nothing(tmp_path, spill):
    lay, states, p = _pool()
    per = lay.persistent_bytes_per_block * 2
    cache = HostCache(p, 2 * per, disk_dir=tmp_path if spill else None)
    cache.put("a", [1])
    cache.put("b", [2])
    snapshot = (cache.used_bytes, cache.evictions, len(cache), _spill_files(tmp_path))
    for bad in ([1, 2, 3], [99], [-1], [1.5], "x"):
        with pytest.raises(PlanError):
            cache.put("a", bad)
        assert (cache.used_bytes, cache.evictions, len(cache), _spill_files(tmp_path)) == snapshot, bad
    with pytest.raises(PlanError):
        cache.put("new", [99])
    assert "new" not in cache and "a" in cache and "b" in cache
    assert cache.restore("a", [7]) and cache.restore("b", [8])


# ---- handles, counters, sources ---------------------------------------------------------------


def test_a_handle_of_another_key_is_refused(tmp_path):
    lay, states, p = _pool()
    cache = HostCache(p, 10**9)
    cache.put("a", [1])
    cache.put("b", [2])
    ha = cache.prefetch("a", [7])
    before = _memory(states)
    with pytest.raises(PlanError, match="prefetched for another key, not key 'b'"):
        cache.restore("b", [7], handle=ha)
    with pytest.raises(PlanError, match="not key 'zzz'|holds no key 'zzz'"):
        cache.restore("zzz", [7], handle=ha)
    assert _unchanged(states, before)
    assert cache.restore("a", [7], handle=ha)


def test_counters_are_read_only():
    _, _, p = _pool()
    cache = HostCache(p, 10**9)
    cache.put("a", [1])
    cache.restore("a", [2])
    for name in ("hits", "misses", "evictions", "used_bytes", "capacity_bytes", "bytes_per_request"):
        value = getattr(cache, name)
        with pytest.raises(AttributeError, match="read-only"):
            setattr(cache, name, 12345)
        assert getattr(cache, name) == value
    with pytest.raises(AttributeError):
        cache.index = None  # type: ignore[misc]
    assert cache.hits == 1


def test_two_pools_for_one_rank_are_refused():
    _, _, a = _pool(rank=1, tp=2)
    _, _, b = _pool(seed=1, rank=1, tp=2)
    _, _, d = _pool(seed=2, rank=0, tp=2)
    with pytest.raises(BindingError, match="source rank 1 is given twice"):
        LocalTransfer([a, b], d)


# ---- the package's error for every bad argument -----------------------------------------------


def test_deeply_nested_metadata_is_a_layout_error(tmp_path):
    lay, _, _ = _pool()
    path = tmp_path / "deep.safetensors"
    hb = b"[" * 200_000 + b"]" * 200_000
    path.write_bytes(struct.pack("<Q", len(hb)) + hb)
    with pytest.raises(LayoutError, match="nests deeper than 3 levels"):
        load_states(path, lay)


def test_missing_paths_and_directories_are_named(tmp_path):
    lay, _, p = _pool()
    with pytest.raises(BindingError, match="disk_dir: cannot use the directory .*missing: it does not exist"):
        HostCache(p, 10**9, disk_dir=tmp_path / "missing")
    with pytest.raises(BindingError, match="disk_dir: .* is not a directory"):
        (tmp_path / "file").write_bytes(b"")
        HostCache(p, 10**9, disk_dir=tmp_path / "file")
    with pytest.raises(BindingError, match="path: cannot read .*none.safetensors: it does not exist"):
        load_states(tmp_path / "none.safetensors", lay)
    with pytest.raises(BindingError, match="path: cannot use the directory"):
        save_states(HostOffload(p).offload([1]), tmp_path / "no" / "s.safetensors")


def test_a_spill_directory_removed_under_the_tier_is_a_binding_error(tmp_path):
    lay, states, p = _pool()
    d = tmp_path / "spill"
    d.mkdir()
    cache = HostCache(p, lay.persistent_bytes_per_block * 4, disk_dir=d)
    cache.put("a", [1])
    cache.put("b", [2])
    d.rmdir()
    with pytest.raises(BindingError, match="disk_dir"):
        cache.put("c", [3])
    assert "a" in cache and "b" in cache and cache.evictions == 0
    assert cache.restore("a", [7])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes any directory")
def test_an_unwritable_spill_directory_is_a_binding_error(tmp_path):
    lay, _, p = _pool()
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    cache = HostCache(p, lay.persistent_bytes_per_block * 2, disk_dir=d)
    cache.put("a", [1])
    with pytest.raises(BindingError, match="disk_dir: cannot create the directory .*permission denied"):
        cache.put("b", [2])
    assert "a" in cache and cache.evictions == 0


@pytest.mark.parametrize(
    "kwargs,err,needle",
    [
        (dict(tp_rank=-1), BindingError, "tp_rank = -1 must be >= 0"),
        (dict(tp_rank="a"), BindingError, "tp_rank must be a host integer"),
        (dict(block_size=2**70), BindingError, "block_size = .* is too large"),
        (dict(layout="x"), BindingError, "layout must be a Layout, got str"),
        (dict(states=None), BindingError, "states must be a list"),
    ],
)
def test_bad_state_pool_arguments_are_named(kwargs, err, needle):
    lay, states, _ = _pool()
    with pytest.raises(err, match=needle):
        StatePool(**{"layout": lay, "states": states, **kwargs})


@pytest.mark.parametrize(
    "kwargs,err,needle",
    [
        (dict(capacity_bytes="x"), PlanError, "capacity_bytes must be a host integer"),
        (dict(capacity_bytes=2**200), PlanError, f"capacity_bytes = {2**200} is too large"),
        (dict(capacity_bytes=-3), PlanError, "capacity_bytes must be > 0, got -3"),
        (dict(pool="x"), BindingError, "pool must be a StatePool, got str"),
        (dict(disk_dir=3), BindingError, "disk_dir must be a path"),
    ],
)
def test_bad_host_cache_arguments_are_named(kwargs, err, needle):
    _, _, p = _pool()
    with pytest.raises(err, match=needle):
        HostCache(**{"pool": p, "capacity_bytes": 10**9, **kwargs})


def test_an_unhashable_key_is_named():
    _, _, p = _pool()
    cache = HostCache(p, 10**9)
    for call in (cache.put, cache.restore, cache.prefetch):
        with pytest.raises(PlanError, match="key must be hashable .* got list"):
            call([1], [1])
    assert [1] not in cache


# ---- one guard protocol -----------------------------------------------------------------------


def test_the_transfer_modules_leave_the_guard_to_the_core():
    for mod in (local, nixl, pool, offload, cache_mod, disk):
        src = inspect.getsource(mod)
        assert "mark_written" not in src, f"{mod.__name__} records writes itself"
    assert not hasattr(StatePool, "mark_written")


def test_a_guarded_transfer_records_the_write_and_refuses_a_freed_tensor():
    lay = layout(FAMILIES["mamba2"], 1, 1, "SD")
    mk = lambda: [[torch.randn(6, *s.shape).to(getattr(torch, s.dtype)) for s in lay.persistent] for _ in range(2)]  # noqa: E731
    src, dst = mk(), mk()
    t = LocalTransfer([StatePool(lay, src)], StatePool(lay, dst))
    v0 = dst[0][0]._version
    t.run([(1, 2)])
    assert dst[0][0]._version > v0 and torch.equal(dst[0][0][2], src[0][0][1])
    before = [x.clone() for layer in dst for x in layer]
    src[1][0].untyped_storage().resize_(0)
    with pytest.raises(BindingError, match="storage was resized or freed"):
        t.run([(3, 4)])
    assert all(torch.equal(a, b) for a, b in zip(before, [x for layer in dst for x in layer]))
