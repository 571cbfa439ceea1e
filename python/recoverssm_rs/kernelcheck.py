"""Checks of the CUDA kernels that need no GPU.

Three tools, used by ``tests/test_kernels.py`` (and usable by anyone comparing other executors):

* **NVRTC compile + resource report** (:func:`compile_all`): every ``.cu`` under ``kernels/`` (and
  the combined module :mod:`recoverssm_rs.gpu` loads) is compiled through ctypes on the NVRTC library
  of the ``nvidia-cuda-nvrtc-cu12`` wheel -- no driver, no GPU -- with the options ``cupy.RawModule``
  uses, for sm_80 and sm_90: to CUBIN with ptxas verbose output (registers, stack frame, spill
  stores/loads, barriers per kernel) and to PTX (``-arch=compute_XX``, CuPy's path when the device is
  newer than NVRTC).
* **Host emulation** (:func:`emulate_copy_tiles`, :func:`emulate_state_copy`,
  :func:`emulate_state_copy_align`, :func:`emulate_recover_commit`): the same sources compiled as
  host C++ through ``kernels/host_shim.h`` into a shared library (cached by source hash), run over
  the whole grid on numpy buffers, counting misaligned and out-of-range data accesses and barriers.
* **Reference semantics** in numpy (:func:`reference_execute_segments`,
  :func:`reference_state_copy`, :func:`reference_state_copy_align`), in torch for the RecoverSSM
  commit (:func:`reference_recover_commit`, built on :mod:`recoverssm_rs.recurrence`), and a
  reference tiler (:func:`make_tiles`) implementing the planner's tile rules.

Addresses: segments and state metas hold absolute byte addresses. The references take a numpy
``uint8`` buffer and the address ``base`` its first byte stands for (default: its own address), so
a plan built for one buffer (or for a GPU tensor) can be replayed on a host copy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from . import recurrence

import numpy as np

from .errors import BackendUnavailableError
from .gpu import (
    COMMIT_DTYPE_PAIRS,
    COMMIT_META_DTYPE,
    COMMIT_ROW_DTYPE,
    FLAG_HAS_TEMPORAL,
    KERNEL_DIR,
    KIND_CONV_DS,
    KIND_CONV_SD,
    KIND_TEMPORAL,
    MODE_DISJOINT,
    MODE_ROWS_ASCENDING,
    MODE_WITHIN_ROW,
    MODULE_OPTIONS,
    SEGMENT_DTYPE,
    STATE_META_DTYPE,
    THREADS,
    TILE_DTYPE,
    build_commit_meta,
    commit_grid,
    kernel_source,
    module_source,
)

__all__ = [
    "ARCHS",
    "NvrtcUnavailableError",
    "EmulationError",
    "KernelResources",
    "CompileReport",
    "EmulationStats",
    "find_nvrtc",
    "nvrtc_version",
    "cupy_nvrtc_options",
    "nvrtc_compile",
    "parse_ptxas_log",
    "compile_all",
    "resource_table",
    "host_library",
    "host_build_warnings",
    "emulate_copy_tiles",
    "emulate_state_copy",
    "emulate_state_copy_align",
    "make_tiles",
    "align_decision",
    "reference_execute_segments",
    "reference_state_copy",
    "reference_state_copy_align",
    "absolute_segments",
    "random_segment_plan",
    "StateProblem",
    "random_state_problem",
    "emulate_recover_commit",
    "reference_recover_commit",
    "CommitTensors",
    "CommitProblem",
    "random_commit_problem",
    "ERR_ACCEPTED",
    "ERR_COLUMN",
    "ERR_BLOCK",
    "ERR_META",
    "ERR_ARGS",
]

#: Architectures checked (A100, H100/H200).
ARCHS = (80, 90)

ERR_ACCEPTED = 1
ERR_COLUMN = 2
ERR_BLOCK = 4
ERR_META = 8
ERR_ARGS = 16


class NvrtcUnavailableError(BackendUnavailableError):
    """The NVRTC shared library could not be found or loaded."""


class EmulationError(AssertionError):
    """The host emulation saw a misaligned or out-of-range access, or a barrier."""


# ================================================================================================
# NVRTC
# ================================================================================================


def find_nvrtc() -> Optional[Path]:
    """Path of the NVRTC library the compile checks use.

    In order: the file named by ``RECOVERSSM_NVRTC``; ``libnvrtc.so.12`` of the
    ``nvidia-cuda-nvrtc-cu12`` wheel; ``libnvrtc.so.13`` of the CUDA 13 ``nvidia-cuda-nvrtc`` wheel;
    else the system's ``libnvrtc`` (a CUDA toolkit on the loader path).
    """
    override = os.environ.get("RECOVERSSM_NVRTC")
    if override:
        path = Path(override)
        if not path.is_file():
            raise NvrtcUnavailableError(f"RECOVERSSM_NVRTC={override}: no such file")
        return path
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        for loc in spec.submodule_search_locations or ():
            candidates.append(Path(loc) / "lib" / "libnvrtc.so.12")
    for entry in sys.path:
        candidates.append(Path(entry) / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    for entry in sys.path:
        candidates.append(Path(entry) / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13")
    for c in candidates:
        if c.is_file():
            return c
    found = ctypes.util.find_library("nvrtc")
    return Path(found) if found else None


_nvrtc_lock = threading.Lock()
_nvrtc_lib: Optional[ctypes.CDLL] = None


def _nvrtc() -> ctypes.CDLL:
    global _nvrtc_lib
    with _nvrtc_lock:
        if _nvrtc_lib is None:
            path = find_nvrtc()
            if path is None:
                raise NvrtcUnavailableError("libnvrtc not found: pip install nvidia-cuda-nvrtc-cu12")
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise NvrtcUnavailableError(f"cannot load {path}: {exc}") from exc
            vp = ctypes.c_void_p
            lib.nvrtcCreateProgram.argtypes = [
                ctypes.POINTER(vp), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
            ]
            lib.nvrtcCompileProgram.argtypes = [vp, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(vp)]
            for fn in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
                getattr(lib, fn).argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
            for fn in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
                getattr(lib, fn).argtypes = [vp, ctypes.c_char_p]
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            _nvrtc_lib = lib
    return _nvrtc_lib


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library used."""
    lib = _nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def cupy_nvrtc_options(arch: int, *, cubin: bool = True, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The NVRTC options ``cupy.RawModule(code=..., options=MODULE_OPTIONS)`` compiles with.

    From CuPy's ``_core/_compile_with_cache.pyx`` (``assemble_cupy_compiler_options``: the user
    options, ``--std=c++14`` unless a ``-std`` is given, then ``-I`` for the bundled CCCL, CuPy's
    headers and the CUDA include folder) and ``cuda/compiler.py`` (``_compile_with_cache_cuda`` adds
    ``-ftz=true``; ``_compile_using_nvrtc`` adds ``-arch=sm_XX`` -- CUBIN -- when NVRTC knows the
    device's architecture, else ``-arch=compute_XX`` -- PTX -- and
    ``--device-as-default-execution-space`` when jitify is off). When CuPy is importable its own
    ``assemble_cupy_compiler_options`` is used (it needs no GPU); otherwise the equivalent without
    include paths (the kernels include nothing from them).
    """
    opts: tuple[str, ...] = tuple(MODULE_OPTIONS)
    try:
        from cupy._core.core import assemble_cupy_compiler_options  # type: ignore[import-not-found]

        opts = tuple(assemble_cupy_compiler_options(opts))
    except Exception:  # CuPy missing, or its CUDA path detection failed
        if not any("-std=" in o for o in opts):
            opts += ("--std=c++14",)
    opts += ("-ftz=true",)
    opts += (f"-arch=sm_{arch}",) if cubin else (f"-arch=compute_{arch}",)
    opts += ("--device-as-default-execution-space",)
    return opts + tuple(extra)


@dataclass(frozen=True)
class KernelResources:
    """ptxas's resource usage of one kernel for one architecture."""

    file: str
    kernel: str
    arch: int
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    barriers: int
    cmem: int = 0

    @property
    def clean(self) -> bool:
        """No spills and no local memory (stack frame)."""
        return self.stack_frame == 0 and self.spill_stores == 0 and self.spill_loads == 0


