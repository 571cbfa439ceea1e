"""Compiling the package's CUDA kernels with NVRTC, without a GPU or a driver: every ``.cu`` source
(and the combined module the launch layer loads) for sm_80 and sm_90, to CUBIN with ptxas's resource
report (registers, stack frame, spills, barriers per kernel) and to PTX, with the options
``cupy.RawModule`` uses. The checkout's ``scripts/check_kernels.py`` runs it with the user's NVRTC.

A compile takes seconds per file; with ``cache`` (a directory, e.g. :func:`default_cache_dir`)
each report is kept under a key of everything that decides it -- the source with its headers
inlined, the options, the target, the NVRTC library (path, size, modification time, version) --
and processes that compile the same source at once wait on a file lock for the first one's
result instead of compiling it again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import backend_check
from ..errors import BackendUnavailableError
from .module import KERNEL_DIR, MODULE_OPTIONS, kernel_source, module_source

__all__ = [
    "ARCHS",
    "NvrtcUnavailableError",
    "KernelResources",
    "CompileReport",
    "find_nvrtc",
    "nvrtc_version",
    "cupy_nvrtc_options",
    "nvrtc_compile",
    "parse_ptxas_log",
    "compile_all",
    "resource_table",
    "default_cache_dir",
]

#: Architectures checked (A100, H100/H200).
ARCHS = (80, 90)


class NvrtcUnavailableError(BackendUnavailableError):
    """The NVRTC shared library could not be found or loaded."""


# NVRTC
# ================================================================================================


def find_nvrtc() -> Path | None:
    """Path of the NVRTC library the compile checks use.

    In order: the file named by ``RECOVERSSM_NVRTC``; the NVRTC wheel of the installed CuPy's CUDA
    major (the NVRTC CuPy compiles with: ``libnvrtc.so.13`` of ``nvidia-cuda-nvrtc`` 13, which
    torch from PyPI brings, for ``cupy-cuda13x``; ``libnvrtc.so.12`` of ``nvidia-cuda-nvrtc-cu12``
    for ``cupy-cuda12x``); then the other major's wheel, newest first; else the system's
    ``libnvrtc`` (a CUDA toolkit on the loader path).
    """
    override = os.environ.get("RECOVERSSM_NVRTC")
    if override:
        path = Path(override)
        if not path.is_file():
            raise NvrtcUnavailableError(f"RECOVERSSM_NVRTC={override}: no such file")
        return path
    for major in _majors():
        for c in _wheel_candidates(major):
            if c.is_file():
                return c
    found = ctypes.util.find_library("nvrtc")
    return Path(found) if found else None


def _majors() -> tuple[int, ...]:
    """CUDA majors to take NVRTC from: the installed CuPy wheels' first, then 13, then 12."""
    return tuple(dict.fromkeys([*backend_check.cupy_cuda_majors(), 13, 12]))


def _wheel_candidates(major: int) -> list[Path]:
    """Where the NVRTC wheel of CUDA ``major`` puts its library, on sys.path."""
    if major >= 13:  # one folder per major: nvidia/cu13/lib
        return [Path(e) / "nvidia" / f"cu{major}" / "lib" / f"libnvrtc.so.{major}" for e in sys.path]
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        for loc in spec.submodule_search_locations or ():
            candidates.append(Path(loc) / "lib" / f"libnvrtc.so.{major}")
    candidates += [Path(e) / "nvidia" / "cuda_nvrtc" / "lib" / f"libnvrtc.so.{major}" for e in sys.path]
    return candidates


_nvrtc_lock = threading.Lock()
_nvrtc_lib: ctypes.CDLL | None = None
_nvrtc_path: Path | None = None  # the file _nvrtc_lib was loaded from


def _nvrtc() -> ctypes.CDLL:
    global _nvrtc_lib, _nvrtc_path
    with _nvrtc_lock:
        if _nvrtc_lib is None:
            path = find_nvrtc()
            if path is None:
                raise NvrtcUnavailableError(f"libnvrtc not found: {backend_check.nvrtc_install_hint()}")
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise NvrtcUnavailableError(f"cannot load {path}: {exc}") from exc
            vp = ctypes.c_void_p
            lib.nvrtcCreateProgram.argtypes = [
                ctypes.POINTER(vp),
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_char_p),
                ctypes.POINTER(ctypes.c_char_p),
            ]
            lib.nvrtcCompileProgram.argtypes = [vp, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(vp)]
            for fn in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
                getattr(lib, fn).argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
            for fn in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
                getattr(lib, fn).argtypes = [vp, ctypes.c_char_p]
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            _nvrtc_lib, _nvrtc_path = lib, path
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
        from cupy._core.core import assemble_cupy_compiler_options

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
    current: str | None = None
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


def default_cache_dir() -> Path:
    """Where the test suite keeps compile reports: ``$RECOVERSSM_CACHE_DIR/nvrtc``, else
    ``$XDG_CACHE_HOME/recoverssm_rs/nvrtc`` (``~/.cache/recoverssm_rs/nvrtc``)."""
    root = os.environ.get("RECOVERSSM_CACHE_DIR")
    if root:
        return Path(root) / "nvrtc"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recoverssm_rs" / "nvrtc"


#: Bumped when :class:`CompileReport` or the key changes: older entries are never read.
_CACHE_FORMAT = 3


_identity_memo: dict[Path, dict[str, object]] = {}


