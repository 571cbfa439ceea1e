"""Host time per engine step: vLLM 0.33.0's align-mode step code against recoverssm_rs.vllm.

vLLM side (its own code, loaded from the downloaded wheel by tests/support/vllm_oracle.py):
``preprocess_mamba`` on the scalar path (the per-request loop and ``collect_mamba_copy_meta`` over
groups x layers x states, then the pointer staging) plus ``stage_postprocess_inputs_to_gpu``; its
copy kernel launch (``batch_memcpy``) is replaced by a no-op, since on a GPU it is queued
asynchronously. Adapter side: ``VllmMambaStep.preprocess`` (slots, gathering the runner's
per-request values, the core's decision and the multi-group plan) with the plan's execution
skipped likewise. Every request moves its state every step (the worst case).

Device path (the adapter bound to CUDA states; measured without a GPU through the device path's
seam: the states are host tensors that claim to be on ``cuda:0``, the staging copy is a host copy
and the driver launch is not made): host time of the pre-copy half, from the runner's objects
(``preprocess``) and in array form (``DeviceStep.launch`` of a ``PreCopyInputs``: the core's column decision, the int32
staging, the launch build; no per-request Python), and of the post-process half in array form.

    .venv/bin/python benches/vllm_step.py [--requests 1 64 256 1024] [--groups 1 3] [--layers 48]

``--layers`` is the number of recurrent layers of the model, split evenly over the groups.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from recoverssm_rs.cuda import module as cuda_module  # noqa: E402
from recoverssm_rs.cuda import ops as cuda_ops  # noqa: E402
from recoverssm_rs.planner import CopyPlan  # noqa: E402
from recoverssm_rs.vllm import VllmMambaStep  # noqa: E402
from recoverssm_rs.vllm.decide import PostProcessInputs, PreCopyInputs  # noqa: E402
from support import vllm_oracle  # noqa: E402
from support.device_fakes import FakeCuda, FakeOps  # noqa: E402
from support.vllm_trace import paged_views  # noqa: E402

BS, NSB, COLS = 4, 2, 4
C, N, D = 3, 3, 2  # every request: running column 1, previous column 0: one move per request


class _Table:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def get_device_tensor(self, n: int) -> torch.Tensor:
        return self.t[:n]

    def get_numpy_array(self) -> np.ndarray:
        return self.t.numpy()


def build(ns: types.SimpleNamespace, num_reqs: int, num_groups: int, layers: int):
    per = layers // num_groups
    nb = num_reqs * COLS + 1
    spec = vllm_oracle.MambaSpec(
        shapes=((3 + NSB, 8), (2, 4, 4)),
        dtypes=(torch.float32, torch.float32),
        block_size=BS,
        mamba_type="GDN_ATTN",
        num_speculative_blocks=NSB,
    )
    names = [[f"g{g}.l{i}" for i in range(per)] for g in range(num_groups)]
    # bound as vLLM binds them: one buffer of pages per layer, both states strided views of it
    fc = {n: types.SimpleNamespace(kv_cache=paged_views(nb, spec.shapes)) for g in names for n in g}
    kvc = types.SimpleNamespace(
        kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec, layer_names=g) for g in names]
    )
    ids = [f"req-{i}" for i in range(num_reqs)]
    tables = []
    for _ in range(num_groups):
        t = torch.arange(1, num_reqs * COLS + 1, dtype=torch.int32).reshape(num_reqs, COLS)
        tables.append(_Table(t))
    acc = torch.ones(num_reqs, dtype=torch.int32)
    ib = types.SimpleNamespace(
        req_ids=ids, block_table=tables, num_accepted_tokens_cpu=acc.numpy(), num_accepted_tokens_cpu_tensor=acc
    )
    requests = {
        r: types.SimpleNamespace(num_computed_tokens=C, block_ids=tuple(t.t[i].tolist() for t in tables))
        for i, r in enumerate(ids)
    }
    so = types.SimpleNamespace(
        num_scheduled_tokens={r: N for r in ids},
        scheduled_spec_decode_tokens={r: [0] * D for r in ids},
        finished_req_ids=set(),
        preempted_req_ids=set(),
        scheduled_cached_reqs=types.SimpleNamespace(resumed_req_ids=set()),
    )
    return kvc, fc, ib, requests, so, ids


def time_vllm(ns, kvc, fc, ib, requests, so, ids, reps):
    wmu = ns.wmu
    funcs = {"GDN_ATTN": (ns.lmu.get_conv_copy_spec, ns.lmu.get_temporal_copy_spec)}
    make = lambda n, dtype: vllm_oracle.CpuGpuBuffer(n, dtype=dtype)  # noqa: E731
    bufs = wmu.MambaBuffers.create(len(ids), kvc, funcs, make, torch.device("cpu"), True)
    cache_config = types.SimpleNamespace(enable_prefix_caching=True)
    launched = []
    wmu.batch_memcpy = lambda s, d, n: launched.append(len(n))  # the async launch, not timed
    times = []
    for _ in range(reps):
        state_idx = {r: 0 for r in ids}
        ib.num_accepted_tokens_cpu[:] = 1
        t0 = time.perf_counter()
        wmu.preprocess_mamba(so, kvc, cache_config, state_idx, ib, requests, fc, funcs, bufs.preprocess, None)
        wmu.stage_postprocess_inputs_to_gpu(bufs.postprocess_align, so, ids, len(ids), requests, state_idx)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), launched[-1]


def time_adapter(kvc, fc, ib, requests, so, ids, reps):
    step = VllmMambaStep.from_runner(
        kvc, fc, {"GDN_ATTN": ("get_conv_copy_spec", "get_temporal_copy_spec")}, max_num_reqs=len(ids), conv_layout="SD"
    )
    planned = []
    CopyPlan.execute = lambda plan: planned.append(len(plan))  # type: ignore[method-assign,assignment,misc]  # not run: counted
    times = []
    for _ in range(reps):
        step.release(ids)
        step._slots_table.assign(ids)  # each request its request index, as preprocess assigns them
        step.mamba_state_idx[: len(ids)] = 0
        ib.num_accepted_tokens_cpu[:] = 1
        t0 = time.perf_counter()
        step.preprocess(so, ib, requests)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), planned[-1]


def time_device(kvc, fc, ib, requests, so, ids, reps):
    """The device path's host time per half-step: ``(preprocess, pre_copy array form, post_process
    array form, launches per step)``."""
    launches = []
    cuda_ops.cuda_ops = FakeOps()
    cuda_module.launch = lambda kl, index, stream: launches.append(kl.kernel)  # type: ignore[assignment]

    fake = {k: types.SimpleNamespace(kv_cache=[FakeCuda(t) for t in v.kv_cache]) for k, v in fc.items()}
    step = VllmMambaStep.from_runner(
        kvc,
        fake,
        {"GDN_ATTN": ("get_conv_copy_spec", "get_temporal_copy_spec")},
        max_num_reqs=len(ids),
        conv_layout="SD",
    )
    dev = step.device_step
    assert dev is not None
    n = len(ids)
    tables = step.tables(ib, n)
    c, ns_, nd = np.full(n, C), np.full(n, N), np.full(n, D)
    run, acc = np.zeros(n, np.int64), FakeCuda(torch.ones(n, dtype=torch.int32))
    acc_post = FakeCuda(torch.full((n,), 2, dtype=torch.int32))
    pre, arr, post = [], [], []
    for _ in range(reps):
        step.release(ids)
        step._slots_table.assign(ids)  # each request its request index, as preprocess assigns them
        step.mamba_state_idx[:n] = 0
        launches.clear()
        t0 = time.perf_counter()
        step.preprocess(so, ib, requests, num_accepted=acc)
        t1 = time.perf_counter()
        curr, _ = dev.launch(PreCopyInputs(tables, c, ns_, acc, run))
        t2 = time.perf_counter()
        dev.launch(PostProcessInputs(tables, curr, c, ns_, nd, acc_post))
        t3 = time.perf_counter()
        pre.append(t1 - t0)
        arr.append(t2 - t1)
        post.append(t3 - t2)
    assert len(launches) == 3, launches  # one fused launch per half-step, every group included
    return statistics.median(pre), statistics.median(arr), statistics.median(post), len(launches) // 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 64, 256, 1024])
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    ns = vllm_oracle.load()
    vllm_oracle.set_conv_layout(ns, "SD")
    print(
        f"align-mode step host time, {args.layers} recurrent layers (GDN: conv + temporal), "
        f"block_size={BS}, num_speculative_blocks={NSB}, every request moving; median of {args.reps}"
    )
    print(
        "host path: vLLM's preprocess + staging against the adapter's preprocess (decision + plan); device path "
        "(us): preprocess from the runner's objects, DeviceStep.launch of each half-step's inputs, launches per half-step"
    )
    print(
        f"{'requests':>8} {'groups':>6} {'copies':>8} {'vLLM ms':>10} {'adapter ms':>11} {'ratio':>8} "
        f"{'dev pre us':>11} {'ratio':>8} {'dev array pre':>14} {'dev array post':>15} {'launch/half':>12}"
    )
    for g in args.groups:
        for r in args.requests:
            kvc, fc, ib, requests, so, ids = build(ns, r, g, args.layers)
            tv, nv = time_vllm(ns, kvc, fc, ib, requests, so, ids, args.reps)
            ta, na = time_adapter(kvc, fc, ib, requests, so, ids, args.reps)
            assert nv == na, f"vLLM collected {nv} copies, the adapter planned {na}"
            dp, da, dq, nl = time_device(kvc, fc, ib, requests, so, ids, args.reps)
            print(
                f"{r:>8} {g:>6} {na:>8} {tv * 1e3:>10.3f} {ta * 1e3:>11.3f} {tv / ta:>7.1f}x "
                f"{dp * 1e6:>11.1f} {tv / dp:>7.1f}x {da * 1e6:>14.1f} {dq * 1e6:>15.1f} {nl:>12}",
                flush=True,
            )


if __name__ == "__main__":
    main()
