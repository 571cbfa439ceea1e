"""The Python-visible align step: numpy inputs in, a validated, hazard-checked plan out.

    .venv/bin/python benches/plan_step.py [--requests 256 --layers 48 --repeat 300 --json]

Workload (docs/design.md section 9): Qwen3-Next GDN layers (``layouts.preset("qwen3-next-80b-a3b",
num_spec=3)``: conv SD ``[6, 8192]`` bf16 = 96 KiB, temporal ``[32, 128, 128]`` bf16 = 1 MiB per
block), ``--layers`` layers x ``--requests`` requests x 2 persistent states; block table
``[R, 5]`` int32 with distinct blocks, ``src_col = 0``, ``dst_col = 4``, ``num_accepted`` random
in ``1..4``: every request crosses, so every (layer, state, request) is one copy (24,576 for
256 x 48).

State tensors: real torch tensors, strided views into one anonymous ``MAP_NORESERVE`` mapping
laid out as pages (per layer a ``[num_blocks, page]`` region, the conv state then the temporal
state in each page, like vLLM's per-layer views). Nothing ever touches that memory (planning only
computes addresses), so it costs no RAM; the loop baseline indexes the very same tensors, so all
three methods compute the same addresses. The request-count sweep binds descriptors at made-up
addresses through ``recoverssm_rs._core.Planner`` instead (no tensors at all).

Methods, each producing the same (src_ptr, dst_ptr, nbytes) per copy:
  plan    ``CopyPlanner.plan_align(...)`` (validation, hazards, segments; Rust, GIL released)
  plan+view  the same, plus the zero-copy numpy view of the segments (``plan.segments``)
  core    ``_core.Planner.plan_align(...)`` (the same without the thin Python wrapper)
  numpy   the best vectorised numpy version: broadcasting over layers and requests, no checks
  loop    a per-copy Python loop like vLLM 0.33's ``collect_mamba_copy_meta``: per request the
          block-table row, per layer and state the copy-spec function with torch indexing on the
          state tensor (``state[blk, a-1:]``, ``state[blk]``) and ``.data_ptr()``
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import sys
import time

import numpy as np
import torch

import recoverssm_rs
from recoverssm_rs import _core, layouts
from recoverssm_rs.planner import CopyPlanner, describe_tensor

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux value; Python < 3.12 lacks the name
NUM_SPEC = 3
COLS = NUM_SPEC + 2


def make_step(R: int, seed: int = 0):
    """Block table [R, 5] int32 of distinct blocks 1..5R, src 0, dst 4, accepted 1..4."""
    rng = np.random.default_rng(seed)
    bt = (rng.permutation(R * COLS) + 1).astype(np.int32).reshape(R, COLS)
    sc = np.zeros(R, np.int32)
    dc = np.full(R, COLS - 1, np.int32)
    na = rng.integers(1, NUM_SPEC + 2, R).astype(np.int32)
    return bt, sc, dc, na


class Pool:
    """Per layer a ``[num_blocks, page]`` byte region of one lazily committed mapping; the conv
    and temporal states are views into it."""

    def __init__(self, layout, num_layers: int, num_blocks: int):
        self.conv_spec, self.temp_spec = layout.persistent
        self.conv_bytes = self.conv_spec.nbytes
        self.page = self.conv_bytes + self.temp_spec.nbytes
        size = num_layers * num_blocks * self.page
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        raw = torch.frombuffer(self.map, dtype=torch.uint8)
        self.states = []
        for l in range(num_layers):
            region = raw[l * num_blocks * self.page:(l + 1) * num_blocks * self.page].view(num_blocks, self.page)
            layer = []
            for off, spec in ((0, self.conv_spec), (self.conv_bytes, self.temp_spec)):
                v = region[:, off:off + spec.nbytes].view(getattr(torch, spec.dtype))
                isz = spec.itemsize
                inner = np.cumprod((1,) + tuple(reversed(spec.shape[1:])))[::-1].tolist()
                layer.append(v.as_strided((num_blocks, *spec.shape), (self.page // isz, *inner), v.storage_offset()))
            self.states.append(layer)
        self.num_blocks = num_blocks


def fake_descriptors(layout, num_layers: int, num_blocks: int):
    """``(data_ptr, dtype, shape, byte_strides, "cuda:0", True, False)`` of dense tensors at made-up,
    non-overlapping addresses (never dereferenced)."""
    addr, descs = 1 << 44, []
    for _ in range(num_layers):
        layer = []
        for s in layout.persistent:
            isz = s.itemsize
            inner = np.cumprod((isz,) + tuple(reversed(s.shape[1:])))[::-1].tolist()
            layer.append((addr, s.dtype, [num_blocks, *s.shape], [s.nbytes, *inner], "cuda:0", True, False))
            addr += (num_blocks * s.nbytes + 4095) // 4096 * 4096 + 4096
        descs.append(layer)
    return descs


# ------------------------------------------------------------------------------------------------
# Baselines
# ------------------------------------------------------------------------------------------------


def get_conv_copy_spec(state, block_ids, cur_block_idx, num_accepted_tokens):
    """vLLM's conv copy spec: the window of the source block shifted by the accepted tokens."""
    src_block_id = block_ids[cur_block_idx]
    src_state = state[src_block_id, num_accepted_tokens - 1:]
    return src_state.data_ptr(), src_state.numel()


