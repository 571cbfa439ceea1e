"""numpy dtypes of the plan records the Rust core produces (and the CUDA kernels consume).

They mirror ``rust/plan/segment.rs`` and ``kernels/common.cuh`` field for field; a test checks
the sizes against the compiled core.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "records",
    "SEGMENT_DTYPE",
    "TILE_DTYPE",
    "MOVE_ROW_DTYPE",
    "STATE_META_DTYPE",
    "COMMIT_ROW_DTYPE",
    "MODE_NAMES",
]

#: One 2-D strided copy: rows x row_bytes from ``src + r * pitch`` to ``dst + r * pitch``.
SEGMENT_DTYPE = np.dtype(
    [
        ("src", "<u8"),
        ("dst", "<u8"),
        ("row_bytes", "<u4"),
        ("rows", "<u4"),
        ("pitch", "<u4"),
        ("wave", "<u2"),
        ("mode", "u1"),
        ("elem_bytes", "u1"),
    ]
)

#: A unit of GPU work: bytes (single-row / rows-ascending segments) or rows of one segment.
TILE_DTYPE = np.dtype([("segment", "<u4"), ("begin", "<u4"), ("count", "<u4"), ("reserved", "<u4")])

#: One request's copy in compact form, shared by all layers (-1: that kind is not copied).
MOVE_ROW_DTYPE = np.dtype(
    [
        ("request", "<u4"),
        ("shift", "<u4"),
        ("conv_src", "<i8"),
        ("temporal_src", "<i8"),
        ("dst", "<i8"),
        ("conv_wave", "<u2"),
        ("temporal_wave", "<u2"),
        ("reserved", "<u4"),
    ]
)

#: Per (layer, persistent state) metadata for the fused device kernel.
STATE_META_DTYPE = np.dtype(
    [
        ("base", "<u8"),
        ("block_stride", "<u8"),
        ("state_bytes", "<u8"),
        ("kind", "<u4"),
        ("elem_bytes", "<u4"),
        ("width", "<u4"),
        ("dim", "<u4"),
        ("layer", "<u4"),
        ("state", "<u4"),
        ("num_blocks", "<u8"),
        ("reserved", "<u8"),
    ]
)

#: One request's RecoverSSM commit: tokens to fold in, its state block, the boundary block (-1: none).
COMMIT_ROW_DTYPE = np.dtype(
    [
        ("request", "<u4"),
        ("count", "<u4"),
        ("state_block", "<i8"),
        ("boundary_block", "<i8"),
        ("boundary_len", "<u4"),
        ("reserved", "<u4"),
    ]
)

#: Segment modes: how source and destination may overlap.
MODE_NAMES = {0: "disjoint", 1: "rows_ascending", 2: "within_row"}

assert SEGMENT_DTYPE.itemsize == 32
assert TILE_DTYPE.itemsize == 16
assert MOVE_ROW_DTYPE.itemsize == 40
assert STATE_META_DTYPE.itemsize == 64
assert COMMIT_ROW_DTYPE.itemsize == 32


def records(raw: Any, dtype: Any) -> np.ndarray:
    """A read-only, zero-copy numpy view of a core buffer (``_core.RawBuffer``, which exports the
    buffer protocol) as records of ``dtype``."""
    return np.frombuffer(raw, dtype=dtype)
