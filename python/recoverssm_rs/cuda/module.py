"""Kernel loading: the CUDA sources shipped in the package, the one CuPy module compiled from them,
function handles per device, the caller's stream, and the launch of a core-built
:class:`~recoverssm_rs._core.KernelLaunch`.

The module is compiled once per process with NVRTC (``cupy.RawModule``, options
:data:`MODULE_OPTIONS`). A launch is ``cuLaunchKernel(function, grid, block, 0, stream, NULL,
extra)`` with ``extra`` pointing at the core's packed arguments: nothing here knows a kernel's
parameters.
"""

from __future__ import annotations

import logging
import numbers
import re
import threading
from pathlib import Path
from typing import Any

from .._core import KernelLaunch
from ..errors import BackendUnavailableError, PlanError
from ..plan_format import ABI

__all__ = [
    "KERNEL_DIR",
    "KERNEL_FILES",
    "KERNEL_NAMES",
    "MODULE_OPTIONS",
    "kernel_source",
    "module_source",
    "load_module",
    "get_kernel",
    "function_ptr",
    "stream_handle",
    "launch",
    "address",
]

_LOG = logging.getLogger("recoverssm_rs")

#: Folder of the CUDA sources shipped inside the package.
KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"
#: Kernel translation units, in module order (the core's list).
KERNEL_FILES: tuple[str, ...] = tuple(ABI["kernel_files"])
#: Entry points of the module (``extern "C"``, so the names are not mangled; the core's list).
KERNEL_NAMES: tuple[str, ...] = tuple(k["name"] for k in ABI["kernels"])
#: Options given to ``cupy.RawModule`` (CuPy appends its own: include paths, ``-ftz=true``,
#: ``-arch=sm_XX``, ``--device-as-default-execution-space``).
MODULE_OPTIONS = ("--std=c++17", "-DRECOVERSSM_KERNELS=1")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def _expand(name: str, seen: set[str]) -> str:
    text = (KERNEL_DIR / name).read_text(encoding="utf-8")
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


_HINT = (
    "The CUDA executor needs CuPy and a CUDA GPU: install the package's GPU extra matching your "
    "CUDA (`pip install cupy-cuda12x` for CUDA 12, `cupy-cuda13x` for CUDA 13), or use CPU tensors "
    "(host executor)."
)
_lock = threading.Lock()
_module: Any = None
_kernels: dict[str, Any] = {}
_functions: dict[tuple[str, int], int] = {}
_cupy_ok: Any = None


def _cupy() -> Any:
    """The cupy module, once it is known to see a device (checked once: no CUDA call afterwards,
    so launches stay legal inside a CUDA-graph capture)."""
    global _cupy_ok
    if _cupy_ok is not None:
        return _cupy_ok
    from ..backend_check import gpu_stack_problem

    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailableError(f"CuPy is not importable ({exc}). {gpu_stack_problem() or _HINT}") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver / device
        raise BackendUnavailableError(f"CuPy found no usable CUDA device ({exc}). {_HINT}") from exc
    if count < 1:
        raise BackendUnavailableError(f"CuPy found no CUDA device. {_HINT}")
    problem = gpu_stack_problem()
    if problem is not None:
        # A CuPy for another CUDA major often still runs (the driver serves both); say so once.
        _LOG.warning("recoverssm_rs: %s", problem)
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
            module = _cupy().RawModule(code=module_source(), options=MODULE_OPTIONS)
            module.compile()
            _LOG.debug("recoverssm_rs kernels compiled (options %s)", " ".join(MODULE_OPTIONS))
            _module = module
    return _module


def get_kernel(name: str) -> Any:
    """One kernel of :func:`load_module` (a ``cupy.RawKernel``), cached by name, with its function
    handle loaded on the current device (so a later launch there, for example inside a CUDA-graph
    capture, loads nothing)."""
    kernel = _kernels.get(name)
    if kernel is None:
        if name not in KERNEL_NAMES:
            raise KeyError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_NAMES)}")
        kernel = load_module().get_function(name)
        _kernels[name] = kernel
    function_ptr(name, int(_cupy().cuda.runtime.getDevice()))
    return kernel


def function_ptr(name: str, device_index: int) -> int:
    """The ``CUfunction`` handle of kernel ``name`` loaded on ``cuda:device_index`` (cached)."""
    key = (name, device_index)
    fn = _functions.get(key)
    if fn is None:
        kernel = _kernels.get(name)
        if kernel is None:
            if name not in KERNEL_NAMES:
                raise KeyError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_NAMES)}")
            kernel = _kernels[name] = load_module().get_function(name)
        with _cupy().cuda.Device(device_index):
            fn = int(kernel.kernel.ptr)
        _functions[key] = fn
    return fn


def stream_handle(stream: Any, device_index: int) -> int:
    """The ``cudaStream_t`` of ``stream``: a ``torch.cuda.Stream`` (``.cuda_stream``), a CuPy stream
    (``.ptr``), a raw handle (int), or ``None`` (torch's current stream on ``cuda:device_index``:
    inside ``torch.cuda.graph(...)`` the capture stream, so launches are captured)."""
    if isinstance(stream, int):
        return stream
    if stream is None:
        import torch

        return int(torch.cuda.current_stream(device_index).cuda_stream)
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = getattr(stream, "ptr", None)
    if handle is None:
        raise PlanError(f"stream must be a torch.cuda.Stream, a CuPy stream or None, got {type(stream).__name__}")
    return int(handle)


def launch(kl: KernelLaunch, device_index: int, stream: Any = None) -> None:
    """Launch the core-built ``kl`` on ``cuda:device_index`` on ``stream`` (see
    :func:`stream_handle`); never synchronises. The current device must be ``device_index``."""
    fn = function_ptr(kl.kernel, device_index)
    handle = stream_handle(stream, device_index)
    gx, gy, gz = kl.grid
    bx, by, bz = kl.block
    _cupy().cuda.driver.launchKernel(fn, gx, gy, gz, bx, by, bz, 0, handle, 0, kl.extra_ptr)


def address(x: Any) -> int:
    """A device address given as an int, or the data pointer of a torch tensor or CuPy array."""
    if isinstance(x, numbers.Integral):
        return int(x)
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    return int(x.__cuda_array_interface__["data"][0])
