"""Run a test's Python code in a process of its own without paying an interpreter start each time.

Tests that guard against crashes (a write into freed memory, a hang, a segfault) run their body
apart, so that a regression fails that test and not the session. A fresh ``python -c`` per case
spends seconds importing torch, numpy and recoverssm_rs before a body that often takes well under
one. Here a *zygote* process is started once per test process (one per pytest-xdist worker: see
``shared()``), imports those modules, and forks a child per case::

    result = isolated.shared().run("import torch; print(torch.zeros(2).sum())", timeout=60)
    assert result.returncode == 0, result.describe()

The child runs the code as ``python -c`` would (a fresh ``__main__``, ``sys.argv == ["-c"]``,
``sys.path[0] == ""``, stdin from /dev/null, stdout and stderr captured, an uncaught exception
printed and exit status 1; at the end, threads joined, atexit handlers run and the case's objects
collected, but the modules the zygote imported are not torn down) in the caller's current directory
and the environment the zygote was started with. A child that crashes, is killed or outlives its
timeout (then its process group is killed) fails its own case only: the zygote reaps it and serves
the next one. Code that needs another environment, or behaviour fixed when an interpreter starts
(environment variables read at import; ``GLIBC_TUNABLES``, which ``mallopt`` in a child cannot
replace: the zygote's heap already has room the child allocates from; a module not yet imported),
needs a real fresh interpreter instead.

Why forking the zygote is sound: ``fork()`` copies only the calling thread, so a thread that held a
lock at that moment would leave it held for ever in the child. The zygote runs no thread of its own
and no torch operation (torch's thread pools start on a first parallel operation, never at import).
The one native thread it has is the worker of numpy's OpenBLAS, started at import: OpenBLAS
registers a ``pthread_atfork`` handler that stops its pool before each fork (a child starts it again
on its first BLAS call). The zygote checks this after every fork: it must be left with one thread,
or it reports the case as an error instead of serving it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

PRELOAD = ("numpy", "torch", "recoverssm_rs")
"""Modules the zygote imports before its first fork (each one that is installed)."""

START_TIMEOUT = 600.0
"""Seconds the zygote may take to import ``PRELOAD`` on a loaded machine."""

ANSWER_SLACK = 60.0
"""Seconds beyond a case's timeout that the zygote may take to answer before it is taken for dead."""


@dataclass(frozen=True)
class Result:
    """How one isolated case ended, in ``subprocess.CompletedProcess`` terms."""

    returncode: int
    """The exit status, or minus the signal that ended the child (``-11``: SIGSEGV)."""
    stdout: str
    stderr: str
    timed_out: bool = False
    """The child was still running at its timeout and was killed (with its process group)."""

    def describe(self, tail: int = 3000) -> str:
        """One line on how the child ended, then the end of its stderr (for assertion messages)."""
        if self.timed_out:
            how = "still running at its timeout: killed"
        elif self.returncode < 0:
            how = f"killed by signal {-self.returncode} ({_signal_name(-self.returncode)})"
        else:
            how = f"exit status {self.returncode}"
        return f"isolated case: {how}\n--- stderr (end) ---\n{self.stderr[-tail:]}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


class ZygoteError(RuntimeError):
    """The zygote itself failed (did not start, died, or could not fork a case)."""


