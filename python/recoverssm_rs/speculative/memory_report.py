"""The memory of a :class:`~recoverssm_rs.StateCache`: pool, workspace, and what full-state scratch
would cost instead of RecoverSSM's records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryReport"]


@dataclass(frozen=True)
class MemoryReport:
    """Memory of a :class:`StateCache` (all layers)."""

    persistent_bytes_per_block: int
    """Persistent states of every layer in one block."""
    pool_bytes: int
    """The whole persistent block pool."""
    workspace_bytes: int
    """The workspace for ``max_requests`` requests: verify records and verified conv windows."""
    workspace_bytes_per_request: int
    record_bytes_per_request: int
    """The layout's verify records (all layers) for one request."""
    full_state_scratch_bytes: int
    """What keeping one full recurrent state per window token would cost for the same requests."""
    window: int

    @property
    def scratch_ratio(self) -> float:
        """Full-state scratch bytes per workspace byte."""
        return self.full_state_scratch_bytes / max(self.workspace_bytes, 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "persistent_bytes_per_block": self.persistent_bytes_per_block,
            "pool_bytes": self.pool_bytes,
            "workspace_bytes": self.workspace_bytes,
            "workspace_bytes_per_request": self.workspace_bytes_per_request,
            "record_bytes_per_request": self.record_bytes_per_request,
            "full_state_scratch_bytes": self.full_state_scratch_bytes,
            "scratch_ratio": self.scratch_ratio,
            "window": self.window,
        }

    def __repr__(self) -> str:
        return (
            f"MemoryReport(pool={self.pool_bytes} B, workspace={self.workspace_bytes} B, "
            f"scratch_ratio={self.scratch_ratio:.1f}, window={self.window})"
        )
