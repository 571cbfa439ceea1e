"""``benches/bench.py --gpu``: the GPU copy benchmark of the checkout (``benches/gpu_copy.py``).

That benchmark (the fused align kernel and the tiled plan executor against device-to-device copy
bandwidth, CUDA-event timing) still lives in the repository's ``benches/`` folder, beside the GPU
launch layer it measures; this module finds it, imports it only when ``--gpu`` is given, runs it
with ``--json`` (its own tables stream to stderr as progress) and returns its JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import types
from pathlib import Path
from typing import Any, NoReturn

from recoverssm_rs.errors import BackendUnavailableError

__all__ = ["QUICK_ARGS", "GpuArgsError", "find_script", "format_table", "require_script", "run"]

QUICK_ARGS = ["--requests", "1,16", "--layers", "8", "--budget", "0.05", "--chunks", ""]
"""``benches/gpu_copy.py`` arguments for ``bench --quick --gpu``."""


class GpuArgsError(ValueError):
    """The GPU copy benchmark refused its arguments (``--gpu-args``); the message is its own."""


class _ArgError(Exception):
    pass


class _StrictParser(argparse.ArgumentParser):
    """The script's argument parser, raising its error instead of printing the usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise _ArgError(message)


def find_script(checkout: Path | None = None) -> Path | None:
    """``benches/gpu_copy.py`` of the source checkout this package runs from, or ``None``.

    ``checkout`` defaults to the checkout this module lives in (``scripts/recoverssm_dev/bench``).
    """
    root = Path(__file__).resolve().parents[3] if checkout is None else checkout
    script = root / "benches" / "gpu_copy.py"
    return script if script.is_file() else None


def require_script() -> Path:
    """:func:`find_script`, or :class:`BackendUnavailableError` saying where it is to be found."""
    script = find_script()
    if script is None:
        raise BackendUnavailableError(
            "bench --gpu runs benches/gpu_copy.py from a source checkout of recoverssm_rs; this "
            "installation has none (run it from the repository, e.g. after scripts/setup.sh)"
        )
    return script


def run(args: list[str], script: Path | None = None) -> dict[str, Any]:
    """Run the GPU copy benchmark with ``args`` (plus ``--json``); returns its JSON document.

    Raises :class:`BackendUnavailableError` when the script is not found or measured nothing (no
    CUDA device, torch or CuPy: its reason is in the message), :class:`GpuArgsError` when its
    argument parser refuses ``args`` (before it measures anything).
    """
    script = script or require_script()
    spec = importlib.util.spec_from_file_location("recoverssm_rs_bench_gpu_copy", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if getattr(module, "argparse", None) is argparse:  # its parser raises instead of exiting
        strict = types.SimpleNamespace(**{**vars(argparse), "ArgumentParser": _StrictParser})
        setattr(module, "argparse", strict)  # noqa: B010 (a module's global, by name)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):  # the JSON document; its tables go to stderr
            rc = module.main(["--json", *args])
    except _ArgError as e:
        raise GpuArgsError(f"{script.name}: {e}") from None
    if rc != 0:
        raise BackendUnavailableError(f"{script} exited with status {rc}")
    doc: dict[str, Any] = json.loads(out.getvalue())
    if not doc.get("measured", False):
        raise BackendUnavailableError(f"bench --gpu: {doc.get('reason', 'nothing measured')}")
    doc["script"] = str(script)
    return doc


def format_table(doc: dict[str, Any]) -> str:
    """A compact table of the GPU results: per request count and method, the median GB/s, the
    fastest repetition's GB/s (``best``), % of d2d and host time."""
    lines = [
        (
            f"GPU copy ({doc.get('gpu', {}).get('name', 'GPU')}): GB/s = (bytes read + written) / GPU "
            "time, median and best repetition; % of a device-to-device copy of the same bytes"
        )
    ]
    head = f"{'requests':>8} {'layers':>6}  {'method':<22} {'GB/s':>8} {'best':>8} {'% d2d':>7} {'host us':>9}"
    lines += [head, "-" * len(head)]
    for res in doc.get("results", []):
        if "methods" not in res:
            lines.append(f"{res.get('requests', '?'):>8}  {res.get('skipped', 'skipped')}")
            continue
        for name, m in res["methods"].items():
            host = "" if m.get("host_us") is None else f"{m['host_us']:.1f}"
            # the spread the script records: the fastest repetition's rate beside the median's
            best = f"{m['gbps'] * m['gpu_us'] / m['gpu_us_min']:.0f}" if m.get("gpu_us") and m.get("gpu_us_min") else ""
            lines.append(
                f"{res['requests']:>8} {res['layers']:>6}  {name:<22} {m['gbps']:>8.0f} {best:>8} "
                f"{m['pct_d2d']:>6.1f}% {host:>9}"
            )
    lines += [f"target: {t}" for t in doc.get("targets", [])]
    return "\n".join(lines)
