"""An independent reference for transfer tests: the full unsharded states built with numpy, sharded
for each rank the way vLLM's weight loaders shard them, and pools of strided pages holding them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from recoverssm_rs import layouts
from recoverssm_rs.transfer import StatePool

PAD = 24  # bytes of padding after the states in each page


@dataclass(frozen=True)
class Family:
    name: str
    calc: str
    params: dict[str, Any]
    segments: list[tuple[str, int, int]] = field(default_factory=list)  # (name, units, unit_dim)
    heads: int | None = None
    temporal_inner: tuple[int, ...] = ()
    conv: bool = True
    spec: bool = True  # may use num_spec > 0


FAMILIES = {
    f.name: f
    for f in [
        Family(
            "mamba1",
            "mamba1",
            dict(intermediate_size=16, state_size=3, conv_kernel=4),
            [("x", 16, 1)],
            16,
            (3,),
            spec=False,
        ),
        Family(
            "mamba2",
            "mamba2",
            dict(intermediate_size=16, n_groups=2, num_heads=8, head_dim=2, state_size=3, conv_kernel=4),
            [("x", 16, 1), ("B", 2, 3), ("C", 2, 3)],
            8,
            (2, 3),
        ),
        Family(
            "mamba2_g1",
            "mamba2",
            dict(
                intermediate_size=16, n_groups=1, num_heads=8, head_dim=2, state_size=3, conv_kernel=4, logical_window=4
            ),
            [("x", 16, 1), ("B", 1, 3), ("C", 1, 3)],
            8,
            (2, 3),
        ),
        Family("short_conv", "short_conv", dict(intermediate_size=16, conv_kernel=3), [("x", 16, 1)]),
        Family("linear_attention", "linear_attention", dict(num_heads=8, head_dim=3), [], 8, (3, 3), conv=False),
        Family(
            "gdn",
            "gdn",
            dict(num_k_heads=8, num_v_heads=16, head_k_dim=2, head_v_dim=3, conv_kernel_size=4),
            [("q", 8, 2), ("k", 8, 2), ("v", 16, 3)],
            16,
            (3, 2),
        ),
        Family(
            "kda",
            "kda",
            dict(num_heads=8, head_dim=2, conv_kernel_size=4),
            [("q", 8, 2), ("k", 8, 2), ("v", 8, 2)],
            8,
            (2, 2),
        ),
        Family(
            "gdn_recoverssm",
            "gdn",
            dict(num_k_heads=8, num_v_heads=8, head_k_dim=2, head_v_dim=2, conv_kernel_size=4, recover_ssm=True),
            [("q", 8, 2), ("k", 8, 2), ("v", 8, 2)],
            8,
            (2, 2),
        ),
        Family(
            "kda_recoverssm",
            "kda",
            dict(num_heads=8, head_dim=3, conv_kernel_size=4, recover_ssm=True),
            [("q", 8, 3), ("k", 8, 3), ("v", 8, 3)],
            8,
            (3, 3),
        ),
    ]
}

CONV_DTYPE = "float16"


def nixl_or_skip() -> None:
    """Called at a NIXL test module's import: skips the module when NIXL is not importable, and fails
    instead under ``RECOVERSSM_REQUIRE_NIXL=1`` (as CI sets it)."""
    import os

    import pytest
    from recoverssm_rs.transfer import nixl

    if nixl.nixl_available():
        return
    if os.environ.get("RECOVERSSM_REQUIRE_NIXL", "0") not in ("", "0"):
        raise RuntimeError(f"RECOVERSSM_REQUIRE_NIXL=1 but NIXL is not importable; {nixl.INSTALL_HINT}")
    pytest.skip(
        f"NIXL is not importable ({nixl.INSTALL_HINT}); set RECOVERSSM_REQUIRE_NIXL=1 to fail instead",
        allow_module_level=True,
    )


def kernel_of(fam: Family) -> int:
    """The family's conv kernel size (vLLM names it conv_kernel or conv_kernel_size), 0 without conv."""
    return int(fam.params.get("conv_kernel_size", fam.params.get("conv_kernel", 0)))


SSM_DTYPE = "float32"


def layout(fam: Family, tp: int, num_spec: int, conv_layout: str, **over: Any) -> Any:
    kw: dict[str, Any] = dict(fam.params, tp_size=tp, num_spec=num_spec, **over)
    if fam.conv:
        kw.setdefault("conv_layout", conv_layout)
        kw.setdefault("dtype", CONV_DTYPE)
    if fam.heads is not None:
        kw.setdefault("ssm_dtype", SSM_DTYPE)
    return getattr(layouts, fam.calc)(**kw)