def get_temporal_copy_spec(state, block_ids, cur_block_idx, num_accepted_tokens):
    """vLLM's temporal copy spec: the accepted token's spec-block state."""
    src_block_id = block_ids[cur_block_idx + num_accepted_tokens - 1]
    src_state = state[src_block_id]
    return src_state.data_ptr(), src_state.numel()


COPY_FUNCS = (get_conv_copy_spec, get_temporal_copy_spec)


def loop_baseline(states, block_table_t, src_col, dst_col, num_accepted, out):
    """Per-copy Python loop (vLLM 0.33 ``collect_mamba_copy_meta`` per request)."""
    src_ptrs, dst_ptrs, sizes = out
    offset = 0
    for r in range(block_table_t.shape[0]):
        src_idx, dst_idx, a = int(src_col[r]), int(dst_col[r]), int(num_accepted[r])
        if src_idx == dst_idx and a == 1:
            continue
        block_ids = block_table_t[r].tolist()
        dest_block_id = block_ids[dst_idx]
        for layer in states:
            for state, copy_func in zip(layer, COPY_FUNCS):
                start, numel = copy_func(state, block_ids, src_idx, a)
                src_ptrs[offset] = start
                dst_ptrs[offset] = state[dest_block_id].data_ptr()
                sizes[offset] = numel * state.element_size()
                offset += 1
    return offset


class Vectorised:
    """The best numpy version: per-(layer, state) bases broadcast against per-request blocks."""

    def __init__(self, states):
        conv, temp = zip(*states)
        self.conv_base = np.array([t.data_ptr() for t in conv], np.int64)[:, None]
        self.temp_base = np.array([t.data_ptr() for t in temp], np.int64)[:, None]
        self.conv_stride = conv[0].stride(0) * conv[0].element_size()
        self.temp_stride = temp[0].stride(0) * temp[0].element_size()
        self.width = conv[0].shape[1]
        self.row = conv[0].shape[2] * conv[0].element_size()
        self.temp_bytes = temp[0][0].numel() * temp[0].element_size()
        self.L = len(states)

    def __call__(self, bt, sc, dc, na):
        r = np.arange(bt.shape[0])
        k = na.astype(np.int64) - 1
        src = bt[r, sc].astype(np.int64)
        dst = bt[r, dc].astype(np.int64)
        tsrc = bt[r, sc + k].astype(np.int64)
        L, R = self.L, len(r)
        out_src = np.empty((L, 2, R), np.int64)
        out_dst = np.empty((L, 2, R), np.int64)
        out_n = np.empty((L, 2, R), np.int64)
        np.add(self.conv_base, src * self.conv_stride + k * self.row, out=out_src[:, 0])
        np.add(self.temp_base, tsrc * self.temp_stride, out=out_src[:, 1])
        np.add(self.conv_base, dst * self.conv_stride, out=out_dst[:, 0])
        np.add(self.temp_base, dst * self.temp_stride, out=out_dst[:, 1])
        out_n[:, 0] = (self.width - k) * self.row
        out_n[:, 1] = self.temp_bytes
        return out_src.ravel(), out_dst.ravel(), out_n.ravel()


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------


