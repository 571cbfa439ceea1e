"""Host offload: a set of requests' persistent states copied to a host buffer (pinned when the
pool is on CUDA) and back, byte-exact, with the transfer core's plans. Workspace is never moved.

Saved states keep the fingerprint and rank of the pool they came from: a restore into the same
rank is one contiguous read per state; a restore into another rank or TP size re-shards through
the transfer plans from the saved ranks it needs (pass one :class:`HostStates` per source rank),
and is refused (BindingError naming the missing source ranks) when those were not saved."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core import LayoutFingerprint
from ..errors import PlanError
from .local import LocalTransfer
from .pool import StatePool

__all__ = ["HostOffload", "HostStates"]


@dataclass
class HostStates:
    """Persistent states of ``num_requests`` requests held in host memory: ``pool`` holds request
    ``i`` in its block ``i + 1`` (block 0 is the null block), with the layout, fingerprint and
    rank of the pool they were offloaded from."""

    pool: StatePool
    num_requests: int
    source_blocks: list[int] | None = None
    """The blocks the requests were offloaded from (their block map on disk)."""

    @property
    def fingerprint(self) -> LayoutFingerprint:
        """The fingerprint (layout and TP rank) of the pool the states were offloaded from."""
        return self.pool.fingerprint

    @property
    def nbytes(self) -> int:
        """Bytes held (all layers and persistent states of every request)."""
        return self.num_requests * self.pool.num_layers * sum(self.pool.fingerprint.state_nbytes)

    def __repr__(self) -> str:
        return f"HostStates(requests={self.num_requests}, bytes={self.nbytes})"


class HostOffload:
    """Offloads requests' persistent states of ``pool`` to host memory and restores them.

    For a CUDA pool the host buffer is pinned and the copies are enqueued on the current CUDA
    stream (the caller's): synchronize that stream before reading an offloaded copy on the host
    or reusing the offloaded blocks."""

    def __init__(self, pool: StatePool) -> None:
        self.pool = pool

    def _host_pool(self, num_requests: int) -> StatePool:
        p = self.pool
        cuda = p.device.startswith("cuda")
        layers: list[list[Any]] = []
        for _ in range(p.num_layers):
            layer = []
            for spec in p.layout.persistent:
                shape = (num_requests + 1, *spec.shape)
                if cuda:
                    import torch

                    dt = getattr(torch, spec.dtype)
                    layer.append(torch.empty(shape, dtype=dt, pin_memory=True))
                else:
                    layer.append(_host_array(shape, spec.dtype, p.tensors[0]))
            layers.append(layer)
        fp = p.fingerprint
        return StatePool(p.layout, layers, tp_rank=fp.tp_rank, block_size=fp.block_size)

    def offload(self, blocks: Sequence[int]) -> HostStates:
        """Copies the persistent states of ``blocks`` (one per request) to a new host buffer.

        The pool's bound tensors are checked first (BindingError, nothing copied, when one was
        freed or re-pointed); bad block ids are a PlanError."""
        self.pool.check()
        host = self._host_pool(len(blocks))
        LocalTransfer({self.pool.fingerprint.tp_rank: self.pool}, host).run([(b, i + 1) for i, b in enumerate(blocks)])
        return HostStates(host, len(blocks), source_blocks=[int(b) for b in blocks])

    def restore(self, states: HostStates | Sequence[HostStates], blocks: Sequence[int]) -> None:
        """Copies saved states into ``blocks`` of the pool (request ``i`` into ``blocks[i]``).

        ``states``: what :meth:`offload` returned, or one such per source rank of the same
        instance and the same requests (for a restore into another rank or TP size). The saved
        states are keyed by the rank they were offloaded from: a restore into another rank
        re-shards through the transfer plans, and is refused -- nothing written -- when it needs a
        source rank that was not given (rank 0's heads are never written into rank 1's pool).
        """
        saved = [states] if isinstance(states, HostStates) else list(states)
        counts = sorted({s.num_requests for s in saved})
        if len(counts) != 1 or counts[0] != len(blocks):
            raise PlanError(f"restore: offloaded requests {counts} (per source rank) but {len(blocks)} blocks given")
        LocalTransfer({s.fingerprint.tp_rank: s.pool for s in saved}, self.pool).run(
            [(i + 1, b) for i, b in enumerate(blocks)]
        )

    def __repr__(self) -> str:
        return f"HostOffload({self.pool!r})"


def _host_array(shape: tuple[int, ...], dtype: str, like: Any) -> Any:
    """A host tensor of the pool's kind (torch for torch pools, numpy otherwise)."""
    if hasattr(like, "data_ptr") and hasattr(like, "element_size"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, dtype=np.dtype(dtype))