def _library_identity() -> dict[str, object]:
    """The NVRTC library compiles go to (loaded once per process): its version, size and content
    hash (hashed once per process) -- not its path or modification time, so that the same library
    installed into another virtual environment (a fresh clone's) finds the reports already made."""
    version = list(nvrtc_version())
    path = _nvrtc_path
    if path is None:
        return {"version": version, "size": None, "sha256": None}
    if path not in _identity_memo:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        _identity_memo[path] = {"version": version, "size": path.stat().st_size, "sha256": digest.hexdigest()}
    return _identity_memo[path]


_include_memo: dict[str, str] = {}


def _include_identity(folder: str) -> str:
    """An include folder by what it holds (each file's path in it and size, walked once per process),
    not where it is: the same CuPy and CUDA headers installed into another virtual environment (a
    fresh clone's) give the same key."""
    if folder not in _include_memo:
        digest = hashlib.sha256()
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for f in sorted(files):
                path = os.path.join(root, f)
                try:
                    size = os.stat(path).st_size
                except OSError:
                    size = -1
                digest.update(f"{os.path.relpath(path, folder)}\0{size}\n".encode())
        _include_memo[folder] = digest.hexdigest()
    return _include_memo[folder]


def _keyed_option(option: str) -> str:
    return f"-I<{_include_identity(option[2:])}>" if option.startswith("-I") else option


def _cache_key(name: str, arch: int, target: str, text: str, options: Sequence[str]) -> str:
    blob = json.dumps(
        {
            "format": _CACHE_FORMAT,
            "name": name,
            "arch": arch,
            "target": target,
            "source": hashlib.sha256(text.encode()).hexdigest(),
            "options": [_keyed_option(o) for o in options],
            "nvrtc": _library_identity(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_report(path: Path) -> CompileReport | None:
    try:
        d = json.loads(path.read_text())
        d["options"] = tuple(d["options"])
        d["kernels"] = [KernelResources(**k) for k in d["kernels"]]
        return CompileReport(**d)
    except (OSError, ValueError, TypeError, KeyError):
        return None  # missing, or written by another format: compiled again


def nvrtc_compile(
    name: str,
    arch: int,
    *,
    target: str = "cubin",
    source: str | None = None,
    verbose: bool = True,
    cache: str | os.PathLike[str] | None = None,
) -> CompileReport:
    """Compile one kernel file (``name`` under ``kernels/``, includes inlined) or ``source``.

    ``target="cubin"`` compiles with ``-arch=sm_XX`` (plus ``-Xptxas=-v`` when ``verbose``) and parses
    the resource report; ``target="ptx"`` compiles with ``-arch=compute_XX``. With ``cache`` (a
    directory), a successful report is kept there and reused while nothing that decides it changes
    (see the module's docstring); concurrent callers of one key compile it once.
    """
    if target not in ("cubin", "ptx"):
        raise ValueError("target must be 'cubin' or 'ptx'")
    text = kernel_source(name) if source is None else source
    extra = ("-Xptxas=-v",) if (verbose and target == "cubin") else ()
    options = cupy_nvrtc_options(arch, cubin=target == "cubin", extra=extra)
    if cache is None:
        return _compile(name, arch, target, text, options)
    folder = Path(cache)
    folder.mkdir(parents=True, exist_ok=True)
    key = _cache_key(name, arch, target, text, options)
    entry = folder / f"{key}.json"
    with open(folder / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process compiling this key: wait for its entry
        report = _read_report(entry)
        if report is None:
            report = _compile(name, arch, target, text, options)
            if report.ok:
                tmp = folder / f"{key}.{os.getpid()}.tmp"
                tmp.write_text(json.dumps(asdict(report)))
                os.replace(tmp, entry)
    return report


def _compile(name: str, arch: int, target: str, text: str, options: tuple[str, ...]) -> CompileReport:
    lib = _nvrtc()
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


def compile_all(
    archs: Sequence[int] = ARCHS,
    *,
    ptx: bool = True,
    module: bool = True,
    cache: str | os.PathLike[str] | None = None,
) -> list[CompileReport]:
    """Compile every kernel source (and the combined module) for every architecture.

    Returns one :class:`CompileReport` per (file, arch, target); the CUBIN reports carry the
    per-kernel :class:`KernelResources`. The combined module appears as file ``"<module>"``.
    ``cache``: as :func:`nvrtc_compile`'s.
    """
    names = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    reports: list[CompileReport] = []
    for arch in archs:
        for name in names:
            reports.append(nvrtc_compile(name, arch, target="cubin", cache=cache))
            if ptx:
                reports.append(nvrtc_compile(name, arch, target="ptx", cache=cache))
        if module:
            reports.append(nvrtc_compile("<module>", arch, target="cubin", source=module_source(), cache=cache))
    return reports


def resource_table(reports: Iterable[CompileReport]) -> str:
    """A plain-text table of the CUBIN resource reports."""
    lines = [
        f"{'file':<16} {'kernel':<22} {'arch':>5} {'regs':>5} {'stack':>6} {'spill st':>9} {'spill ld':>9} {'bar':>4}"
    ]
    for rep in reports:
        for k in rep.kernels:
            lines.append(
                f"{k.file:<16} {k.kernel:<22} {'sm_' + str(k.arch):>5} {k.registers:>5} {k.stack_frame:>6} "
                f"{k.spill_stores:>9} {k.spill_loads:>9} {k.barriers:>4}"
            )
    return "\n".join(lines)
