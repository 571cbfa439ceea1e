"""Host offload: a set of requests' persistent states copied to a host buffer (pinned when the
pool is on CUDA) and back, byte-exact, with the transfer core's plans. Workspace is never moved.

Saved states keep the fingerprint and rank of the pool they came from: a restore into the same
rank is one contiguous read per state; a restore into another rank or TP size re-shards through
the transfer plans from the saved ranks it needs (pass one :class:`HostStates` per source rank),
and is refused (BindingError naming the missing source ranks) when those were not saved."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import LayoutFingerprint, TransferPlan, block_list, check_pool, restore_sources
from ..errors import PlanError
from .local import LocalTransfer
from .pool import StatePool

if TYPE_CHECKING:
    from .streams import TransferHandle

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
        return self.num_requests * self.pool.fingerprint.request_nbytes(self.pool.num_layers)

    def __repr__(self) -> str:
        return f"HostStates(requests={self.num_requests}, bytes={self.nbytes})"


class HostOffload:
    """Offloads requests' persistent states of ``pool`` to host memory and restores them.

    For a CUDA pool the host buffer is pinned and the copies are enqueued on the current CUDA
    stream (the caller's): synchronize that stream before reading an offloaded copy on the host
    or reusing the offloaded blocks.

    :meth:`offload_async` and :meth:`prefetch` enqueue the same copies on a side stream of the
    pool's device instead, ordered by events (no device-wide sync), and return a
    :class:`~recoverssm_rs.transfer.streams.TransferHandle`; ``restore(..., handle=)`` then only
    orders the caller's stream after the prefetched copies, so a restore can start a step early.
    ``streams`` replaces the stream backend (default: ``torch.cuda`` for CUDA pools, none for
    host pools, whose handles are complete at once)."""

    def __init__(self, pool: StatePool, *, streams: Any = None) -> None:
        from .streams import SideStream, TorchStreams

        check_pool(pool)
        self.pool = pool
        if streams is None and pool.device.startswith("cuda"):
            streams = TorchStreams(pool.device)
        self._side = SideStream(streams)

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
        return self._offload(blocks, lambda f: f())

    def offload_async(self, blocks: Sequence[int]) -> TransferHandle:
        """:meth:`offload` on the side stream, after the work the current stream had enqueued;
        the handle's ``states`` may be read on the host after ``handle.synchronize()``, and
        ``handle.wait()`` orders the current stream after the copies (before reusing
        ``blocks``)."""
        from .streams import TransferHandle

        event: list[Any] = []
        states = self._offload(blocks, lambda f: event.append(self._side.run(f)))
        return TransferHandle("offload", states, list(states.source_blocks or ()), event[0], self._side.streams)

    def _offload(self, blocks: Sequence[int], run: Any) -> HostStates:
        ids = block_list(blocks, offload=True)
        host = self._host_pool(len(ids))
        transfer = LocalTransfer({self.pool.fingerprint.tp_rank: self.pool}, host)
        plan = transfer.plan([(b, i + 1) for i, b in enumerate(ids)])
        run(lambda: transfer.execute(plan))  # the core checks the pools' guards, copies, records
        return HostStates(host, len(ids), source_blocks=ids)

    def prefetch(self, states: HostStates | Sequence[HostStates], blocks: Sequence[int]) -> TransferHandle:
        """Starts :meth:`restore` of ``states`` into ``blocks`` on the side stream (after the
        work the current stream had enqueued, so the blocks' previous users finish first) and
        returns at once; pass the handle to ``restore(states, blocks, handle=)`` or call
        ``handle.wait()`` before the current stream reads the blocks. Every check runs here,
        before anything is enqueued."""
        ids = block_list(blocks)
        return self.start_restore(states, ids, self.plan_restore(states, ids))  # checked first

    def start_restore(
        self, states: HostStates | Sequence[HostStates], ids: list[int], planned: tuple[LocalTransfer, TransferPlan]
    ) -> TransferHandle:
        """:meth:`prefetch` of a restore already checked and planned by :meth:`plan_restore` (a
        caller that must check before it changes anything of its own: :class:`HostCache`)."""
        from .streams import TransferHandle

        transfer, plan = planned
        saved = [states] if isinstance(states, HostStates) else list(states)
        event = self._side.run(lambda: transfer.execute(plan))
        return TransferHandle("restore", saved, ids, event, self._side.streams, owner=self)

    def restore(
        self, states: HostStates | Sequence[HostStates], blocks: Sequence[int], *, handle: TransferHandle | None = None
    ) -> None:
        """Copies saved states into ``blocks`` of the pool (request ``i`` into ``blocks[i]``).

        ``states``: what :meth:`offload` returned, or one such per source rank of the same
        instance and the same requests (for a restore into another rank or TP size). The saved
        states are keyed by the rank they were offloaded from: a restore into another rank
        re-shards through the transfer plans, and is refused -- nothing written -- when it needs a
        source rank that was not given (rank 0's heads are never written into rank 1's pool).

        With ``handle`` (from :meth:`prefetch` of the same states and blocks) nothing is copied
        again: the current stream is ordered after the prefetched copies.
        """
        from .streams import TransferHandle

        ids = block_list(blocks)
        if handle is not None:
            saved = list(states) if isinstance(states, (list, tuple)) else [states]
            same = isinstance(handle, TransferHandle) and handle.kind == "restore" and handle.blocks == ids
            if not same or handle.owner is not self or [id(s) for s in handle.states] != [id(s) for s in saved]:  # type: ignore[union-attr]
                raise PlanError(
                    f"restore: {handle!r} was not prefetched for these states and blocks {ids} by this HostOffload "
                    f"(of {self.pool!r}); nothing was written"
                )
            handle.wait()
            return
        transfer, plan = self.plan_restore(states, ids)
        transfer.execute(plan)

    def plan_restore(self, states: Any, blocks: list[int]) -> tuple[LocalTransfer, TransferPlan]:
        """Checks and plans a restore of ``states`` into ``blocks`` (block ids from
        :func:`~recoverssm_rs._core.block_list`); nothing moves until the transfer executes the
        plan."""
        _, sources = restore_sources(states, len(blocks))  # the core checks the saved states
        transfer = LocalTransfer(dict(sources), self.pool)
        return transfer, transfer.plan([(i + 1, b) for i, b in enumerate(blocks)])

    def __repr__(self) -> str:
        return f"HostOffload({self.pool!r}, streams={self._side.streams!r})"


def _host_array(shape: tuple[int, ...], dtype: str, like: Any) -> Any:
    """A host tensor of the pool's kind (torch for torch pools, numpy otherwise)."""
    if hasattr(like, "data_ptr") and hasattr(like, "element_size"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, dtype=np.dtype(dtype))
