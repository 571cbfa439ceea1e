"""Cost of the bound-memory guard per step: ``planner.core.check()`` (every tensor's and storage's
address and size, before a write) and ``mark_written()`` (autograd version counters, after), for a
48-layer GDN pool bound as one pool per state kind (each layer a view), as one tensor per layer and
state, and as vLLM binds them (one raw buffer per layer, its states page-interleaved views of it:
96 views over 48 storages).

    .venv/bin/python benches/guard_cost.py [--number 20000]
"""

from __future__ import annotations

import argparse
import timeit

import recoverssm_rs as rs
import torch
from recoverssm_rs import layouts


def _page_views(layout: layouts.Layout, blocks: int) -> list[torch.Tensor]:
    """One layer's states as vLLM makes them: views of one raw byte buffer, each block a page holding
    every state of the layer (``torch.as_strided`` over the buffer viewed as the state's dtype)."""
    sizes = [int(torch.tensor(s.shape).prod()) * getattr(torch, s.dtype).itemsize for s in layout.persistent]
    page = sum(sizes)
    raw = torch.zeros(blocks * page, dtype=torch.uint8)
    out, offset = [], 0
    for s, size in zip(layout.persistent, sizes):
        dt = getattr(torch, s.dtype)
        inner = torch.empty(s.shape).stride()
        out.append(raw.view(dt).as_strided((blocks, *s.shape), (page // dt.itemsize, *inner), offset // dt.itemsize))
        offset += size
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args(argv)
    layout = layouts.gdn(
        num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel_size=4, num_spec=3, conv_layout="DS"
    )
    pools = [torch.zeros((48, 64, *s.shape), dtype=getattr(torch, s.dtype)) for s in layout.persistent]
    views = rs.Planner(layout, [[p[layer] for p in pools] for layer in range(48)])
    separate = rs.Planner(
        layout,
        [[torch.zeros((64, *s.shape), dtype=getattr(torch, s.dtype)) for s in layout.persistent] for _ in range(48)],
    )
    vllm = rs.Planner(layout, [_page_views(layout, 64) for _ in range(48)])
    print(f"{'binding':<40}{'check us':>10}{'mark us':>10}")
    forms = (
        ("one pool per state kind (views)", views),
        ("one tensor per layer and state", separate),
        ("one raw buffer per layer (vLLM)", vllm),
    )
    for name, planner in forms:
        n = args.number
        check = min(timeit.repeat(planner.core.check, number=n, repeat=3)) / n * 1e6
        mark = min(timeit.repeat(planner.core.mark_written, number=n, repeat=3)) / n * 1e6
        print(f"{name:<40}{check:>10.2f}{mark:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
