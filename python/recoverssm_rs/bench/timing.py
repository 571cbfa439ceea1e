"""Timing shared by the benchmarks: methods repeated within a time budget, interleaved, as percentiles."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["Budget", "measure_interleaved"]


@dataclass(frozen=True)
class Budget:
    """How long to time one method: about ``seconds`` of repetitions, within ``[min_reps, max_reps]``."""

    seconds: float
    min_reps: int = 3
    max_reps: int = 2000
    warmup: int = 2


def measure_interleaved(fns: Mapping[str, tuple[Callable[[], object], Budget]],
                        on_done: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    """Time several methods of one case in rounds, one call of each per round, not one after another.

    On a shared machine the load changes within seconds; timed in turn, each method would see a
    different load and their ratio would measure the load. Interleaved, every method samples the
    same stretch of time. Each method gets the repetitions its own :class:`Budget` allows (from its
    fastest warm-up call) and drops out of the rounds when it has them; ``on_done(name)`` is called
    then. Returns, per name, what :func:`measure` returns.
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
    for i in range(max(reps.values(), default=0)):
        for name, (fn, _) in fns.items():
            if i >= reps[name]:
                continue
            t0 = time.perf_counter_ns()
            fn()
            times[name][i] = time.perf_counter_ns() - t0
            if i + 1 == reps[name] and on_done is not None:
                on_done(name)
    out = {}
    for name, ts in times.items():
        ts = ts / 1e9
        out[name] = {"median_s": float(np.median(ts)), "p10_s": float(np.percentile(ts, 10)),
                     "p90_s": float(np.percentile(ts, 90)), "reps": len(ts)}
    return out
