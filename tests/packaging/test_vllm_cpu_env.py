"""scripts/vllm_cpu_env.sh: what it says of an environment, and one maker at a time.

No download here: each case gives the script an environment folder of its own, complete (a marker
and an executable `venv/bin/python`) or not, and checks what the script does with it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_cpu_env.sh"


def _run(env_dir: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RECOVERSSM_VLLM_CPU_ENV=str(env_dir))
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def _complete(env_dir: Path) -> Path:
    py = env_dir / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    (env_dir / "complete").touch()
    return py


def test_check_says_missing_then_complete_and_makes_nothing(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    r = _run(env_dir, "--check")
    assert (r.returncode, r.stdout.strip()) == (0, "missing")
    assert not env_dir.exists()
    py = _complete(env_dir)
    r = _run(env_dir, "--check")
    assert (r.returncode, r.stdout.strip()) == (0, "complete")
    r = _run(env_dir)
    assert r.returncode == 0
    assert r.stdout.strip().splitlines()[-1] == str(py)


def test_a_second_maker_waits_for_the_first_and_uses_its_environment(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    env = dict(os.environ, RECOVERSSM_VLLM_CPU_ENV=str(env_dir))
    with open(env_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # The first maker holds the lock: the script waits instead of making a second copy.
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        time.sleep(1.0)
        assert proc.poll() is None, "the script did not wait for the lock"
        py = _complete(env_dir)
        fcntl.flock(lock, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == str(py)
    assert "downloading" not in err
