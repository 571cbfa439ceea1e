"""Whether this machine can run the GPU tests: shared by the root conftest (skipping or requiring
the ``gpu``-marked tests) and the harness's own tests."""

from __future__ import annotations


def cuda_device() -> bool:
    """torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def gpu_stack_problem() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # ImportError, or CUDARuntimeError without a driver
        return f"CuPy is not usable ({type(exc).__name__}: {exc})"
    return None