def timeit(fn, repeat: int, warmup: int = 3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    ts = np.array(ts) / 1000.0
    return {"median_us": float(np.median(ts)), "p10_us": float(np.percentile(ts, 10)),
            "p90_us": float(np.percentile(ts, 90)), "repeat": repeat}


def triples(src, dst, n):
    return set(zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), np.asarray(n).tolist()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=300, help="repetitions of the fast methods")
    ap.add_argument("--loop-repeat", type=int, default=5, help="repetitions of the Python loop")
    ap.add_argument("--sweep", type=int, nargs="*", default=[1, 64, 256, 1024],
                    help="request counts for the scaling sweep (core planner, fake descriptors)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary only")
    args = ap.parse_args(argv)
    say = (lambda *a: None) if args.json else print

    layout = layouts.preset("qwen3-next-80b-a3b", num_spec=NUM_SPEC)
    R, L = args.requests, args.layers
    num_blocks = R * COLS + 1
    copies = R * L * 2
    pool = Pool(layout, L, num_blocks)
    planner = CopyPlanner(layout, pool.states)
    core = planner._core
    bt, sc, dc, na = make_step(R)
    say(f"recoverssm_rs {recoverssm_rs.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
        f"{torch.get_num_threads()} torch threads")
    say(f"layout: {layout.backend} conv {layout.persistent[0].shape} {layout.persistent[0].dtype}, "
        f"temporal {layout.persistent[1].shape} {layout.persistent[1].dtype}; {L} layers x {R} requests x 2 "
        f"states = {copies} copies; {num_blocks} blocks; tensors: views into a "
        f"{L * num_blocks * pool.page / 2**30:.1f} GiB MAP_NORESERVE mapping (never touched)")

    # --- the same addresses from every method --------------------------------------------------
    plan = planner.plan_align(bt, sc, dc, na)
    assert len(plan) == copies and plan.num_waves == 1, plan
    segs = plan.segments
    seg_set = triples(segs["src"].astype(np.int64), segs["dst"].astype(np.int64),
                      segs["rows"].astype(np.int64) * segs["row_bytes"])
    vec = Vectorised(pool.states)
    vs, vd, vn = vec(bt, sc, dc, na)
    vec_set = triples(vs, vd, vn)
    bt_t = torch.from_numpy(bt)
    out = (np.zeros(copies, np.int64), np.zeros(copies, np.int64), np.zeros(copies, np.int64))
    n_loop = loop_baseline(pool.states, bt_t, sc, dc, na, out)
    loop_set = triples(*out)
    assert n_loop == copies
    if plan.num_segments == copies:
        assert seg_set == vec_set == loop_set, "plan, numpy and loop disagree on the copies"
        agree = "identical sets of (src, dst, bytes)"
    else:  # coalesced neighbours (not expected with distinct random blocks): compare byte totals
        assert vec_set == loop_set and plan.nbytes == int(vn.sum())
        agree = f"numpy == loop; plan coalesced to {plan.num_segments} segments, same bytes"
    say(f"check: plan {plan.num_segments} segments (SD conv cross-block copies are one contiguous row each), "
        f"numpy {len(vs)}, loop {n_loop} copies: {agree}; {plan.nbytes / 2**30:.2f} GiB per step")
    del plan

    # --- timings -------------------------------------------------------------------------------
    res = {}
    res["plan"] = timeit(lambda: planner.plan_align(bt, sc, dc, na), args.repeat)
    res["plan+view"] = timeit(lambda: planner.plan_align(bt, sc, dc, na).segments, args.repeat)
    res["core"] = timeit(lambda: core.plan_align(bt, sc, dc, na), args.repeat)
    res["numpy"] = timeit(lambda: vec(bt, sc, dc, na), args.repeat)
    res["loop"] = timeit(lambda: loop_baseline(pool.states, bt_t, sc, dc, na, out), args.loop_repeat, warmup=1)
    for k, v in res.items():
        v["ns_per_copy"] = v["median_us"] * 1000.0 / copies
    ratios = {
        "loop_over_plan": res["loop"]["median_us"] / res["plan"]["median_us"],
        "numpy_over_plan": res["numpy"]["median_us"] / res["plan"]["median_us"],
        "plan_over_core": res["plan"]["median_us"] / res["core"]["median_us"],
    }
    say(f"\n{'method':<10} {'median us':>11} {'p10 us':>11} {'p90 us':>11} {'ns/copy':>9} {'reps':>5}")
    for k, v in res.items():
        say(f"{k:<10} {v['median_us']:>11.1f} {v['p10_us']:>11.1f} {v['p90_us']:>11.1f} "
            f"{v['ns_per_copy']:>9.2f} {v['repeat']:>5}")
    say(f"ratios: loop/plan = {ratios['loop_over_plan']:.0f}x, numpy/plan = {ratios['numpy_over_plan']:.2f}x, "
        f"python wrapper/core = {ratios['plan_over_core']:.2f}x")

    # --- scaling in requests (fake descriptors, core planner) -----------------------------------
    sweep = []
    say(f"\nscaling (core planner, descriptors at made-up addresses, {L} layers):")
    say(f"{'requests':>8} {'copies':>8} {'median us':>11} {'p10 us':>9} {'p90 us':>9} {'ns/copy':>9}")
    for r in args.sweep:
        nb = r * COLS + 1
        cp = _core.Planner(layout, fake_descriptors(layout, L, nb), None)
        step = make_step(r, seed=r)
        p = cp.plan_align(*step)
        assert p.num_copies == r * L * 2
        del p
        reps = max(20, min(2000, int(args.repeat * 256 / max(r, 1))))
        t = timeit(lambda: cp.plan_align(*step), reps)
        t.update(requests=r, copies=r * L * 2, ns_per_copy=t["median_us"] * 1000.0 / (r * L * 2))
        sweep.append(t)
        say(f"{r:>8} {r * L * 2:>8} {t['median_us']:>11.1f} {t['p10_us']:>9.1f} {t['p90_us']:>9.1f} "
            f"{t['ns_per_copy']:>9.2f}")

    if args.json:
        print(json.dumps({
            "version": recoverssm_rs.__version__, "layout": "qwen3-next-80b-a3b", "num_spec": NUM_SPEC,
            "requests": R, "layers": L, "copies": copies, "num_blocks": num_blocks,
            "tensors": "views into a MAP_NORESERVE mapping (untouched)", "check": agree,
            "results": res, "ratios": ratios, "sweep": sweep,
            "torch_threads": torch.get_num_threads(),
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
