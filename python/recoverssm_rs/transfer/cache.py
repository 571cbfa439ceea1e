"""An offload tier for one pool: requests' persistent states kept in host memory (pinned for a
CUDA pool) under a byte capacity with least-recently-used eviction, spilled to disk when a
directory is given. Bytes per request come from the layout (every layer's persistent states);
workspace is never saved."""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import overload

from .._core import HostCacheIndex, TransferPlan, block_list, check_pool
from ..errors import PlanError
from .disk import _load, _save
from .local import LocalTransfer
from .offload import HostOffload, HostStates
from .pool import StatePool
from .streams import TransferHandle

__all__ = ["HostCache"]

#: An entry found for a restore: its id, states, the blocks, and the checked restore plan.
_Found = tuple[int, HostStates, list[int], tuple[LocalTransfer, TransferPlan]]

log = logging.getLogger("recoverssm_rs")


class _Counter:
    """A read-only attribute of :class:`HostCache`: one field of the core index's
    :class:`~recoverssm_rs._core.CacheCounters` snapshot (assigning one is an AttributeError)."""

    def __init__(self, field: str, doc: str) -> None:
        self.field = field
        self.__doc__ = doc

    @overload
    def __get__(self, cache: None, owner: type[HostCache]) -> _Counter: ...
    @overload
    def __get__(self, cache: HostCache, owner: type[HostCache]) -> int: ...
    def __get__(self, cache: HostCache | None, owner: type[HostCache]) -> _Counter | int:
        return self if cache is None else int(getattr(cache.index.counters(), self.field))

    def __set__(self, cache: HostCache, value: object) -> None:
        raise AttributeError(f"HostCache.{self.field} is read-only: the core counts it")


