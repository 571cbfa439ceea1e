"""The GPU test harness itself: where a GPU is required (``RECOVERSSM_REQUIRE_GPU``, set by
``scripts/gpu_check.sh``) but absent, the run fails instead of skipping its GPU tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.gpu import gpu_stack_problem

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(gpu_stack_problem() is None, reason="a usable GPU is present")
def test_required_gpu_that_is_missing_fails_the_run():
    env = dict(os.environ, RECOVERSSM_REQUIRE_GPU="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "tools" / "test_demo_gpu.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=TESTS.parent,
        timeout=120,
    )
    assert r.returncode != 0
    assert "RECOVERSSM_REQUIRE_GPU is set but" in r.stdout + r.stderr


def test_without_the_requirement_gpu_tests_skip_cleanly():
    env = {k: v for k, v in os.environ.items() if k != "RECOVERSSM_REQUIRE_GPU"}
    if gpu_stack_problem() is None:
        pytest.skip("a usable GPU is present: the GPU tests would run, not skip")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            str(TESTS / "tools" / "test_demo_gpu.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=TESTS.parent,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout
