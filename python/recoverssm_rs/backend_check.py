"""Which optional dependency is missing or mismatched, as one line that says what to install.

The core package needs only numpy. torch (StateCache, the demo, the benchmarks), CuPy (CUDA
tensors) and matplotlib (``bench --plot``) are optional extras; this module turns their absence, or
a CuPy built for another CUDA major version than torch, into one clear sentence naming the extra to
install. It never imports torch or CuPy unless asked to check them.

- :func:`missing_module_message` maps a ``ModuleNotFoundError`` for an optional dependency to that
  sentence (``None`` for any other module: a real bug, left to surface).
- :func:`require` / :func:`require_torch` raise :class:`~recoverssm_rs.errors.BackendUnavailableError`
  when an optional module (torch, matplotlib) is missing.
- :func:`cuda_match_problem` compares torch's CUDA version with the installed CuPy wheels (pure:
  the facts are arguments); :func:`gpu_stack_problem` gathers those facts from this environment and
  :func:`require_gpu_stack` raises on a problem. Call them before the first GPU launch.
- :func:`nvrtc_requirement` names the NVRTC wheel of a CUDA major (the kernel compile checks take
  the one of the installed CuPy's major, :func:`cupy_cuda_majors`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Iterable

from .errors import BackendUnavailableError

__all__ = [
    "EXTRAS",
    "cuda_match_problem",
    "cupy_cuda_majors",
    "cupy_distributions",
    "cupy_extra",
    "gpu_stack_problem",
    "missing_module_message",
    "nvrtc_install_hint",
    "nvrtc_requirement",
    "require",
    "require_gpu_stack",
    "require_torch",
]

PACKAGE = "recoverssm_rs"

EXTRAS: dict[str, str] = {
    "torch": "torch",
    "matplotlib": "plot",
}
"""Top-level module -> the extra of this package that installs it (CuPy: see :func:`cupy_extra`)."""

_CUPY_WHEEL = re.compile(r"^cupy-cuda(\d+)x$")


def _install_line(extra: str) -> str:
    return f"pip install '{PACKAGE}[{extra}]'"


def cupy_extra(cuda_major: int | None) -> str:
    """The extra that installs torch with the CuPy wheel for ``cuda_major`` (12 when unknown)."""
    return f"gpu-cu{cuda_major if cuda_major in (12, 13) else 12}"


def _cuda_major(version: str | None) -> int | None:
    if not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def missing_module_message(exc: ModuleNotFoundError, what: str = "this command") -> str | None:
    """One line naming the extra that provides the module ``exc`` could not import, or ``None``.

    ``what`` names the thing that needed it (``"the demo"``). Only torch, CuPy and matplotlib are
    optional dependencies; for any other module the answer is ``None`` (re-raise: it is a bug).
    """
    top = (exc.name or "").split(".", 1)[0]
    if top == "cupy":
        return (
            f"{what} needs CuPy, which is not installed: {_install_line('gpu-cu13')} for a torch "
            f"built with CUDA 13, {_install_line('gpu-cu12')} for CUDA 12"
        )
    if top == "torch":
        return _needs_torch(what)
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return f"{what} needs {top}, which is not installed: {_install_line(extra)}"


def _needs_torch(what: str) -> str:
    return (
        f"{what} needs torch, which is not installed: {_install_line('torch')} (CPU) or "
        f"{_install_line('gpu-cu13')} (CUDA 13; gpu-cu12 for CUDA 12)"
    )


def require(module: str, what: str = "this command") -> None:
    """Raise :class:`BackendUnavailableError` if the optional ``module`` (a key of :data:`EXTRAS`)
    is not installed; the message names ``what`` needs it and the extra to install. A module
    that is not one of the optional dependencies is refused whether it is installed or not."""
    if not isinstance(module, str) or module not in EXTRAS:
        raise BackendUnavailableError(
            f"require: module = {module!r} is not an optional dependency of {PACKAGE}; "
            f"expected one of: {', '.join(EXTRAS)}"
        )
    if module == "torch":
        require_torch(what)
    elif importlib.util.find_spec(module) is None:
        raise BackendUnavailableError(f"{what} needs {module}, which is not installed: {_install_line(EXTRAS[module])}")


def require_torch(what: str = "this command") -> None:
    """Raise :class:`BackendUnavailableError` (one line: what to install) if torch is missing."""
    if importlib.util.find_spec("torch") is None:
        raise BackendUnavailableError(_needs_torch(what))


def cupy_distributions() -> list[str]:
    """Names of the installed CuPy distributions (``cupy-cuda12x``, ``cupy-cuda13x``, ``cupy``)."""
    names = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "cupy" or _CUPY_WHEEL.match(name):
            names.add(name)
    return sorted(names)


def cupy_cuda_majors() -> list[int]:
    """CUDA majors of the installed CuPy wheels (``cupy-cuda13x`` -> 13), ascending; a CuPy built
    from source (``cupy``) names none."""
    return sorted({int(m.group(1)) for d in cupy_distributions() if (m := _CUPY_WHEEL.match(d))})


def nvrtc_requirement(cuda_major: int) -> str:
    """The pip requirement of the NVRTC wheel for CUDA ``cuda_major`` (12: its own ``-cu12``
    package; 13 and later: ``nvidia-cuda-nvrtc`` of that major, which torch built with it brings)."""
    if cuda_major <= 12:
        return f"nvidia-cuda-nvrtc-cu{cuda_major}"
    return f"nvidia-cuda-nvrtc>={cuda_major},<{cuda_major + 1}"


def nvrtc_install_hint() -> str:
    """What to install when no NVRTC library is found: the wheel of the installed CuPy's CUDA major
    (both majors' when no CuPy wheel is installed)."""
    majors = cupy_cuda_majors() or [13, 12]
    return " or ".join(f"pip install '{nvrtc_requirement(m)}' (CUDA {m})" for m in majors)


def cuda_match_problem(torch_cuda: str | None, cupy_dists: Iterable[str]) -> str | None:
    """Why torch (built for CUDA ``torch_cuda``) and the CuPy wheels ``cupy_dists`` do not fit.

    ``torch_cuda`` is ``torch.version.cuda`` (``None`` for a CPU-only torch). Returns ``None`` when
    exactly one CuPy is installed and its CUDA major equals torch's (a source-built ``cupy`` is
    taken to match), else one line saying what to install or remove.
    """
    if isinstance(cupy_dists, (str, bytes)) or (torch_cuda is not None and not isinstance(torch_cuda, str)):
        raise BackendUnavailableError(
            f"cuda_match_problem: torch_cuda must be torch.version.cuda (a string or None), got {torch_cuda!r}, "
            f"and cupy_dists a list of distribution names (cupy_distributions()), got {cupy_dists!r}"
        )
    dists = sorted(set(cupy_dists))
    if torch_cuda is None:
        return (
            f"torch is a CPU-only build (torch.version.cuda is None): install a CUDA build of "
            f"torch, e.g. {_install_line('gpu-cu13')}"
        )
    major = _cuda_major(torch_cuda)
    if major is None:
        return f"torch.version.cuda = {torch_cuda!r} is not a CUDA version (expected e.g. '12.8'): reinstall torch"
    want = f"cupy-cuda{major}x"
    fix = f"{_install_line(cupy_extra(major))}"
    if not dists:
        return f"CuPy is not installed; torch is built for CUDA {torch_cuda}: {fix}"
    if len(dists) > 1:
        return (
            f"several CuPy packages are installed ({', '.join(dists)}) and they shadow each other: "
            f"keep only {want}, the one for torch's CUDA {torch_cuda} (pip uninstall the others)"
        )
    (dist,) = dists
    m = _CUPY_WHEEL.match(dist)
    if m is None:  # a CuPy built from source against the local toolkit
        return None
    if int(m.group(1)) != major:
        return f"{dist} is built for CUDA {m.group(1)} but torch for CUDA {torch_cuda}: pip uninstall {dist} and {fix}"
    return None


def gpu_stack_problem() -> str | None:
    """What keeps the CUDA path from working here (torch / CuPy missing or mismatched), or ``None``.

    Inspects ``torch.version.cuda`` and the installed CuPy packages; it does not touch a device
    (whether one is present is the GPU layer's own check).
    """
    if importlib.util.find_spec("torch") is None:
        return (
            f"the CUDA path needs torch and CuPy; torch is not installed: "
            f"{_install_line('gpu-cu13')} (CUDA 13) or {_install_line('gpu-cu12')} (CUDA 12)"
        )
    import torch

    return cuda_match_problem(torch.version.cuda, cupy_distributions())


def require_gpu_stack() -> None:
    """Raise :class:`BackendUnavailableError` with :func:`gpu_stack_problem`'s line, if any."""
    problem = gpu_stack_problem()
    if problem is not None:
        raise BackendUnavailableError(problem)
