"""The record formats and constants the Rust core shares with the CUDA kernels and the Python
package, as numpy dtypes and Python ints.

The core owns every one of them (``rust/kernels/records.rs``, ``rust/kernels/constants.rs``) and
exports them with :func:`recoverssm_rs._core.kernel_abi`; this module only turns that description
into numpy dtypes. The CUDA sources include a header the core generates from the same tables
(``kernels/rs_abi.cuh``), so no layout or constant has a second copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core

__all__ = [
    "ABI",
    "CONSTANTS",
    "records",
    "record_dtype",
    "record_columns",
    "SEGMENT_DTYPE",
    "TILE_DTYPE",
    "MOVE_ROW_DTYPE",
    "STATE_META_DTYPE",
    "COMMIT_ROW_DTYPE",
    "COMMIT_META_DTYPE",
    "MODE_NAMES",
    "ERROR_CODES",
]

#: The core's description of the kernels' calling conventions, records and constants.
ABI: dict[str, Any] = _core.kernel_abi()
#: Every shared constant by its name in the CUDA sources (``RS_THREADS``, ``RS_KIND_TEMPORAL``, ...).
CONSTANTS: dict[str, int] = dict(ABI["constants"])


def record_dtype(name: str) -> np.dtype:
    """The numpy dtype of the core's record ``name`` (``"Segment"``, ``"StateMeta"``, ...)."""
    spec = ABI["records"][name]
    names, offsets, formats = [], [], []
    for field, offset, fmt, _c_type in spec["fields"]:
        names.append(field)
        offsets.append(offset)
        formats.append(fmt)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": spec["size"]})


def record_columns(name: str) -> tuple[tuple[str, ...], np.dtype]:
    """The field names and the one scalar type of the core's record ``name`` when it is a run of
    fields of one type without padding (the transfer plan's ``Read`` and ``StagedCopy`` rows): such
    records are viewed as 2-D arrays with a column per field, in this order."""
    spec = ABI["records"][name]
    names = tuple(field for field, _offset, _fmt, _c_type in spec["fields"])
    formats = {fmt for _field, _offset, fmt, _c_type in spec["fields"]}
    scalar = np.dtype(formats.pop()) if len(formats) == 1 else None
    if scalar is None or spec["size"] != scalar.itemsize * len(names):
        raise _core.RecoverSSMError(f"record {name} is not a run of fields of one type; use record_dtype({name!r})")
    return names, scalar


#: One 2-D strided copy: rows x row_bytes from ``src + r * pitch`` to ``dst + r * pitch``.
SEGMENT_DTYPE = record_dtype("Segment")
#: A unit of GPU work: bytes (single-row / rows-ascending segments) or rows of one segment.
TILE_DTYPE = record_dtype("Tile")
#: One request's copy in compact form, shared by all layers (-1: that kind is not copied).
MOVE_ROW_DTYPE = record_dtype("MoveRow")
#: Per (layer, persistent state) metadata for the fused device kernel.
STATE_META_DTYPE = record_dtype("StateMeta")
#: One request's RecoverSSM commit: tokens to fold in, its state block, the boundary block (-1: none).
COMMIT_ROW_DTYPE = record_dtype("CommitRow")
#: One layer of the commit kernel's table.
COMMIT_META_DTYPE = record_dtype("CommitMeta")

#: Segment modes: how source and destination may overlap.
MODE_NAMES = {
    CONSTANTS["RS_MODE_DISJOINT"]: "disjoint",
    CONSTANTS["RS_MODE_ROWS_ASCENDING"]: "rows_ascending",
    CONSTANTS["RS_MODE_WITHIN_ROW"]: "within_row",
}
#: Error bits of the kernels' error word and their names.
ERROR_CODES: dict[int, str] = {int(bit): name for bit, name, _meaning in ABI["error_bits"]}


def records(raw: Any, dtype: Any) -> np.ndarray:
    """A read-only, zero-copy numpy view of a core buffer (``_core.RawBuffer``, which exports the
    buffer protocol) as records of ``dtype``."""
    return np.frombuffer(raw, dtype=dtype)
