"""The zygote of ``support.isolated``, which the crash-guarding tests run their cases in: a case that
crashes or hangs is reported as such and fails alone; the zygote serves the next case."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest
from support import isolated

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def zygote() -> isolated.Zygote:
    return isolated.shared()


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (killed, waiting for its new parent to reap it)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _still_serving(zygote: isolated.Zygote, pid: int) -> None:
    assert zygote.pid() == pid, "the zygote was restarted"
    result = zygote.run("import torch; print(int(torch.arange(4).sum()))", timeout=60)
    assert (result.returncode, result.stdout, result.timed_out) == (0, "6\n", False), result.describe()


@pytest.mark.parametrize(
    "crash", ["import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "import ctypes; ctypes.string_at(0)"]
)
def test_a_segfault_fails_its_case_only(zygote, crash):
    pid = zygote.pid()
    result = zygote.run(f"print('before', flush=True)\n{crash}\nprint('after')", timeout=60)
    assert result.returncode == -signal.SIGSEGV and not result.timed_out
    assert result.stdout == "before\n"
    assert "Fatal Python error: Segmentation fault" in result.stderr  # faulthandler's stack
    assert result.describe().startswith("isolated case: killed by signal 11 (SIGSEGV)\n")
    _still_serving(zygote, pid)


def test_a_hang_is_killed_at_its_timeout_with_what_it_started(zygote, tmp_path):
    pid = zygote.pid()
    code = f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(tmp_path / "pid")!r}, "w").write(str(child.pid))
        print("sleeping", flush=True)
        time.sleep(600)
    """
    result = zygote.run(textwrap.dedent(code), timeout=3)
    assert result.timed_out and result.returncode == -signal.SIGKILL
    assert result.stdout == "sleeping\n"
    assert result.describe().startswith("isolated case: still running at its timeout: killed\n")
    grandchild = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the process the case started outlived its timeout"
    _still_serving(zygote, pid)


def test_a_case_runs_as_python_dash_c_would(zygote, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = """
        import atexit, os, sys
        class Noisy:
            def __del__(self):
                print("collected")
        noisy = Noisy()
        atexit.register(print, "atexit")
        print(__name__, sys.argv, repr(sys.path[0]), os.getcwd())
        print("to stderr", file=sys.stderr)
    """
    result = zygote.run(textwrap.dedent(code), timeout=60)
    assert result.returncode == 0, result.describe()
    assert result.stdout.splitlines() == [f"__main__ ['-c'] '' {tmp_path}", "atexit", "collected"]
    assert result.stderr == "to stderr\n"


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [
        ("raise ValueError('bad')", 1, 'File "<string>", line 1, in <module>\nValueError: bad\n'),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('stopped')", 1, "stopped\n"),
        ("import os; os._exit(7)", 7, ""),
    ],
)
def test_exit_statuses_and_uncaught_errors(zygote, code, status, stderr):
    result = zygote.run(code, timeout=60)
    assert result.returncode == status and result.stderr.endswith(stderr), result.describe()
    assert "isolated.py" not in result.stderr  # the case's frames only


def test_the_zygote_forks_with_one_thread_and_no_torch_op(zygote):
    # Cases that start threads (torch's pools, a BLAS call) do so in their child: the zygote is left
    # with its single thread (see the module's doc on why forking it is sound).
    code = "import numpy as np, torch; a = np.ones((300, 300)); a @ a; t = torch.randn(512, 512); t @ t"
    assert zygote.run(code, timeout=60).returncode == 0
    assert os.listdir(f"/proc/{zygote.pid()}/task") == [str(zygote.pid())]
    result = zygote.run("import sys; print(sorted({'numpy', 'torch', 'recoverssm_rs'} & set(sys.modules)))", timeout=60)
    assert result.stdout == "['numpy', 'recoverssm_rs', 'torch']\n"
