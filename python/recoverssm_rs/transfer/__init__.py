"""Moving recurrent states beyond one block pool: prefill -> decode transfer between instances
with different tensor-parallel sizes and conv layouts, and host offload.

- :class:`LayoutFingerprint` (core): what one rank's pool holds; exchanged at handshake, and
  :meth:`LayoutFingerprint.check_compatible` rejects every incompatible pair before a byte moves.
- :func:`plan_transfer` (core): the reads that rebuild, in the destination's blocks, exactly the
  destination rank's shard of every persistent state (re-sharded conv sub-projections, head
  slices, SD <-> DS, different conv widths); workspace is never moved.
- :class:`StatePool`: one rank's state tensors; :class:`LocalTransfer` runs plans between pools
  in one process; :class:`HostOffload` copies requests' states to host memory and back
  (asynchronously on a side stream with :meth:`HostOffload.offload_async` /
  :meth:`HostOffload.prefetch`); :class:`HostCache` keeps them under a byte capacity.
- :mod:`recoverssm_rs.transfer.nixl`: the same plans over NIXL between processes or machines
  (needs ``nixl-cu12``; imported lazily).
"""

from __future__ import annotations

from .._core import LayoutFingerprint, PeerInfo, TransferPlan, check_sources, plan_transfer
from .cache import HostCache
from .disk import load_states, save_states
from .local import LocalTransfer, read_rows, run_staged, staged_rows
from .offload import HostOffload, HostStates
from .pool import StatePool, byte_view
from .streams import TorchStreams, TransferHandle

__all__ = [
    "HostCache",
    "HostOffload",
    "HostStates",
    "LayoutFingerprint",
    "LocalTransfer",
    "PeerInfo",
    "StatePool",
    "TorchStreams",
    "TransferHandle",
    "TransferPlan",
    "byte_view",
    "check_sources",
    "load_states",
    "plan_transfer",
    "read_rows",
    "run_staged",
    "save_states",
    "staged_rows",
]
