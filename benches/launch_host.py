"""Host time of one device launch, measured without a GPU through the launch layer's CUDA seam.

Every launch of the device path does host work before the driver call: describing the step's
tensors, the core's checks and packing, the error word, the stream. This benchmark runs that work
for real -- the planner's ``launch_align`` / ``launch_align_decision`` and the state cache's commit
launch, down to ``cuLaunchKernel`` -- with a stand-in for CuPy whose ``launchKernel`` does nothing,
over CPU tensors that claim to live on ``cuda:0`` (the path only reads their pointers, shapes and
devices). What it leaves out: the driver call itself and torch's current-stream lookup (a stream is
passed explicitly), which a GPU run adds.

    .venv/bin/python benches/launch_host.py [--requests 1,16,256,1024] [--repeat 2000] [--json FILE]

Prints, per launch kind and request count, the median host time per launch (us) over ``--repeat``
launches, and the ratio of the largest to the smallest request count (flat = 1.0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from recoverssm_rs import Planner, layouts
from recoverssm_rs.cuda import ops as device_path
from recoverssm_rs.cuda.commit import CommitKernel
from recoverssm_rs.plan_format import COMMIT_ROW_DTYPE
from recoverssm_rs.speculative.state_cache import StateCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' stand-in for a CUDA tensor: what the guard calls per launch (``data_ptr``, the storage's
# ``data_ptr`` / ``nbytes``, the version-counter bump) goes to the host tensor's own C methods, so
# it costs what it costs on a CUDA tensor.
from support.device_fakes import FakeCuda  # noqa: E402


class FakeOps(device_path.CudaOps):
    def context(self, index: int, stream: Any) -> Any:
        return contextlib.nullcontext()

    def torch_stream(self, stream: Any, index: int) -> Any:
        return stream

    def upload(self, raw: np.ndarray, index: int) -> Any:
        return FakeCuda(torch.from_numpy(np.ascontiguousarray(raw).copy()))

    def zeros_i32(self, n: int, index: int) -> Any:
        return FakeCuda(torch.zeros(n, dtype=torch.int32))

    def synchronize(self, index: int) -> None:
        pass


def install_seam() -> None:
    """CuPy whose driver launch does nothing; the device path's torch calls on the host."""
    fake = SimpleNamespace(
        RawModule=lambda code, options: SimpleNamespace(
            compile=lambda: None, get_function=lambda name: SimpleNamespace(kernel=SimpleNamespace(ptr=0xF00))
        ),
        cuda=SimpleNamespace(
            Device=lambda i: contextlib.nullcontext(),
            runtime=SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0),
            driver=SimpleNamespace(launchKernel=lambda *a: None),
        ),
    )
    sys.modules["cupy"] = fake  # type: ignore[assignment]
    device_path.cuda_ops = FakeOps()


def median_us(fn: Callable[[], None], repeat: int) -> float:
    for _ in range(min(200, repeat)):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def copy_case(R: int, layers: int = 48) -> tuple[Planner, list[Any], Any]:
    layout = layouts.gdn(
        num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel_size=4, num_spec=3, conv_layout="DS"
    )
    cols, nb = 8, 2 * R * 8 + 2
    # one tensor per state kind, each layer a view (as engines bind their pools)
    pools = [torch.zeros((layers, nb, *s.shape), dtype=getattr(torch, s.dtype)) for s in layout.persistent]
    states = [[FakeCuda(p[l]) for p in pools] for l in range(layers)]
    planner = Planner(layout, states)
    bt = FakeCuda(torch.arange(1, R * cols + 1, dtype=torch.int32).reshape(R, cols))
    vecs = [FakeCuda(torch.zeros(R, dtype=torch.int32)) for _ in range(4)]
    return planner, [bt, *vecs], pools


def commit_case(R: int) -> CommitKernel:
    layout = layouts.kda(num_heads=4, head_dim=16, num_spec=3, recover_ssm=True)

    class HostKernel(CommitKernel):
        def device_name(self) -> str:
            return "cuda:0"

        def device_arg(self, x: Any) -> Any:
            return FakeCuda(x)

    cache = StateCache(layout, num_layers=48, num_blocks=2 * R + 2, max_requests=R)
    return HostKernel(cache.commit_meta(), device="cpu", num_blocks=cache.num_blocks, max_requests=R)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", default="1,16,256,1024")
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    install_seam()
    requests = [int(x) for x in args.requests.split(",")]
    stream = SimpleNamespace(cuda_stream=7)
    results: dict[str, dict[int, float]] = {"launch_align": {}, "launch_align_decision": {}, "commit": {}}
    for R in requests:
        planner, (bt, src, dst, acc, run), _pools = copy_case(R)
        planner.prepare_device()
        results["launch_align"][R] = median_us(
            lambda: planner.launch_align(bt, src, dst, acc, stream=stream), args.repeat
        )
        results["launch_align_decision"][R] = median_us(
            lambda: planner.launch_align_decision(bt, src, run, acc, 16, stream=stream), args.repeat
        )
        kernel = commit_case(R)
        rows = torch.zeros(R * COMMIT_ROW_DTYPE.itemsize, dtype=torch.uint8)
        counts = torch.zeros(R, dtype=torch.int32)
        results["commit"][R] = median_us(lambda: kernel.launch(rows, R, counts, stream), args.repeat)
    print(f"host time per launch (us, median of {args.repeat}); 48 layers; CUDA seam on this CPU")
    print(f"{'launch':<24}" + "".join(f"{'R=' + str(r):>10}" for r in requests) + f"{'max/min':>10}")
    for name, row in results.items():
        vals = [row[r] for r in requests]
        print(f"{name:<24}" + "".join(f"{v:>10.1f}" for v in vals) + f"{max(vals) / min(vals):>10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: {str(r): v for r, v in row.items()} for k, row in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
