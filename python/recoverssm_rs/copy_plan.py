"""A planned copy step: :class:`CopyPlan` (the validated, hazard-ordered, coalesced copies of one
step, with zero-copy numpy views of its records) and :class:`TileTable` (its tiles for the GPU
batched-copy kernel)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _core
from .plan_format import MOVE_ROW_DTYPE, SEGMENT_DTYPE, TILE_DTYPE, records

if TYPE_CHECKING:
    from .planner import CopyPlanner

__all__ = ["CopyPlan", "TileTable", "DEFAULT_TILE_BYTES"]

DEFAULT_TILE_BYTES = 64 * 1024


class TileTable(NamedTuple):
    """Tiles of a plan for the GPU batched-copy kernel, grouped by wave."""

    tiles: np.ndarray
    """``TILE_DTYPE`` records."""
    wave_starts: np.ndarray
    """``uint32 [num_waves + 1]``: tiles of wave ``w`` are ``tiles[wave_starts[w]:wave_starts[w+1]]``."""
    tile_bytes: int


class CopyPlan:
    """The validated copies of one step. Inspect it with zero-copy numpy views; run it with
    :meth:`execute`. Holds its planner (and so the state tensors) alive."""

    __slots__ = ("_plan", "_planner", "_segments", "_rows", "_waves")

    def __init__(self, plan: _core.Plan, planner: CopyPlanner) -> None:
        self._plan = plan
        self._planner = planner
        self._segments: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._waves: np.ndarray | None = None

    @property
    def segments(self) -> np.ndarray:
        """Segment records (``SEGMENT_DTYPE``), grouped by wave; a read-only view."""
        if self._segments is None:
            self._segments = records(self._plan.segments(), dtype=SEGMENT_DTYPE)
        return self._segments

    @property
    def rows(self) -> np.ndarray:
        """Compact per-request records (``MOVE_ROW_DTYPE``), sorted by request."""
        if self._rows is None:
            self._rows = records(self._plan.rows(), dtype=MOVE_ROW_DTYPE)
        return self._rows

    @property
    def waves(self) -> np.ndarray:
        """``uint32 [num_waves + 1]``: segments of wave ``w`` are ``segments[waves[w]:waves[w+1]]``."""
        if self._waves is None:
            self._waves = records(self._plan.wave_starts(), dtype=np.uint32)
        return self._waves

    def tiles(self, tile_bytes: int = DEFAULT_TILE_BYTES) -> TileTable:
        """Cut the segments into tiles of about ``tile_bytes`` (a multiple of 16)."""
        t, w = self._plan.tiles(tile_bytes)
        return TileTable(records(t, dtype=TILE_DTYPE), records(w, dtype=np.uint32),
                         tile_bytes)

    @property
    def num_waves(self) -> int:
        """Ordered waves: copies of a wave may run concurrently, waves run in order."""
        return self._plan.num_waves

    @property
    def num_segments(self) -> int:
        return self._plan.num_segments

    @property
    def num_requests(self) -> int:
        """Requests that move something."""
        return self._plan.num_requests

    @property
    def nbytes(self) -> int:
        """Bytes the plan copies."""
        return self._plan.nbytes

    @property
    def planner(self) -> CopyPlanner:
        return self._planner

    def __len__(self) -> int:
        """Number of (layer, state, request) copies planned, before coalescing."""
        return self._plan.num_copies

    def execute(self, stream: Any = None) -> None:
        """Run the plan on the states' device: the Rust host executor for CPU states (GIL
        released; every segment is checked before the first byte moves), the CUDA kernels for
        CUDA states (on ``stream``, default the current torch stream; one launch per wave).

        Raises:
            BindingError: a bound tensor or its storage no longer has the memory it was bound with
                (``set_()``, ``resize_()``, ``.data = ...``, a freed storage); nothing is written.
        """
        bound = self._planner.bound
        bound.check()
        if self._planner.device == "cpu":
            self._plan.execute_host()
        else:
            from .cuda.copy import execute_plan

            execute_plan(self, stream=stream)
        bound.mark_written()

    def __repr__(self) -> str:
        return (
            f"CopyPlan(copies={len(self)}, segments={self.num_segments}, "
            f"requests={self.num_requests}, waves={self.num_waves}, bytes={self.nbytes})"
        )
