"""Tests marked ``gpu`` need a CUDA device: they are skipped, with the reason, where torch sees none.

With ``RECOVERSSM_REQUIRE_GPU=1`` (``scripts/gpu_check.sh`` sets it) a missing GPU, torch or CuPy
is an error instead: a GPU run that silently skipped its GPU tests would look green.
"""

import os

import pytest
from support.gpu import cuda_device, gpu_stack_problem

# The longest tests start first: pytest-xdist hands each worker a run of the collected order and the
# others steal from its end, so a long test collected late would run alone at the end of the run.
# The vLLM end-to-end test (vLLM's environment, a wheel of this checkout, an engine start per
# configuration) takes minutes; the rest are seconds each and even out by stealing.
FIRST = ("tests/e2e/",)


def _run_longest_first(items):
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: the rest keep their order


def pytest_collection_modifyitems(config, items):
    _run_longest_first(items)
    if os.environ.get("RECOVERSSM_REQUIRE_GPU", "0") not in ("", "0"):
        problem = gpu_stack_problem()
        if problem is not None:
            raise pytest.UsageError(f"RECOVERSSM_REQUIRE_GPU is set but {problem}")
        return
    if cuda_device():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---- device-path doubles (tests/support/device_fakes.py), shared by the device-path tests --------------


@pytest.fixture
def fake_ops(monkeypatch):
    """The device path's torch CUDA calls on the host (see ``device_fakes.FakeOps``)."""
    from support import device_fakes

    return device_fakes.install(monkeypatch)[0]


@pytest.fixture
def recorder(monkeypatch):
    """Records each core-built launch instead of running it."""
    from support import device_fakes

    return device_fakes.install(monkeypatch, ops=False, emulate=False)[1]


@pytest.fixture
def emulator(monkeypatch):
    """Records each core-built launch and runs it through the host emulation."""
    from support import device_fakes

    return device_fakes.install(monkeypatch, ops=False, emulate=True)[1]
