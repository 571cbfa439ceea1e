"""The plot of a simulation: reused tokens and checkpoint memory per policy per workload.

Used by ``recoverssm simulate --plot PATH``; needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["plot_runs"]


def plot_runs(runs: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Writes a two-panel figure to ``path`` (its format from the suffix, e.g. ``.png``, ``.svg``):
    reused prompt tokens, and the most checkpoints held at once (bytes when the runs carry
    ``peak_bytes``), as bars per policy grouped by workload (each run's ``workload``, else its
    ``trace`` file's name, else one group).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def group(r: dict[str, Any]) -> str:
        if r.get("workload"):
            return str(r["workload"])
        return os.path.splitext(os.path.basename(str(r.get("trace") or "trace")))[0]

    groups = list(dict.fromkeys(group(r) for r in runs))
    policies = list(dict.fromkeys(str(r["policy"]) for r in runs))
    in_bytes = all("peak_bytes" in r for r in runs)
    panels = (
        ("reused_tokens", "reused prompt tokens"),
        ("peak_bytes", "peak checkpoint memory (bytes)") if in_bytes else ("peak_checkpoints", "peak checkpoints held"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 2.2 * len(groups) + 4), 4.2))
    width = 0.8 / max(len(policies), 1)
    for ax, (key, label) in zip(axes, panels):
        for k, policy in enumerate(policies):
            xs, vals = [], []
            for i, g in enumerate(groups):
                r = next((r for r in runs if group(r) == g and r["policy"] == policy), None)
                if r is not None:
                    xs.append(i + (k - (len(policies) - 1) / 2) * width)
                    vals.append(r[key])
            ax.bar(xs, vals, width, label=policy)
        ax.set_xticks(range(len(groups)), groups, rotation=20 if len(groups) > 3 else 0)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
