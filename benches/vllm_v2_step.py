"""Host time per half-step of ``recoverssm_rs.vllm.ModelStateV2`` (vLLM's GPU-resident runner).

Measured without a GPU through the device path's seam: the states are host tensors that claim to
be on ``cuda:0`` and the driver launch of the fused kernel is not made (the slot bookkeeping is
inside that launch). The runner's tensors are wrapped once, as a runner's are on the device
already (the harness re-wrapped them every half-step until 2026-12-02: about 2 us more per half,
which no runner pays). What is timed per half: the adapter's Python, the core's checks (the
planner's guard over every bound state tensor included) and the launch build. Every scheduled
request moves its state in the pre-copy and saves one in the post-process (the worst case); one
group of ``--layers`` GDN layers. vLLM's side is not timed here: its step is Triton launches only,
whose host time needs a GPU.

With ``--cuda`` (a machine with a GPU, CuPy and torch with CUDA), the same on real CUDA tensors:
the states on ``cuda:0``, the launch a real one, the device synchronised after each step outside
the timed window; this is the host time a runner pays (``scripts/gpu_check.sh`` records it).

The states are bound as vLLM binds them (one raw buffer per layer, both states strided views of
it: the guard checks 96 views and 48 storages at 48 layers, and a write bumps 48 version counters),
and the seam's stand-ins answer what the core reads through the host tensor's own C methods, as a
CUDA tensor does (until 2026-12-07 each state was a tensor of its own, with no storage checked and
no version bumped, its stand-in answering through Python methods: figures before that date are not
comparable).

With ``--split``, where one half-step's time goes at the first ``--requests`` (``timeit``, medians
of 500 short batches): the planner's guard alone (``planner.core.check()``: every bound view's ``data_ptr()``, every storage's ``data_ptr()`` and ``nbytes()``), the
Python reads the core's description of one runner stand-in makes, the benchmark's launch-argument
hook on one tensor, the core's two half-steps called directly (guard, four descriptions per half,
checks, launch build; a no-op write), and the adapter's two half-steps (the core's plus
``ModelStateV2``'s Python and its write callback, the launch replaced by a no-op).

With ``--recoverssm``, every row is a spec-decode row whose RecoverSSM commit (a KDA cache of
``--layers`` layers, its commit kernel bound the same way) runs inside the post-process's launch:
timed are the staging (``stage_recoverssm``: the core's plan and the host-to-device copy, made when
the step's metadata is built) and the post-process with the commit.

    .venv/bin/python benches/vllm_v2_step.py [--requests 1 64 256 1024] [--layers 48] [--reps 200]
                                             [--recoverssm | --split] [--cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from recoverssm_rs.cuda import module as cuda_module  # noqa: E402
from recoverssm_rs.cuda import ops as cuda_ops  # noqa: E402
from recoverssm_rs.vllm.model_state import ModelStateV2  # noqa: E402
from support.device_fakes import FakeCuda, FakeOps, bind_host_commit  # noqa: E402
from support.vllm_trace import paged_views  # noqa: E402

BS, NSB, COLS = 4, 2, 4
ON_GPU = False  # --cuda: real CUDA tensors and launches instead of the seam


def build(num_reqs: int, layers: int) -> tuple[ModelStateV2, list[torch.Tensor]]:
    """A ``ModelStateV2`` over ``layers`` layers bound as vLLM binds them: one raw buffer per layer,
    whose blocks (pages) each hold the conv state, then the temporal state; both states are
    strided views of it, so the guard checks 96 views and 48 storages at 48 layers."""
    nb = num_reqs * COLS + 1
    shapes = ((3 + NSB, 8), (2, 4, 4))
    spec = types.SimpleNamespace(
        shapes=shapes,
        dtypes=(torch.float32, torch.float32),
        block_size=BS,
        mamba_type="GDN_ATTN",
        num_speculative_blocks=NSB,
        mamba_cache_mode="align",
    )
    names = [f"l{i}" for i in range(layers)]
    where = "cuda" if ON_GPU else "cpu"
    fc = {n: types.SimpleNamespace(kv_cache=[device(v) for v in paged_views(nb, shapes, where)]) for n in names}
    kvc = types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec, layer_names=names)])
    funcs = {"GDN_ATTN": ("get_conv_copy_spec", "get_temporal_copy_spec")}
    # through the seam the adapter's own buffers are host tensors; on a GPU on the states' device
    ms = ModelStateV2.from_runner(
        kvc, fc, funcs, max_num_reqs=num_reqs, conv_layout="SD", device=None if ON_GPU else "cpu"
    )
    return ms, [device(torch.arange(1, num_reqs * COLS + 1, dtype=torch.int32).reshape(num_reqs, COLS))]


def device(x: Any) -> Any:
    """A runner tensor as the adapter sees it: on a GPU a CUDA tensor; through the seam a host
    tensor's stand-in (wrapped once, as a runner's tensors are on the device already; the adapter's
    own buffers are wrapped when it binds them)."""
    if ON_GPU:
        return x.cuda()
    return x if isinstance(x, FakeCuda) else FakeCuda(x)


def run(num_reqs: int, layers: int, reps: int) -> tuple[float, float]:
    ms, tables = build(num_reqs, layers)
    idx = device(torch.randperm(num_reqs).to(torch.int32))
    qsl = device(torch.arange(0, 3 * (num_reqs + 1), 3, dtype=torch.int32))  # 1 token + 2 drafts each
    before = device(torch.full((num_reqs,), 3, dtype=torch.int32))  # column 0 -> column 1 in the pre-copy
    after = device(torch.full((num_reqs,), 6, dtype=torch.int32))  # 3 + 3 - 2 drafts + 3 accepted - 1: a save at 4
    sampled = device(torch.full((num_reqs,), 3, dtype=torch.int32))
    pre, post = [], []
    for _ in range(reps):
        # not timed: what add_request(s, 3) does for every slot (column 0, count 1), in one go
        ms.state_idx.fill_(0)
        ms.num_accepted.fill_(1)
        t0 = time.perf_counter()
        ms.preprocess_state(idx, before, qsl, tables)
        t1 = time.perf_counter()
        ms.postprocess_state(idx, sampled, after, tables)
        t2 = time.perf_counter()
        if ON_GPU:
            torch.cuda.synchronize()
        pre.append(t1 - t0)
        post.append(t2 - t1)
    return statistics.median(pre), statistics.median(post)


def run_recoverssm(num_reqs: int, layers: int, reps: int) -> tuple[float, float]:
    """Medians of the staging and of the post-process with the commit in its launch."""
    from recoverssm_rs import layouts
    from recoverssm_rs.speculative.state_cache import StateCache
    from recoverssm_rs.vllm import RecoverSSMCommit

    ms, tables = build(num_reqs, layers)
    layout = layouts.kda(num_heads=2, head_dim=4, conv_kernel_size=3, num_spec=NSB, recover_ssm=True)
    cache = StateCache(layout, num_layers=layers, num_blocks=1 + num_reqs * (COLS + 1), max_requests=num_reqs)
    bind_host_commit(cache)
    StateCache._is_device_tensor = staticmethod(lambda x: isinstance(x, torch.Tensor))  # type: ignore[method-assign]
    rows = torch.arange(num_reqs)
    first = 1 + rows * (COLS + 1)
    commit = RecoverSSMCommit(
        cache,
        request_indices=rows,
        state_blocks=first.numpy(),
        num_computed_tokens=torch.full((num_reqs,), 3, dtype=torch.int32),
        block_table=(first[:, None] + 1 + torch.arange(COLS)[None, :]).to(torch.int32),
    )
    idx = device(torch.randperm(num_reqs).to(torch.int32))
    after = device(torch.full((num_reqs,), 6, dtype=torch.int32))
    sampled = device(torch.full((num_reqs,), 3, dtype=torch.int32))
    # not timed: a pre-copy of no rows begins each step (a post-process needs its step's pre-copy)
    none, zeros = device(torch.zeros(0, dtype=torch.int32)), device(torch.zeros(num_reqs + 1, dtype=torch.int32))
    stage, post = [], []
    for _ in range(reps):
        ms.preprocess_state(none, zeros, zeros, tables)
        t0 = time.perf_counter()
        ms.stage_recoverssm(commit)
        t1 = time.perf_counter()
        ms.postprocess_state(idx, sampled, after, tables, recoverssm=True)
        t2 = time.perf_counter()
        stage.append(t1 - t0)
        post.append(t2 - t1)
    return statistics.median(stage), statistics.median(post)


def split(num_reqs: int, layers: int) -> dict[str, float]:
    """Microseconds per call of each piece of a half-step."""
    ms, tables = build(num_reqs, layers)
    idx = device(torch.randperm(num_reqs).to(torch.int32))
    qsl = device(torch.arange(0, 3 * (num_reqs + 1), 3, dtype=torch.int32))
    before = device(torch.full((num_reqs,), 3, dtype=torch.int32))
    after = device(torch.full((num_reqs,), 6, dtype=torch.int32))
    sampled = device(torch.full((num_reqs,), 3, dtype=torch.int32))

    def both() -> None:
        ms.preprocess_state(idx, before, qsl, tables)
        ms.postprocess_state(idx, sampled, after, tables)

    both()  # the core's step made, the tables uploaded
    step, core, noop = ms._step, ms.planner.core, lambda *a: None
    hook = cuda_ops.cuda_ops.launch_arg

    def core_both() -> None:
        step.pre(tables, idx, before, qsl, noop, hook)
        step.post(idx, sampled, after, tables, False, noop, hook)

    def reads() -> None:  # what the core reads of one runner stand-in to describe it
        idx.layout, idx.stride(), idx.dtype, idx.data_ptr(), idx.shape, idx.device  # noqa: B018

    def best(f: Any, n: int) -> float:
        """The median over 500 batches of ``n`` calls (a batch's time, not a long loop's: on a
        shared machine a long loop's wall time includes the other jobs' time slices)."""
        return statistics.median(timeit.repeat(f, number=n, repeat=500)) / n * 1e6

    views = sum(len(layer) for group in ms.planner.states for layer in group)
    return {
        f"guard check ({views} views, {layers} storages)": best(core.check, 10),
        "one description's Python reads": best(reads, 20),
        "launch-argument hook, one tensor": best(lambda: hook(idx), 20),
        "core pre + post (no-op write)": best(core_both, 5),
        "adapter pre + post": best(both, 5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 64, 256, 1024])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--recoverssm", action="store_true", help="time the post-process with a RecoverSSM commit")
    ap.add_argument("--split", action="store_true", help="where one half-step's time goes (timeit)")
    ap.add_argument("--cuda", action="store_true", help="real CUDA tensors and launches (needs a GPU and CuPy)")
    a = ap.parse_args()
    launches: list[Any] = []
    if a.cuda:
        if a.recoverssm:
            ap.error("--recoverssm runs through the seam only")
        global ON_GPU
        ON_GPU = True
    else:
        cuda_ops.cuda_ops = FakeOps()
        cuda_module.launch = lambda kl, index, stream: launches.append(kl.kernel)  # type: ignore[assignment]
        cuda_ops.CudaOps.launch_arg = staticmethod(device)  # type: ignore[method-assign,assignment]
    torch.set_num_threads(1)
    if a.split:
        for what, us in split(a.requests[0], a.layers).items():
            print(f"{what:<40} {us:>8.2f} us")
        return
    if a.recoverssm:
        print(f"{'requests':>8} {'stage us':>12} {'post+commit us':>16} {'launches/post':>14}")
        for r in a.requests:
            launches.clear()
            stage, post = run_recoverssm(r, a.layers, a.reps)
            posts = len(launches) - a.reps  # less each step's (untimed) pre-copy
            print(f"{r:>8} {stage * 1e6:>12.1f} {post * 1e6:>16.1f} {posts / a.reps:>14.1f}")
        return
    print(f"{'requests':>8} {'pre-copy us':>12} {'post-process us':>16} {'launches/half':>14}")
    for r in a.requests:
        launches.clear()
        pre, post = run(r, a.layers, a.reps)
        per_half = "-" if a.cuda else f"{len(launches) / (2 * a.reps):.1f}"  # on a GPU not counted
        print(f"{r:>8} {pre * 1e6:>12.1f} {post * 1e6:>16.1f} {per_half:>14}")


if __name__ == "__main__":
    main()
