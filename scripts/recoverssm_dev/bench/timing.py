"""Timing shared by the benchmarks: methods repeated within a time budget, interleaved, as percentiles."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "ROUNDS",
    "Budget",
    "format_ratio",
    "format_spread",
    "measure_interleaved",
    "paired_ratios",
    "ratio",
    "round_range",
]

ROUNDS = 8
"""Rounds :func:`measure_interleaved` splits each method's calls into."""


@dataclass(frozen=True)
class Budget:
    """How long to time one method: about ``seconds`` of repetitions, within ``[min_reps, max_reps]``."""

    seconds: float
    min_reps: int = 3
    max_reps: int = 2000
    warmup: int = 2


def measure_interleaved(
    fns: Mapping[str, tuple[Callable[[], object], Budget]],
    on_done: Callable[[str], None] | None = None,
    rounds: int = ROUNDS,
) -> dict[str, dict[str, float]]:
    """Time several methods of one case in ``rounds`` rounds, each method's calls split among them.

    On a shared machine the load changes within seconds; timed one after another, each method would
    see a different load and their ratio would measure the load. Interleaved, every method samples
    the same stretches of time. Within a round a method's calls run back to back, so that thread
    pools (torch's OpenMP workers, the executor's rayon workers) do not fight over the cores at
    every call. Each method gets the repetitions its own :class:`Budget` allows (from its fastest
    warm-up call); ``on_done(name)`` is called when it has them. Returns, per name, ``median_s``,
    ``p10_s``, ``p90_s`` (seconds), ``reps``, and ``rounds_s``: the median of each round's calls
    (``None`` for a round without calls of that method). The spread of the round medians (and of
    ratios of two methods taken round by round, :func:`ratio`) is what the load did to the
    figures while they were measured.
    """
    reps: dict[str, int] = {}
    for name, (fn, budget) in fns.items():
        one = float("inf")
        for _ in range(max(1, budget.warmup) + 1):
            t0 = time.perf_counter()
            fn()
            one = min(one, time.perf_counter() - t0)
        reps[name] = int(min(budget.max_reps, max(budget.min_reps, budget.seconds / max(one, 1e-7))))
    times = {name: np.empty(n) for name, n in reps.items()}
    done = dict.fromkeys(reps, 0)
    per_round: dict[str, list[float | None]] = {name: [None] * rounds for name in reps}
    for r in range(rounds):
        for name, (fn, _) in fns.items():
            until = reps[name] * (r + 1) // rounds  # an even share of the calls per round
            if done[name] >= until:
                continue
            for i in range(done[name], until):
                t0 = time.perf_counter_ns()
                fn()
                times[name][i] = time.perf_counter_ns() - t0
            per_round[name][r] = float(np.median(times[name][done[name] : until])) / 1e9
            done[name] = until
            if until == reps[name] and on_done is not None:
                on_done(name)
    out: dict[str, dict[str, Any]] = {}
    for name, ts in times.items():
        ts = ts / 1e9
        out[name] = {
            "median_s": float(np.median(ts)),
            "p10_s": float(np.percentile(ts, 10)),
            "p90_s": float(np.percentile(ts, 90)),
            "reps": len(ts),
            "rounds_s": per_round[name],
        }
    return out


def round_range(t: Mapping[str, Any], f: Callable[[float], float] = lambda s: s) -> list[float]:
    """``[min, max]`` of ``f(round median)`` over the rounds of one method's timing ``t`` (from
    :func:`measure_interleaved`); the median's ``f`` twice where no round is recorded."""
    vals = [f(x) for x in t.get("rounds_s", ()) if x]
    if not vals:
        vals = [f(t["median_s"])]
    return [min(vals), max(vals)]


def paired_ratios(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[float]:
    """``a / b`` round by round, for the rounds in which both methods ran (the same stretch of time,
    so the same load); the ratio of the medians alone where they share none."""
    pairs = [x / y for x, y in zip(a.get("rounds_s", ()), b.get("rounds_s", ()), strict=False) if x and y]
    return pairs or [a["median_s"] / b["median_s"]]


def ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, list[float]]:
    """The ratio of two methods' times ``a / b``: the median of the per-round ratios
    (:func:`paired_ratios`) and their ``[min, max]``."""
    pairs = paired_ratios(a, b)
    return float(np.median(pairs)), [min(pairs), max(pairs)]


def _num(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def format_ratio(r: Mapping[str, Any], key: str) -> str:
    """``r[key]`` as ``"0.62x (0.55-0.70)"``: the ratio of the medians and its ``_range``."""
    lo, hi = r.get(f"{key}_range", [r[key], r[key]])
    return f"{_num(r[key])}x ({_num(lo)}-{_num(hi)})"


def format_spread(value: float, spread: Sequence[float], scale: float = 1.0) -> str:
    """A figure with its spread, ``"12.3 (11.0-13.5)"``: ``value`` and the min-max ``spread`` of the
    rounds (:func:`round_range`), each times ``scale``."""
    lo, hi = spread
    return f"{_num(value * scale)} ({_num(lo * scale)}-{_num(hi * scale)})"
