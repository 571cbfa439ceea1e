"""CuPy launch layer for the package's CUDA kernels, and the record formats they read.

The kernels live as CUDA sources in ``recoverssm_rs/kernels/`` (``copy_tiles.cu``,
``state_copy.cu``, shared ``common.cuh``). They are compiled once per process into one
:class:`cupy.RawModule` (NVRTC, options :data:`MODULE_OPTIONS`) and launched on the caller's torch
stream, so they order with the surrounding torch work without any host synchronisation.

Importing this module needs neither CuPy nor a GPU: CuPy is imported on first use, and a missing
CuPy or GPU raises :class:`~recoverssm_rs.errors.BackendUnavailableError`.

Kernels (parameters are listed in the launch functions and in the ``.cu`` headers):

* ``rs_copy_tiles`` -- one wave of a planned batched copy (segments cut into tiles);
  :func:`launch_copy_tiles`.
* ``rs_state_copy`` / ``rs_state_copy_align`` -- the fused align-mode copy of every persistent
  state of every layer for a batch of requests, explicit or with the align decision taken on the
  device; :func:`launch_state_copy`, :func:`launch_state_copy_align`.
* ``rs_recover_commit`` (``recover_commit.cu``) -- the RecoverSSM commit (GDN / KDA) of every layer
  and request in one launch: recurrent states folded from the verify records, conv windows
  compacted, align-mode boundary states; :func:`build_commit_meta`, :func:`commit_grid`,
  :func:`launch_recover_commit`.

:func:`execute_plan` runs a :class:`~recoverssm_rs.planner.CopyPlan` bound to CUDA states.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import _core
from .errors import BackendUnavailableError, BindingError, PlanError
from .plan_format import COMMIT_ROW_DTYPE, SEGMENT_DTYPE, STATE_META_DTYPE, TILE_DTYPE, records
from .tensors import describe_tensor, require_arg

__all__ = [
    "KERNEL_DIR",
    "KERNEL_FILES",
    "KERNEL_NAMES",
    "MODULE_OPTIONS",
    "THREADS",
    "DEFAULT_STATE_CHUNKS",
    "STATE_CHUNK_BYTES",
    "state_chunks",
    "SEGMENT_DTYPE",
    "TILE_DTYPE",
    "STATE_META_DTYPE",
    "COMMIT_ROW_DTYPE",
    "COMMIT_META_DTYPE",
    "COMMIT_ROWS_PER_THREAD",
    "COMMIT_DTYPE_PAIRS",
    "COMMIT_CONV_CHUNK_BYTES",
    "DT_F32",
    "DT_BF16",
    "DT_F16",
    "COMMIT_GDN",
    "COMMIT_KDA",
    "CommitGrid",
    "MODE_DISJOINT",
    "MODE_ROWS_ASCENDING",
    "MODE_WITHIN_ROW",
    "KIND_TEMPORAL",
    "KIND_CONV_SD",
    "KIND_CONV_DS",
    "FLAG_HAS_TEMPORAL",
    "ERROR_CODES",
    "ErrorWord",
    "decode_error_word",
    "kernel_source",
    "module_source",
    "load_module",
    "get_kernel",
    "current_stream",
    "state_copy_grid",
    "launch_copy_tiles",
    "launch_state_copy",
    "launch_state_copy_align",
    "execute_plan",
    "build_commit_meta",
    "commit_grid",
    "launch_recover_commit",
]

_LOG = logging.getLogger("recoverssm_rs")

#: Folder of the CUDA sources shipped inside the package.
KERNEL_DIR = Path(__file__).resolve().with_name("kernels")
#: Kernel translation units, in module order.
KERNEL_FILES = ("copy_tiles.cu", "state_copy.cu", "recover_commit.cu")
#: Entry points of the module (``extern "C"``, so the names are not mangled).
KERNEL_NAMES = ("rs_copy_tiles", "rs_state_copy", "rs_state_copy_align", "rs_recover_commit")
#: Options given to ``cupy.RawModule`` (CuPy appends its own: include paths, ``-ftz=true``,
#: ``-arch=sm_XX``, ``--device-as-default-execution-space``; kernelcheck reproduces them).
MODULE_OPTIONS = ("--std=c++17", "-DRECOVERSSM_KERNELS=1")
#: Threads per CTA of every launch (RS_THREADS in common.cuh).
THREADS = 256
#: CTAs per state copy in the fused kernel (blockIdx.x) for 2 MiB temporal states. Measured on an
#: H200 (2026-11-29, Kimi-K3-like 2 MiB fp32 states, 48 layers): 16 CTAs per state (vLLM's choice)
#: reached 81.8% of device-to-device bandwidth at 1 request and 91.5% at 16+, 32 reached 86.0% /
#: 92.7%, 64 reached 88.0% / 94.3%.
DEFAULT_STATE_CHUNKS = 64
#: Bytes of one state copy per CTA that :func:`state_chunks` aims at.
STATE_CHUNK_BYTES = 32 * 1024
_MAX_GRID_YZ = 65535
_MAX_GRID_X = 2**31 - 1

# Record formats (little-endian, #[repr(C)]): one definition, in plan_format (which mirrors
# rust/plan/segment.rs and kernels/common.cuh); re-exported here for the launch layer's users.
assert SEGMENT_DTYPE.itemsize == 32 and TILE_DTYPE.itemsize == 16 and STATE_META_DTYPE.itemsize == 64

MODE_DISJOINT = 0
MODE_ROWS_ASCENDING = 1
MODE_WITHIN_ROW = 2
KIND_TEMPORAL = 0
KIND_CONV_SD = 1
KIND_CONV_DS = 2
#: ``flags`` bit of the fused kernels: some state is temporal (validate its source column/block for
#: the whole request).
FLAG_HAS_TEMPORAL = 1

#: Element-type codes of the commit kernel's metadata (RS_DT_* in recover_commit.cu).
DT_F32 = 0
DT_BF16 = 1
DT_F16 = 2
#: Recurrence kinds of the commit kernel (RS_RC_GDN / RS_RC_KDA).
COMMIT_GDN = 0
COMMIT_KDA = 1
#: Value rows of the recurrent state each thread of the commit kernel keeps in registers (x 4 key
#: channels; RS_RC_ROWS): a CTA of 256 threads covers 64 rows of a 128-channel head.
COMMIT_ROWS_PER_THREAD = 8
#: (recurrent state dtype, key+gate record dtype) pairs the commit kernel is instantiated for: a
#: float32 state with float32 / bfloat16 / float16 records, or a 16-bit state with records of its own
#: type.
COMMIT_DTYPE_PAIRS = (("float32", "float32"), ("float32", "bfloat16"), ("float32", "float16"),
                      ("bfloat16", "bfloat16"), ("float16", "float16"))
#: Bytes of a conv window per conv CTA of the commit kernel.
COMMIT_CONV_CHUNK_BYTES = 16 * 1024

#: One layer of the commit kernel (``struct CommitMeta`` in recover_commit.cu): byte addresses and
#: strides of the five tensors (recurrent pool, corrections, key+gate records, conv pool, verified
#: conv windows) and the layer's geometry. Built by :func:`build_commit_meta`.
COMMIT_META_DTYPE = np.dtype(
    [
        ("rec_base", "<u8"),
        ("rec_block_stride", "<u8"),
        ("corr_base", "<u8"),
        ("corr_row_stride", "<u8"),
        ("kg_base", "<u8"),
        ("kg_row_stride", "<u8"),
        ("conv_base", "<u8"),
        ("conv_block_stride", "<u8"),
        ("win_base", "<u8"),
        ("win_row_stride", "<u8"),
        ("heads", "<u4"),
        ("head_v", "<u4"),
        ("head_k", "<u4"),
        ("window", "<u4"),
        ("kg_width", "<u4"),
        ("kind", "<u4"),
        ("state_dtype", "<u4"),
        ("kg_dtype", "<u4"),
        ("conv_layout", "<u4"),
        ("conv_width", "<u4"),
        ("conv_dim", "<u4"),
        ("conv_hist", "<u2"),
        ("conv_elem", "<u2"),
    ]
)
assert COMMIT_META_DTYPE.itemsize == 128 and COMMIT_ROW_DTYPE.itemsize == 32

#: Error bits of the fused kernels' error word (RS_ERR_* in common.cuh).
ERROR_CODES = {
    1: "accepted",  # num_accepted outside [1, max_accepted]
    2: "column",  # a block-table column outside [0, cols)
    4: "block",  # a block id outside [1, num_blocks) (dst) / [0, num_blocks) (src)
    8: "meta",  # a state cannot take the request (window shorter than the shift, ...)
    16: "args",  # block_size < 1 or running < 0 (align form)
}


@dataclass(frozen=True)
class ErrorWord:
    """The decoded error word (``int32[3]``) of a fused state-copy launch."""

    bits: int
    first_request: Optional[int]
    last_request: Optional[int]

    @property
    def ok(self) -> bool:
        """True when no request was rejected."""
        return self.bits == 0

    @property
    def names(self) -> list[str]:
        """Names of the error kinds seen (see :data:`ERROR_CODES`)."""
        return [name for bit, name in ERROR_CODES.items() if self.bits & bit]


def decode_error_word(err: Any, num_requests: int) -> ErrorWord:
    """Decode the ``int32[3]`` error word written by the fused kernels.

    ``err[0]`` is the OR of the error bits, ``err[1]`` the maximum of ``num_requests - r`` and
    ``err[2]`` the maximum of ``r + 1`` over the rejected requests ``r`` (zero-initialised by the
    caller). Pass a host copy (numpy array, list, or a CPU tensor); reading a device word is the
    caller's (synchronising) decision.
    """
    w = [int(x) for x in np.asarray(err).reshape(-1)[:3]]
    if w[0] == 0:
        return ErrorWord(0, None, None)
    return ErrorWord(w[0], num_requests - w[1], w[2] - 1)


# ------------------------------------------------------------------------------------------------
# Sources
# ------------------------------------------------------------------------------------------------

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def _expand(name: str, seen: set[str]) -> str:
    path = KERNEL_DIR / name
    text = path.read_text(encoding="utf-8")
    out: list[str] = []
    pos = 0
    for m in _INCLUDE.finditer(text):
        out.append(text[pos : m.start()])
        inc = m.group(1)
        if inc not in seen:
            seen.add(inc)
            line = text.count("\n", 0, m.end()) + 2
            out.append(_expand(inc, seen) + f'\n#line {line} "{name}"\n')
        pos = m.end() + 1
    out.append(text[pos:])
    return f'#line 1 "{name}"\n' + "".join(out)


def kernel_source(name: str) -> str:
    """The full text of one kernel source with its local ``#include "..."`` files inlined.

    Inlining (rather than ``-I``) makes the source text the whole compilation input, so CuPy's
    kernel cache (keyed on the source) can never serve a binary built from an older header.
    """
    return _expand(name, set())


def module_source() -> str:
    """The source of the module :func:`load_module` compiles: every kernel file, headers once."""
    seen: set[str] = set()
    return "\n".join(_expand(name, seen) for name in KERNEL_FILES)


# ------------------------------------------------------------------------------------------------
# Module loading
# ------------------------------------------------------------------------------------------------

_HINT = (
    "The CUDA executor needs CuPy and a CUDA GPU: install CuPy with `pip install cupy-cuda12x` "
    "(CUDA 12; `cupy-cuda13x` for CUDA 13), or use CPU tensors (host executor)."
)
_lock = threading.Lock()
_module: Any = None
_kernels: dict[str, Any] = {}


_cupy_ok: Any = None


def _cupy() -> Any:
    """The cupy module, once it is known to see a device (checked once: no CUDA call afterwards,
    so launches stay legal inside a CUDA-graph capture)."""
    global _cupy_ok
    if _cupy_ok is not None:
        return _cupy_ok
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailableError(f"CuPy is not installed. {_HINT}") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver / device
        raise BackendUnavailableError(f"CuPy found no usable CUDA device ({exc}). {_HINT}") from exc
    if count < 1:
        raise BackendUnavailableError(f"CuPy found no CUDA device. {_HINT}")
    _cupy_ok = cupy
    return cupy


def load_module() -> Any:
    """The kernels' ``cupy.RawModule``, compiled once per process (thread-safe) and cached.

    Raises:
        BackendUnavailableError: CuPy is missing or there is no CUDA device.
    """
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            cp = _cupy()
            module = cp.RawModule(code=module_source(), options=MODULE_OPTIONS)
            module.compile()
            _LOG.debug("recoverssm_rs kernels compiled (options %s)", " ".join(MODULE_OPTIONS))
            _module = module
    return _module


def get_kernel(name: str) -> Any:
    """One kernel of :func:`load_module` (a ``cupy.RawKernel``), cached by name."""
    kernel = _kernels.get(name)
    if kernel is None:
        if name not in KERNEL_NAMES:
            raise KeyError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_NAMES)}")
        kernel = load_module().get_function(name)
        _kernels[name] = kernel
    return kernel


_torch_ok: Any = None


def _torch() -> Any:
    """The torch module, once it is known to see a CUDA device (checked once)."""
    global _torch_ok
    if _torch_ok is None:
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailableError(f"torch is not installed. {_HINT}") from exc
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"torch sees no CUDA device. {_HINT}")
        _torch_ok = torch
    return _torch_ok


def current_stream() -> Any:
    """The caller's current torch CUDA stream, as a ``cupy.cuda.ExternalStream``.

    Inside ``torch.cuda.graph(...)`` this is the capture stream, so launches are captured.
    """
    _cupy()  # first: without CuPy, torch is not even imported
    return _external(_torch().cuda.current_stream())


_EXTERNAL: dict[tuple[int, int], Any] = {}
_EXTERNAL_KEEP = 64


def _external(torch_stream: Any) -> Any:
    """A torch CUDA stream as a ``cupy.cuda.ExternalStream`` (same handle, same device), made once
    per (handle, device): the wrapper holds nothing but the handle, so reusing it is exact and
    saves its construction on every launch."""
    key = (int(torch_stream.cuda_stream), int(torch_stream.device.index))
    ext = _EXTERNAL.get(key)
    if ext is None:
        cp = _cupy()
        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream in favour of Stream.from_external; it still works.
            warnings.simplefilter("ignore", DeprecationWarning)
            ext = cp.cuda.ExternalStream(key[0], key[1])
        if len(_EXTERNAL) >= _EXTERNAL_KEEP:
            _EXTERNAL.clear()
        _EXTERNAL[key] = ext
    return ext


# ------------------------------------------------------------------------------------------------
# Launches
# ------------------------------------------------------------------------------------------------


def _described(x: Any, what: str) -> tuple[int, str, list[int], list[int], str]:
    return require_arg(x, what)


def _ptr(x: Any, what: str) -> int:
    """Device address of a CUDA tensor, CuPy array, ``__cuda_array_interface__`` object or int."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    d = _described(x, what)
    _core.check_device_address(d, what)
    return d[0]


