"""Plan-driven NIXL transfers against one contiguous NIXL transfer of the same bytes.

    .venv/bin/python benches/transfer.py [--requests 16 64 128] [--layers 4] [--reps 5] [--json]

Two OS processes on one machine, CPU memory, NIXL's UCX backend. The source process holds the
source instance's ranks (Qwen3-Next-80B GDN layers: 16 k-heads, 32 v-heads of 128, conv kernel 4,
bfloat16 conv windows and states; vLLM-style pages ``[conv | temporal | pad]`` per layer and block)
with every request's state in a random block, plus one contiguous registered buffer. The
destination (this process) pulls a batch of requests into random blocks of its own pool:

  pull        ``NixlEndpoint.pull`` (plan, descriptors, one READ per request and source rank,
              polling, staged copies): completion per request
  pull-batch  the same with ``per_request=False``: one READ per source rank for the batch
  contiguous  one READ of one descriptor of the same byte count from the contiguous buffer

Every agent runs without NIXL's progress thread unless ``--progress-thread``: the destination
progresses its reads while it polls, and the source process progresses its agents every 1 ms
(connection set-up, notifications; UCX's CMA reads need nothing from it). NIXL's thread
busy-polls: with the 12 agents of this benchmark on a 2-core machine the threads, not the copies,
set the figures.

Pool pages are allocated by numpy, which advises the kernel to back large arrays with huge pages
(transparent huge pages in `madvise` mode here): with 4 KiB pages (a plain `torch.empty`) UCX's
shared-memory reads of the same descriptors ran about 2x slower in this setup.

Scenarios: equal TP and layout; P_TP 2 -> D_TP 1; P_TP 1 -> D_TP 2 (rank 0); SD -> DS with
num_spec 0 -> 3 (conv staged). Times are medians over ``--reps`` pulls (wall clock, including
everything the caller waits for); GB/s = bytes / time (1e9). ``desc/req`` is the number of NIXL
descriptors per request after merging; ``vllm desc/req`` is vLLM 0.33's count for the same pair
(4 per GDN layer and source rank read: 3 conv sub-projections + 1 temporal; SD is not supported
there).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

GDN = dict(
    num_k_heads=16,
    num_v_heads=32,
    head_k_dim=128,
    head_v_dim=128,
    conv_kernel_size=4,
    dtype="bfloat16",
    ssm_dtype="bfloat16",
)
PAD = 256
# name: (source tp, source layout, source num_spec, destination tp, destination rank, layout, num_spec)
SCENARIOS = {
    "tp1->tp1 DS": (1, "DS", 3, 1, 0, "DS", 3),
    "tp2->tp1 DS": (2, "DS", 3, 1, 0, "DS", 3),
    "tp1->tp2 DS": (1, "DS", 3, 2, 0, "DS", 3),
    "tp1 SD0->tp1 DS3": (1, "SD", 0, 1, 0, "DS", 3),
}


def _layout(tp: int, conv_layout: str, num_spec: int) -> Any:
    from recoverssm_rs import layouts

    return layouts.gdn(tp_size=tp, num_spec=num_spec, conv_layout=conv_layout, **GDN)


def _pool(tp: int, rank: int, conv_layout: str, num_spec: int, layers: int, blocks: int, fill: bool) -> Any:
    import torch
    from recoverssm_rs.transfer import StatePool

    lay = _layout(tp, conv_layout, num_spec)
    specs = lay.persistent
    page = sum(s.nbytes for s in specs) + PAD
    states = []
    keep = []
    for _ in range(layers):
        # numpy's large allocations are advised for huge pages (fewer pages for the transport
        # to pin than torch's 4 KiB pages: a 2x difference in UCX's shared-memory reads here).
        arr = np.empty((blocks, page), dtype=np.uint8)
        buf = torch.from_numpy(arr)
        if fill:
            buf.random_(0, 256)
        else:
            buf.zero_()
        keep.append(buf)
        views, off = [], 0
        for s in specs:
            views.append(buf[:, off : off + s.nbytes].view(torch.bfloat16).view(blocks, *s.shape))
            off += s.nbytes
        states.append(views)
    p = StatePool(lay, states, tp_rank=rank, block_size=64)
    p._pages = keep  # type: ignore[attr-defined]
    return p


def _source(conn: Any, layers: int, blocks: int, raw_bytes: int, prog: bool) -> None:
    from recoverssm_rs.transfer.nixl import NixlEndpoint, import_nixl

    nixl = import_nixl()
    eps: dict[str, list[Any]] = {}
    for name, (ptp, lp, sp, *_rest) in SCENARIOS.items():
        eps[name] = [
            NixlEndpoint(f"src-{name}-{p}", _pool(ptp, p, lp, sp, layers, blocks, True), progress_thread=prog)
            for p in range(ptp)
        ]
    raw = np.random.default_rng(0).integers(0, 256, size=raw_bytes, dtype=np.uint8)
    agent = nixl.nixl_agent("src-raw", nixl.nixl_agent_config(enable_prog_thread=prog, backends=["UCX"]))
    agent.register_memory(np.array([(raw.ctypes.data, raw.nbytes, 0)], dtype=np.uint64), "DRAM")
    conn.send(
        (
            {k: [e.info().to_bytes() for e in v] for k, v in eps.items()},
            (agent.get_agent_metadata(), int(raw.ctypes.data), raw.nbytes),
        )
    )
    # Without progress threads the source's agents progress here (connection set-up and the
    # pullers' notifications; CMA reads themselves need nothing from the source), every 1 ms.
    while not prog and not conn.poll(0.001):
        for v in eps.values():
            for e in v:
                e.notifications()
        agent.get_new_notifs()
    conn.recv()


def _contiguous(agent: Any, remote: str, local_addr: int, remote_addr: int, nbytes: int) -> float:
    t0 = time.perf_counter()
    h = agent.initialize_xfer(
        "READ",
        agent.get_xfer_descs(np.array([(local_addr, nbytes, 0)], dtype=np.uint64), "DRAM"),
        agent.get_xfer_descs(np.array([(remote_addr, nbytes, 0)], dtype=np.uint64), "DRAM"),
        remote,
    )
    st = agent.transfer(h)
    while st == "PROC":
        st = agent.check_xfer_state(h)
    dt = time.perf_counter() - t0
    agent.release_xfer_handle(h)
    if st != "DONE":
        raise RuntimeError(f"contiguous transfer: {st}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--progress-thread",
        action="store_true",
        help="run NIXL's background progress thread in every agent (NIXL's default; each busy-polls)",
    )
    ap.add_argument(
        "--no-restore-failed",
        action="store_true",
        help="pull with restore_failed=False (no copy of the destination spans before posting)",
    )
    args = ap.parse_args()
    keep = not args.no_restore_failed

    from recoverssm_rs.transfer.nixl import NixlEndpoint, import_nixl

    nixl = import_nixl()
    n_max = max(args.requests)
    blocks = n_max + 2
    per_req_max = (
        max(
            sum(_layout(t, lp, sp).persistent_bytes_per_block for _ in [0])
            for t, lp, sp in [(s[3], s[5], s[6]) for s in SCENARIOS.values()]
        )
        * args.layers
    )
    raw_bytes = per_req_max * n_max
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    src = ctx.Process(target=_source, args=(there, args.layers, blocks, raw_bytes, args.progress_thread))
    src.start()
    infos, (raw_md, raw_addr, _) = here.recv()
    local_raw = np.zeros(raw_bytes, dtype=np.uint8)
    agent = nixl.nixl_agent(
        "dst-raw", nixl.nixl_agent_config(enable_prog_thread=args.progress_thread, backends=["UCX"])
    )
    agent.register_memory(np.array([(local_raw.ctypes.data, local_raw.nbytes, 0)], dtype=np.uint64), "DRAM")
    remote_raw = agent.add_remote_agent(raw_md)
    remote_raw = remote_raw.decode() if isinstance(remote_raw, bytes) else remote_raw
    rng = np.random.default_rng(1)
    rows = []
    try:
        for name, (ptp, lp, _sp, dtp, drank, ld, sd) in SCENARIOS.items():
            ep = NixlEndpoint(
                f"dst-{name}",
                _pool(dtp, drank, ld, sd, args.layers, blocks, False),
                progress_thread=args.progress_thread,
            )
            for info in infos[name]:
                ep.connect(info)
            for n in args.requests:
                reqs = list(
                    zip(
                        rng.permutation(np.arange(1, blocks))[:n].tolist(),
                        rng.permutation(np.arange(1, blocks))[:n].tolist(),
                    )
                )
                t_pull, t_batch, t_raw = [], [], []
                # Warm-up (connections, first touch of the destination pages), not timed.
                ep.pull(reqs, restore_failed=keep)
                ep.pull(reqs, per_request=False, restore_failed=keep)
                _contiguous(agent, remote_raw, local_raw.ctypes.data, raw_addr, raw_bytes)
                res = None
                for _ in range(args.reps):
                    res = ep.pull(reqs, restore_failed=keep)
                    assert res.ok, res.failed
                    t_pull.append(res.seconds)
                    rb = ep.pull(reqs, per_request=False, restore_failed=keep)
                    assert rb.ok, rb.failed
                    t_batch.append(rb.seconds)
                    t_raw.append(_contiguous(agent, remote_raw, local_raw.ctypes.data, raw_addr, res.nbytes))
                assert res is not None
                nbytes = res.nbytes
                m_pull, m_batch, m_raw = (statistics.median(x) for x in (t_pull, t_batch, t_raw))
                src_ranks = max(1, ptp // dtp)
                rows.append(
                    dict(
                        scenario=name,
                        requests=n,
                        layers=args.layers,
                        bytes=nbytes,
                        pull_gbps=nbytes / m_pull / 1e9,
                        batch_gbps=nbytes / m_batch / 1e9,
                        contiguous_gbps=nbytes / m_raw / 1e9,
                        pull_vs_contiguous=m_raw / m_pull,
                        batch_vs_contiguous=m_raw / m_batch,
                        desc_per_request=res.descriptors / n,
                        vllm_desc_per_request=(4 * args.layers * src_ranks) if lp == ld == "DS" else None,
                    )
                )
    finally:
        here.send("done")
        src.join(60)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'scenario':18} {'reqs':>5} {'MiB':>8} {'pull GB/s':>10} {'batch GB/s':>10} {'contig GB/s':>11} "
        f"{'pull/contig':>11} {'batch/contig':>12} {'desc/req':>8} {'vllm desc/req':>13}"
    )
    for r in rows:
        v = r["vllm_desc_per_request"]
        print(
            f"{r['scenario']:18} {r['requests']:>5} {r['bytes'] / 2**20:>8.1f} {r['pull_gbps']:>10.2f} "
            f"{r['batch_gbps']:>10.2f} {r['contiguous_gbps']:>11.2f} {r['pull_vs_contiguous']:>11.2f} "
            f"{r['batch_vs_contiguous']:>12.2f} {r['desc_per_request']:>8.1f} {('-' if v is None else v):>13}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