@dataclass
class CompileReport:
    """Result of compiling one source for one architecture and target."""

    file: str
    arch: int
    target: str  # "cubin" or "ptx"
    ok: bool
    options: tuple[str, ...]
    log: str
    binary_size: int = 0
    kernels: list[KernelResources] = field(default_factory=list)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:.*?(\d+) bytes cmem\[0\])?")


def parse_ptxas_log(log: str, file: str, arch: int) -> list[KernelResources]:
    """Per-entry resource usage from ptxas ``-v`` output (as NVRTC returns it in the program log)."""
    out: list[KernelResources] = []
    current: Optional[str] = None
    frame = (0, 0, 0)
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current, frame = m.group(1), (0, 0, 0)
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = _REGS.search(line)
        if m:
            out.append(
                KernelResources(
                    file=file,
                    kernel=current,
                    arch=arch,
                    registers=int(m.group(1)),
                    stack_frame=frame[0],
                    spill_stores=frame[1],
                    spill_loads=frame[2],
                    barriers=int(m.group(2) or 0),
                    cmem=int(m.group(3) or 0),
                )
            )
            current = None
    return out


def nvrtc_compile(
    name: str, arch: int, *, target: str = "cubin", source: Optional[str] = None, verbose: bool = True
) -> CompileReport:
    """Compile one kernel file (``name`` under ``kernels/``, includes inlined) or ``source``.

    ``target="cubin"`` compiles with ``-arch=sm_XX`` (plus ``-Xptxas=-v`` when ``verbose``) and parses
    the resource report; ``target="ptx"`` compiles with ``-arch=compute_XX``.
    """
    if target not in ("cubin", "ptx"):
        raise ValueError("target must be 'cubin' or 'ptx'")
    lib = _nvrtc()
    text = kernel_source(name) if source is None else source
    extra = ("-Xptxas=-v",) if (verbose and target == "cubin") else ()
    options = cupy_nvrtc_options(arch, cubin=target == "cubin", extra=extra)
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None)
    if rc != 0:
        raise NvrtcUnavailableError(f"nvrtcCreateProgram failed: {lib.nvrtcGetErrorString(rc).decode()}")
    try:
        enc = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(enc))(*enc)
        rc = lib.nvrtcCompileProgram(prog, len(enc), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        binary_size = 0
        if rc == 0:
            get_size = lib.nvrtcGetCUBINSize if target == "cubin" else lib.nvrtcGetPTXSize
            get_size(prog, ctypes.byref(size))
            binary_size = size.value
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    report = CompileReport(name, arch, target, rc == 0, options, log, binary_size)
    if rc == 0 and target == "cubin":
        report.kernels = parse_ptxas_log(log, name, arch)
    return report


def compile_all(archs: Sequence[int] = ARCHS, *, ptx: bool = True, module: bool = True) -> list[CompileReport]:
    """Compile every kernel source (and the combined module) for every architecture.

    Returns one :class:`CompileReport` per (file, arch, target); the CUBIN reports carry the
    per-kernel :class:`KernelResources`. The combined module appears as file ``"<module>"``.
    """
    names = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    reports: list[CompileReport] = []
    for arch in archs:
        for name in names:
            reports.append(nvrtc_compile(name, arch, target="cubin"))
            if ptx:
                reports.append(nvrtc_compile(name, arch, target="ptx"))
        if module:
            reports.append(nvrtc_compile("<module>", arch, target="cubin", source=module_source()))
    return reports


def resource_table(reports: Iterable[CompileReport]) -> str:
    """A plain-text table of the CUBIN resource reports."""
    lines = [f"{'file':<16} {'kernel':<22} {'arch':>5} {'regs':>5} {'stack':>6} {'spill st':>9} {'spill ld':>9} {'bar':>4}"]
    for rep in reports:
        for k in rep.kernels:
            lines.append(
                f"{k.file:<16} {k.kernel:<22} {'sm_' + str(k.arch):>5} {k.registers:>5} {k.stack_frame:>6} "
                f"{k.spill_stores:>9} {k.spill_loads:>9} {k.barriers:>4}"
            )
    return "\n".join(lines)


# ================================================================================================
# Host emulation
# ================================================================================================

HOST_CXX = os.environ.get("RECOVERSSM_CXX", "g++")
HOST_CXX_FLAGS = (
    "-x", "c++", "-std=c++17", "-O1", "-fno-strict-aliasing", "-fvisibility=hidden", "-fno-gnu-unique",
    "-Wall", "-Wextra", "-shared", "-fPIC",
)

_host_lock = threading.Lock()
_host_libs: dict[str, ctypes.CDLL] = {}
_host_warnings: dict[str, str] = {}

_ENTRY_SIGNATURES: dict[str, list[Any]] = {
    "rs_copy_tiles": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32],
    "rs_state_copy": [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32,
        ctypes.c_void_p,
    ],
    "rs_state_copy_align": [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
        ctypes.c_uint32, ctypes.c_void_p,
    ],
}
_ENTRY_SIGNATURES["rs_recover_commit"] = [
    ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32,
    ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p,
]
_ENTRY_FILES = {"rs_copy_tiles": "copy_tiles.cu", "rs_state_copy": "state_copy.cu", "rs_state_copy_align": "state_copy.cu",
                "rs_recover_commit": "recover_commit.cu"}
_RUNNER_PREFIX = [
    ctypes.POINTER(ctypes.c_uint),  # grid[3]
    ctypes.POINTER(ctypes.c_uint),  # block[3]
    ctypes.c_ulonglong,  # order
    ctypes.POINTER(ctypes.c_ulonglong),  # ranges
    ctypes.c_int,  # num_ranges
    ctypes.POINTER(ctypes.c_longlong),  # counters[4]
]