def _int32_vector(x: Any, n: int, what: str) -> int:
    """Address of a per-request int32 device vector with at least ``n`` contiguous elements (the
    core checks it); a plain int is taken as the address."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    return int(_core.device_vector(_described(x, what), what, int(n))[0])


def _block_table(block_table: Any) -> tuple[int, int, int, int]:
    """(address, rows, cols, row stride in elements) of an int32 2-D block table (core-checked)."""
    ptr, rows, cols, row_stride = _core.device_block_table(_described(block_table, "block_table"))
    return int(ptr), int(rows), int(cols), int(row_stride)


def _launch(name: str, grid: tuple[int, int, int], args: tuple[Any, ...], stream: Any) -> None:
    kernel = get_kernel(name)
    if stream is None:
        stream = current_stream()
    elif hasattr(stream, "cuda_stream") and not hasattr(stream, "ptr"):
        stream = _external(stream)  # a torch.cuda.Stream
    with stream:
        kernel(grid, (THREADS, 1, 1), args)


def launch_copy_tiles(
    segments_dev: Any,
    tiles_dev: Any,
    first_tile: int,
    num_tiles: int,
    stream: Any = None,
    *,
    max_ctas: Optional[int] = None,
) -> None:
    """Launch ``rs_copy_tiles`` for one wave: tiles ``[first_tile, first_tile + num_tiles)``.

    Args:
        segments_dev: device array of :data:`SEGMENT_DTYPE` records (tensor, CuPy array or address).
        tiles_dev: device array of :data:`TILE_DTYPE` records.
        first_tile, num_tiles: the wave's tile range (``wave_starts[w]``, ``wave_starts[w+1] -
            wave_starts[w]``). Launch waves in order on one stream; ``num_tiles == 0`` launches nothing.
        stream: a CuPy stream or a ``torch.cuda.Stream``; ``None`` uses :func:`current_stream` (the
            caller's torch stream).
        max_ctas: cap on the grid (the kernel walks the tiles grid-stride); ``None``: one CTA per tile.

    Kernel: ``rs_copy_tiles(const Segment*, const Tile*, uint32 first_tile, uint32 num_tiles)``,
    grid ``(min(num_tiles, max_ctas), 1, 1)``, block ``(256, 1, 1)``.
    """
    _core.check_tile_range(first_tile, num_tiles)
    if num_tiles == 0:
        return
    grid_x = num_tiles if max_ctas is None else max(1, min(num_tiles, int(max_ctas)))
    grid_x = min(grid_x, _MAX_GRID_X)
    args = (
        np.uint64(_ptr(segments_dev, "segments")),
        np.uint64(_ptr(tiles_dev, "tiles")),
        np.uint32(first_tile),
        np.uint32(num_tiles),
    )
    _launch("rs_copy_tiles", (grid_x, 1, 1), args, stream)


def state_chunks(max_state_bytes: int) -> int:
    """CTAs per state copy for states of at most ``max_state_bytes`` bytes: one per
    :data:`STATE_CHUNK_BYTES`, between 1 and :data:`DEFAULT_STATE_CHUNKS` (64 for 2 MiB states)."""
    return max(1, min(DEFAULT_STATE_CHUNKS, -(-int(max_state_bytes) // STATE_CHUNK_BYTES)))


def state_copy_grid(num_requests: int, num_meta: int, chunks: int = DEFAULT_STATE_CHUNKS) -> tuple[int, int, int]:
    """Grid of the fused kernels: ``(chunks, min(R, 65535), min(num_meta, 65535))``.

    The kernels walk requests (y) and states (z) grid-stride, so the folded grid stays correct.
    """
    return (max(1, int(chunks)), max(1, min(num_requests, _MAX_GRID_YZ)), max(1, min(num_meta, _MAX_GRID_YZ)))


def _launch_fused(
    kernel: str,
    meta_dev: Any,
    num_meta: int,
    block_table: Any,
    src_col: Any,
    second: tuple[str, Any],
    num_accepted: Any,
    err: Any,
    *,
    n: int,
    max_accepted: int,
    num_blocks: int,
    has_temporal: bool,
    chunks: int,
    block_size: Optional[int],
    stream: Any,
    validated: bool,
) -> None:
    """Check (unless ``validated``), pack and launch one fused state-copy kernel. The parameters of
    both entry points are those of ``rs_state_copy`` with ``block_size`` inserted before
    ``num_requests`` for ``rs_state_copy_align`` (``second`` is dst_col or running)."""
    name, vec = second
    if validated:
        # The caller had the core check these inputs (CopyPlanner: check_step_args on every call,
        # check_fused_launch of its constants once) and made them int32 tensors with a contiguous
        # last axis: only their addresses are read here.
        bt, row_stride, cols = int(block_table.data_ptr()), int(block_table.stride()[0]), int(block_table.shape[1])
        meta_ptr, s_ptr, m_ptr, a_ptr, err_ptr = (int(x.data_ptr()) for x in (meta_dev, src_col, vec, num_accepted, err))
    else:
        bt, bt_rows, cols, row_stride = _block_table(block_table)
        _core.check_fused_launch(num_meta, n, max_accepted, num_blocks, chunks, block_size, bt_rows)
        err_ptr = _int32_vector(err, 3, "err")
        meta_ptr = _ptr(meta_dev, "metas")
        s_ptr = _int32_vector(src_col, n, "src_col")
        m_ptr = _int32_vector(vec, n, name)
        a_ptr = _int32_vector(num_accepted, n, "num_accepted")
    if n == 0 or num_meta == 0:
        return
    args: tuple[Any, ...] = (
        np.uint64(meta_ptr),
        np.uint32(num_meta),
        np.uint64(bt),
        np.int64(row_stride),
        np.int32(cols),
        np.uint64(s_ptr),
        np.uint64(m_ptr),
        np.uint64(a_ptr),
    )
    if block_size is not None:
        args += (np.int32(block_size),)
    args += (
        np.int32(n),
        np.int32(max_accepted),
        np.int64(num_blocks),
        np.uint32(FLAG_HAS_TEMPORAL if has_temporal else 0),
        np.uint64(err_ptr),
    )
    _launch(kernel, state_copy_grid(n, num_meta, chunks), args, stream)


def launch_state_copy(
    meta_dev: Any,
    num_meta: int,
    block_table: Any,
    src_col: Any,
    dst_col: Any,
    num_accepted: Any,
    err: Any,
    *,
    max_accepted: int,
    num_blocks: int,
    has_temporal: bool,
    num_requests: Optional[int] = None,
    chunks: int = DEFAULT_STATE_CHUNKS,
    stream: Any = None,
    validated: bool = False,
) -> None:
    """Launch ``rs_state_copy`` (explicit form) on the caller's stream; never synchronises.

    Args:
        meta_dev: device array of ``num_meta`` :data:`STATE_META_DTYPE` records.
        block_table: int32 CUDA tensor / CuPy array ``[>= R, cols]``, column axis contiguous.
        src_col, dst_col, num_accepted: int32 device vectors of ``R`` elements.
        err: int32 device vector of 3 elements, zeroed by the caller before the step; read it (a
            synchronising read) with :func:`decode_error_word` when convenient.
        max_accepted: ``1 + num_spec``.
        num_blocks: blocks of the pool (ids in ``[1, num_blocks)``: the null block 0 is neither
            written nor read; a row whose source and destination are both 0 is skipped).
        has_temporal: some state in ``meta_dev`` is temporal (sets :data:`FLAG_HAS_TEMPORAL`).
        num_requests: ``R``; default ``len(src_col)``. Keep it fixed for CUDA-graph replay.
        chunks: CTAs per state copy (grid x).
        stream: a CuPy stream or a ``torch.cuda.Stream``; ``None``: the current torch stream.
        validated: the caller already had the core check these arguments (``CopyPlanner`` does,
            with ``_core.check_step_args``) and passes int32 torch tensors with a contiguous last
            axis: their addresses are used as they are (saves the re-description on every step).

    Kernel: ``rs_state_copy(const StateMeta* metas, uint32 num_meta, const int32* block_table,
    int64 bt_row_stride, int32 bt_cols, const int32* src_col, const int32* dst_col,
    const int32* num_accepted, int32 num_requests, int32 max_accepted, int64 num_blocks,
    uint32 flags, int32* err)``, grid :func:`state_copy_grid`, block ``(256, 1, 1)``.
    """
    n = int(src_col.shape[0]) if num_requests is None else int(num_requests)
    _launch_fused("rs_state_copy", meta_dev, num_meta, block_table, src_col, ("dst_col", dst_col), num_accepted, err,
                  n=n, max_accepted=max_accepted, num_blocks=num_blocks, has_temporal=has_temporal, chunks=chunks,
                  block_size=None, stream=stream, validated=validated)


def launch_state_copy_align(
    meta_dev: Any,
    num_meta: int,
    block_table: Any,
    src_col: Any,
    running: Any,
    num_accepted: Any,
    err: Any,
    *,
    block_size: int,
    max_accepted: int,
    num_blocks: int,
    has_temporal: bool,
    num_requests: Optional[int] = None,
    chunks: int = DEFAULT_STATE_CHUNKS,
    stream: Any = None,
    validated: bool = False,
) -> None:
    """Launch ``rs_state_copy_align``: the align decision is taken on the device.

    Per request: ``new = running + a - 1``, ``aligned = new // block_size * block_size``; the request
    copies iff ``aligned >= running`` and ``aligned >= block_size``, with destination column
    ``aligned // block_size - 1`` and accepted count ``aligned - running + 1``. ``running`` is an
    int32 device vector (``computed + scheduled - drafts``); the other arguments are those of
    :func:`launch_state_copy`.

    Kernel: ``rs_state_copy_align(const StateMeta* metas, uint32 num_meta, const int32* block_table,
    int64 bt_row_stride, int32 bt_cols, const int32* src_col, const int32* running,
    const int32* num_accepted, int32 block_size, int32 num_requests, int32 max_accepted,
    int64 num_blocks, uint32 flags, int32* err)``, grid :func:`state_copy_grid`, block ``(256, 1, 1)``.
    """
    n = int(src_col.shape[0]) if num_requests is None else int(num_requests)
    _launch_fused("rs_state_copy_align", meta_dev, num_meta, block_table, src_col, ("running", running), num_accepted,
                  err, n=n, max_accepted=max_accepted, num_blocks=num_blocks, has_temporal=has_temporal,
                  chunks=chunks, block_size=block_size, stream=stream, validated=validated)


def execute_plan(plan: Any, stream: Any = None, *, tile_bytes: int = 64 * 1024) -> None:
    """Run a :class:`~recoverssm_rs.planner.CopyPlan` whose states are CUDA tensors.

    The plan's segments and tiles (``plan.tiles(tile_bytes)``) are staged in pinned host memory,
    copied to the device asynchronously, and executed by one ``rs_copy_tiles`` launch per wave, all
    on ``stream`` (a ``torch.cuda.Stream``; default: the current torch stream). Nothing waits for
    the device. The staging buffers return to torch's caching allocators, which keep them alive
    until the stream has used them.
    """
    torch = _torch()
    if stream is not None and not hasattr(stream, "cuda_stream"):
        raise PlanError(f"stream must be a torch.cuda.Stream or None, got {type(stream).__name__}")
    segments = np.ascontiguousarray(plan.segments)
    table = plan.tiles(tile_bytes)
    tiles = np.ascontiguousarray(table.tiles)
    starts = [int(x) for x in table.wave_starts]
    if len(tiles) == 0:
        return
    device = torch.device(plan.planner.device)
    nseg = segments.nbytes
    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with torch.cuda.device(device), ctx:
        host = torch.empty(nseg + tiles.nbytes, dtype=torch.uint8, pin_memory=True)
        staged = host.numpy()
        staged[:nseg] = segments.view(np.uint8).reshape(-1)
        staged[nseg:] = tiles.view(np.uint8).reshape(-1)
        dev = torch.empty(host.shape[0], dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=True)
        cs = current_stream()
        base = dev.data_ptr()
        for w in range(len(starts) - 1):
            if starts[w + 1] > starts[w]:
                launch_copy_tiles(base, base + nseg, starts[w], starts[w + 1] - starts[w], cs)


# ------------------------------------------------------------------------------------------------
# RecoverSSM commit
# ------------------------------------------------------------------------------------------------

def build_commit_meta(
    recurrent: Any,
    corrections: Any,
    keygate: Any,
    conv: Any = None,
    conv_window: Any = None,
    *,
    kind: str,
    conv_layout: str = "DS",
    conv_kernel_size: int = 1,
) -> np.ndarray:
    """The per-layer :data:`COMMIT_META_DTYPE` table of ``rs_recover_commit`` (host numpy array).

    Each argument is a sequence of per-layer torch tensors or numpy arrays (or one tensor with a
    leading layer axis): ``recurrent`` ``[num_blocks, H, V, K]`` (float32, bfloat16 or float16),
    ``corrections`` ``[max_requests, H, Q, V]`` float32, ``keygate`` ``[max_requests, H, Q, K + 1]``
    (``kind="gdn"``) or ``[..., 2K]`` (``"kda"``) in float32 / bfloat16 / float16, ``conv``
    ``[num_blocks, W, D]`` (``conv_layout="SD"``) or ``[num_blocks, D, W]`` (``"DS"``) with
    ``W = conv_kernel_size - 1 + Q - 1``, and ``conv_window`` ``[max_requests, same]`` of the conv
    dtype (``conv`` and ``conv_window`` both ``None``: no conv state). Every axis but the first must
    be dense; the first (block / request) stride is free; all tensors share one device. Only
    addresses, strides and shapes are read, so CPU tensors give a table for the host emulation,
    CUDA tensors one for the device. The rules are the core's (``rust/commit_meta.rs``).

    Raises:
        BindingError: a shape, dtype, stride, alignment or device that the kernel cannot take.
    """
    def descs(x: Any, name: str) -> list[Any]:
        out = []
        for layer, t in enumerate(x):
            try:
                out.append(describe_tensor(t))
            except TypeError as exc:
                raise BindingError(f"layer {layer}: {name}: {exc} (layers without a conv state: pass "
                                   "conv=None and conv_window=None)") from None
        return out

    raw = _core.commit_meta_table(
        descs(recurrent, "recurrent"), descs(corrections, "corrections"), descs(keygate, "keygate"),
        None if conv is None else descs(conv, "conv"), None if conv_window is None else descs(conv_window, "conv_window"),
        str(kind), str(conv_layout), conv_kernel_size)
    return records(raw, dtype=COMMIT_META_DTYPE).copy()


class CommitGrid(tuple):
    """``(rec_ctas, conv_ctas)`` of a commit launch: CTAs per (layer, row) for the recurrent states
    (heads x value tiles) and for the conv windows."""

    def __new__(cls, rec_ctas: int, conv_ctas: int) -> "CommitGrid":
        return super().__new__(cls, (int(rec_ctas), int(conv_ctas)))

    @property
    def rec_ctas(self) -> int:
        return self[0]

    @property
    def conv_ctas(self) -> int:
        return self[1]

    def grid(self, num_rows: int, num_layers: int) -> tuple[int, int, int]:
        """The launch grid for ``num_rows`` rows and ``num_layers`` layers."""
        return (self.rec_ctas + self.conv_ctas, max(1, min(int(num_rows), _MAX_GRID_YZ)),
                max(1, min(int(num_layers), _MAX_GRID_YZ)))


def commit_grid(meta: Any, *, threads: int = THREADS, conv_chunk_bytes: int = COMMIT_CONV_CHUNK_BYTES) -> CommitGrid:
    """CTAs per (layer, row) of ``rs_recover_commit`` for a :data:`COMMIT_META_DTYPE` table: one per
    (head, value tile) of the largest layer, and one per ``conv_chunk_bytes`` of the largest conv
    window (0 when no layer has a conv state)."""
    m = np.asarray(meta).view(COMMIT_META_DTYPE).reshape(-1)
    rec, conv = 1, 0
    for row in m:
        groups = (int(row["head_k"]) + 3) // 4
        per_cta = max(1, threads // max(1, groups)) * COMMIT_ROWS_PER_THREAD
        rec = max(rec, int(row["heads"]) * -(-int(row["head_v"]) // per_cta))
        if int(row["conv_layout"]):
            nbytes = int(row["conv_width"]) * int(row["conv_dim"]) * int(row["conv_elem"])
            conv = max(conv, max(1, -(-nbytes // max(16, int(conv_chunk_bytes)))))
    return CommitGrid(rec, conv)


def launch_recover_commit(
    meta_dev: Any,
    num_layers: int,
    rows_dev: Any,
    num_rows: int,
    *,
    num_blocks: int,
    max_requests: int,
    grid: CommitGrid,
    num_accepted: Any = None,
    err: Any = None,
    stream: Any = None,
) -> None:
    """Launch ``rs_recover_commit`` on the caller's stream; never synchronises, never allocates.

    Args:
        meta_dev: device array of ``num_layers`` :data:`COMMIT_META_DTYPE` records.
        rows_dev: device array of at least ``num_rows`` :data:`COMMIT_ROW_DTYPE` records (the Rust
            commit plan; padding rows have ``state_block <= 0``).
        num_blocks: blocks of the pools; max_requests: workspace rows.
        grid: :func:`commit_grid` of the table.
        num_accepted: optional int32 device vector indexed by ``row.request``: the count becomes
            ``clamp(num_accepted[request], 0, row.count)`` on the device (plan with the query
            lengths as counts). ``None``: the rows' counts.
        err: optional int32 device vector of 3 elements (zeroed by the caller), see
            :func:`decode_error_word` (its request numbers are row indices).
        stream: a CuPy stream or a ``torch.cuda.Stream``; ``None``: the current torch stream.

    Kernel: ``rs_recover_commit(const CommitMeta* metas, uint32 num_layers, const CommitRow* rows,
    uint32 num_rows, const int32* num_accepted, uint32 num_counts, int64 num_blocks,
    uint32 max_requests, uint32 rec_ctas, int32* err)``, grid ``grid.grid(num_rows, num_layers)``,
    block ``(256, 1, 1)``.
    """
    grid = CommitGrid(*grid)
    _core.check_commit_launch(num_layers, num_rows, num_blocks, max_requests, grid.rec_ctas, grid.conv_ctas)
    counts_ptr, num_counts = 0, 0
    if num_accepted is not None:
        counts_ptr, num_counts = (int(x) for x in _core.device_vector(
            _described(num_accepted, "num_accepted"), "num_accepted", 1))
    err_ptr = 0 if err is None else _int32_vector(err, 3, "err")
    if num_rows == 0 or num_layers == 0:
        return
    args = (
        np.uint64(_ptr(meta_dev, "metas")),
        np.uint32(num_layers),
        np.uint64(_ptr(rows_dev, "rows")),
        np.uint32(num_rows),
        np.uint64(counts_ptr),
        np.uint32(num_counts),
        np.int64(num_blocks),
        np.uint32(max_requests),
        np.uint32(grid.rec_ctas),
        np.uint64(err_ptr),
    )
    _launch("rs_recover_commit", grid.grid(num_rows, num_layers), args, stream)
