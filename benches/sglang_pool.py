"""SGLang's mamba-pool operations against recoverssm_rs.sglang, same inputs, one run, on CPU.

SGLang side: its own code (0.5.23, loaded from the downloaded wheel by
tests/support/sglang_oracle.py): ``MambaPool.copy_from`` (copy-on-write / fork), ``clear_slots``,
``get_cpu_copy`` + ``load_cpu_copy`` (a HiCache round trip), and the speculative commit after
verify through its torch fallback (``_scatter_speculative_state_with_mask`` per state tensor, commit
and track passes). Package side: the same operations of ``SglangMambaPool`` over a second pool
built by SGLang's own constructor. Every case checks that both pools end byte-equal.

Two pools, per tensor-parallel rank: Kimi-K3-like (Kimi-Linear KDA: 32 heads of 128 at TP 8, conv
kernel 4, draft 4) and Qwen3-Next-like (GDN as a Mamba2 pool: 32 value heads of 128, 16 key heads,
TP 8, draft 4, the deduplicated conv-window scratch). ``--layers`` is scaled down from the models'
(48 / 36 linear layers) so that both pools fit a small CPU machine.

Per case: median microseconds over ``--repeat`` calls (after one warm-up), the ratio SGLang /
package, and the bytes the operation allocates (torch's profiler, the sum of every allocation
during one call: an upper bound of its peak temporary memory; the HiCache row excludes the host
copy itself, which both sides return).

    .venv/bin/python benches/sglang_pool.py [--layers 8] [--slots 64] [--batch 8 32] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support import sglang_oracle  # noqa: E402

DRAFT = 4


def make_pool(ns, kind: str, layers: int, slots: int, rows: int):
    C = ns.configs
    dtype = C.Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32)
    if kind == "kimi-k3":
        shape = C.KimiLinearStateShape.create(tp_world_size=8, num_heads=32, head_dim=128, conv_kernel_size=4)
        params = C.KimiLinearCacheParams(shape=shape, layers=list(range(layers)), dtype=dtype)
    else:  # qwen3-next: GDN, conv over q, k, v
        shape = C.Mamba2StateShape.create(
            tp_world_size=8,
            intermediate_size=32 * 128 + 16 * 128,
            n_groups=16,
            num_heads=32,
            head_dim=128,
            state_size=128,
            conv_kernel=4,
        )
        params = C.Mamba2CacheParams(shape=shape, layers=list(range(layers)), dtype=dtype)
    pool = ns.pool.MambaPool(
        size=slots,
        spec_state_size=rows,
        cache_params=params,
        mamba_layer_ids=list(range(layers)),
        device="cpu",
        speculative_num_draft_tokens=DRAFT,
    )
    g = torch.Generator().manual_seed(0)
    c = pool.mamba_cache
    for t in [*c.conv, c.temporal, c.intermediate_ssm, *pool._intermediate_conv_window_phys]:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return pool


def buffers(pool):
    c = pool.mamba_cache
    return [*c.conv, c.temporal]


def allocated_bytes(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(0, e.self_cpu_memory_usage) for e in prof.events())


def timed(fn, repeat: int) -> float:
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


def cases(ns, theirs, ops, batch: int, slots: int):
    scatter = ns.backend.HybridLinearAttnBackend._scatter_speculative_state_with_mask
    src = torch.arange(1, batch + 1)
    dst = torch.arange(slots - batch + 1, slots + 1)
    steps = torch.arange(batch) % DRAFT
    track = torch.arange(batch + 1, 2 * batch + 1)
    track_steps = torch.where(torch.arange(batch) % 2 == 0, steps, -1)

    def sglang_commit():
        c = theirs.mamba_cache
        for d, s in [(c.temporal, c.intermediate_ssm), *zip(c.conv, c.intermediate_conv_window)]:
            scatter(d, s, src, steps)
            scatter(d, s, track, track_steps)

    def hicache(pool):
        def run():
            saved = pool.get_cpu_copy(src)
            pool.load_cpu_copy(saved, dst)

        return run

    return [
        ("copy_from", lambda: theirs.copy_from(src, dst), lambda: ops.copy_from(src, dst)),
        ("clear_slots", lambda: theirs.clear_slots(dst), lambda: ops.clear_slots(dst)),
        ("hicache round trip", hicache(theirs), hicache(ops)),
        ("commit after verify", sglang_commit, lambda: ops.commit_after_verify(src, steps, track, track_steps)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    if a.slots < 2 * max(a.batch):
        ap.error("--slots must be at least twice the largest --batch (commit and track slots)")
    ns = sglang_oracle.load()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {a.layers} layers, {a.slots} slots")
    head = f"{'pool':10} {'operation':20} {'batch':>5} {'sglang us':>11} {'package us':>11} {'ratio':>7} {'sglang MiB':>11} {'package MiB':>12}"
    print(head)
    print("-" * len(head))
    for kind in ("kimi-k3", "qwen3-next"):
        rows = max(a.batch)
        theirs = make_pool(ns, kind, a.layers, a.slots, rows)
        mine = make_pool(ns, kind, a.layers, a.slots, rows)
        ops = SglangMambaPool.from_pool(mine)
        for batch in a.batch:
            for name, f_sgl, f_pkg in cases(ns, theirs, ops, batch, a.slots):
                t_sgl, t_pkg = timed(f_sgl, a.repeat), timed(f_pkg, a.repeat)
                m_sgl, m_pkg = allocated_bytes(f_sgl), allocated_bytes(f_pkg)
                if name == "hicache round trip":
                    host = sum(t[:, :batch].nbytes for t in buffers(theirs))
                    m_sgl, m_pkg = m_sgl - host, m_pkg - host
                for x, y in zip(buffers(theirs), buffers(mine), strict=True):
                    assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{kind} {name}: pools differ"
                print(
                    f"{kind:10} {name:20} {batch:5d} {t_sgl:11.1f} {t_pkg:11.1f} {t_sgl / t_pkg:6.2f}x "
                    f"{m_sgl / 2**20:11.2f} {m_pkg / 2**20:12.2f}"
                )


if __name__ == "__main__":
    main()