def rank_channels(fam: Family, tp: int, rank: int) -> np.ndarray:
    """Global conv channels rank ``rank`` of ``tp`` holds, in its local order (per segment: the
    rank's slice of units, or the one replicated unit when there are fewer units than ranks)."""
    out, base = [], 0
    for _, units, ud in fam.segments:
        if units % tp == 0:
            per = units // tp
            us = range(rank * per, (rank + 1) * per)
        else:
            assert tp % units == 0
            us = range(rank // (tp // units), rank // (tp // units) + 1)
        for u in us:
            out.extend(range(base + u * ud, base + (u + 1) * ud))
        base += units * ud
    return np.array(out, dtype=np.int64)


def rank_heads(fam: Family, tp: int, rank: int) -> slice:
    assert fam.heads is not None
    per = fam.heads // tp
    return slice(rank * per, (rank + 1) * per)


def conv_channels(fam: Family) -> int:
    return sum(u * d for _, u, d in fam.segments)


@dataclass
class Truth:
    """Per (request, layer): the full conv window ``(width, channels)`` and temporal state."""

    conv: dict[tuple[int, int], np.ndarray]
    temporal: dict[tuple[int, int], np.ndarray]


def make_truth(fam: Family, width: int, num_requests: int, num_layers: int, rng: np.random.Generator) -> Truth:
    conv, temporal = {}, {}
    for r in range(num_requests):
        for layer in range(num_layers):
            if fam.conv:
                conv[r, layer] = rng.standard_normal((width, conv_channels(fam))).astype(CONV_DTYPE)
            if fam.heads is not None:
                temporal[r, layer] = rng.standard_normal((fam.heads, *fam.temporal_inner)).astype(SSM_DTYPE)
    return Truth(conv, temporal)


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


def page_bytes(lay: Any) -> int:
    return sum(_align(s.nbytes) for s in lay.persistent) + PAD


def page_views(lay: Any, buf: np.ndarray) -> list[np.ndarray]:
    """The persistent state tensors as strided views into a page buffer: each page holds the
    states back to back (8-byte aligned), then padding."""
    page = page_bytes(lay)
    views, off = [], 0
    for s in lay.persistent:
        dt = np.dtype(s.dtype)
        inner = np.array(s.shape, dtype=np.int64)
        strides = [page] + [int(np.prod(inner[i + 1 :])) * dt.itemsize for i in range(len(inner))]
        views.append(np.ndarray(shape=(buf.size // page, *s.shape), dtype=dt, buffer=buf, offset=off, strides=strides))
        off += _align(s.nbytes)
    return views


def paged_states(
    lay: Any, num_layers: int, num_blocks: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """One uint8 page buffer per layer (random bytes), and per layer the persistent state tensors
    as strided views into it."""
    bufs = [rng.integers(0, 256, size=num_blocks * page_bytes(lay), dtype=np.uint8) for _ in range(num_layers)]
    return bufs, [page_views(lay, b) for b in bufs]


def write_rank(
    fam: Family, lay: Any, states: list[list[np.ndarray]], truth: Truth, tp: int, rank: int, blocks: list[int]
) -> None:
    """Writes rank ``rank``'s shard of the truth into ``blocks`` (request i -> blocks[i])."""
    ch = rank_channels(fam, tp, rank) if fam.conv else None
    for (r, layer), g in truth.conv.items():
        shard = g[:, ch]
        t = states[layer][0]
        t[blocks[r]] = shard if lay.persistent[0].conv_layout == "SD" else shard.T
    hi = 1 if fam.conv else 0
    for (r, layer), g in truth.temporal.items():
        states[layer][hi][blocks[r]] = g[rank_heads(fam, tp, rank)]


def expected_destination(
    fam: Family,
    dlay: Any,
    before: list[np.ndarray],
    truth: Truth,
    src_width: int,
    tp: int,
    rank: int,
    blocks: list[int],
    kernel: int,
) -> list[np.ndarray]:
    """The destination's page buffers after the transfer: the shard written where the transfer
    writes (the whole window when widths match, else the first ``kernel - 1`` columns), every
    other byte as before."""
    bufs = [b.copy() for b in before]
    states = [page_views(dlay, b) for b in bufs]
    if fam.conv:
        spec = dlay.persistent[0]
        dwidth = spec.shape[0] if spec.conv_layout == "SD" else spec.shape[1]
        cols = dwidth if dwidth == src_width else kernel - 1
        ch = rank_channels(fam, tp, rank)
        for (r, layer), g in truth.conv.items():
            t = states[layer][0]
            if spec.conv_layout == "SD":
                t[blocks[r], :cols, :] = g[:cols, ch]
            else:
                t[blocks[r], :, :cols] = g[:cols, ch].T
    hi = 1 if fam.conv else 0
    for (r, layer), g in truth.temporal.items():
        states[layer][hi][blocks[r]] = g[rank_heads(fam, tp, rank)]
    return bufs


def pool(lay: Any, states: list[list[np.ndarray]], rank: int) -> StatePool:
    return StatePool(lay, states, tp_rank=rank, block_size=16)


def serve_sources(
    conn: Any, fam_name: str, tp: int, num_spec: int, conv_layout: str, seed: int, blocks: list[int], num_layers: int
) -> None:
    """Child process: the source instance. Builds ``tp`` ranks holding the truth (from ``seed``)
    in ``blocks``, registers each with NIXL, sends the handshake infos, serves until told to stop."""
    from recoverssm_rs.transfer.nixl import NixlEndpoint

    fam = FAMILIES[fam_name]
    rng = np.random.default_rng(seed)
    lay = layout(fam, tp, num_spec, conv_layout)
    truth = make_truth(fam, kernel_of(fam) - 1 + num_spec, len(blocks), num_layers, rng)
    eps = []
    for p in range(tp):
        _, st = paged_states(lay, num_layers, max(blocks) + 2, rng)
        write_rank(fam, lay, st, truth, tp, p, blocks)
        eps.append(NixlEndpoint(f"src-{fam_name}-{p}", pool(lay, st, p)))
    conn.send([e.info().to_bytes() for e in eps])
    conn.recv()  # the destination is done
    conn.close()
