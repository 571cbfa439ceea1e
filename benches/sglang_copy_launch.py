"""Host time of ``SglangMambaPool.copy_from`` on the CUDA path, without a GPU: the pool's tensors are
host tensors that claim to be on ``cuda:0`` (the tests' ``FakeCuda``), the device calls go through
the tests' ``FakeOps`` and the driver launch is not made (the launch is queued asynchronously on a
GPU). Measured: the adapter's host work per call (the slot ids to the device, the core's checks and
launch packing, the guard) and how many times it reaches the compiled core's planner per call; and
the host work of a HiCache round trip of the same slots on that path (``get_cpu_copy``: staging,
launch, device-to-host copy of the blocks; ``load_cpu_copy`` of that copy: staging, launch).
"core calls" counts the calls of the compiled core's functions and methods one ``copy_from`` makes.
Medians over ``--rounds`` rounds, with the lowest and highest round.

    .venv/bin/python benches/sglang_copy_launch.py [--batch 8 32] [--layers 8] [--slots 72] [--repeat 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from recoverssm_rs import _core  # noqa: E402
from recoverssm_rs.cuda import module as cuda_module  # noqa: E402
from recoverssm_rs.cuda import ops as cuda_ops  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support.device_fakes import FakeCuda, FakeOps  # noqa: E402


def core_calls(op: Any) -> int:
    """The calls into the compiled core (a method of one of its objects, or one of its functions)
    that one call of ``op`` makes, counted from the profiler's C-call events (not timed)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        owner = getattr(arg, "__self__", None)
        if event == "c_call" and (owner is _core or type(owner).__module__ == _core.__name__):
            calls += 1

    sys.setprofile(count)
    try:
        op()
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--slots", type=int, default=72)
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if 2 * max(a.batch) >= a.slots:  # sources 1..n, destinations n+1..2n, slot 0 the dummy
        ap.error(f"--batch {max(a.batch)} needs --slots > {2 * max(a.batch)}")
    cuda_ops.cuda_ops = FakeOps()
    # the adapter views its slot ids with other strides
    FakeCuda.as_strided = lambda self, size, stride: FakeCuda(self.t.as_strided(size, stride))  # type: ignore[attr-defined]
    launches: list[Any] = []
    cuda_module.launch = lambda kl, index, stream=None: launches.append(kl)  # type: ignore[assignment]
    torch.set_num_threads(1)
    conv = [FakeCuda(torch.zeros(a.layers, a.slots, 8, 3, dtype=torch.bfloat16))]
    temporal = FakeCuda(torch.zeros(a.layers, a.slots, 2, 4, 4))
    pool = SglangMambaPool(conv, temporal)
    print(
        f"{'batch':>5} {'copy_from us':>22} {'core calls':>15} {'launches':>9} {'get_cpu_copy us':>22} {'load_cpu_copy us':>22}"
    )
    for n in a.batch:
        src = FakeCuda(torch.arange(1, n + 1, dtype=torch.int64))
        dst = FakeCuda(torch.arange(n + 1, 2 * n + 1, dtype=torch.int64))
        pool.copy_from(src, dst)  # the first call uploads the constants and the state table
        host = pool.get_cpu_copy(src.t)  # HiCache hands host slot ids
        ops = {
            "copy": (lambda: pool.copy_from(src, dst), a.repeat),
            "get": (lambda: pool.get_cpu_copy(src.t), max(1, a.repeat // 10)),
            "load": (lambda: pool.load_cpu_copy(host, dst.t), max(1, a.repeat // 10)),
        }
        times: dict[str, list[float]] = {k: [] for k in ops}
        for _ in range(a.rounds):
            for k, (op, reps) in ops.items():
                t0 = time.perf_counter()
                for _ in range(reps):
                    op()
                times[k].append((time.perf_counter() - t0) / reps * 1e6)
        launches.clear()
        calls = core_calls(lambda: pool.copy_from(src, dst))  # noqa: B023
        cols = [f"{statistics.median(t):7.1f} ({min(t):.1f}-{max(t):.1f})" for t in times.values()]
        print(f"{n:5d} {cols[0]:>22} {calls:15d} {len(launches):9d} {cols[1]:>22} {cols[2]:>22}")


if __name__ == "__main__":
    main()
