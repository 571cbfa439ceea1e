"""Fixtures of the vLLM adapter's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def launch_args(monkeypatch):
    """The adapter's buffers are CPU tensors here; the launch sees them as CUDA tensors."""
    from recoverssm_rs.cuda.ops import CudaOps
    from support.device_fakes import FakeCuda

    monkeypatch.setattr(CudaOps, "launch_arg", staticmethod(FakeCuda))
