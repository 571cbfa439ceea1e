"""An offload tier for one pool: requests' persistent states kept in host memory (pinned for a
CUDA pool) under a byte capacity with least-recently-used eviction, spilled to disk when a
directory is given. Bytes per request come from the layout (every layer's persistent states);
workspace is never saved."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path

from ..errors import PlanError
from .disk import load_states, save_states
from .offload import HostOffload, HostStates
from .pool import StatePool

__all__ = ["HostCache"]

log = logging.getLogger("recoverssm_rs")


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
        if capacity_bytes <= 0:
            raise PlanError(f"HostCache: capacity_bytes must be > 0, got {capacity_bytes}")
        self.offload = HostOffload(pool)
        self.capacity_bytes = int(capacity_bytes)
        #: Host bytes one request's states take (all layers' persistent states).
        self.bytes_per_request = pool.num_layers * sum(pool.fingerprint.state_nbytes)
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self._entries: OrderedDict[Hashable, HostStates] = OrderedDict()
        self._on_disk: dict[Hashable, Path] = {}
        self._spills = 0
        self.used_bytes = 0
        self.evictions = 0
        self.hits = 0
        self.misses = 0

    def _evict_one(self) -> None:
        key, states = self._entries.popitem(last=False)
        self.used_bytes -= states.nbytes
        self.evictions += 1
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._spills += 1
            path = self.disk_dir / f"states-{os.getpid()}-{id(self):x}-{self._spills}.safetensors"
            save_states(states, path)
            self._on_disk[key] = path
            log.debug("host cache: spilled %r to %s", key, path)

    def put(self, key: Hashable, blocks: Sequence[int]) -> None:
        """Offloads ``blocks`` (one per request) under ``key``, replacing an entry of that key.
        PlanError when they need more than the whole capacity."""
        need = len(blocks) * self.bytes_per_request
        if need > self.capacity_bytes:
            raise PlanError(
                f"HostCache: {len(blocks)} requests need {need} bytes, more than the capacity of {self.capacity_bytes}"
            )
        self.drop(key)
        while self.used_bytes + need > self.capacity_bytes:
            self._evict_one()
        states = self.offload.offload(blocks)
        self._entries[key] = states
        self.used_bytes += states.nbytes

    def get(self, key: Hashable) -> HostStates | None:
        """The saved states of ``key`` (loaded from disk if spilled), marked recently used."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        path = self._on_disk.get(key)
        if path is None:
            return None
        return load_states(path, self.offload.pool.layout)

    def restore(self, key: Hashable, blocks: Sequence[int]) -> bool:
        """Copies ``key``'s states into ``blocks``; False (nothing written) when the tier does not
        hold ``key``."""
        states = self.get(key)
        if states is None:
            self.misses += 1
            return False
        self.offload.restore(states, blocks)
        self.hits += 1
        return True

    def drop(self, key: Hashable) -> None:
        """Forgets ``key`` (in memory and on disk)."""
        states = self._entries.pop(key, None)
        if states is not None:
            self.used_bytes -= states.nbytes
        path = self._on_disk.pop(key, None)
        if path is not None and path.exists():
            path.unlink()

    def __contains__(self, key: object) -> bool:
        return key in self._entries or key in self._on_disk

    def __len__(self) -> int:
        return len(self._entries) + len(self._on_disk)

    def __repr__(self) -> str:
        return (
            f"HostCache(entries={len(self._entries)}, on_disk={len(self._on_disk)}, used={self.used_bytes}/"
            f"{self.capacity_bytes} bytes, evictions={self.evictions}, hits={self.hits}, misses={self.misses})"
        )
