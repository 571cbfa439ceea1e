"""The RecoverSSM commit kernel against its memory roofline (needs a CUDA GPU).

Workload: the Kimi-K3-like preset (``layouts.preset("kimi-k3-like-recoverssm")``: KDA, 32 heads of
128 x 128 fp32 recurrent state, a bf16 DS conv window of 12288 x 10, window Q = 8), 48 layers, one
``StateCache.launch_commit`` of B requests that each accept the whole window (the heaviest commit:
every record folded in), timed with CUDA events, median of the repetitions.

Bytes moved per (layer, request): the recurrent state read and written, the corrections and the
key+gate records read, the conv window read from the workspace and written to the block, plus the
commit rows: :func:`commit_bytes` (computed from the kernel's own per-layer table). The roofline is
those bytes over the device-to-device bandwidth measured on the same GPU with one
``dst.copy_(src)`` of the same number of bytes (read + write counted, as for the commit).

    python benches/commit_gpu.py [--requests 1,48,96,256] [--reps 20] [--json FILE]

vLLM's published Kimi-K3 RecoverSSM commit times (vLLM issue #56082; the GPU is not named in the
issue text we have): B=48, T=8: 351 us before / 177 us after their optimisation; B=96: 701 / 340 us;
about 8-12 us at B=1. They are printed next to ours for orientation, not as a like-for-like figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np
from recoverssm_rs.plan_format import COMMIT_META_DTYPE, COMMIT_ROW_DTYPE

LAYERS = 48
VLLM_PUBLISHED_US = {1: "8-12", 48: "351 -> 177", 96: "701 -> 340"}
_ITEMSIZE = {0: 4, 1: 2, 2: 2}  # RS_DT_F32, RS_DT_BF16, RS_DT_F16


def commit_bytes(meta: Any, counts: Any) -> int:
    """Bytes a commit moves for a ``COMMIT_META_DTYPE`` table and the per-request token counts
    (requests with a count of 0 move nothing; no boundary states): per layer and committed request,
    the recurrent state read and written, the first ``count`` correction and key+gate records read,
    the verified conv window read and the block's window written; plus one 32-byte row per request
    and the table itself."""
    m = np.asarray(meta).view(COMMIT_META_DTYPE).reshape(-1)
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    total = m.nbytes + len(c) * COMMIT_ROW_DTYPE.itemsize
    for row in m:
        heads, v, k = int(row["heads"]), int(row["head_v"]), int(row["head_k"])
        state = heads * v * k * _ITEMSIZE[int(row["state_dtype"])]
        per_token = heads * (v * 4 + int(row["kg_width"]) * _ITEMSIZE[int(row["kg_dtype"])])
        conv = int(row["conv_width"]) * int(row["conv_dim"]) * int(row["conv_elem"]) if int(row["conv_layout"]) else 0
        for n in c[c > 0]:
            total += 2 * state + int(min(n, int(row["window"]))) * per_token + 2 * conv
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", default="1,48,96,256")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("commit_gpu: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("commit_gpu: no CUDA device (this benchmark needs a GPU)", file=sys.stderr)
        return 2
    import recoverssm_rs as rs
    from recoverssm_rs import layouts

    layout = layouts.preset("kimi-k3-like-recoverssm")
    requests = [int(x) for x in args.requests.split(",")]
    gpu = torch.cuda.get_device_name(0)
    results = []
    print(f"RecoverSSM commit, Kimi-K3-like preset, {LAYERS} layers, window 8, on {gpu}")
    print(f"{'B':>5} {'us':>10} {'MB':>10} {'GB/s':>8} {'d2d GB/s':>9} {'roofline':>9}  vLLM published (us, other GPU)")
    for B in requests:
        cache = rs.StateCache(layout, num_layers=LAYERS, num_blocks=B + 1, max_requests=B, device="cuda")
        for t in cache.buffers().values():
            t.normal_() if t.dtype.is_floating_point else t.zero_()
        window = cache.window
        blocks = np.arange(1, B + 1)
        rows = cache.plan_commit(np.full(B, window), blocks)
        rows_dev = torch.from_numpy(rows.view(np.uint8).copy()).cuda()
        counts = torch.full((B,), window, dtype=torch.int32, device="cuda")
        cache.launch_commit(rows_dev, num_accepted=counts)  # compile + load
        torch.cuda.synchronize()
        times = []
        for _ in range(args.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            cache.launch_commit(rows_dev, num_accepted=counts)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        assert cache.commit_error().ok
        us = statistics.median(times)
        nbytes = commit_bytes(cache.commit_meta(), np.full(B, window))
        half = max(1, nbytes // 2)  # a copy reads and writes: move the same total
        src = torch.empty(half, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)
        d2d = []
        for _ in range(args.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            d2d.append(start.elapsed_time(end) * 1e3)
        d2d_gbps = 2 * half / statistics.median(d2d) / 1e3
        gbps = nbytes / us / 1e3
        res = dict(
            requests=B,
            us=us,
            bytes=nbytes,
            gbps=gbps,
            d2d_gbps=d2d_gbps,
            roofline=gbps / d2d_gbps,
            vllm_published_us=VLLM_PUBLISHED_US.get(B),
            gpu=gpu,
        )
        results.append(res)
        print(
            f"{B:>5} {us:>10.1f} {nbytes / 1e6:>10.1f} {gbps:>8.0f} {d2d_gbps:>9.0f} {100 * res['roofline']:>8.1f}%  "
            f"{VLLM_PUBLISHED_US.get(B, '')}"
        )
        del cache, src, dst
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
