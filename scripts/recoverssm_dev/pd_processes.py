"""The process plumbing of ``pd-demo``: two child processes with the parent in charge.

The children start with Ctrl-C ignored (a terminal sends it to the whole process group), so the
parent alone answers it and ends them (:func:`stop_children`); each child sends its result, or its
error as one line, over a pipe (:func:`child_main`), so a failure is never a traceback (unless
``verbose``) nor a parent waiting for a child that is gone. NIXL's INFO logging (to stdout) is
silenced in the children unless ``verbose``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["child_main", "quiet_logs", "start_children", "stop_children", "wait_result"]


def quiet_logs(verbose: bool) -> None:
    """In a child process: NIXL's INFO lines (and UCX's warnings) only when ``verbose``; then
    NIXL's and the package's log lines go to stderr, stdout stays the summary's."""
    import logging
    import os

    from recoverssm_rs.errors import BackendUnavailableError
    from recoverssm_rs.transfer.nixl import import_nixl

    if not verbose:
        os.environ.setdefault("UCX_LOG_LEVEL", "error")
    try:
        import_nixl()  # configures the "nixl" logger (INFO, on stdout)
    except BackendUnavailableError:
        return  # nothing to silence; a body that needs NIXL says so itself
    nixl_log = logging.getLogger("nixl")
    if verbose:
        for h in nixl_log.handlers:
            if isinstance(h, logging.StreamHandler):
                h.setStream(sys.stderr)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    else:
        nixl_log.setLevel(logging.WARNING)


def child_main(
    role: str, body: Callable[..., dict[str, Any] | None], args: tuple[Any, ...], out: Any, verbose: bool
) -> None:
    """A child process's target: ``body(*args)``; its result (a dict, or None for nothing), or its
    error as one line, goes to the parent over ``out`` (a traceback only when ``verbose``)."""
    try:
        quiet_logs(verbose)
        result = body(*args)
    except Exception as e:
        if verbose:
            import traceback

            traceback.print_exc()
        result = {"error": f"the {role} process failed: {type(e).__name__}: {e}"}
    if result is not None:
        try:
            out.send(result)
        except (BrokenPipeError, EOFError, OSError):  # the parent is gone
            pass
    out.close()
    if result is not None and "error" in result:
        sys.exit(1)


def stop_children(procs: list[Any], grace: float = 0.0) -> None:
    """Ends every child: those still running after ``grace`` seconds (together) get SIGTERM, then
    SIGKILL; waits for each."""
    import time

    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def start_children(procs: list[Any]) -> None:
    """Starts the children with Ctrl-C ignored (a terminal's Ctrl-C reaches the whole process
    group): the parent alone answers it, and ends them."""
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave the signals alone
        old = None
    try:
        for proc in procs:
            proc.start()
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


EXIT_WAIT_S = 180  # how long wait_result waits for a child that closed its pipe to exit


def wait_result(children: dict[str, tuple[Any, Any]], main: str) -> dict[str, Any]:
    """Waits on each child's ``(result pipe, process)`` until ``main`` sends its result, any child
    sends an error, or a child ends without sending what it owed (``main`` its result, the others
    nothing but a zero exit code); returns that result or an ``{"error": ...}`` naming the child."""
    from multiprocessing.connection import wait

    pending = dict(children)
    while pending:
        ready = wait([conn for conn, _ in pending.values()])
        for role, (conn, proc) in list(pending.items()):
            if conn not in ready:
                continue
            try:
                msg = dict(conn.recv())
            except (EOFError, OSError):  # the child closed its end: it is ending
                del pending[role]
                # A child that closed its end is ending; tearing down its interpreter can take tens
                # of seconds on a loaded machine, so wait for its exit code that long.
                proc.join(EXIT_WAIT_S)
                if proc.exitcode is None:
                    return {"error": f"the {role} process closed its pipe but did not end within {EXIT_WAIT_S} s"}
                if role == main or proc.exitcode != 0:
                    return {"error": f"the {role} process ended (exit code {proc.exitcode}) without a result"}
                continue
            if role == main or "error" in msg:
                return msg
    return {"error": f"the {main} process sent no result"}
