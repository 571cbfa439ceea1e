"""Ctrl-C and failing child processes: one line, no traceback, no process left behind.

SIGINT goes to the whole process group, as a terminal's Ctrl-C does, of a running
``benches/bench.py`` and ``scripts/pd_demo.py``; the P/D demo's child-process plumbing is checked
with real spawned processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from recoverssm_dev.pd_processes import child_main, start_children, stop_children, wait_result

ROOT = Path(__file__).resolve().parents[2]


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # A terminal's shell starts a command with Ctrl-C at its default; a test run started in the
        # background (`cmd &`) would pass on SIGINT ignored, and Python keeps it ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _ctrl_c(proc: subprocess.Popen[str]) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    return out, err


def test_ctrl_c_stops_bench_with_one_line():
    pytest.importorskip("torch")
    # A full run (about a minute): --quick ends about 1.5 s after its first line, which a loaded
    # machine can take to deliver the signal (seen at load 9: the run ended first, exit 0).
    proc = _start("benches/bench.py")
    first = proc.stderr.readline()  # progress: the measuring has begun
    assert first.startswith("bench: ["), first
    out, err = _ctrl_c(proc)
    assert out == ""  # no table of a run cut short
    assert err.splitlines()[-1] == "benches/bench.py: error: interrupted"
    assert all(line.startswith("bench: [") for line in err.splitlines()[:-1]), err


def test_ctrl_c_stops_pd_demo_and_its_processes():
    from recoverssm_rs.transfer import nixl

    if not nixl.nixl_available():
        pytest.skip("NIXL is not importable")
    proc = _start("scripts/pd_demo.py", "--requests", "64", "--generate", "40")
    first = proc.stderr.readline()
    m = re.search(r"pid (\d+)\) and decode .*pid (\d+)\) processes started", first)
    assert m, first
    children = [int(m.group(1)), int(m.group(2))]
    time.sleep(1.0)  # the children are importing or working; the signal reaches them too
    out, err = _ctrl_c(proc)
    assert out == ""
    assert err.splitlines() == ["scripts/pd_demo.py: error: interrupted"], err
    assert all(_gone(pid) for pid in children), children


# ---- the child processes of pd-demo --------------------------------------------------------------


def _spawn(role: str, body, args) -> tuple[object, object]:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(role, body, args, there, False))
    start_children([proc])
    there.close()
    return here, proc


def test_a_failing_child_is_one_line_and_ends_the_wait(capfd):
    dec = _spawn("decode", int, ("x",))
    pre = _spawn("prefill", time.sleep, (0,))  # sends nothing and exits 0: no error
    try:
        got = wait_result({"decode": dec, "prefill": pre}, "decode")
    finally:
        stop_children([dec[1], pre[1]], grace=10)
    assert got == {"error": "the decode process failed: ValueError: invalid literal for int() with base 10: 'x'"}
    assert dec[1].exitcode == 1 and pre[1].exitcode == 0
    assert "Traceback" not in capfd.readouterr().err


def test_a_child_gone_without_a_result_and_a_prefill_error_are_reported():
    dec = _spawn("decode", os._exit, (3,))
    try:
        got = wait_result({"decode": dec}, "decode")
    finally:
        stop_children([dec[1]], grace=10)
    assert got == {"error": "the decode process ended (exit code 3) without a result"}
    # the prefill side fails while the decode side waits: the error comes back, the decode side is ended
    dec = _spawn("decode", time.sleep, (60,))
    pre = _spawn("prefill", int, ("y",))
    t0 = time.monotonic()
    try:
        got = wait_result({"decode": dec, "prefill": pre}, "decode")
        os.kill(dec[1].pid, signal.SIGINT)  # the children ignore Ctrl-C: the parent answers it
        time.sleep(0.2)
        assert dec[1].is_alive()
    finally:
        stop_children([dec[1], pre[1]])
    assert got["error"].startswith("the prefill process failed: ValueError")
    assert not dec[1].is_alive() and time.monotonic() - t0 < 30


def test_a_result_is_returned():
    dec = _spawn("decode", dict, ((("mismatches", 0),),))
    try:
        assert wait_result({"decode": dec}, "decode") == {"mismatches": 0}
    finally:
        stop_children([dec[1]], grace=10)
    assert dec[1].exitcode == 0
