"""``bench --plot FILE.png``: throughput against requests and bandwidth against state size.

One panel per benchmark in the results: the plan step's copies per second against the number of
requests (the package's planner and the baselines on the same log-log axes), and the host copy's
GB/s against the state size at the largest batch (the executor and the torch baselines). Each line
is the median; the shaded band around it spans the lowest to the highest per-round median (the
spread the machine's load caused while the methods were timed interleaved). Baselines are dashed.
Needs matplotlib (the ``plot`` extra); uses the Agg canvas, never a window or pyplot's global state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["HOST_METHODS", "PLAN_METHODS", "make_figure", "save_plot"]

PLAN_METHODS = ("plan", "core", "numpy", "loop")
"""Plan-step methods drawn (``plan+view`` sits on top of ``plan``)."""
HOST_METHODS = ("execute", "plan+execute", "copy_", "index")
"""Host-copy methods drawn (``execute(1seg)`` is a diagnostic)."""


def _style(method: str, baselines: list[str]) -> dict[str, Any]:
    return {
        "linestyle": "--" if method in baselines else "-",
        "marker": "o",
        "markersize": 4,
        "label": f"{method} (baseline)" if method in baselines else method,
    }


def _line(ax: Axes, x: list[float], methods: list[dict[str, Any]], key: str, style: dict[str, Any]) -> None:
    """The medians ``m[key]`` as a line and, where every point has it, ``m[key + "_range"]`` as a
    band in the line's colour."""
    (line,) = ax.plot(x, [m[key] for m in methods], **style)
    if all(f"{key}_range" in m for m in methods):
        ax.fill_between(
            x,
            [m[f"{key}_range"][0] for m in methods],
            [m[f"{key}_range"][1] for m in methods],
            color=line.get_color(),
            alpha=0.18,
            linewidth=0,
        )


def _plan_panel(ax: Axes, doc: dict[str, Any]) -> None:
    results = sorted(doc["results"], key=lambda r: r["requests"])
    requests = [r["requests"] for r in results]
    for m in PLAN_METHODS:
        _line(ax, requests, [r["methods"][m] for r in results], "copies_per_s", _style(m, doc["baselines"]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(requests, [str(r) for r in requests])
    ax.set_xlabel(f"requests per step ({doc['layers']} layers x 2 states each)")
    ax.set_ylabel("copies planned per second")
    ax.set_title(f"align step, {doc['layout']} (median; band: min-max of the rounds)", fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")


def _host_panel(ax: Axes, doc: dict[str, Any]) -> None:
    batch = max(r["batch"] for r in doc["results"])
    results = sorted((r for r in doc["results"] if r["batch"] == batch), key=lambda r: r["state_bytes"])
    sizes = [r["state_bytes"] for r in results]
    for m in HOST_METHODS:
        _line(ax, sizes, [r["methods"][m] for r in results], "GBps", _style(m, doc["baselines"]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [r["size"] for r in results])
    ax.set_xlabel(f"state size (bytes per block; {doc['dtype']})")
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(f"host copy, {batch} random blocks per call (median; band: min-max of the rounds)", fontsize="medium")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")


def make_figure(results: dict[str, Any], title: str | None = None) -> Figure:
    """The figure for ``results`` (the ``bench`` JSON document: ``plan_step`` and/or ``host_copy``).

    Raises ``ValueError`` when the document holds neither benchmark.
    """
    from matplotlib.figure import Figure

    panels = [(key, fn) for key, fn in (("plan_step", _plan_panel), ("host_copy", _host_panel)) if results.get(key)]
    if not panels:
        raise ValueError("nothing to plot: the results hold neither plan_step nor host_copy")
    fig = Figure(figsize=(6.4 * len(panels), 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, fn) in zip(axes, panels, strict=True):
        fn(ax, results[key])
    if title:
        fig.suptitle(title, fontsize="medium")
    return fig


def save_plot(results: dict[str, Any], path: str | Path, title: str | None = None) -> Figure:
    """Draw ``results`` (see :func:`make_figure`) into ``path`` (PNG at 120 dpi); returns the figure."""
    fig = make_figure(results, title)
    fig.savefig(path, dpi=120)
    return fig
