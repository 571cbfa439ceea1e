"""Host emulation of the package's CUDA kernels: the kernel sources compiled as host C++ through
``tests/support/host_shim.h`` into a shared library (cached by source hash) and run over the whole grid on
numpy buffers, counting misaligned and out-of-range data accesses and barriers. The builds are
kept in a per-user cache folder checked to be private (see :func:`_cache_dir`).

Every emulated launch is a :class:`~recoverssm_rs._core.KernelLaunch` built by the core -- by the
same launch builders the CUDA path uses (``FusedCopy``, ``CommitLaunch``, ``copy_tiles_launch``), over
host arrays described as if they lived on ``cuda:0`` -- and the host entry point takes its argument
buffer as the kernel's one parameter, the record the generated header declares (its size checked
against the buffer, its field offsets against the core's by the header's ``static_assert`` checks): the
emulation checks the core's record too.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from recoverssm_rs import _core
from recoverssm_rs.cuda.module import KERNEL_DIR
from recoverssm_rs.plan_format import (
    ABI,
    COMMIT_META_DTYPE,
    COMMIT_ROW_DTYPE,
    CONSTANTS,
    SEGMENT_DTYPE,
    STATE_META_DTYPE,
    TILE_DTYPE,
)

from .references import records_of

__all__ = [
    "EmulationError",
    "EmulationStats",
    "THREADS",
    "host_library",
    "host_build_warnings",
    "device_desc",
    "run",
    "emulate_copy_tiles",
    "emulate_state_copy",
    "emulate_recover_commit",
]

THREADS: int = CONSTANTS["RS_THREADS"]
#: The host shim that makes the kernel sources host C++ (test tooling: not in the package).
SHIM = Path(__file__).resolve().with_name("host_shim.h")
_FILES = {k["name"]: k["file"] for k in ABI["kernels"]}

HOST_CXX = os.environ.get("RECOVERSSM_CXX", "g++")
HOST_CXX_FLAGS = (
    "-x",
    "c++",
    "-std=c++17",
    "-O1",
    "-fno-strict-aliasing",
    "-fvisibility=hidden",
    "-fno-gnu-unique",
    "-Wall",
    "-Wextra",
    "-shared",
    "-fPIC",
)

_log = logging.getLogger("recoverssm_rs.tests.emulation")
_host_lock = threading.Lock()
_host_libs: dict[str, ctypes.CDLL] = {}
_host_warnings: dict[str, str] = {}

_RUNNER = [
    ctypes.POINTER(ctypes.c_uint),  # grid[3]
    ctypes.POINTER(ctypes.c_uint),  # block[3]
    ctypes.c_ulonglong,  # order
    ctypes.POINTER(ctypes.c_ulonglong),  # ranges
    ctypes.c_int,  # num_ranges
    ctypes.POINTER(ctypes.c_longlong),  # counters[4]
    ctypes.c_void_p,  # packed arguments
    ctypes.c_ulonglong,  # their size
]


class EmulationError(AssertionError):
    """The host emulation saw a misaligned or out-of-range access, or a barrier."""


_cache_lock = threading.Lock()
_cache: Path | None = None


def private_dir(path: Path) -> bool:
    """Whether ``path`` is a real folder (no link) that this user owns and only this user can
    write, read or enter (mode 0700): the libraries built there are loaded into this process."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


