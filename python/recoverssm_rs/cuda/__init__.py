"""The CUDA launch layer: kernel loading (:mod:`.module`), the copy kernels (:mod:`.copy`), the RecoverSSM
commit kernel (:mod:`.commit`) and the NVRTC check (:mod:`.nvrtc`); the record formats the kernels read
and the error word they write.

Kernels (``recoverssm_rs/kernels/*.cu``):

* ``rs_copy_tiles`` -- one wave of a planned batched copy; :func:`launch_copy_tiles`,
  :func:`execute_plan` (runs a :class:`~recoverssm_rs.CopyPlan` bound to CUDA states).
* ``rs_state_copy`` -- the fused align-mode copy of every persistent state of every layer for a
  batch of requests, with explicit destination columns or the align decision taken on the device
  (``block_size``); :func:`launch_state_copy`.
* ``rs_recover_commit`` -- the RecoverSSM commit (GDN / KDA) of every layer and request in one
  launch; :func:`build_commit_meta`, :func:`commit_grid`, :func:`launch_recover_commit`.

The Rust core owns each kernel's calling convention (``_core.kernel_abi()``): it checks every
argument and packs the launch; Python hands the packed buffer to ``cuLaunchKernel``. Importing this
package needs neither CuPy nor a GPU: CuPy is imported on first use, and a missing CuPy or GPU raises
:class:`~recoverssm_rs.errors.BackendUnavailableError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core import ErrorWord
from ..plan_format import (
    COMMIT_META_DTYPE,
    COMMIT_ROW_DTYPE,
    CONSTANTS,
    ERROR_CODES,
    SEGMENT_DTYPE,
    STATE_META_DTYPE,
    TILE_DTYPE,
)
from .commit import COMMIT_DTYPE_PAIRS, build_commit_meta, commit_grid, launch_recover_commit
from .copy import MAX_STATE_CHUNKS, execute_plan, launch_copy_tiles, launch_state_copy, state_chunks
from .module import (
    KERNEL_DIR,
    KERNEL_FILES,
    KERNEL_NAMES,
    MODULE_OPTIONS,
    get_kernel,
    kernel_source,
    load_module,
    module_source,
)

__all__ = [
    "KERNEL_DIR",
    "KERNEL_FILES",
    "KERNEL_NAMES",
    "MODULE_OPTIONS",
    "THREADS",
    "MAX_STATE_CHUNKS",
    "STATE_CHUNK_BYTES",
    "state_chunks",
    "SEGMENT_DTYPE",
    "TILE_DTYPE",
    "STATE_META_DTYPE",
    "COMMIT_ROW_DTYPE",
    "COMMIT_META_DTYPE",
    "COMMIT_DTYPE_PAIRS",
    "MODE_DISJOINT",
    "MODE_ROWS_ASCENDING",
    "MODE_WITHIN_ROW",
    "KIND_TEMPORAL",
    "KIND_CONV_SD",
    "KIND_CONV_DS",
    "FLAG_HAS_TEMPORAL",
    "FLAG_DECIDE",
    "ERROR_CODES",
    "ErrorWord",
    "decode_error_word",
    "kernel_source",
    "module_source",
    "load_module",
    "get_kernel",
    "launch_copy_tiles",
    "launch_state_copy",
    "execute_plan",
    "build_commit_meta",
    "commit_grid",
    "launch_recover_commit",
]

#: Threads per CTA of every launch.
THREADS: int = CONSTANTS["RS_THREADS"]
#: Bytes of one state copy per CTA of the fused kernel.
STATE_CHUNK_BYTES: int = CONSTANTS["RS_STATE_CHUNK_BYTES"]
#: ``StateMeta.kind`` values.
KIND_TEMPORAL: int = CONSTANTS["RS_KIND_TEMPORAL"]
KIND_CONV_SD: int = CONSTANTS["RS_KIND_CONV_SD"]
KIND_CONV_DS: int = CONSTANTS["RS_KIND_CONV_DS"]
#: Segment modes of ``rs_copy_tiles``.
MODE_DISJOINT: int = CONSTANTS["RS_MODE_DISJOINT"]
MODE_ROWS_ASCENDING: int = CONSTANTS["RS_MODE_ROWS_ASCENDING"]
MODE_WITHIN_ROW: int = CONSTANTS["RS_MODE_WITHIN_ROW"]
#: ``flags`` bits of ``rs_state_copy``.
FLAG_HAS_TEMPORAL: int = CONSTANTS["RS_FLAG_HAS_TEMPORAL"]
FLAG_DECIDE: int = CONSTANTS["RS_FLAG_DECIDE"]


def decode_error_word(err: Any, num_requests: int) -> ErrorWord:
    """Decode a host copy (numpy array, list, or CPU tensor) of the ``int32[3]`` error word a
    kernel wrote: ``err[0]`` the OR of the error bits, ``err[1]`` the maximum of
    ``num_requests - r``, ``err[2]`` the maximum of ``r + 1`` over the rejected requests ``r``.
    Reading a device word is the caller's (synchronising) decision."""
    return ErrorWord([int(x) for x in np.asarray(err).reshape(-1)[:3]], int(num_requests))
