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

from .._core import HostCacheIndex
from .disk import load_states, save_states
from .offload import HostOffload, HostStates
from .pool import StatePool
from .streams import TransferHandle

__all__ = ["HostCache"]

log = logging.getLogger("recoverssm_rs")


class _Counter:
    """A read-only attribute of :class:`HostCache`: one field of the core index's
    :class:`~recoverssm_rs._core.CacheCounters` snapshot."""

    def __init__(self, field: str, doc: str) -> None:
        self.field = field
        self.__doc__ = doc

    @overload
    def __get__(self, cache: None, owner: type[HostCache]) -> _Counter: ...
    @overload
    def __get__(self, cache: HostCache, owner: type[HostCache]) -> int: ...
    def __get__(self, cache: HostCache | None, owner: type[HostCache]) -> _Counter | int:
        return self if cache is None else int(getattr(cache.index.counters(), self.field))


class HostCache:
    """Saved states of ``pool`` by key (a prefix hash, a request id), within ``capacity_bytes`` of
    host memory.

    :meth:`put` offloads a request group's blocks, evicting the least recently used entries
    until the new one fits (to ``disk_dir`` when given, else dropped); :meth:`restore` copies an
    entry back (from memory, or from disk) and marks it recently used. Entries keep their source
    rank and layout (:class:`HostStates`), so :meth:`get` may be restored into another rank with
    :meth:`HostOffload.restore`.

    Args:
        pool: the pool whose states are offloaded and restored.
        capacity_bytes: host bytes the tier may hold.
        disk_dir: a directory for evicted entries (one safetensors file each), or None.
    """

    def __init__(self, pool: StatePool, capacity_bytes: int, *, disk_dir: str | os.PathLike[str] | None = None) -> None:
        self.offload = HostOffload(pool)
        #: The tier's rules (capacity, bytes per request, LRU order, spill), kept by the core.
        self.index = HostCacheIndex(pool.fingerprint, pool.num_layers, capacity_bytes, spill=disk_dir is not None)
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self._ids: dict[Hashable, int] = {}
        self._keys: dict[int, Hashable] = {}
        self._next_id = 0
        self._entries: dict[int, HostStates] = {}
        self._on_disk: dict[int, Path] = {}

    capacity_bytes = _Counter("capacity_bytes", "Host bytes the tier may hold.")
    bytes_per_request = _Counter(
        "bytes_per_request", "Host bytes one request's states take (all layers' persistent states)."
    )
    used_bytes = _Counter("used_bytes", "Host bytes held now.")
    evictions = _Counter("evictions", "Entries pushed out of host memory so far.")
    hits = _Counter("hits", "Restores that found their key.")
    misses = _Counter("misses", "Restores that did not.")

    def _id(self, key: Hashable) -> int:
        i = self._ids.get(key)
        if i is None:
            i = self._next_id
            self._next_id += 1
            self._ids[key] = i
            self._keys[i] = key
        return i

    def _evicted(self, i: int, spill: bool) -> None:
        states = self._entries.pop(i)
        if spill:
            assert self.disk_dir is not None
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            path = self.disk_dir / f"states-{os.getpid()}-{id(self):x}-{i}.safetensors"
            save_states(states, path)
            self._on_disk[i] = path
            log.debug("host cache: spilled %r to %s", self._keys[i], path)
        else:
            self._forget_key(i)

    def _forget_key(self, i: int) -> None:
        self._ids.pop(self._keys.pop(i), None)

    def put(self, key: Hashable, blocks: Sequence[int]) -> None:
        """Offloads ``blocks`` (one per request) under ``key``, replacing an entry of that key,
        evicting least recently used entries until it fits. PlanError when they need more than
        the whole capacity."""
        self.index.need(len(blocks))
        self.drop(key)
        i = self._id(key)
        for old, spill in self.index.put(i, len(blocks)):
            self._evicted(old, spill)
        try:
            self._entries[i] = self.offload.offload(blocks)
        except BaseException:
            self.index.drop(i)
            self._forget_key(i)
            raise

    def get(self, key: Hashable) -> HostStates | None:
        """The saved states of ``key`` (loaded from disk if spilled), marked recently used."""
        i = self._ids.get(key)
        if i is None:
            return None
        self.index.touch(i)
        return self._states(i, self.index.location(i))

    def _states(self, i: int, where: str | None) -> HostStates | None:
        if where == "memory":
            return self._entries[i]
        if where == "disk":
            return load_states(self._on_disk[i], self.offload.pool.layout)
        return None

    def _lookup(self, key: Hashable) -> HostStates | None:
        i = self._ids.get(key)
        where = self.index.lookup(_NO_ID if i is None else i)  # counts the hit or miss
        return None if i is None else self._states(i, where)

    def prefetch(self, key: Hashable, blocks: Sequence[int]) -> TransferHandle | None:
        """Starts restoring ``key``'s states into ``blocks`` on the pool's side stream (a spilled
        entry is read from disk first) and returns its handle, or None (nothing enqueued) when
        the tier does not hold ``key``. Pass the handle to :meth:`restore` (or call
        ``handle.wait()``) before the current stream reads the blocks."""
        states = self._lookup(key)
        return None if states is None else self.offload.prefetch(states, blocks)

    def restore(self, key: Hashable, blocks: Sequence[int], *, handle: TransferHandle | None = None) -> bool:
        """Copies ``key``'s states into ``blocks``; False (nothing written) when the tier does not
        hold ``key``. With ``handle`` (from :meth:`prefetch` of ``key`` into ``blocks``) the
        current stream is only ordered after the prefetched copies."""
        if handle is not None:
            self.offload.restore(handle.states, blocks, handle=handle)
            return True
        states = self._lookup(key)
        if states is None:
            return False
        self.offload.restore(states, blocks)
        return True

    def drop(self, key: Hashable) -> None:
        """Forgets ``key`` (in memory and on disk)."""
        i = self._ids.get(key)
        if i is None:
            return
        self.index.drop(i)
        self._entries.pop(i, None)
        path = self._on_disk.pop(i, None)
        if path is not None and path.exists():
            path.unlink()
        self._forget_key(i)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        x = self.index.counters()
        return (
            f"HostCache(entries={x.in_memory}, on_disk={x.on_disk}, used={x.used_bytes}/"
            f"{x.capacity_bytes} bytes, evictions={x.evictions}, hits={x.hits}, misses={x.misses})"
        )


#: An id no entry has (ids count up from 0), looked up to count a miss for an unknown key.
_NO_ID = 2**64 - 1