def _cache_dir() -> Path:
    """Where host builds are kept across runs: ``$RECOVERSSM_HOST_CACHE``, default
    ``$XDG_CACHE_HOME/recoverssm_rs/host-kernels`` (``XDG_CACHE_HOME``: ``~/.cache``), created mode
    0700 and used only while :func:`private_dir` holds; else (another owner, other users' access,
    a link) a private temporary folder of this process's own (``mkdtemp``, removed at exit), which
    is logged."""
    global _cache
    with _cache_lock:
        if _cache is not None:
            return _cache
        given = os.environ.get("RECOVERSSM_HOST_CACHE")
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        d = Path(given) if given else Path(base) / "recoverssm_rs" / "host-kernels"
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            _log.warning("host emulation: cannot create %s (%s); using a private temporary folder", d, exc)
        if not private_dir(d):
            if d.is_dir():
                _log.warning(
                    "host emulation: %s is not a private folder of this user (mode 0700, "
                    "owned by uid %d); using a private temporary folder",
                    d,
                    os.getuid(),
                )
            d = Path(tempfile.mkdtemp(prefix="recoverssm_rs-host-kernels-"))
            atexit.register(shutil.rmtree, d, ignore_errors=True)
        _cache = d
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
        for part in sorted(KERNEL_DIR.glob("*.cuh")) + [SHIM, KERNEL_DIR / name]:
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
            cmd = [
                cxx,
                *HOST_CXX_FLAGS,
                "-include",
                str(SHIM),
                "-I",
                str(KERNEL_DIR),
                "-o",
                str(tmp),
                str(KERNEL_DIR / name),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"host build of {name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
            log.write_text(proc.stderr)
            os.replace(tmp, so)
        _host_warnings[name] = log.read_text() if log.exists() else ""
        lib = ctypes.CDLL(str(so))
        for entry, fname in _FILES.items():
            if fname == name:
                fn = getattr(lib, f"rs_host_{entry}")
                fn.argtypes = _RUNNER
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

    def check(self, what: str) -> None:
        """Raise :class:`EmulationError` on any misaligned / out-of-range access or barrier."""
        if self.misaligned or self.out_of_range or self.barriers:
            raise EmulationError(
                f"{what}: {self.misaligned} misaligned and {self.out_of_range} out-of-range accesses, "
                f"{self.barriers} barriers (of {self.accesses} accesses)"
            )


def _ranges_arg(ranges: Iterable[Any] | None) -> tuple[Any, int]:
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


def device_desc(x: np.ndarray) -> Any:
    """A host array as if it lived on ``cuda:0`` (a ``__cuda_array_interface__`` over its memory: the
    core only checks and packs launches; the emulation runs the kernel on the host addresses)."""
    from .fakes import FakeDeviceArray

    return FakeDeviceArray(int(x.ctypes.data), tuple(x.shape), tuple(x.strides), dtype=x.dtype.name)


def run(
    kl: Any,
    *,
    grid: Sequence[int] | None = None,
    block: Sequence[int] | None = None,
    order: int = 0,
    ranges: Iterable[Any] | None = None,
    stats: EmulationStats | None = None,
) -> EmulationStats:
    """Run one core-built launch on the host (its grid and block unless overridden).

    ``order``: thread execution order (0 natural, 1 reversed, other: a seeded shuffle of the grid).
    ``ranges``: memory the kernel may touch (arrays or (lo, hi) address pairs); accesses outside are
    counted.
    """
    lib = host_library(_FILES[kl.kernel])
    g = (ctypes.c_uint * 3)(*[int(x) for x in (grid or kl.grid)])
    b = (ctypes.c_uint * 3)(*[int(x) for x in (block or kl.block)])
    counters = (ctypes.c_longlong * 4)()
    rng, nrng = _ranges_arg(ranges)
    rc = getattr(lib, f"rs_host_{kl.kernel}")(
        g, b, ctypes.c_ulonglong(order), rng, nrng, counters, kl.args_ptr, kl.args_size
    )
    if rc == -2:
        raise EmulationError(
            f"{kl.kernel}: the core filled {kl.args_size} argument bytes, the kernel's parameter record takes another size"
        )
    if stats is None:
        stats = EmulationStats()
    stats.add(list(counters))
    return stats


def emulate_copy_tiles(
    segments: Any,
    tiles: Any,
    wave_starts: Sequence[int] | None = None,
    *,
    threads: int = THREADS,
    grid: int | None = None,
    order: int = 0,
    ranges: Iterable[Any] | None = None,
    check: bool = True,
) -> EmulationStats:
    """Run ``rs_copy_tiles`` on the host, one emulated launch per wave, in wave order.

    ``segments`` / ``tiles``: ``SEGMENT_DTYPE`` / ``TILE_DTYPE`` arrays (or raw bytes) whose
    addresses point into live host memory; ``wave_starts``: tile offsets of each wave (default: one
    wave of all tiles); ``threads``: blockDim.x; ``grid``: the most CTAs per launch (default: one
    per tile).
    """
    seg = records_of(segments, SEGMENT_DTYPE, "segments")
    til = records_of(tiles, TILE_DTYPE, "tiles")
    if wave_starts is None:
        wave_starts = [0, len(til)]
    stats = EmulationStats()
    for w in range(len(wave_starts) - 1):
        first, n = int(wave_starts[w]), int(wave_starts[w + 1]) - int(wave_starts[w])
        kl = _core.copy_tiles_launch(
            segments=int(seg.ctypes.data), tiles=int(til.ctypes.data), first_tile=first, num_tiles=n, max_ctas=grid
        )
        if kl is not None:
            run(kl, block=(threads, 1, 1), order=order, ranges=ranges, stats=stats)
    if check:
        stats.check("rs_copy_tiles")
    return stats


def _i32(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def emulate_state_copy(
    metas: Any,
    block_table: Any,
    src_col: Any,
    dst_or_running: Any,
    num_accepted: Any,
    *,
    max_accepted: int,
    num_blocks: int,
    block_size: int | None = None,
    has_temporal: bool | None = None,
    chunks: int = 4,
    threads: int = THREADS,
    grid_yz: tuple[int, int] | None = None,
    order: int = 0,
    ranges: Iterable[Any] | None = None,
    err: np.ndarray | None = None,
    check: bool = True,
) -> np.ndarray:
    """Run ``rs_state_copy`` on the host through the core's ``FusedCopy``; returns the ``int32[3]``
    error word. ``dst_or_running`` is ``dst_col``, or ``running`` with a ``block_size`` (the device
    decision). ``has_temporal`` defaults to "some meta is temporal"; ``grid_yz`` overrides
    gridDim.y/z (to exercise the grid-stride folding)."""
    m = records_of(metas, STATE_META_DTYPE, "metas")
    bt = np.asarray(block_table, dtype=np.int32)
    if bt.ndim != 2 or (bt.shape[1] > 1 and bt.strides[1] != 4):
        bt = np.ascontiguousarray(bt)
    s, x, a = _i32(src_col), _i32(dst_or_running), _i32(num_accepted)
    if has_temporal is None:
        has_temporal = bool(np.any(m["kind"] == CONSTANTS["RS_KIND_TEMPORAL"]))
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    fused = _core.FusedCopy(
        device="cuda:0",
        metas=int(m.ctypes.data),
        num_meta=len(m),
        max_accepted=max_accepted,
        num_blocks=num_blocks,
        has_temporal=bool(has_temporal),
        chunks=chunks,
        err=int(err.ctypes.data),
    )
    kl = fused.launch(
        block_table=device_desc(bt),
        src_col=device_desc(s),
        second=device_desc(x),
        num_accepted=device_desc(a),
        block_size=block_size,
    )
    stats = EmulationStats()
    if kl is not None:
        grid = None if grid_yz is None else (kl.grid[0], grid_yz[0], grid_yz[1])
        run(kl, grid=grid, block=(threads, 1, 1), order=order, ranges=ranges, stats=stats)
    if check:
        stats.check("rs_state_copy")
    return err


def emulate_recover_commit(
    metas: Any,
    rows: Any,
    *,
    num_blocks: int,
    max_requests: int,
    num_accepted: Any = None,
    grid: Sequence[int] | None = None,
    threads: int = THREADS,
    grid_yz: tuple[int, int] | None = None,
    order: int = 0,
    ranges: Iterable[Any] | None = None,
    err: np.ndarray | None = None,
    check: bool = True,
    stats: EmulationStats | None = None,
) -> np.ndarray:
    """Run ``rs_recover_commit`` on the host over the whole grid; returns the ``int32[3]`` error word.

    The launch is the core's ``CommitLaunch`` for ``threads`` threads per CTA. ``grid``: an explicit
    ``(rec_ctas, conv_ctas)`` (the parameter record filled by field name with the core's raw packer,
    to test grids the core would not choose); ``grid_yz`` overrides gridDim.y / gridDim.z. ``ranges``: memory the kernel may touch
    besides ``metas``, ``rows`` and ``num_accepted`` (which are added).
    """
    m = records_of(metas, COMMIT_META_DTYPE, "metas")
    rw = records_of(rows, COMMIT_ROW_DTYPE, "rows")
    counts = None if num_accepted is None else _i32(num_accepted).reshape(-1)
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n, layers = len(rw), len(m)
    extra: list[Any] = [m, rw] + ([counts] if counts is not None and counts.size else [])
    rng = None if ranges is None else list(ranges) + extra
    if stats is None:
        stats = EmulationStats()
    if n and layers:
        if grid is None:
            ck = _core.CommitLaunch(
                m.view(np.uint8),
                device="cuda:0",
                metas=int(m.ctypes.data),
                num_blocks=num_blocks,
                max_requests=max_requests,
                err=int(err.ctypes.data),
                threads=threads,
            )
            kl = ck.launch(
                rows=device_desc(rw.view(np.uint8)), num_accepted=None if counts is None else device_desc(counts)
            )
        else:
            rec_ctas, conv_ctas = int(grid[0]), int(grid[1])
            fields = {
                "metas": int(m.ctypes.data),
                "num_layers": layers,
                "rows": int(rw.ctypes.data),
                "num_rows": n,
                "num_accepted": 0 if counts is None else int(counts.ctypes.data),
                "num_counts": 0 if counts is None else counts.size,
                "num_blocks": num_blocks,
                "max_requests": max_requests,
                "rec_ctas": rec_ctas,
                "err": int(err.ctypes.data),
                "reserved": 0,
            }
            kl = _core.pack_launch(
                "rs_recover_commit", (rec_ctas + conv_ctas, min(n, 65535), min(layers, 65535)), (threads, 1, 1), fields
            )
        if kl is not None:
            g = None if grid_yz is None else (kl.grid[0], grid_yz[0], grid_yz[1])
            run(kl, grid=g, order=order, ranges=rng, stats=stats)
    if check:
        stats.check("rs_recover_commit")
    return err