class HostCache:
    """Saved states of ``pool`` by key (a prefix hash, a request id), within ``capacity_bytes`` of
    host memory.

    :meth:`put` offloads a request group's blocks, evicting the least recently used entries
    until the new one fits (to ``disk_dir`` when given, else dropped); :meth:`restore` copies an
    entry back (from memory, or from disk) and marks it recently used. Entries keep their source
    rank and layout (:class:`HostStates`), so :meth:`get` may be restored into another rank with
    :meth:`HostOffload.restore`.

    A key must be hashable and equal to itself (so must each item of a tuple or frozenset key):
    a NaN, which equals no other NaN, is a PlanError naming the key in every call.

    A refused call changes nothing: a :meth:`put` that is too large or names bad blocks keeps the
    entry already stored under its key and evicts nothing. The counters are read-only.

    Spill files live in a private directory the tier makes inside ``disk_dir`` at its first spill
    (mode 0700, an exclusive create under a random name); each file is bound to its entry and
    sealed with keys only this tier holds, so a file swapped with another entry's, or rewritten,
    is refused on restore (LayoutError naming the key) and nothing is written. When the cache is
    dropped, the spill files it wrote and then its private directory are removed (no link is
    followed; the rest of ``disk_dir``, and anything else put in the private directory, stays).

    Args:
        pool: the pool whose states are offloaded and restored.
        capacity_bytes: host bytes the tier may hold.
        disk_dir: a directory for evicted entries (one safetensors file each), or None. It must
            exist and must not be writable by every user unless it has the sticky bit (like
            ``/tmp``); BindingError naming it otherwise.
    """

    def __init__(self, pool: StatePool, capacity_bytes: int, *, disk_dir: str | os.PathLike[str] | None = None) -> None:
        fingerprint = check_pool(pool)
        # The tier's rules (capacity, bytes per request, LRU order, spill, the spill directory
        # and the keys of its files), kept and checked by the core.
        self._index = HostCacheIndex(fingerprint, pool.num_layers, capacity_bytes, disk_dir=disk_dir)
        self._offload = HostOffload(pool)
        self._disk_dir = None if disk_dir is None else Path(disk_dir)
        self._ids: dict[Hashable, int] = {}
        self._keys: dict[int, Hashable] = {}
        self._next_id = 0
        self._entries: dict[int, HostStates] = {}
        self._on_disk: dict[int, Path] = {}

    @property
    def index(self) -> HostCacheIndex:
        """The core's bookkeeping of the tier (read it through the counters below)."""
        return self._index

    @property
    def offload(self) -> HostOffload:
        """The offload engine of :attr:`pool`."""
        return self._offload

    @property
    def disk_dir(self) -> Path | None:
        """The directory evicted entries spill into (inside a private directory), or None."""
        return self._disk_dir

    capacity_bytes = _Counter("capacity_bytes", "Host bytes the tier may hold.")
    bytes_per_request = _Counter(
        "bytes_per_request", "Host bytes one request's states take (all layers' persistent states)."
    )
    used_bytes = _Counter("used_bytes", "Host bytes held now.")
    evictions = _Counter("evictions", "Entries pushed out of host memory so far.")
    hits = _Counter("hits", "Restores that found their key.")
    misses = _Counter("misses", "Restores that did not.")

    def _known(self, key: Hashable) -> int | None:
        self._index.check_key(key)
        return self._ids.get(key)

    def _spill(self, i: int) -> Path:
        path = self._index.spill_path(i)
        _save(self._entries[i], path, tier=self._index, entry=i)
        log.debug("host cache: spilled %r to %s", self._keys[i], path)
        return path

    def put(self, key: Hashable, blocks: Sequence[int]) -> None:
        """Offloads ``blocks`` (one per request) under ``key``, replacing an entry of that key,
        evicting least recently used entries until it fits. PlanError when they need more than
        the whole capacity or name bad blocks, BindingError when a spill cannot be written or the
        old version's spill file cannot be removed: then nothing changed (the entry under ``key``
        stays, nothing was evicted)."""
        old = self._known(key)
        # Every version of a key is a new entry (a prefetch handle of the old one then no longer
        # matches it); the core forgets the old version as part of the put.
        i = self._next_id
        states = self._offload.offload(blocks)  # checks the blocks and the pool; copies only
        evicted = self._index.plan_put(i, states.num_requests, replaces=old)  # refused when too large
        spilled: dict[int, Path] = {}
        try:
            for j, spill in evicted:
                if spill:
                    spilled[j] = self._spill(j)
            if old is not None:
                self._remove_file(old)  # the last step that can fail
        except BaseException:
            for j in spilled:
                self._index.remove_spill(j)
            raise
        # Everything checked and written: now change the tier (the core forgets the old version
        # as part of its put). Not inside an assert: `python -O` strips those, call and all.
        recorded = self._index.put(i, states.num_requests, replaces=old)
        assert recorded == evicted, "the core evicted what it planned to"
        if old is not None:
            self._forget(old)
        self._next_id += 1
        self._ids[key] = i
        self._keys[i] = key
        for j, _ in evicted:
            if j in spilled:
                self._entries.pop(j)
                self._on_disk[j] = spilled[j]
            else:
                self._forget(j)
        self._entries[i] = states

    def _forget(self, i: int) -> None:
        """Forgets entry ``i`` here -- its bytes, its spill file's path, its key -- once the core
        has forgotten it and its file is gone (a replaced version, a dropped key, an entry evicted
        without a spill)."""
        self._entries.pop(i, None)
        self._on_disk.pop(i, None)
        self._ids.pop(self._keys.pop(i), None)

    def _remove_file(self, i: int) -> None:
        """Removes entry ``i``'s spill file, if it has one; the tier forgets the file only once
        it is gone (a file that cannot be removed is a BindingError, and nothing changes)."""
        if i in self._on_disk:
            self._index.remove_spill(i)

    def get(self, key: Hashable) -> HostStates | None:
        """The saved states of ``key`` (loaded from disk if spilled), marked recently used."""
        i = self._known(key)
        if i is None:
            return None
        self._index.touch(i)
        return self._states(i, self._index.location(i))

    def _states(self, i: int, where: str | None) -> HostStates | None:
        if where == "memory":
            return self._entries[i]
        if where == "disk":
            path = self._on_disk[i]
            layout = self._offload.pool.layout
            return _load(path, layout, tier=self._index, entry=i, key=repr(self._keys[i]))
        return None

    def _lookup(self, key: Hashable, blocks: Sequence[int]) -> _Found | None:
        """The entry of ``key`` and its restore into ``blocks``, checked and planned; then (and
        only then) the hit is counted and the entry marked used. None, a miss counted, when the
        tier does not hold ``key``. A refused restore (bad blocks, a bad spill file) counts
        nothing and keeps the recency order."""
        ids = block_list(blocks)
        i = self._known(key)
        where = None if i is None else self._index.location(i)
        if i is None or where is None:
            self._index.lookup(_NO_ID if i is None else i)  # counts the miss
            return None
        states = self._states(i, where)
        assert states is not None
        planned = self._offload.plan_restore(states, ids)  # the core checks states and blocks
        self._index.lookup(i)  # counts the hit
        return i, states, ids, planned

    def prefetch(self, key: Hashable, blocks: Sequence[int]) -> TransferHandle | None:
        """Starts restoring ``key``'s states into ``blocks`` on the pool's side stream (a spilled
        entry is read from disk first) and returns its handle, or None (nothing enqueued) when
        the tier does not hold ``key``. Pass the handle to :meth:`restore` of the same key (or
        call ``handle.wait()``) before the current stream reads the blocks."""
        found = self._lookup(key, blocks)
        if found is None:
            return None
        i, states, ids, planned = found
        handle = self._offload.start_restore(states, ids, planned)
        handle.entry = i
        return handle

    def restore(self, key: Hashable, blocks: Sequence[int], *, handle: TransferHandle | None = None) -> bool:
        """Copies ``key``'s states into ``blocks``; False (nothing written) when the tier does not
        hold ``key``. With ``handle`` (from :meth:`prefetch` of ``key`` into ``blocks``) the
        current stream is only ordered after the prefetched copies; a handle prefetched for
        another key is refused (PlanError naming the key)."""
        if handle is not None:
            entry = getattr(handle, "entry", None)
            self._index.check_prefetched(self._known(key), entry if isinstance(entry, int) else None, repr(key))
            self._offload.restore(handle.states, blocks, handle=handle)
            return True
        found = self._lookup(key, blocks)
        if found is None:
            return False
        transfer, plan = found[3]
        transfer.execute(plan)
        return True

    def drop(self, key: Hashable) -> None:
        """Forgets ``key`` (in memory and on disk)."""
        i = self._known(key)
        if i is None:
            return
        self._remove_file(i)  # the only step that can fail: first
        self._index.drop(i)
        self._forget(i)

    def __contains__(self, key: object) -> bool:
        try:
            return self._known(key) is not None
        except PlanError:
            return False

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        x = self._index.counters()
        return (
            f"HostCache(entries={x.in_memory}, on_disk={x.on_disk}, used={x.used_bytes}/"
            f"{x.capacity_bytes} bytes, evictions={x.evictions}, hits={x.hits}, misses={x.misses})"
        )


#: An id no entry has (ids count up from 0), looked up to count a miss for an unknown key.
_NO_ID = 2**64 - 1
