"""Host offload and the disk tier against plain copies of the same bytes, in the same run.

    .venv/bin/python benches/offload.py [--requests 16 64] [--layers 8] [--reps 5] [--device cpu] [--json]

A pool of Qwen3-Next-80B GDN layers at TP 1 (16 k-heads, 32 v-heads of 128, conv kernel 4,
bfloat16 conv windows and states; one tensor per (layer, state)) in torch on ``--device``; a batch
of requests in random blocks. Rows:

  offload     ``HostOffload.offload`` (plan, host buffer -- pinned on CUDA -- and copies)
  restore     ``HostOffload.restore`` into other random blocks
  copy_       a plain ``Tensor.copy_`` of one buffer holding the same bytes (to host and back)
  save        ``save_states`` (checksums, safetensors framing, temporary file, fsync, rename)
  load        ``load_states`` (read, header checks, checksums, host buffer)
  write       a sequential write + fsync of the same bytes to one file
  read        a read of that file

Times are medians over ``--reps`` (wall clock, synchronised on CUDA); GB/s = bytes / time (1e9).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

GDN = dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel_size=4)


def _time(fn: Callable[[], Any], reps: int, device: str) -> float:
    out = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def run(requests: int, layers: int, reps: int, device: str) -> list[dict[str, Any]]:
    from recoverssm_rs import layouts
    from recoverssm_rs.transfer import HostOffload, StatePool, load_states, save_states

    lay = layouts.gdn(**GDN, tp_size=1, num_spec=0, dtype="bfloat16", ssm_dtype="bfloat16")
    blocks = 2 * requests + 2
    states = [
        [torch.zeros((blocks, *s.shape), dtype=torch.bfloat16, device=device) for s in lay.persistent]
        for _ in range(layers)
    ]
    pool = StatePool(lay, states)
    rng = np.random.default_rng(0)
    perm = rng.permutation(np.arange(1, blocks))
    src, dst = perm[:requests].tolist(), perm[requests : 2 * requests].tolist()
    off = HostOffload(pool)
    host = off.offload(src)
    nbytes = host.nbytes
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    hflat = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.startswith("cuda"))
    rows = [
        ("offload", _time(lambda: off.offload(src), reps, device)),
        ("restore", _time(lambda: off.restore(host, dst), reps, device)),
        ("copy_ to host", _time(lambda: hflat.copy_(flat, non_blocking=True), reps, device)),
        ("copy_ to device", _time(lambda: flat.copy_(hflat, non_blocking=True), reps, device)),
    ]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "states.safetensors")
        plain = os.path.join(d, "plain.bin")
        data = hflat.numpy()

        def write() -> None:
            with open(plain, "wb") as f:
                f.write(data.data)
                f.flush()
                os.fsync(f.fileno())

        def read() -> None:
            with open(plain, "rb") as f:
                f.read()

        rows += [
            ("save", _time(lambda: save_states(host, path), reps, device)),
            ("load", _time(lambda: load_states(path, lay), reps, device)),
            ("write", _time(write, reps, device)),
            ("read", _time(read, reps, device)),
        ]
    return [
        dict(row=r, requests=requests, layers=layers, bytes=nbytes, seconds=t, gbps=nbytes / t / 1e9) for r, t in rows
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = [r for n in a.requests for r in run(n, a.layers, a.reps, a.device)]
    if a.json:
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return
    sys.stdout.write(f"{'row':<16}{'requests':>9}{'MB':>9}{'ms':>10}{'GB/s':>8}\n")
    for r in out:
        sys.stdout.write(
            f"{r['row']:<16}{r['requests']:>9}{r['bytes'] / 1e6:>9.1f}{r['seconds'] * 1e3:>10.2f}{r['gbps']:>8.2f}\n"
        )


if __name__ == "__main__":
    main()