class Zygote:
    """A process that has imported ``PRELOAD`` and forks one child per case (see the module's doc)."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self._preload = preload
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._buffer = b""

    # ---- the test process's side ----------------------------------------------------------------

    def run(self, code: str, timeout: float = 120.0) -> Result:
        """Run ``code`` in a forked child; its outcome, whatever it is (a crash is a result)."""
        proc = self._started()
        request = {"code": code, "timeout": timeout, "cwd": os.getcwd()}
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
            answer = self._answer(timeout + ANSWER_SLACK)
        except (OSError, ZygoteError) as exc:
            self.close()
            raise ZygoteError(f"the zygote failed while running a case: {exc}") from exc
        if "error" in answer:
            raise ZygoteError(answer["error"])
        return Result(answer["returncode"], answer["stdout"], answer["stderr"], answer["timed_out"])

    def pid(self) -> int:
        """The zygote's process id (started if it was not)."""
        return self._started().pid

    def close(self) -> None:
        """Stop the zygote (its children are killed on their timeout or when it exits)."""
        proc, self._proc = self._proc, None
        self._buffer = b""
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # end of requests: the zygote exits
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self.close()
        self._log = tempfile.NamedTemporaryFile(prefix="zygote-", suffix=".log")
        tests = str(Path(__file__).resolve().parents[1])
        # `python -c` like the cases themselves; the tests folder is on the path only to import this.
        boot = (
            f"import sys; sys.path.insert(0, {tests!r}); from support import isolated; "
            f"sys.path.remove({tests!r}); isolated._serve({list(self._preload)!r})"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            bufsize=0,
            start_new_session=True,  # a terminal's Ctrl-C reaches the test process, which closes this
        )
        try:
            ready = self._answer(START_TIMEOUT)
        except ZygoteError as exc:
            self.close()
            raise ZygoteError(f"the zygote did not start: {exc}") from exc
        if not ready.get("ready"):
            self.close()
            raise ZygoteError(f"the zygote did not start: {ready}")
        return self._proc

    def _answer(self, timeout: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                raise ZygoteError(f"no answer in {timeout:.0f} s{self._log_tail()}")
            chunk = proc.stdout.read(65536)
            if not chunk:
                proc.wait()
                raise ZygoteError(f"it exited with status {proc.returncode}{self._log_tail()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        text = Path(self._log.name).read_bytes()[-3000:].decode(errors="replace")
        return f"; its stderr:\n{text}" if text else ""


_shared: Zygote | None = None


def shared() -> Zygote:
    """This test process's zygote, started on first use and stopped when the process exits.

    Each pytest-xdist worker is a process of its own and so gets its own zygote; a session that
    never runs an isolated case starts none."""
    global _shared
    if _shared is None:
        _shared = Zygote()
        atexit.register(_shared.close)
    return _shared


# ---- the zygote's side ----------------------------------------------------------------------------


def _serve(preload: list[str]) -> None:
    """The zygote's loop: one JSON request a line on stdin, one JSON answer a line on stdout."""
    import gc
    import importlib

    # The protocol moves off fds 0 and 1, which the children get: stdin from /dev/null, and
    # stdout pointing at stderr, so that a stray print can never corrupt an answer.
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # not installed: a case that imports it fails as it would in a fresh interpreter
    # Objects that outlive every fork: a child's collections skip them (and leave their pages shared).
    gc.freeze()
    answers.write(json.dumps({"ready": True}).encode() + b"\n")
    for line in requests:
        request = json.loads(line)
        answer = _fork_case(request, requests, answers)
        answers.write(json.dumps(answer).encode() + b"\n")


def _fork_case(request: dict[str, Any], requests: IO[bytes], answers: IO[bytes]) -> dict[str, Any]:
    """Fork a child for one request, wait for it (killing it at its timeout): the answer."""
    import threading

    if threading.active_count() != 1:
        return {"error": f"the zygote runs {threading.active_count()} Python threads: it must not fork"}
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        requests.close()
        answers.close()
        _run_case(request, out.fileno(), err.fileno())
    try:
        os.setpgid(pid, pid)  # also done by the child: whichever runs first
    except OSError:
        pass  # the child has already exited, or has set it itself
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"error": f"the zygote had {threads} threads left after fork(): forking it is not sound"}
    status, timed_out = _wait(pid, request["timeout"])
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "timed_out": timed_out,
        "stdout": _read(out),
        "stderr": _read(err),
    }


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """The child's wait status, and whether it had to be killed at its timeout."""
    pidfd = os.pidfd_open(pid)
    try:
        ready = select.select([pidfd], [], [], timeout)[0]
    finally:
        os.close(pidfd)
    if not ready:
        try:
            os.killpg(pid, signal.SIGKILL)  # the child and whatever it started
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    return status, not ready


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    return text


def _run_case(request: dict[str, Any], out: int, err: int) -> NoReturn:
    """In the forked child: run the case as ``python -c CODE`` would, then end with its status."""
    import atexit
    import builtins
    import ctypes
    import faulthandler
    import gc
    import resource
    import threading
    import traceback
    import types

    os.setpgid(0, 0)  # a group of its own: a timeout kills what the case started too
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: never outlive the zygote
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash a test provokes leaves no core file
    os.dup2(out, 1)
    os.dup2(err, 2)
    faulthandler.enable()  # a fatal signal prints the Python stack on the captured stderr
    os.chdir(request["cwd"])
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:
        # As `python -c` prints it: the case's frames only (not this function's).
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        status = 1
    # The interpreter's shutdown, up to the teardown of the modules the zygote imported (the same
    # in every case, and most of a second with torch): non-daemon threads joined, atexit handlers
    # run, the case's globals cleared and collected (its objects' destructors run here, where a
    # use of freed memory would crash), the standard streams flushed.
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        main.__dict__.clear()
        gc.collect()
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        traceback.print_exc()
        status = 120  # what the interpreter returns when flushing its streams fails at exit
    os._exit(status)


def _exit_status(exc: SystemExit) -> int:
    """The status `python` exits with for an uncaught ``SystemExit`` (its message on stderr)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1
