"""Random problems for the kernel tests (and for comparing other executors against the references):
segment plans over an arena, fused state-copy problems, RecoverSSM commit problems."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from recoverssm_rs import layouts
from recoverssm_rs.cuda import COMMIT_DTYPE_PAIRS
from recoverssm_rs.plan_format import COMMIT_ROW_DTYPE, SEGMENT_DTYPE, STATE_META_DTYPE
from recoverssm_rs.speculative import recurrence

from .references import (
    KIND_CONV_DS,
    KIND_CONV_SD,
    KIND_TEMPORAL,
    MODE_DISJOINT,
    MODE_ROWS_ASCENDING,
    MODE_WITHIN_ROW,
    CommitTensors,
)


def absolute_segments(rel: np.ndarray, base: int) -> np.ndarray:
    """Segments whose ``src`` / ``dst`` are offsets, rebased to absolute addresses at ``base``."""
    out = np.array(rel, dtype=SEGMENT_DTYPE, copy=True)
    out["src"] += np.uint64(base)
    out["dst"] += np.uint64(base)
    return out


def _footprint(src: int, dst: int, row_bytes: int, rows: int, pitch: int) -> tuple[np.ndarray, np.ndarray]:
    idx = (np.arange(rows, dtype=np.int64)[:, None] * pitch + np.arange(row_bytes, dtype=np.int64)[None, :]).ravel()
    return src + idx, dst + idx


def _random_segment(rng: np.random.Generator, arena: int, max_bytes: int, descending: bool) -> tuple | None:
    kind = rng.choice(["1d", "1d", "2d", "rows_asc", "within_row", "tiny", "overlap_row"])
    elem = int(rng.choice([1, 2, 4, 8]))

    def log_size(lo: int, hi: int) -> int:
        return int(np.exp(rng.uniform(np.log(lo), np.log(max(lo, hi) + 1))))

    def place(extent: int) -> int | None:
        if extent >= arena:
            return None
        off = int(rng.integers(0, arena - extent)) // elem * elem
        if rng.random() < 0.3:
            off = off // 16 * 16
        return off

    mode, rows, pitch = MODE_DISJOINT, 1, 0
    if kind in ("1d", "tiny", "2d"):
        if kind == "2d":
            rows = int(rng.integers(2, 65))
            row_bytes = max(elem, log_size(1, min(4096, max_bytes // rows)) // elem * elem)
            gap = int(rng.integers(0, 64)) // elem * elem
            pitch = row_bytes + gap
            if rng.random() < 0.5:
                pitch = (pitch + 15) // 16 * 16
        else:
            hi = 3 * elem if kind == "tiny" else max_bytes
            row_bytes = max(elem, log_size(1, hi) // elem * elem)
        extent = (rows - 1) * pitch + row_bytes
        dst = place(extent)
        src = place(extent)
        if dst is None or src is None:
            return None
        if rng.random() < 0.5:  # congruent modulo 16 (vector path)
            src = src // 16 * 16 + dst % 16
            if src + extent > arena:
                return None
        s_idx, d_idx = _footprint(src, dst, row_bytes, rows, pitch)
        if np.intersect1d(s_idx, d_idx).size:
            return None
    elif kind == "rows_asc":
        # In-block SD conv shift: [width, dim] rows, shift rows up; rows = width - shift.
        mode = MODE_ROWS_ASCENDING
        width = int(rng.integers(2, 11))
        shift = int(rng.integers(1, width))
        rows = width - shift
        row_bytes = max(elem, log_size(1, min(8192, max_bytes // width)) // elem * elem)
        pitch = row_bytes + (int(rng.integers(0, 48)) // elem * elem if rng.random() < 0.3 else 0)
        base = place(width * pitch)
        if base is None:
            return None
        dst, src = base, base + shift * pitch  # rows == 1 (shift = width - 1): no overlap at all
        if descending and rng.random() < 0.5:
            dst, src = src, dst
    else:
        # In-block DS conv shift ([dim, width], shift inside each row), or one overlapping row.
        mode = MODE_WITHIN_ROW
        if kind == "overlap_row":
            rows, width = 1, max(2, log_size(2, max_bytes // elem))
        else:
            rows, width = int(rng.integers(1, 301)), int(rng.integers(2, 71))
        shift = int(rng.integers(1, width))
        pitch = width * elem + (int(rng.integers(0, 4)) * elem if rng.random() < 0.3 else 0)
        if rows * pitch > max_bytes:
            rows = max(1, max_bytes // pitch)
        row_bytes = (width - shift) * elem
        base = place(rows * pitch)
        if base is None:
            return None
        dst, src = base, base + shift * elem
        if descending and rng.random() < 0.5:
            dst, src = src, dst
        if rows == 1:
            pitch = 0
    return (src, dst, row_bytes, rows, pitch, 0, mode, elem)


def random_segment_plan(
    rng: np.random.Generator,
    *,
    arena_size: int = 1 << 20,
    max_waves: int = 3,
    max_segments: int = 10,
    max_bytes: int = 100 * 1024,
    descending: bool = False,
) -> np.ndarray:
    """A random valid segment plan (offsets relative to an arena of ``arena_size`` bytes).

    Mixes 1-D and 2-D disjoint copies, in-block SD shifts (ROWS_ASCENDING), in-block DS shifts and
    single overlapping rows (WITHIN_ROW), element sizes 1-8, congruent and incongruent alignments,
    sizes from 1 byte to ``max_bytes``. Within a wave no segment writes a byte another segment of the
    wave reads or writes (the planner's contract); later waves may read earlier waves' output.
    ``descending`` also emits right shifts (src < dst), beyond the planner's contract.
    """
    specs: list[tuple] = []
    for w in range(int(rng.integers(1, max_waves + 1))):
        read = np.zeros(arena_size, dtype=bool)
        written = np.zeros(arena_size, dtype=bool)
        for _ in range(int(rng.integers(1, max_segments + 1))):
            for _attempt in range(20):
                spec = _random_segment(rng, arena_size, max_bytes, descending)
                if spec is None:
                    continue
                s_idx, d_idx = _footprint(spec[0], spec[1], spec[2], spec[3], spec[4] if spec[3] > 1 else 0)
                if written[s_idx].any() or written[d_idx].any() or read[d_idx].any():
                    continue
                read[s_idx] = True
                written[d_idx] = True
                specs.append(spec[:5] + (w,) + spec[6:])
                break
    out = np.zeros(len(specs), dtype=SEGMENT_DTYPE)
    for i, s in enumerate(specs):
        out[i] = s
    return out


@dataclass
class StateProblem:
    """A random fused-kernel problem: state tensors in one arena, block table and request vectors.

    ``metas_rel`` holds bases relative to the arena; :meth:`metas` rebases them.
    """

    arena_size: int
    metas_rel: np.ndarray
    num_blocks: int
    max_accepted: int
    block_table: np.ndarray
    src_col: np.ndarray
    dst_col: np.ndarray
    num_accepted: np.ndarray

    def metas(self, base: int) -> np.ndarray:
        out = self.metas_rel.copy()
        out["base"] += np.uint64(base)
        return out

    @property
    def has_temporal(self) -> bool:
        return bool(np.any(self.metas_rel["kind"] == KIND_TEMPORAL))


def random_state_problem(
    rng: np.random.Generator,
    *,
    max_requests: int = 10,
    invalid: float = 0.2,
    in_place: float = 0.35,
    max_state_bytes: int = 16 * 1024,
    wide_block_table: bool | None = None,
) -> StateProblem:
    """A random problem for the fused kernels honouring the host's guarantees.

    Every request owns distinct blocks (so no destination block is another request's source); some
    requests shift in place (``bt[dst_col] == bt[src_col]``), some are padding or no-ops, and a
    fraction ``invalid`` carries one bad value the device must reject (accepted count, column,
    block id). Layouts mix SD / DS conv states (1, 2 or 4-byte elements), temporal states, conv-only
    and temporal-only layers, misaligned bases and padded block strides.
    """
    max_acc = int(rng.integers(1, 5))
    layers = int(rng.integers(1, 4))
    states: list[dict[str, int]] = []
    for layer in range(layers):
        shape = rng.choice(["conv+temporal", "conv+temporal", "conv", "temporal"])
        if "conv" in shape:
            elem = int(rng.choice([1, 2, 2, 4]))
            width = max_acc - 1 + int(rng.integers(1, 4))
            dim = int(rng.integers(1, max(2, min(300, max_state_bytes // (width * elem)))))
            kind = KIND_CONV_SD if rng.random() < 0.5 else KIND_CONV_DS
            states.append(dict(kind=kind, elem=elem, width=width, dim=dim, bytes=width * dim * elem, layer=layer))
        if "temporal" in shape:
            elem = int(rng.choice([2, 4]))
            n = int(np.exp(rng.uniform(0, np.log(max_state_bytes // elem)))) * elem
            states.append(dict(kind=KIND_TEMPORAL, elem=elem, width=0, dim=0, bytes=n, layer=layer))
    R = int(rng.integers(1, max_requests + 1))
    cols = max_acc + int(rng.integers(0, 4))
    nb = R * cols + 1 + int(rng.integers(0, 4))
    metas = np.zeros(len(states), dtype=STATE_META_DTYPE)
    off = int(rng.integers(0, 64))
    for i, st in enumerate(states):
        elem = st["elem"]
        off = (off + elem - 1) // elem * elem
        if rng.random() < 0.4:
            off = (off + 15) // 16 * 16
        stride = st["bytes"] + (int(rng.integers(1, 9)) * elem if rng.random() < 0.3 else 0)
        metas[i] = (off, stride, st["bytes"], st["kind"], elem, st["width"], st["dim"], st["layer"], i, nb, 0, 0)
        off += stride * nb + int(rng.integers(0, 40))
    arena = off + 64
    blocks = rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols)
    bt = blocks.copy()
    src = np.zeros(R, np.int32)
    dst = np.zeros(R, np.int32)
    acc = np.zeros(R, np.int32)
    for r in range(R):
        a = int(rng.integers(1, max_acc + 1))
        s = int(rng.integers(0, cols - a + 1))
        d = int(rng.integers(0, cols))
        u = rng.random()
        if u < in_place:
            if a > 1 and rng.random() < 0.5:
                d = s
            else:
                bt[r, d] = bt[r, s]
        elif u < in_place + 0.05:
            d, a = s, 1  # no-op
        elif u < in_place + 0.1:
            if rng.random() < 0.5:
                s = -1
            else:
                d = -int(rng.integers(1, 3))
        if rng.random() < invalid:
            what = int(rng.integers(0, 9))
            if what == 0:
                a = int(rng.choice([0, -2, max_acc + 1]))
            elif what == 1:
                s = cols + int(rng.integers(0, 3))
            elif what == 2:
                d = cols + int(rng.integers(0, 3))
            elif what == 3 and a > 1:
                s = cols - a + 1  # temporal source column out of range
            elif what == 4:
                bt[r, max(d, 0) % cols] = int(rng.choice([0, nb, -1]))
            elif what == 5:
                bt[r, max(s, 0) % cols] = int(rng.choice([nb, nb + 7, -1]))
            elif what == 6:
                bt[r, (max(s, 0) + a - 1) % cols] = nb
            elif what == 7 and 0 <= d < cols and bt[r, d] >= 1:
                # A tensor smaller than the pool: this request's destination is past its end.
                metas["num_blocks"][int(rng.integers(0, len(metas)))] = bt[r, d]
        src[r], dst[r], acc[r] = s, d, a
    if wide_block_table is None:
        wide_block_table = bool(rng.random() < 0.3)
    if wide_block_table:  # a view with a larger row stride
        full = np.full((R, cols + 3), -7, dtype=np.int32)
        full[:, :cols] = bt
        bt = full[:, :cols]
    return StateProblem(arena, metas, nb, max_acc, bt, src, dst, acc)


@dataclass
class CommitProblem:
    """A random commit problem: the tensors as views at byte offsets of one arena (so the same
    problem can be laid on two arenas -- emulated kernel and reference -- or on a CUDA arena), the
    rows and the optional device counts."""

    arena_size: int
    specs: list[tuple[str, int, int, tuple[int, ...], str, int]]
    """(name, layer, byte offset, shape, dtype, first-axis stride in elements)."""
    kind: str
    conv_layout: recurrence.ConvLayout
    conv_kernel_size: int
    num_blocks: int
    max_requests: int
    rows: np.ndarray
    num_accepted: np.ndarray | None

    def tensors(self, arena: Any) -> CommitTensors:
        """The problem's tensors as views of ``arena`` (a 1-D uint8 torch tensor of arena_size bytes)."""
        import torch

        out: dict[str, list[Any]] = {k: [] for k in ("recurrent", "corrections", "keygate", "conv", "conv_window")}
        for name, _layer, off, shape, dtype, stride0 in self.specs:
            dt = getattr(torch, dtype)
            es = torch.empty((), dtype=dt).element_size()
            inner = int(np.prod(shape[1:]))
            nbytes = ((shape[0] - 1) * stride0 + inner) * es
            flat = arena[off : off + nbytes].view(dt)
            strides = [stride0] + [int(np.prod(shape[i + 1 :])) for i in range(1, len(shape))]
            out[name].append(flat.as_strided(shape, strides))
        has_conv = bool(out["conv"])
        return CommitTensors(
            out["recurrent"],
            out["corrections"],
            out["keygate"],
            out["conv"] if has_conv else None,
            out["conv_window"] if has_conv else None,
            self.kind,
            self.conv_layout,
            self.conv_kernel_size,
        )

    def fill(self, arena: Any, seed: int) -> None:
        """Random bytes everywhere, then sensible values in the tensors: states ~ N(0, 0.25),
        corrections ~ N(0, 1), keys ~ N(0, 1/K), log-gates in (-3, 0), conv values ~ N(0, 1)."""
        import torch

        g = torch.Generator().manual_seed(seed)
        arena.copy_(torch.randint(0, 256, (arena.numel(),), dtype=torch.uint8, generator=g))
        t = self.tensors(arena)
        for x in t.recurrent:
            x.copy_(torch.randn(x.shape, generator=g) * 0.5)
        for x in t.corrections:
            x.copy_(torch.randn(x.shape, generator=g))
        for x in t.keygate:
            k = t.recurrent[0].shape[-1]
            x[..., :k].copy_(torch.randn(x[..., :k].shape, generator=g) / max(1.0, k**0.5))
            x[..., k:].copy_(-3.0 * torch.rand(x[..., k:].shape, generator=g))
        for x in (t.conv or []) + (t.conv_window or []):
            x.copy_(torch.randn(x.shape, generator=g))


def random_commit_problem(
    rng: np.random.Generator,
    *,
    kind: str | None = None,
    dtypes: tuple[str, str] | None = None,
    device_counts: bool | None = None,
    max_rows: int = 6,
    max_layers: int = 3,
    conv: str | None = None,
) -> CommitProblem:
    """A random problem for ``rs_recover_commit`` honouring the host's guarantees (every block is
    written by one row at most, no row writes a block another row reads).

    Mixes GDN / KDA, the kernel's (state, key+gate) dtype pairs, head sizes that are and are not
    multiples of 4 (vector and element paths), several layers, padding rows, counts 0 .. Q (and
    device counts beyond both ends), boundary rows, SD / DS / no conv windows of 2- and 4-byte
    elements, misaligned bases and padded block / row strides. ``conv`` forces "SD", "DS" or "none".
    """
    kind = kind or str(rng.choice(["gdn", "kda"]))
    sdt, kdt = dtypes or COMMIT_DTYPE_PAIRS[int(rng.integers(0, len(COMMIT_DTYPE_PAIRS)))]
    if device_counts is None:
        device_counts = bool(rng.random() < 0.35)
    conv = conv or str(rng.choice(["SD", "DS", "DS", "SD", "none"]))
    H = int(rng.integers(1, 4))
    K = int(rng.choice([1, 3, 4, 5, 8, 8, 12, 16, 16, 32]))
    V = int(rng.integers(1, 41))
    Q = int(rng.integers(1, 6))
    L = int(rng.integers(1, max_layers + 1))
    kc_ = int(rng.integers(1, 5))
    D = int(rng.integers(1, 41))
    cdt = str(rng.choice(["bfloat16", "float32", "float16"]))
    W = kc_ - 1 + Q - 1
    R = int(rng.integers(1, max_rows + 1))
    MR = R + int(rng.integers(0, 3))
    nb = 2 * R + 2 + int(rng.integers(0, 4))
    kgw = 2 * K if kind == "kda" else K + 1
    es = {"float32": 4, "bfloat16": 2, "float16": 2}
    specs: list[tuple[str, int, int, tuple[int, ...], str, int]] = []
    off = int(rng.integers(0, 64))

    def place(name: str, layer: int, shape: tuple[int, ...], dtype: str) -> None:
        nonlocal off
        e = es[dtype]
        inner = int(np.prod(shape[1:]))
        stride0 = inner + (int(rng.integers(1, 5)) if rng.random() < 0.3 else 0)
        off = (off + e - 1) // e * e
        if rng.random() < 0.5:
            off = (off + 15) // 16 * 16
        specs.append((name, layer, off, shape, dtype, stride0))
        off += ((shape[0] - 1) * stride0 + inner) * e + int(rng.integers(0, 40))

    for layer in range(L):
        place("recurrent", layer, (nb, H, V, K), sdt)
        place("corrections", layer, (MR, H, Q, V), "float32")
        place("keygate", layer, (MR, H, Q, kgw), kdt)
        if conv != "none":
            shape = (W, D) if conv == "SD" else (D, W)
            place("conv", layer, (nb,) + shape, cdt)
            place("conv_window", layer, (MR,) + shape, cdt)
    rows = np.zeros(R, dtype=COMMIT_ROW_DTYPE)
    blocks = rng.permutation(np.arange(1, nb))
    reqs = rng.permutation(MR)[:R]
    count_at = rng.permutation(MR)[:R]  # each row's entry of the device counts, not its request
    for i in range(R):
        sb = int(blocks[2 * i])
        cnt = int(rng.integers(0, Q + 1))
        if rng.random() < 0.3:
            cnt = Q
        bb, blen = -1, 0
        if cnt >= 1 and rng.random() < 0.45:
            bb, blen = int(blocks[2 * i + 1]), int(rng.integers(1, cnt + 1))
        if rng.random() < 0.12:
            sb = int(rng.choice([0, -1]))  # padding
        rows[i] = (int(reqs[i]), cnt, sb, bb, blen, int(count_at[i]))
    counts = None
    if device_counts:
        counts = rng.integers(-2, Q + 3, size=MR + int(rng.integers(0, 3))).astype(np.int32)
    layout: recurrence.ConvLayout = "SD" if conv == "SD" else "DS"  # no conv state: either
    return CommitProblem(off + 64, specs, kind, layout, kc_, nb, MR, rows, counts)


def owned_step(rng: np.random.Generator, R: int, cols: int, max_acc: int, nb: int):
    """A random valid align step ``(block_table, src_col, dst_col, num_accepted)`` (int32) in which
    every request owns its blocks (so one fused launch is hazard-free): in-block conv shifts, two
    columns naming one block, no-ops and padding rows included; with two requests or more, the first
    is an in-block shift and the second a plain copy."""
    bt = rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols).copy()
    src, dst, acc = (np.zeros(R, np.int32) for _ in range(3))
    for r in range(R):
        a = int(rng.integers(1, max_acc + 1))
        s = int(rng.integers(0, cols - a + 1))
        d = int(rng.integers(0, cols))
        u = rng.random()
        if u < 0.25 and a > 1:
            d = s  # in-block shift
        elif u < 0.35:
            bt[r, d] = bt[r, s]  # two columns naming one block
        elif u < 0.4:
            d, a = s, 1  # no-op
        elif u < 0.5:
            s = -1  # padding
        src[r], dst[r], acc[r] = s, d, a
    if R > 1 and cols >= max_acc:
        src[0], dst[0], acc[0] = 0, 0, max_acc
        src[1], dst[1], acc[1] = 0, cols - 1, max(1, max_acc - 1)
    return bt, src, dst, acc


#: Draft tokens of the multi-group device-path tests' layouts.
NSPEC = 3


def group_layouts() -> list[Any]:
    """Three groups of different layouts sharing NSPEC: two GDN (SD, DS) and a short conv (DS)."""
    return [
        layouts.gdn(
            num_k_heads=2,
            num_v_heads=4,
            head_k_dim=16,
            head_v_dim=16,
            conv_kernel_size=4,
            num_spec=NSPEC,
            conv_layout="SD",
        ),
        layouts.gdn(
            num_k_heads=1,
            num_v_heads=2,
            head_k_dim=8,
            head_v_dim=16,
            conv_kernel_size=4,
            num_spec=NSPEC,
            conv_layout="DS",
        ),
        layouts.short_conv(intermediate_size=64, conv_kernel=4, num_spec=NSPEC, conv_layout="DS"),
    ]
