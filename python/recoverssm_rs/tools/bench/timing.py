"""Timing shared by the benchmarks: methods repeated within a time budget, interleaved, as percentiles."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["ROUNDS", "Budget", "measure_interleaved"]

ROUNDS = 8
"""Rounds :func:`measure_interleaved` splits each method's calls into."""


@dataclass(frozen=True)
class Budget:
    """How long to time one method: about ``seconds`` of repetitions, within ``[min_reps, max_reps]``."""

    seconds: float
    min_reps: int = 3
    max_reps: int = 2000
    warmup: int = 2


def measure_interleaved(fns: Mapping[str, tuple[Callable[[], object], Budget]],
                        on_done: Callable[[str], None] | None = None,
                        rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """Time several methods of one case in ``rounds`` rounds, each method's calls split among them.

    On a shared machine the load changes within seconds; timed one after another, each method would
    see a different load and their ratio would measure the load. Interleaved, every method samples
    the same stretches of time. Within a round a method's calls run back to back, so that thread
    pools (torch's OpenMP workers, the executor's rayon workers) do not fight over the cores at
    every call. Each method gets the repetitions its own :class:`Budget` allows (from its fastest
    warm-up call); ``on_done(name)`` is called when it has them. Returns, per name, ``median_s``,
    ``p10_s``, ``p90_s`` (seconds) and ``reps``.
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
    for r in range(rounds):
        for name, (fn, _) in fns.items():
            until = reps[name] * (r + 1) // rounds  # an even share of the calls per round
            if done[name] >= until:
                continue
            for i in range(done[name], until):
                t0 = time.perf_counter_ns()
                fn()
                times[name][i] = time.perf_counter_ns() - t0
            done[name] = until
            if until == reps[name] and on_done is not None:
                on_done(name)
    out = {}
    for name, ts in times.items():
        ts = ts / 1e9
        out[name] = {"median_s": float(np.median(ts)), "p10_s": float(np.percentile(ts, 10)),
                     "p90_s": float(np.percentile(ts, 90)), "reps": len(ts)}
    return out
