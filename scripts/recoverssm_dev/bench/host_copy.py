"""Host executor bandwidth against torch on the same bytes.

For each state size S and batch N: a real CPU pool ``[2N + 1, *state]`` fp32 (one temporal state,
one layer; the 2 MiB case is Kimi-K3-like ``[32, 128, 128]`` fp32), and ``plan_copy(src, dst)`` of
N blocks to N other blocks, both in random order (no two copies coalesce, as in an engine step).
Timed interleaved (each method's calls split into rounds, the methods in turn within a round, so
that all of them see the same machine load):

  execute        ``plan.execute()`` (plan built outside the timed region; N segments)
  plan+execute   ``planner.plan_copy(src, dst).execute()``
  execute(1seg)  ``plan.execute()`` for blocks ``1..N -> N+1..2N``: coalesced to one segment
  copy_          baseline: ``dst_view.copy_(src_view)`` of one contiguous tensor of the same N*S bytes
  index          baseline: ``pool[dst_idx] = pool[src_idx]`` (gather into a temporary, then scatter;
                 what engines do today)

Bandwidth is bytes read + bytes written per second (2 N S / t; for ``index`` the temporary's extra
traffic is not counted), median over repetitions, in GB/s (1e9), with the min-max of the rounds'
medians (``GBps_range``). The executor's ratios to ``copy_`` and to ``index`` are the median of
the ratios taken round by round, with their min-max (``_range``). Small pools sit in the CPU caches
(no rotation), so the small sizes measure cache bandwidth and per-call overhead. The executor uses
2 threads per wave of >= 4 MiB where the machine has them; torch uses its intra-op threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from recoverssm_rs._core import Layout, StateSpec
from recoverssm_rs.planner import Planner

from .progress import Progress
from .timing import Budget, format_ratio, format_spread, measure_interleaved, ratio, round_range

__all__ = ["BASELINES", "METHODS", "SHAPES", "count_units", "format_table", "memory_bytes", "run"]

SHAPES: dict[str, tuple[int, ...]] = {"4K": (1024,), "64K": (16384,), "256K": (65536,), "2M": (32, 128, 128)}
"""State sizes (fp32 shapes) by name."""
METHODS = ("execute", "plan+execute", "execute(1seg)", "copy_", "index")
BASELINES = ("copy_", "index")


def memory_bytes(sizes: Sequence[str], batches: Sequence[int]) -> int:
    """The memory the largest case takes: its pool of ``2N + 1`` states and the index copy's
    temporary of ``N`` more (float32)."""
    state = max(4 * int(np.prod(SHAPES[s])) for s in sizes)
    return (3 * max(batches) + 1) * state


def count_units(sizes: Sequence[str], batches: Sequence[int]) -> int:
    """Progress units :func:`run` reports: one per (size, batch, method)."""
    return len(sizes) * len(batches) * len(METHODS)


def _case(torch: Any, name: str, n: int, budget: Budget, progress: Progress, seed: int) -> dict[str, Any]:
    shape = SHAPES[name]
    layout = Layout("BENCH", [StateSpec("temporal", shape, "float32", "persistent", "temporal")])
    pool = torch.empty(2 * n + 1, *shape)
    pool.copy_(torch.arange(2 * n + 1, dtype=torch.float32).view(-1, *[1] * len(shape)).expand_as(pool))
    planner = Planner(layout, [[pool]])
    rng = np.random.default_rng(seed)
    src = (1 + rng.permutation(n)).astype(np.int64)
    dst = (n + 1 + rng.permutation(n)).astype(np.int64)
    plan = planner.plan_copy(src, dst)
    plan.execute()
    if not torch.equal(pool[torch.from_numpy(dst)], pool[torch.from_numpy(src)]):
        raise AssertionError(f"{name} x {n}: the host executor copied the wrong bytes")
    state_bytes = layout.persistent[0].nbytes
    assert state_bytes is not None  # a persistent state has a size per block
    payload = n * state_bytes
    seq = planner.plan_copy(np.arange(1, n + 1), np.arange(n + 1, 2 * n + 1))
    src_view, dst_view = pool[1 : n + 1], pool[n + 1 : 2 * n + 1]
    src_idx, dst_idx = torch.from_numpy(src), torch.from_numpy(dst)

    def index_copy() -> None:
        pool[dst_idx] = pool[src_idx]

    fns: dict[str, Callable[[], object]] = {
        "execute": plan.execute,
        "plan+execute": lambda: planner.plan_copy(src, dst).execute(),
        "execute(1seg)": seq.execute,
        "copy_": lambda: dst_view.copy_(src_view),
        "index": index_copy,
    }
    case = f"host copy, {name} states x {n}"
    progress.start(case, "timing the methods interleaved")
    methods: dict[str, dict[str, Any]] = measure_interleaved(
        {m: (fns[m], budget) for m in METHODS}, on_done=lambda m: progress.advance(case, f"{m} done")
    )
    for t in methods.values():
        t["GBps"] = 2 * payload / t["median_s"] / 1e9
        t["GBps_range"] = round_range(t, lambda s: 2 * payload / s / 1e9)
    # GB/s ratios are inverse time ratios: execute / copy_ in GB/s = copy_ time / execute time
    over_copy, over_copy_range = ratio(methods["copy_"], methods["execute"])
    over_index, over_index_range = ratio(methods["index"], methods["execute"])
    return {
        "size": name,
        "state_bytes": state_bytes,
        "batch": n,
        "payload_bytes": payload,
        "segments": plan.num_segments,
        "segments_seq": seq.num_segments,
        "methods": methods,
        "execute_over_copy_": over_copy,
        "execute_over_copy__range": over_copy_range,
        "execute_over_index": over_index,
        "execute_over_index_range": over_index_range,
    }


def run(
    sizes: Sequence[str], batches: Sequence[int], budget: Budget, progress: Progress | None = None, seed: int = 0
) -> dict[str, Any]:
    """Time every method for every (state size, batch); returns the results as a JSON-ready dict."""
    import torch

    progress = progress or Progress(count_units(sizes, batches), enabled=False)
    results = [_case(torch, name, n, budget, progress, seed) for name in sizes for n in batches]
    return {
        "dtype": "float32",
        "methods": list(METHODS),
        "baselines": list(BASELINES),
        "budget_s": budget.seconds,
        "torch_threads": torch.get_num_threads(),
        "results": results,
    }


def format_table(doc: dict[str, Any]) -> str:
    """The host-copy results as a text table: per method the median GB/s (read + written) with the
    min-max of the rounds' medians, and the executor's ratio to ``copy_`` and to the index copy with
    their spread (min-max of the per-round ratios)."""
    lines = [
        (
            f"host copy: plan_copy of N random blocks of a CPU pool; GB/s = (bytes read + written) / s, "
            f"median (min-max of the timing rounds); baselines: {', '.join(doc['baselines'])}; "
            f"torch threads {doc['torch_threads']}"
        )
    ]
    cells = {
        id(r): [format_spread(r["methods"][m]["GBps"], r["methods"][m]["GBps_range"]) for m in METHODS]
        for r in doc["results"]
    }
    width = max([13, *(len(c) for cs in cells.values() for c in cs)])
    head = (
        f"{'state':>6} {'N':>4} {'MiB':>7} {'segs':>5} "
        + " ".join(f"{m:>{width}}" for m in METHODS)
        + f" {'exec/copy_':>19} {'exec/index':>19}"
    )
    lines += [head, "-" * len(head)]
    for r in doc["results"]:
        lines.append(
            f"{r['size']:>6} {r['batch']:>4} {r['payload_bytes'] / 2**20:>7.1f} {r['segments']:>5} "
            + " ".join(f"{c:>{width}}" for c in cells[id(r)])
            + f" {format_ratio(r, 'execute_over_copy_'):>19} {format_ratio(r, 'execute_over_index'):>19}"
        )
    return "\n".join(lines)
