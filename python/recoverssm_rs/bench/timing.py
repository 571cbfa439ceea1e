"""Timing helpers shared by the benchmarks: repeat a call within a time budget, keep percentiles."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Budget", "measure"]


@dataclass(frozen=True)
class Budget:
    """How long to time one method: about ``seconds`` of repetitions, within ``[min_reps, max_reps]``."""

    seconds: float
    min_reps: int = 3
    max_reps: int = 2000
    warmup: int = 2

    def scaled(self, factor: float) -> Budget:
        """The same budget with ``factor`` times the seconds (for the slow baselines)."""
        return Budget(self.seconds * factor, self.min_reps, self.max_reps, self.warmup)


def measure(fn: Callable[[], object], budget: Budget) -> dict[str, float]:
    """Time ``fn()``: warm-up calls, then repetitions filling ``budget``; times in seconds.

    The number of repetitions comes from the fastest warm-up call, so that one call delayed by the
    scheduler (common on a shared machine) does not cut the sample to ``min_reps``. Returns
    ``median_s``, ``p10_s``, ``p90_s`` and ``reps``.
    """
    one = float("inf")
    for _ in range(max(1, budget.warmup) + 1):
        t0 = time.perf_counter()
        fn()
        one = min(one, time.perf_counter() - t0)
    one = max(one, 1e-7)
    reps = int(min(budget.max_reps, max(budget.min_reps, budget.seconds / one)))
    ts = np.empty(reps)
    for i in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        ts[i] = time.perf_counter_ns() - t0
    ts /= 1e9
    return {"median_s": float(np.median(ts)), "p10_s": float(np.percentile(ts, 10)),
            "p90_s": float(np.percentile(ts, 90)), "reps": reps}