def _cache_dir() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    d = Path(tempfile.gettempdir()) / f"recoverssm_rs-kernelcheck-{uid}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def host_library(name: str) -> ctypes.CDLL:
    """The host-C++ build of kernel file ``name`` (compiled on first use, cached by source hash).

    The key covers the shim, the headers, the source, the flags and the compiler's version, so an
    edited kernel is always rebuilt. Compiler warnings are kept in :func:`host_build_warnings`.
    """
    with _host_lock:
        lib = _host_libs.get(name)
        if lib is not None:
            return lib
        cxx = shutil.which(HOST_CXX)
        if cxx is None:
            raise RuntimeError(f"host emulation needs a C++17 compiler ({HOST_CXX} not found)")
        h = hashlib.sha256()
        for part in sorted(KERNEL_DIR.glob("*.cuh")) + sorted(KERNEL_DIR.glob("*.h")) + [KERNEL_DIR / name]:
            h.update(part.name.encode())
            h.update(part.read_bytes())
        h.update(" ".join(HOST_CXX_FLAGS).encode())
        ver = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
        h.update(ver.encode())
        key = h.hexdigest()[:20]
        so = _cache_dir() / f"{Path(name).stem}-{key}.so"
        log = _cache_dir() / f"{Path(name).stem}-{key}.log"
        if not so.exists():
            tmp = so.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            cmd = [cxx, *HOST_CXX_FLAGS, "-include", str(KERNEL_DIR / "host_shim.h"), "-I", str(KERNEL_DIR),
                   "-o", str(tmp), str(KERNEL_DIR / name)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"host build of {name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
            log.write_text(proc.stderr)
            os.replace(tmp, so)
        _host_warnings[name] = log.read_text() if log.exists() else ""
        lib = ctypes.CDLL(str(so))
        for entry, fname in _ENTRY_FILES.items():
            if fname == name:
                fn = getattr(lib, f"rs_host_{entry}")
                fn.argtypes = _RUNNER_PREFIX + _ENTRY_SIGNATURES[entry]
                fn.restype = ctypes.c_int
        _host_libs[name] = lib
        return lib


def host_build_warnings(name: str) -> str:
    """Compiler diagnostics of the host build of ``name`` (empty when clean)."""
    host_library(name)
    return _host_warnings.get(name, "")


@dataclass
class EmulationStats:
    """Counters of an emulated launch (summed over launches)."""

    misaligned: int = 0
    out_of_range: int = 0
    barriers: int = 0
    accesses: int = 0
    launches: int = 0

    def add(self, counters: Sequence[int]) -> None:
        self.misaligned += int(counters[0])
        self.out_of_range += int(counters[1])
        self.barriers += int(counters[2])
        self.accesses += int(counters[3])
        self.launches += 1


def _addr(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data)
    return int(x)


def _ranges_arg(ranges: Optional[Iterable[Any]]) -> tuple[Any, int]:
    """ranges: numpy arrays (their byte extent) or (lo, hi) address pairs."""
    if ranges is None:
        return None, 0
    flat: list[int] = []
    for r in ranges:
        if isinstance(r, np.ndarray):
            lo = int(r.ctypes.data)
            flat += [lo, lo + r.nbytes]
        else:
            lo, hi = r
            flat += [int(lo), int(hi)]
    arr = (ctypes.c_ulonglong * max(1, len(flat)))(*flat)
    return arr, len(flat) // 2


def _run(entry: str, grid: Sequence[int], block: Sequence[int], order: int, ranges: Any,
         stats: EmulationStats, *args: Any) -> None:
    lib = host_library(_ENTRY_FILES[entry])
    g = (ctypes.c_uint * 3)(*[int(x) for x in grid])
    b = (ctypes.c_uint * 3)(*[int(x) for x in block])
    counters = (ctypes.c_longlong * 4)()
    rng, nrng = ranges
    getattr(lib, f"rs_host_{entry}")(g, b, ctypes.c_ulonglong(order), rng, nrng, counters, *args)
    stats.add(list(counters))


def _check(stats: EmulationStats, what: str) -> None:
    if stats.misaligned or stats.out_of_range or stats.barriers:
        raise EmulationError(
            f"{what}: {stats.misaligned} misaligned and {stats.out_of_range} out-of-range accesses, "
            f"{stats.barriers} barriers (of {stats.accesses} accesses)"
        )


def _records(x: Any, dtype: np.dtype, what: str) -> np.ndarray:
    arr = np.ascontiguousarray(x)
    if arr.dtype != dtype:
        if arr.dtype == np.uint8 and arr.size % dtype.itemsize == 0:
            arr = arr.view(dtype)
        else:
            raise TypeError(f"{what}: expected dtype {dtype} (or raw uint8 bytes), got {arr.dtype}")
    return arr.reshape(-1)


def emulate_copy_tiles(
    segments: Any,
    tiles: Any,
    wave_starts: Optional[Sequence[int]] = None,
    *,
    threads: int = THREADS,
    grid: Optional[int] = None,
    order: int = 0,
    ranges: Optional[Iterable[Any]] = None,
    check: bool = True,
) -> EmulationStats:
    """Run ``rs_copy_tiles`` on the host, one emulated launch per wave, in wave order.

    Args:
        segments, tiles: :data:`~recoverssm_rs.gpu.SEGMENT_DTYPE` / ``TILE_DTYPE`` arrays (or raw
            bytes); segment addresses point into live host memory.
        wave_starts: tile offsets of each wave (``len = waves + 1``); default: one wave of all tiles.
        threads: blockDim.x. grid: gridDim.x per launch (default: one CTA per tile).
        order: thread execution order (0 natural, 1 reversed, other: seeded shuffle of the grid).
        ranges: memory the kernel may touch (arrays or (lo, hi) address pairs); accesses outside
            are counted. check: raise :class:`EmulationError` on any misaligned / out-of-range
            access or barrier.
    """
    seg = _records(segments, SEGMENT_DTYPE, "segments")
    til = _records(tiles, TILE_DTYPE, "tiles")
    if wave_starts is None:
        wave_starts = [0, len(til)]
    stats = EmulationStats()
    rng = _ranges_arg(ranges)
    for w in range(len(wave_starts) - 1):
        first, n = int(wave_starts[w]), int(wave_starts[w + 1]) - int(wave_starts[w])
        if n <= 0:
            continue
        gx = n if grid is None else max(1, min(n, int(grid)))
        _run("rs_copy_tiles", (gx, 1, 1), (threads, 1, 1), order, rng, stats,
             seg.ctypes.data, til.ctypes.data, first, n)
    if check:
        _check(stats, "rs_copy_tiles")
    return stats


def _i32(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def _state_launch(entry: str, metas: Any, block_table: Any, src_col: Any, mid: Any, num_accepted: Any,
                  block_size: Optional[int], *, max_accepted: int, num_blocks: int, has_temporal: Optional[bool],
                  chunks: int, threads: int, grid_yz: Optional[tuple[int, int]], order: int,
                  ranges: Optional[Iterable[Any]], err: Optional[np.ndarray], check: bool) -> np.ndarray:
    m = _records(metas, STATE_META_DTYPE, "metas")
    bt = np.asarray(block_table, dtype=np.int32)
    if bt.ndim != 2 or (bt.shape[1] > 1 and bt.strides[1] != 4):
        bt = np.ascontiguousarray(bt)
    s, x, a = _i32(src_col), _i32(mid), _i32(num_accepted)
    n = len(s)
    if has_temporal is None:
        has_temporal = bool(np.any(m["kind"] == KIND_TEMPORAL))
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    gy = max(1, min(n, 65535)) if grid_yz is None else grid_yz[0]
    gz = max(1, min(len(m), 65535)) if grid_yz is None else grid_yz[1]
    stats = EmulationStats()
    if n and len(m):
        common = [m.ctypes.data, len(m), bt.ctypes.data, bt.strides[0] // 4, bt.shape[1], s.ctypes.data,
                  x.ctypes.data, a.ctypes.data]
        tail = [n, max_accepted, num_blocks, FLAG_HAS_TEMPORAL if has_temporal else 0, err.ctypes.data]
        if block_size is not None:
            common.append(block_size)
        _run(entry, (chunks, gy, gz), (threads, 1, 1), order, _ranges_arg(ranges), stats, *common, *tail)
    if check:
        _check(stats, entry)
    return err


def emulate_state_copy(
    metas: Any,
    block_table: Any,
    src_col: Any,
    dst_col: Any,
    num_accepted: Any,
    *,
    max_accepted: int,
    num_blocks: int,
    has_temporal: Optional[bool] = None,
    chunks: int = 4,
    threads: int = THREADS,
    grid_yz: Optional[tuple[int, int]] = None,
    order: int = 0,
    ranges: Optional[Iterable[Any]] = None,
    err: Optional[np.ndarray] = None,
    check: bool = True,
) -> np.ndarray:
    """Run ``rs_state_copy`` on the host; returns the ``int32[3]`` error word.

    ``has_temporal`` defaults to "some meta is temporal"; ``grid_yz`` overrides gridDim.y/z (to
    exercise the grid-stride folding); other arguments as :func:`emulate_copy_tiles`.
    """
    return _state_launch("rs_state_copy", metas, block_table, src_col, dst_col, num_accepted, None,
                         max_accepted=max_accepted, num_blocks=num_blocks, has_temporal=has_temporal,
                         chunks=chunks, threads=threads, grid_yz=grid_yz, order=order, ranges=ranges, err=err,
                         check=check)


def emulate_state_copy_align(
    metas: Any,
    block_table: Any,
    src_col: Any,
    running: Any,
    num_accepted: Any,
    *,
    block_size: int,
    max_accepted: int,
    num_blocks: int,
    has_temporal: Optional[bool] = None,
    chunks: int = 4,
    threads: int = THREADS,
    grid_yz: Optional[tuple[int, int]] = None,
    order: int = 0,
    ranges: Optional[Iterable[Any]] = None,
    err: Optional[np.ndarray] = None,
    check: bool = True,
) -> np.ndarray:
    """Run ``rs_state_copy_align`` on the host; returns the ``int32[3]`` error word."""
    return _state_launch("rs_state_copy_align", metas, block_table, src_col, running, num_accepted, block_size,
                         max_accepted=max_accepted, num_blocks=num_blocks, has_temporal=has_temporal,
                         chunks=chunks, threads=threads, grid_yz=grid_yz, order=order, ranges=ranges, err=err,
                         check=check)


# ================================================================================================
# Reference tiler
# ================================================================================================


def make_tiles(
    segments: Any, *, tile_bytes: int = 64 * 1024, rng: Optional[np.random.Generator] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cut segments into tiles grouped by wave, with the planner's rules.

    Returns ``(tiles, wave_starts)``. Byte-unit segments (``rows == 1`` or ROWS_ASCENDING) are cut
    in byte ranges whose boundaries fall where ``dst + begin`` is 16-byte aligned (about
    ``tile_bytes`` bytes of work per tile); a single row overlapping itself (``rows == 1``, mode != 0,
    ``|src - dst| < row_bytes``) is never cut. Row-unit segments are cut in row ranges of about ``tile_bytes`` bytes. With
    ``rng``, tile sizes are randomised (0.25x .. 2x) to exercise odd cuts.
    """
    seg = _records(segments, SEGMENT_DTYPE, "segments")
    order = np.argsort(seg["wave"], kind="stable")
    tiles: list[tuple[int, int, int, int]] = []
    starts = [0]
    waves = seg["wave"][order]
    for idx_pos, si in enumerate(order):
        s = seg[si]
        if idx_pos > 0 and waves[idx_pos] != waves[idx_pos - 1]:
            starts.append(len(tiles))

        def size() -> int:
            if rng is None:
                return max(1, tile_bytes)
            return max(1, int(tile_bytes * rng.uniform(0.25, 2.0)))

        rows, row_bytes, mode = int(s["rows"]), int(s["row_bytes"]), int(s["mode"])
        if rows == 1 or mode == MODE_ROWS_ASCENDING:
            if rows == 1 and mode != MODE_DISJOINT and abs(int(s["src"]) - int(s["dst"])) < row_bytes:
                tiles.append((int(si), 0, row_bytes, 0))  # an overlapping row is one tile
                continue
            dst = int(s["dst"])
            begin = 0
            while begin < row_bytes:
                want = max(1, size() // rows)
                end = ((dst + begin + want + 15) // 16) * 16 - dst
                end = min(row_bytes, max(end, begin + 1))
                tiles.append((int(si), begin, end - begin, 0))
                begin = end
        else:
            per = max(1, size() // max(1, row_bytes))
            begin = 0
            while begin < rows:
                count = min(per, rows - begin)
                tiles.append((int(si), begin, count, 0))
                begin += count
    starts.append(len(tiles))
    if len(seg) == 0:
        starts = [0, 0]
    return np.array(tiles, dtype=np.uint32).reshape(-1, 4).view(TILE_DTYPE).reshape(-1), np.array(starts, dtype=np.int64)


# ================================================================================================
# Reference semantics
# ================================================================================================


def _base(buf: np.ndarray, base: Optional[int]) -> int:
    if buf.dtype != np.uint8 or buf.ndim != 1:
        raise TypeError("buf must be a 1-D uint8 array")
    return int(buf.ctypes.data) if base is None else int(base)


def _copy_rows(buf: np.ndarray, src: int, dst: int, row_bytes: int, rows: int, pitch: int) -> None:
    """Snapshot copy: read every source row, then write (= memmove for the allowed overlaps)."""
    if rows == 1:
        buf[dst : dst + row_bytes] = buf[src : src + row_bytes].copy()
        return
    idx = np.arange(rows, dtype=np.int64)[:, None] * pitch + np.arange(row_bytes, dtype=np.int64)[None, :]
    data = buf[src + idx]
    buf[dst + idx] = data


def reference_execute_segments(buf: np.ndarray, segments: Any, base: Optional[int] = None) -> None:
    """Execute a segment plan on ``buf`` (uint8) in place, with the documented semantics.

    Segments run wave by wave (a stable sort by ``wave``); each segment copies its rows as if all of
    its source bytes were read before any destination byte is written. That is the result the three
    modes' disciplines produce for the overlaps they allow (ROWS_ASCENDING: src = dst + k*pitch;
    WITHIN_ROW: an overlap inside each row; DISJOINT: none).
    """
    b = _base(buf, base)
    seg = _records(segments, SEGMENT_DTYPE, "segments")
    for si in np.argsort(seg["wave"], kind="stable"):
        s = seg[si]
        rows = int(s["rows"])
        _copy_rows(buf, int(s["src"]) - b, int(s["dst"]) - b, int(s["row_bytes"]), rows,
                   int(s["pitch"]) if rows > 1 else 0)


def _decide(bt_row: np.ndarray, cols: int, s: int, d: int, a: int, max_accepted: int, num_blocks: int,
            temporal: bool) -> tuple[int, Optional[tuple[int, int, int, int]]]:
    # The host planner's order (rust/plan/step.rs), as rs_decide in state_copy.cu.
    if s < 0 or d < 0:
        return 0, None
    if s >= cols or d >= cols:
        return ERR_COLUMN, None
    src_blk, dst_blk = int(bt_row[s]), int(bt_row[d])
    if src_blk == 0 and dst_blk == 0:
        return 0, None
    if a < 1 or a > max_accepted:
        return ERR_ACCEPTED, None
    if temporal and s + a - 1 >= cols:
        return ERR_COLUMN, None
    if s == d and a == 1:
        return 0, None
    if not (1 <= dst_blk < num_blocks) or not (0 <= src_blk < num_blocks):
        return ERR_BLOCK, None
    if temporal and not (1 <= int(bt_row[s + a - 1]) < num_blocks):
        return ERR_BLOCK, None
    return 0, (src_blk, dst_blk, s, a)


def _apply_state(buf: np.ndarray, b: int, m: np.void, bt_row: np.ndarray, cols: int, num_blocks: int,
                 q: tuple[int, int, int, int]) -> int:
    src_blk, dst_blk, s, a = q
    meta_blocks = int(m["num_blocks"])
    if dst_blk >= meta_blocks:
        return ERR_META
    base, stride = int(m["base"]) - b, int(m["block_stride"])
    kind = int(m["kind"])
    if kind == KIND_TEMPORAL:
        col = s + a - 1
        if col >= cols:
            return ERR_COLUMN
        sb = int(bt_row[col])
        if not 1 <= sb < num_blocks:
            return ERR_BLOCK
        if sb >= meta_blocks:
            return ERR_META
        if sb != dst_blk:
            n = int(m["state_bytes"])
            _copy_rows(buf, base + sb * stride, base + dst_blk * stride, n, 1, 0)
        return 0
    if kind not in (KIND_CONV_SD, KIND_CONV_DS):
        return ERR_META
    width, dim, elem = int(m["width"]), int(m["dim"]), int(m["elem_bytes"])
    if src_blk < 1:
        return ERR_BLOCK
    if src_blk >= meta_blocks:
        return ERR_META
    if width == 0 or dim == 0 or elem == 0 or a - 1 >= width or width * dim * elem > int(m["state_bytes"]):
        return ERR_META
    if src_blk == dst_blk and a == 1:
        return 0
    shift, ncols = a - 1, width - (a - 1)
    src_state, dst_state = base + src_blk * stride, base + dst_blk * stride
    if kind == KIND_CONV_SD:
        L = dim * elem
        _copy_rows(buf, src_state + shift * L, dst_state, ncols * L, 1, 0)
    else:
        row = width * elem
        _copy_rows(buf, src_state + shift * elem, dst_state, ncols * elem, dim, row)
    return 0


def _report(err: np.ndarray, code: int, r: int, n: int) -> None:
    err[0] |= code
    err[1] = max(int(err[1]), n - r)
    err[2] = max(int(err[2]), r + 1)


def reference_state_copy(
    buf: np.ndarray,
    metas: Any,
    block_table: Any,
    src_col: Any,
    dst_col: Any,
    num_accepted: Any,
    *,
    max_accepted: int,
    num_blocks: int,
    has_temporal: Optional[bool] = None,
    base: Optional[int] = None,
    err: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The fused kernel's semantics (explicit form) on ``buf``, in place; returns the error word.

    Requests run in order (the host guarantees no request's destination block is another's source
    block, so the order does not matter); each decision and error bit is the kernel's.
    """
    b = _base(buf, base)
    m = _records(metas, STATE_META_DTYPE, "metas")
    bt = np.asarray(block_table, dtype=np.int64)
    s_, d_, a_ = (np.asarray(x, dtype=np.int64) for x in (src_col, dst_col, num_accepted))
    if has_temporal is None:
        has_temporal = bool(np.any(m["kind"] == KIND_TEMPORAL))
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n, cols = len(s_), bt.shape[1]
    for r in range(n):
        code, q = _decide(bt[r], cols, int(s_[r]), int(d_[r]), int(a_[r]), max_accepted, num_blocks, has_temporal)
        _finish(buf, b, m, bt[r], cols, num_blocks, code, q, err, r, n)
    return err


def _finish(buf: np.ndarray, b: int, m: np.ndarray, bt_row: np.ndarray, cols: int, num_blocks: int, code: int,
            q: Optional[tuple[int, int, int, int]], err: np.ndarray, r: int, n: int) -> None:
    if code:
        _report(err, code, r, n)
        return
    if q is None:
        return
    for mi in range(len(m)):
        c = _apply_state(buf, b, m[mi], bt_row, cols, num_blocks, q)
        if c:
            _report(err, c, r, n)


def align_decision(running: int, a: int, block_size: int) -> Optional[tuple[int, int]]:
    """vLLM's align decision: ``(dst_col, a_eff)`` when the request copies, else ``None``."""
    new = running + a - 1
    aligned = new // block_size * block_size
    if aligned >= running and aligned >= block_size:
        return aligned // block_size - 1, aligned - running + 1
    return None


def reference_state_copy_align(
    buf: np.ndarray,
    metas: Any,
    block_table: Any,
    src_col: Any,
    running: Any,
    num_accepted: Any,
    *,
    block_size: int,
    max_accepted: int,
    num_blocks: int,
    has_temporal: Optional[bool] = None,
    base: Optional[int] = None,
    err: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The align-decision entry's semantics on ``buf``, in place; returns the error word."""
    b = _base(buf, base)
    m = _records(metas, STATE_META_DTYPE, "metas")
    bt = np.asarray(block_table, dtype=np.int64)
    s_, run_, a_ = (np.asarray(x, dtype=np.int64) for x in (src_col, running, num_accepted))
    if has_temporal is None:
        has_temporal = bool(np.any(m["kind"] == KIND_TEMPORAL))
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n, cols = len(s_), bt.shape[1]
    for r in range(n):
        s, run, a = int(s_[r]), int(run_[r]), int(a_[r])
        code, q = 0, None
        if s >= 0:
            if a < 1 or a > max_accepted:
                code = ERR_ACCEPTED
            elif block_size < 1 or run < 0:
                code = ERR_ARGS
            else:
                dec = align_decision(run, a, block_size)
                if dec is not None:
                    code, q = _decide(bt[r], cols, s, dec[0], dec[1], max_accepted, num_blocks, has_temporal)
        _finish(buf, b, m, bt[r], cols, num_blocks, code, q, err, r, n)
    return err

# ================================================================================================
# Random problems (for the tests, and for comparing other executors against the references)
# ================================================================================================


def absolute_segments(rel: np.ndarray, base: int) -> np.ndarray:
    """Segments whose ``src`` / ``dst`` are offsets, rebased to absolute addresses at ``base``."""
    out = np.array(rel, dtype=SEGMENT_DTYPE, copy=True)
    out["src"] += np.uint64(base)
    out["dst"] += np.uint64(base)
    return out


def _footprint(src: int, dst: int, row_bytes: int, rows: int, pitch: int) -> tuple[np.ndarray, np.ndarray]:
    idx = (np.arange(rows, dtype=np.int64)[:, None] * pitch + np.arange(row_bytes, dtype=np.int64)[None, :]).ravel()
    return src + idx, dst + idx


def _random_segment(rng: np.random.Generator, arena: int, max_bytes: int, descending: bool) -> Optional[tuple]:
    kind = rng.choice(["1d", "1d", "2d", "rows_asc", "within_row", "tiny", "overlap_row"])
    elem = int(rng.choice([1, 2, 4, 8]))

    def log_size(lo: int, hi: int) -> int:
        return int(np.exp(rng.uniform(np.log(lo), np.log(max(lo, hi) + 1))))

    def place(extent: int) -> Optional[int]:
        if extent >= arena:
            return None
        off = int(rng.integers(0, arena - extent)) // elem * elem
        if rng.random() < 0.3:
            off = off // 16 * 16
        return off

    mode, rows, pitch = MODE_DISJOINT, 1, 0
    if kind in ("1d", "tiny", "2d"):
        if kind == "2d":
            rows = int(rng.integers(2, 65))
            row_bytes = max(elem, log_size(1, min(4096, max_bytes // rows)) // elem * elem)
            gap = int(rng.integers(0, 64)) // elem * elem
            pitch = row_bytes + gap
            if rng.random() < 0.5:
                pitch = (pitch + 15) // 16 * 16
        else:
            hi = 3 * elem if kind == "tiny" else max_bytes
            row_bytes = max(elem, log_size(1, hi) // elem * elem)
        extent = (rows - 1) * pitch + row_bytes
        dst = place(extent)
        src = place(extent)
        if dst is None or src is None:
            return None
        if rng.random() < 0.5:  # congruent modulo 16 (vector path)
            src = src // 16 * 16 + dst % 16
            if src + extent > arena:
                return None
        s_idx, d_idx = _footprint(src, dst, row_bytes, rows, pitch)
        if np.intersect1d(s_idx, d_idx).size:
            return None
    elif kind == "rows_asc":
        # In-block SD conv shift: [width, dim] rows, shift rows up; rows = width - shift.
        mode = MODE_ROWS_ASCENDING
        width = int(rng.integers(2, 11))
        shift = int(rng.integers(1, width))
        rows = width - shift
        row_bytes = max(elem, log_size(1, min(8192, max_bytes // width)) // elem * elem)
        pitch = row_bytes + (int(rng.integers(0, 48)) // elem * elem if rng.random() < 0.3 else 0)
        base = place(width * pitch)
        if base is None:
            return None
        dst, src = base, base + shift * pitch  # rows == 1 (shift = width - 1): no overlap at all
        if descending and rng.random() < 0.5:
            dst, src = src, dst
    else:
        # In-block DS conv shift ([dim, width], shift inside each row), or one overlapping row.
        mode = MODE_WITHIN_ROW
        if kind == "overlap_row":
            rows, width = 1, max(2, log_size(2, max_bytes // elem))
        else:
            rows, width = int(rng.integers(1, 301)), int(rng.integers(2, 71))
        shift = int(rng.integers(1, width))
        pitch = width * elem + (int(rng.integers(0, 4)) * elem if rng.random() < 0.3 else 0)
        if rows * pitch > max_bytes:
            rows = max(1, max_bytes // pitch)
        row_bytes = (width - shift) * elem
        base = place(rows * pitch)
        if base is None:
            return None
        dst, src = base, base + shift * elem
        if descending and rng.random() < 0.5:
            dst, src = src, dst
        if rows == 1:
            pitch = 0
    return (src, dst, row_bytes, rows, pitch, 0, mode, elem)


def random_segment_plan(
    rng: np.random.Generator,
    *,
    arena_size: int = 1 << 20,
    max_waves: int = 3,
    max_segments: int = 10,
    max_bytes: int = 100 * 1024,
    descending: bool = False,
) -> np.ndarray:
    """A random valid segment plan (offsets relative to an arena of ``arena_size`` bytes).

    Mixes 1-D and 2-D disjoint copies, in-block SD shifts (ROWS_ASCENDING), in-block DS shifts and
    single overlapping rows (WITHIN_ROW), element sizes 1-8, congruent and incongruent alignments,
    sizes from 1 byte to ``max_bytes``. Within a wave no segment writes a byte another segment of the
    wave reads or writes (the planner's contract); later waves may read earlier waves' output.
    ``descending`` also emits right shifts (src < dst), beyond the planner's contract.
    """
    specs: list[tuple] = []
    for w in range(int(rng.integers(1, max_waves + 1))):
        read = np.zeros(arena_size, dtype=bool)
        written = np.zeros(arena_size, dtype=bool)
        for _ in range(int(rng.integers(1, max_segments + 1))):
            for _attempt in range(20):
                spec = _random_segment(rng, arena_size, max_bytes, descending)
                if spec is None:
                    continue
                s_idx, d_idx = _footprint(spec[0], spec[1], spec[2], spec[3], spec[4] if spec[3] > 1 else 0)
                if written[s_idx].any() or written[d_idx].any() or read[d_idx].any():
                    continue
                read[s_idx] = True
                written[d_idx] = True
                specs.append(spec[:5] + (w,) + spec[6:])
                break
    out = np.zeros(len(specs), dtype=SEGMENT_DTYPE)
    for i, s in enumerate(specs):
        out[i] = s
    return out


@dataclass
class StateProblem:
    """A random fused-kernel problem: state tensors in one arena, block table and request vectors.

    ``metas_rel`` holds bases relative to the arena; :meth:`metas` rebases them.
    """

    arena_size: int
    metas_rel: np.ndarray
    num_blocks: int
    max_accepted: int
    block_table: np.ndarray
    src_col: np.ndarray
    dst_col: np.ndarray
    num_accepted: np.ndarray

    def metas(self, base: int) -> np.ndarray:
        out = self.metas_rel.copy()
        out["base"] += np.uint64(base)
        return out

    @property
    def has_temporal(self) -> bool:
        return bool(np.any(self.metas_rel["kind"] == KIND_TEMPORAL))


def random_state_problem(
    rng: np.random.Generator,
    *,
    max_requests: int = 10,
    invalid: float = 0.2,
    in_place: float = 0.35,
    max_state_bytes: int = 16 * 1024,
    wide_block_table: Optional[bool] = None,
) -> StateProblem:
    """A random problem for the fused kernels honouring the host's guarantees.

    Every request owns distinct blocks (so no destination block is another request's source); some
    requests shift in place (``bt[dst_col] == bt[src_col]``), some are padding or no-ops, and a
    fraction ``invalid`` carries one bad value the device must reject (accepted count, column,
    block id). Layouts mix SD / DS conv states (1, 2 or 4-byte elements), temporal states, conv-only
    and temporal-only layers, misaligned bases and padded block strides.
    """
    max_acc = int(rng.integers(1, 5))
    layers = int(rng.integers(1, 4))
    states: list[dict[str, int]] = []
    for layer in range(layers):
        shape = rng.choice(["conv+temporal", "conv+temporal", "conv", "temporal"])
        if "conv" in shape:
            elem = int(rng.choice([1, 2, 2, 4]))
            width = max_acc - 1 + int(rng.integers(1, 4))
            dim = int(rng.integers(1, max(2, min(300, max_state_bytes // (width * elem)))))
            kind = KIND_CONV_SD if rng.random() < 0.5 else KIND_CONV_DS
            states.append(dict(kind=kind, elem=elem, width=width, dim=dim, bytes=width * dim * elem, layer=layer))
        if "temporal" in shape:
            elem = int(rng.choice([2, 4]))
            n = int(np.exp(rng.uniform(0, np.log(max_state_bytes // elem)))) * elem
            states.append(dict(kind=KIND_TEMPORAL, elem=elem, width=0, dim=0, bytes=n, layer=layer))
    R = int(rng.integers(1, max_requests + 1))
    cols = max_acc + int(rng.integers(0, 4))
    nb = R * cols + 1 + int(rng.integers(0, 4))
    metas = np.zeros(len(states), dtype=STATE_META_DTYPE)
    off = int(rng.integers(0, 64))
    for i, st in enumerate(states):
        elem = st["elem"]
        off = (off + elem - 1) // elem * elem
        if rng.random() < 0.4:
            off = (off + 15) // 16 * 16
        stride = st["bytes"] + (int(rng.integers(1, 9)) * elem if rng.random() < 0.3 else 0)
        metas[i] = (off, stride, st["bytes"], st["kind"], elem, st["width"], st["dim"], st["layer"], i, nb, 0)
        off += stride * nb + int(rng.integers(0, 40))
    arena = off + 64
    blocks = rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols)
    bt = blocks.copy()
    src = np.zeros(R, np.int32)
    dst = np.zeros(R, np.int32)
    acc = np.zeros(R, np.int32)
    for r in range(R):
        a = int(rng.integers(1, max_acc + 1))
        s = int(rng.integers(0, cols - a + 1))
        d = int(rng.integers(0, cols))
        u = rng.random()
        if u < in_place:
            if a > 1 and rng.random() < 0.5:
                d = s
            else:
                bt[r, d] = bt[r, s]
        elif u < in_place + 0.05:
            d, a = s, 1  # no-op
        elif u < in_place + 0.1:
            if rng.random() < 0.5:
                s = -1
            else:
                d = -int(rng.integers(1, 3))
        if rng.random() < invalid:
            what = int(rng.integers(0, 9))
            if what == 0:
                a = int(rng.choice([0, -2, max_acc + 1]))
            elif what == 1:
                s = cols + int(rng.integers(0, 3))
            elif what == 2:
                d = cols + int(rng.integers(0, 3))
            elif what == 3 and a > 1:
                s = cols - a + 1  # temporal source column out of range
            elif what == 4:
                bt[r, max(d, 0) % cols] = int(rng.choice([0, nb, -1]))
            elif what == 5:
                bt[r, max(s, 0) % cols] = int(rng.choice([nb, nb + 7, -1]))
            elif what == 6:
                bt[r, (max(s, 0) + a - 1) % cols] = nb
            elif what == 7 and 0 <= d < cols and bt[r, d] >= 1:
                # A tensor smaller than the pool: this request's destination is past its end.
                metas["num_blocks"][int(rng.integers(0, len(metas)))] = bt[r, d]
        src[r], dst[r], acc[r] = s, d, a
    if wide_block_table is None:
        wide_block_table = bool(rng.random() < 0.3)
    if wide_block_table:  # a view with a larger row stride
        full = np.full((R, cols + 3), -7, dtype=np.int32)
        full[:, :cols] = bt
        bt = full[:, :cols]
    return StateProblem(arena, metas, nb, max_acc, bt, src, dst, acc)


# ================================================================================================
# RecoverSSM commit (rs_recover_commit)
# ================================================================================================


def emulate_recover_commit(
    metas: Any,
    rows: Any,
    *,
    num_blocks: int,
    max_requests: int,
    num_accepted: Any = None,
    grid: Optional[Sequence[int]] = None,
    threads: int = THREADS,
    grid_yz: Optional[tuple[int, int]] = None,
    order: int = 0,
    ranges: Optional[Iterable[Any]] = None,
    err: Optional[np.ndarray] = None,
    check: bool = True,
    stats: Optional[EmulationStats] = None,
) -> np.ndarray:
    """Run ``rs_recover_commit`` on the host over the whole grid; returns the ``int32[3]`` error word.

    Args:
        metas: :data:`~recoverssm_rs.gpu.COMMIT_META_DTYPE` table (addresses of host memory, e.g.
            :func:`~recoverssm_rs.gpu.build_commit_meta` of CPU tensors).
        rows: :data:`~recoverssm_rs.plan_format.COMMIT_ROW_DTYPE` records.
        num_accepted: optional int32 vector indexed by ``row.request`` (the device-count form).
        grid: ``(rec_ctas, conv_ctas)``; default :func:`~recoverssm_rs.gpu.commit_grid` of ``metas``
            for ``threads``. grid_yz: overrides gridDim.y / gridDim.z (grid-stride folding).
        ranges: memory the kernel may touch besides ``metas``, ``rows`` and ``num_accepted`` (which
            are added); accesses outside are counted. stats: receives the access counters.
            Other arguments as :func:`emulate_state_copy`.
    """
    m = _records(metas, COMMIT_META_DTYPE, "metas")
    rw = _records(rows, COMMIT_ROW_DTYPE, "rows")
    counts = None if num_accepted is None else _i32(num_accepted).reshape(-1)
    if grid is None:
        grid = commit_grid(m, threads=threads)
    rec_ctas, conv_ctas = int(grid[0]), int(grid[1])
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n, layers = len(rw), len(m)
    gy = max(1, min(n, 65535)) if grid_yz is None else grid_yz[0]
    gz = max(1, min(layers, 65535)) if grid_yz is None else grid_yz[1]
    extra: list[Any] = [m, rw] + ([counts] if counts is not None and counts.size else [])
    rng = _ranges_arg(None if ranges is None else list(ranges) + extra)
    if stats is None:
        stats = EmulationStats()
    if n and layers:
        _run("rs_recover_commit", (rec_ctas + conv_ctas, gy, gz), (threads, 1, 1), order, rng, stats,
             m.ctypes.data, layers, rw.ctypes.data, n, 0 if counts is None else counts.ctypes.data,
             0 if counts is None else counts.size, num_blocks, max_requests, rec_ctas, err.ctypes.data)
    if check:
        _check(stats, "rs_recover_commit")
    return err


@dataclass
class CommitTensors:
    """The tensors of a RecoverSSM commit, one entry per layer (torch tensors, any device)."""

    recurrent: list[Any]
    """``[num_blocks, H, V, K]`` per layer."""
    corrections: list[Any]
    """``[max_requests, H, Q, V]`` float32 per layer."""
    keygate: list[Any]
    """``[max_requests, H, Q, K + 1 | 2K]`` per layer."""
    conv: Optional[list[Any]]
    """``[num_blocks, W, D]`` (SD) / ``[num_blocks, D, W]`` (DS) per layer, or ``None``."""
    conv_window: Optional[list[Any]]
    """``[max_requests, same]`` per layer, or ``None``."""
    kind: str
    conv_layout: recurrence.ConvLayout
    conv_kernel_size: int

    def meta(self) -> np.ndarray:
        """The kernel's :data:`~recoverssm_rs.gpu.COMMIT_META_DTYPE` table for these tensors."""
        return build_commit_meta(self.recurrent, self.corrections, self.keygate, self.conv, self.conv_window,
                                 kind=self.kind, conv_layout=self.conv_layout, conv_kernel_size=self.conv_kernel_size)

    def all(self) -> list[Any]:
        out = self.recurrent + self.corrections + self.keygate
        return out + (self.conv or []) + (self.conv_window or [])


def _commit_row_code(row: np.void, num_blocks: int, max_requests: int, num_counts: Optional[int]) -> int:
    req, sb, bb = int(row["request"]), int(row["state_block"]), int(row["boundary_block"])
    code = 0
    if req >= max_requests or (num_counts is not None and req >= num_counts):
        code |= ERR_ARGS
    if sb >= num_blocks or (bb >= 0 and (bb < 1 or bb >= num_blocks or bb == sb)):
        code |= ERR_BLOCK
    return code


def reference_recover_commit(
    tensors: CommitTensors,
    rows: Any,
    num_accepted: Any = None,
    *,
    num_blocks: int,
    max_requests: int,
    err: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The commit kernel's semantics, executed in place on ``tensors`` with the torch reference
    (:func:`recoverssm_rs.recurrence.commit` with boundary states, and
    :func:`~recoverssm_rs.recurrence.compact_conv_window`) -- the same calls ``StateCache.commit``
    makes. Returns the error word the kernel reports for ``rows``.

    Per row: ``state_block <= 0`` is padding; a row the kernel rejects (request / block out of
    range, boundary block equal to the state block) changes nothing; ``count`` is
    ``min(row.count, Q)``, or ``clamp(num_accepted[request], 0, row.count)`` with ``num_accepted``;
    ``count == 0`` changes nothing; the boundary is written when ``boundary_block >= 0`` and
    ``1 <= boundary_len <= count``.
    """
    import torch

    from . import recurrence

    rw = _records(rows, COMMIT_ROW_DTYPE, "rows")
    counts_in = None if num_accepted is None else np.asarray(num_accepted, dtype=np.int64).reshape(-1)
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n = len(rw)
    ok = np.zeros(n, dtype=bool)
    for i in range(n):
        if int(rw[i]["state_block"]) <= 0:
            continue
        code = _commit_row_code(rw[i], num_blocks, max_requests, None if counts_in is None else counts_in.size)
        if code:
            _report(err, code, i, n)
        else:
            ok[i] = True
    r = rw[ok]
    if len(r) == 0:
        return err
    req_np = r["request"].astype(np.int64)
    cnt = r["count"].astype(np.int64)
    if counts_in is not None:
        cnt = np.clip(counts_in[req_np], 0, cnt)
    for layer in range(len(tensors.recurrent)):
        rec, corr, kg = tensors.recurrent[layer], tensors.corrections[layer], tensors.keygate[layer]
        q = int(corr.shape[2])
        nl = np.minimum(cnt, q)
        moved = nl > 0
        if not moved.any():
            continue
        rm, nm = r[moved], nl[moved]
        blen = rm["boundary_len"].astype(np.int64)
        has_b = (rm["boundary_block"] >= 0) & (blen >= 1) & (blen <= nm)
        dev = rec.device
        req = torch.as_tensor(rm["request"].astype(np.int64), device=dev)
        sb = torch.as_tensor(rm["state_block"].astype(np.int64), device=dev)
        n_t = torch.as_tensor(nm, device=dev)
        s0 = rec[sb]
        bout = torch.empty_like(s0) if has_b.any() else None
        bcounts = torch.as_tensor(np.where(has_b, blen, -1), device=dev)
        new = recurrence.commit(s0, corr[req], kg[req], n_t, boundary_counts=bcounts if bout is not None else None,
                                boundary_out=bout)
        bmask = torch.as_tensor(has_b, device=dev)
        bb = torch.as_tensor(rm["boundary_block"][has_b].astype(np.int64), device=dev)
        if bout is not None:
            rec[bb] = bout[bmask]
        rec[sb] = new
        if tensors.conv is not None and tensors.conv_window is not None:
            conv, win = tensors.conv[layer], tensors.conv_window[layer][req]
            kc_, lay = tensors.conv_kernel_size, tensors.conv_layout
            if bout is not None:
                conv[bb] = recurrence.compact_conv_window(win[bmask], bcounts[bmask], kc_, lay)
            conv[sb] = recurrence.compact_conv_window(win, n_t, kc_, lay)
    return err




@dataclass
class CommitProblem:
    """A random commit problem: the tensors as views at byte offsets of one arena (so the same
    problem can be laid on two arenas -- emulated kernel and reference -- or on a CUDA arena), the
    rows and the optional device counts."""

    arena_size: int
    specs: list[tuple[str, int, int, tuple[int, ...], str, int]]
    """(name, layer, byte offset, shape, dtype, first-axis stride in elements)."""
    kind: str
    conv_layout: recurrence.ConvLayout
    conv_kernel_size: int
    num_blocks: int
    max_requests: int
    rows: np.ndarray
    num_accepted: Optional[np.ndarray]

    def tensors(self, arena: Any) -> CommitTensors:
        """The problem's tensors as views of ``arena`` (a 1-D uint8 torch tensor of arena_size bytes)."""
        import torch

        out: dict[str, list[Any]] = {k: [] for k in ("recurrent", "corrections", "keygate", "conv", "conv_window")}
        for name, _layer, off, shape, dtype, stride0 in self.specs:
            dt = getattr(torch, dtype)
            es = torch.empty((), dtype=dt).element_size()
            inner = int(np.prod(shape[1:]))
            nbytes = ((shape[0] - 1) * stride0 + inner) * es
            flat = arena[off : off + nbytes].view(dt)
            strides = [stride0] + [int(np.prod(shape[i + 1 :])) for i in range(1, len(shape))]
            out[name].append(flat.as_strided(shape, strides))
        has_conv = bool(out["conv"])
        return CommitTensors(out["recurrent"], out["corrections"], out["keygate"],
                             out["conv"] if has_conv else None, out["conv_window"] if has_conv else None,
                             self.kind, self.conv_layout, self.conv_kernel_size)

    def fill(self, arena: Any, seed: int) -> None:
        """Random bytes everywhere, then sensible values in the tensors: states ~ N(0, 0.25),
        corrections ~ N(0, 1), keys ~ N(0, 1/K), log-gates in (-3, 0), conv values ~ N(0, 1)."""
        import torch

        g = torch.Generator().manual_seed(seed)
        arena.copy_(torch.randint(0, 256, (arena.numel(),), dtype=torch.uint8, generator=g))
        t = self.tensors(arena)
        for x in t.recurrent:
            x.copy_(torch.randn(x.shape, generator=g) * 0.5)
        for x in t.corrections:
            x.copy_(torch.randn(x.shape, generator=g))
        for x in t.keygate:
            k = t.recurrent[0].shape[-1]
            x[..., :k].copy_(torch.randn(x[..., :k].shape, generator=g) / max(1.0, k**0.5))
            x[..., k:].copy_(-3.0 * torch.rand(x[..., k:].shape, generator=g))
        for x in (t.conv or []) + (t.conv_window or []):
            x.copy_(torch.randn(x.shape, generator=g))


def random_commit_problem(
    rng: np.random.Generator,
    *,
    kind: Optional[str] = None,
    dtypes: Optional[tuple[str, str]] = None,
    device_counts: Optional[bool] = None,
    max_rows: int = 6,
    max_layers: int = 3,
    conv: Optional[str] = None,
) -> CommitProblem:
    """A random problem for ``rs_recover_commit`` honouring the host's guarantees (every block is
    written by one row at most, no row writes a block another row reads).

    Mixes GDN / KDA, the kernel's (state, key+gate) dtype pairs, head sizes that are and are not
    multiples of 4 (vector and element paths), several layers, padding rows, counts 0 .. Q (and
    device counts beyond both ends), boundary rows, SD / DS / no conv windows of 2- and 4-byte
    elements, misaligned bases and padded block / row strides. ``conv`` forces "SD", "DS" or "none".
    """
    kind = kind or str(rng.choice(["gdn", "kda"]))
    sdt, kdt = dtypes or COMMIT_DTYPE_PAIRS[int(rng.integers(0, len(COMMIT_DTYPE_PAIRS)))]
    if device_counts is None:
        device_counts = bool(rng.random() < 0.35)
    conv = conv or str(rng.choice(["SD", "DS", "DS", "SD", "none"]))
    H = int(rng.integers(1, 4))
    K = int(rng.choice([1, 3, 4, 5, 8, 8, 12, 16, 16, 32]))
    V = int(rng.integers(1, 41))
    Q = int(rng.integers(1, 6))
    L = int(rng.integers(1, max_layers + 1))
    kc_ = int(rng.integers(1, 5))
    D = int(rng.integers(1, 41))
    cdt = str(rng.choice(["bfloat16", "float32", "float16"]))
    W = kc_ - 1 + Q - 1
    R = int(rng.integers(1, max_rows + 1))
    MR = R + int(rng.integers(0, 3))
    nb = 2 * R + 2 + int(rng.integers(0, 4))
    kgw = 2 * K if kind == "kda" else K + 1
    es = {"float32": 4, "bfloat16": 2, "float16": 2}
    specs: list[tuple[str, int, int, tuple[int, ...], str, int]] = []
    off = int(rng.integers(0, 64))

    def place(name: str, layer: int, shape: tuple[int, ...], dtype: str) -> None:
        nonlocal off
        e = es[dtype]
        inner = int(np.prod(shape[1:]))
        stride0 = inner + (int(rng.integers(1, 5)) if rng.random() < 0.3 else 0)
        off = (off + e - 1) // e * e
        if rng.random() < 0.5:
            off = (off + 15) // 16 * 16
        specs.append((name, layer, off, shape, dtype, stride0))
        off += ((shape[0] - 1) * stride0 + inner) * e + int(rng.integers(0, 40))

    for layer in range(L):
        place("recurrent", layer, (nb, H, V, K), sdt)
        place("corrections", layer, (MR, H, Q, V), "float32")
        place("keygate", layer, (MR, H, Q, kgw), kdt)
        if conv != "none":
            shape = (W, D) if conv == "SD" else (D, W)
            place("conv", layer, (nb,) + shape, cdt)
            place("conv_window", layer, (MR,) + shape, cdt)
    rows = np.zeros(R, dtype=COMMIT_ROW_DTYPE)
    blocks = rng.permutation(np.arange(1, nb))
    reqs = rng.permutation(MR)[:R]
    for i in range(R):
        sb = int(blocks[2 * i])
        cnt = int(rng.integers(0, Q + 1))
        if rng.random() < 0.3:
            cnt = Q
        bb, blen = -1, 0
        if cnt >= 1 and rng.random() < 0.45:
            bb, blen = int(blocks[2 * i + 1]), int(rng.integers(1, cnt + 1))
        if rng.random() < 0.12:
            sb = int(rng.choice([0, -1]))  # padding
        rows[i] = (int(reqs[i]), cnt, sb, bb, blen, 0)
    counts = None
    if device_counts:
        counts = rng.integers(-2, Q + 3, size=MR + int(rng.integers(0, 3))).astype(np.int32)
    layout: recurrence.ConvLayout = "SD" if conv == "SD" else "DS"  # no conv state: either
    return CommitProblem(off + 64, specs, kind, layout, kc_, nb, MR, rows, counts)
