"""Reference semantics of the package's CUDA kernels, for the tests: the planner's tile rules
(:func:`make_tiles`), the batched copy (:func:`reference_execute_segments`), the fused state copy
(:func:`reference_state_copy`, with the align decision when given a ``block_size``) in numpy, and the
RecoverSSM commit (:func:`reference_recover_commit`) with the package's torch reference.

Addresses: segments and state metas hold absolute byte addresses. The references take a numpy
``uint8`` buffer and the address ``base`` its first byte stands for (default: its own address), so
a plan built for one buffer (or for a GPU tensor) can be replayed on a host copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from recoverssm_rs.cuda import build_commit_meta
from recoverssm_rs.plan_format import (
    COMMIT_ROW_DTYPE,
    CONSTANTS,
    SEGMENT_DTYPE,
    STATE_META_DTYPE,
    TILE_DTYPE,
)
from recoverssm_rs.speculative import recurrence

MODE_DISJOINT = CONSTANTS["RS_MODE_DISJOINT"]
MODE_ROWS_ASCENDING = CONSTANTS["RS_MODE_ROWS_ASCENDING"]
MODE_WITHIN_ROW = CONSTANTS["RS_MODE_WITHIN_ROW"]
KIND_TEMPORAL = CONSTANTS["RS_KIND_TEMPORAL"]
KIND_CONV_SD = CONSTANTS["RS_KIND_CONV_SD"]
KIND_CONV_DS = CONSTANTS["RS_KIND_CONV_DS"]
ERR_ACCEPTED = CONSTANTS["RS_ERR_ACCEPTED"]
ERR_COLUMN = CONSTANTS["RS_ERR_COLUMN"]
ERR_BLOCK = CONSTANTS["RS_ERR_BLOCK"]
ERR_META = CONSTANTS["RS_ERR_META"]
ERR_ARGS = CONSTANTS["RS_ERR_ARGS"]


def records_of(x: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """``x`` as a contiguous 1-D array of ``dtype`` records (raw uint8 bytes are viewed)."""
    arr = np.ascontiguousarray(x)
    if arr.dtype != dtype:
        if arr.dtype == np.uint8 and arr.size % dtype.itemsize == 0:
            arr = arr.view(dtype)
        else:
            raise TypeError(f"{what}: expected dtype {dtype} (or raw uint8 bytes), got {arr.dtype}")
    return arr.reshape(-1)


def make_tiles(
    segments: Any, *, tile_bytes: int = 64 * 1024, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cut segments into tiles grouped by wave, with the planner's rules.

    Returns ``(tiles, wave_starts)``. Byte-unit segments (``rows == 1`` or ROWS_ASCENDING) are cut
    in byte ranges whose boundaries fall where ``dst + begin`` is 16-byte aligned (about
    ``tile_bytes`` bytes of work per tile); a single row overlapping itself (``rows == 1``, mode != 0,
    ``|src - dst| < row_bytes``) is never cut. Row-unit segments are cut in row ranges of about ``tile_bytes`` bytes. With
    ``rng``, tile sizes are randomised (0.25x .. 2x) to exercise odd cuts.
    """
    seg = records_of(segments, SEGMENT_DTYPE, "segments")
    order = np.argsort(seg["wave"], kind="stable")
    tiles: list[tuple[int, int, int, int]] = []
    starts = [0]
    waves = seg["wave"][order]
    for idx_pos, si in enumerate(order):
        s = seg[si]
        if idx_pos > 0 and waves[idx_pos] != waves[idx_pos - 1]:
            starts.append(len(tiles))

        def size() -> int:
            if rng is None:
                return max(1, tile_bytes)
            return max(1, int(tile_bytes * rng.uniform(0.25, 2.0)))

        rows, row_bytes, mode = int(s["rows"]), int(s["row_bytes"]), int(s["mode"])
        if rows == 1 or mode == MODE_ROWS_ASCENDING:
            if rows == 1 and mode != MODE_DISJOINT and abs(int(s["src"]) - int(s["dst"])) < row_bytes:
                tiles.append((int(si), 0, row_bytes, 0))  # an overlapping row is one tile
                continue
            dst = int(s["dst"])
            begin = 0
            while begin < row_bytes:
                want = max(1, size() // rows)
                end = ((dst + begin + want + 15) // 16) * 16 - dst
                end = min(row_bytes, max(end, begin + 1))
                tiles.append((int(si), begin, end - begin, 0))
                begin = end
        else:
            per = max(1, size() // max(1, row_bytes))
            begin = 0
            while begin < rows:
                count = min(per, rows - begin)
                tiles.append((int(si), begin, count, 0))
                begin += count
    starts.append(len(tiles))
    if len(seg) == 0:
        starts = [0, 0]
    return np.array(tiles, dtype=np.uint32).reshape(-1, 4).view(TILE_DTYPE).reshape(-1), np.array(
        starts, dtype=np.int64
    )


# ================================================================================================
# Reference semantics
# ================================================================================================


def _base(buf: np.ndarray, base: int | None) -> int:
    if buf.dtype != np.uint8 or buf.ndim != 1:
        raise TypeError("buf must be a 1-D uint8 array")
    return int(buf.ctypes.data) if base is None else int(base)


def _copy_rows(buf: np.ndarray, src: int, dst: int, row_bytes: int, rows: int, pitch: int) -> None:
    """Snapshot copy: read every source row, then write (= memmove for the allowed overlaps)."""
    if rows == 1:
        buf[dst : dst + row_bytes] = buf[src : src + row_bytes].copy()
        return
    idx = np.arange(rows, dtype=np.int64)[:, None] * pitch + np.arange(row_bytes, dtype=np.int64)[None, :]
    data = buf[src + idx]
    buf[dst + idx] = data


def reference_execute_segments(buf: np.ndarray, segments: Any, base: int | None = None) -> None:
    """Execute a segment plan on ``buf`` (uint8) in place, with the documented semantics.

    Segments run wave by wave (a stable sort by ``wave``); each segment copies its rows as if all of
    its source bytes were read before any destination byte is written. That is the result the three
    modes' disciplines produce for the overlaps they allow (ROWS_ASCENDING: src = dst + k*pitch;
    WITHIN_ROW: an overlap inside each row; DISJOINT: none).
    """
    b = _base(buf, base)
    seg = records_of(segments, SEGMENT_DTYPE, "segments")
    for si in np.argsort(seg["wave"], kind="stable"):
        s = seg[si]
        rows = int(s["rows"])
        _copy_rows(
            buf, int(s["src"]) - b, int(s["dst"]) - b, int(s["row_bytes"]), rows, int(s["pitch"]) if rows > 1 else 0
        )


def _decide(
    bt_row: np.ndarray, cols: int, s: int, d: int, a: int, max_accepted: int, num_blocks: int, temporal: bool
) -> tuple[int, tuple[int, int, int, int] | None]:
    # The host planner's order (rust/plan/step.rs), as rs_decide in state_copy.cuh.
    if s < 0 or d < 0:
        return 0, None
    if s >= cols or d >= cols:
        return ERR_COLUMN, None
    src_blk, dst_blk = int(bt_row[s]), int(bt_row[d])
    if src_blk == 0 and dst_blk == 0:
        return 0, None
    if a < 1 or a > max_accepted:
        return ERR_ACCEPTED, None
    if temporal and s + a - 1 >= cols:
        return ERR_COLUMN, None
    if s == d and a == 1:
        return 0, None
    if not (1 <= dst_blk < num_blocks) or not (0 <= src_blk < num_blocks):
        return ERR_BLOCK, None
    if temporal and not (1 <= int(bt_row[s + a - 1]) < num_blocks):
        return ERR_BLOCK, None
    return 0, (src_blk, dst_blk, s, a)


def _apply_state(
    buf: np.ndarray, b: int, m: np.void, bt_row: np.ndarray, cols: int, num_blocks: int, q: tuple[int, int, int, int]
) -> int:
    src_blk, dst_blk, s, a = q
    meta_blocks = int(m["num_blocks"])
    if dst_blk >= meta_blocks:
        return ERR_META
    base, stride = int(m["base"]) - b, int(m["block_stride"])
    kind = int(m["kind"])
    if kind == KIND_TEMPORAL:
        col = s + a - 1
        if col >= cols:
            return ERR_COLUMN
        sb = int(bt_row[col])
        if not 1 <= sb < num_blocks:
            return ERR_BLOCK
        if sb >= meta_blocks:
            return ERR_META
        if sb != dst_blk:
            n = int(m["state_bytes"])
            _copy_rows(buf, base + sb * stride, base + dst_blk * stride, n, 1, 0)
        return 0
    if kind not in (KIND_CONV_SD, KIND_CONV_DS):
        return ERR_META
    width, dim, elem = int(m["width"]), int(m["dim"]), int(m["elem_bytes"])
    if src_blk < 1:
        return ERR_BLOCK
    if src_blk >= meta_blocks:
        return ERR_META
    if width == 0 or dim == 0 or elem == 0 or a - 1 >= width or width * dim * elem > int(m["state_bytes"]):
        return ERR_META
    if src_blk == dst_blk and a == 1:
        return 0
    shift, ncols = a - 1, width - (a - 1)
    src_state, dst_state = base + src_blk * stride, base + dst_blk * stride
    if kind == KIND_CONV_SD:
        L = dim * elem
        _copy_rows(buf, src_state + shift * L, dst_state, ncols * L, 1, 0)
    else:
        row = width * elem
        _copy_rows(buf, src_state + shift * elem, dst_state, ncols * elem, dim, row)
    return 0


def _report(err: np.ndarray, code: int, r: int, n: int) -> None:
    err[0] |= code
    err[1] = max(int(err[1]), n - r)
    err[2] = max(int(err[2]), r + 1)


def reference_state_copy(
    buf: np.ndarray,
    metas: Any,
    block_table: Any,
    src_col: Any,
    dst_or_running: Any,
    num_accepted: Any,
    *,
    max_accepted: int,
    num_blocks: int,
    block_size: int | None = None,
    has_temporal: bool | None = None,
    base: int | None = None,
    err: np.ndarray | None = None,
) -> np.ndarray:
    """The fused kernel's semantics on ``buf``, in place; returns the error word.

    ``dst_or_running`` is ``dst_col``, or with a ``block_size`` the ``running`` token counts of the
    device-side align decision (:func:`align_decision`). Requests run in order (the host guarantees
    no request's destination block is another's source block, so the order does not matter); each
    decision and error bit is the kernel's.
    """
    b = _base(buf, base)
    m = records_of(metas, STATE_META_DTYPE, "metas")
    bt = np.asarray(block_table, dtype=np.int64)
    s_, x_, a_ = (np.asarray(x, dtype=np.int64) for x in (src_col, dst_or_running, num_accepted))
    if has_temporal is None:
        has_temporal = bool(np.any(m["kind"] == KIND_TEMPORAL))
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n, cols = len(s_), bt.shape[1]
    for r in range(n):
        s, x, a = int(s_[r]), int(x_[r]), int(a_[r])
        code: int = 0
        q: tuple[int, int, int, int] | None = None
        if block_size is None:
            code, q = _decide(bt[r], cols, s, x, a, max_accepted, num_blocks, has_temporal)
        elif s >= 0:
            if a < 1 or a > max_accepted:
                code = ERR_ACCEPTED
            elif block_size < 1 or x < 0:
                code = ERR_ARGS
            else:
                dec = align_decision(x, a, block_size)
                if dec is not None:
                    code, q = _decide(bt[r], cols, s, dec[0], dec[1], max_accepted, num_blocks, has_temporal)
        _finish(buf, b, m, bt[r], cols, num_blocks, code, q, err, r, n)
    return err


def _finish(
    buf: np.ndarray,
    b: int,
    m: np.ndarray,
    bt_row: np.ndarray,
    cols: int,
    num_blocks: int,
    code: int,
    q: tuple[int, int, int, int] | None,
    err: np.ndarray,
    r: int,
    n: int,
) -> None:
    if code:
        _report(err, code, r, n)
        return
    if q is None:
        return
    for mi in range(len(m)):
        c = _apply_state(buf, b, m[mi], bt_row, cols, num_blocks, q)
        if c:
            _report(err, c, r, n)


def align_decision(running: int, a: int, block_size: int) -> tuple[int, int] | None:
    """vLLM's align decision: ``(dst_col, a_eff)`` when the request copies, else ``None``."""
    new = running + a - 1
    aligned = new // block_size * block_size
    if aligned >= running and aligned >= block_size:
        return aligned // block_size - 1, aligned - running + 1
    return None


@dataclass
class CommitTensors:
    """The tensors of a RecoverSSM commit, one entry per layer (torch tensors, any device)."""

    recurrent: list[Any]
    """``[num_blocks, H, V, K]`` per layer."""
    corrections: list[Any]
    """``[max_requests, H, Q, V]`` float32 per layer."""
    keygate: list[Any]
    """``[max_requests, H, Q, K + 1 | 2K]`` per layer."""
    conv: list[Any] | None
    """``[num_blocks, W, D]`` (SD) / ``[num_blocks, D, W]`` (DS) per layer, or ``None``."""
    conv_window: list[Any] | None
    """``[max_requests, same]`` per layer, or ``None``."""
    kind: str
    conv_layout: recurrence.ConvLayout
    conv_kernel_size: int

    def meta(self) -> np.ndarray:
        """The kernel's :data:`~recoverssm_rs.cuda.COMMIT_META_DTYPE` table for these tensors."""
        return build_commit_meta(
            self.recurrent,
            self.corrections,
            self.keygate,
            self.conv,
            self.conv_window,
            kind=self.kind,
            conv_layout=self.conv_layout,
            conv_kernel_size=self.conv_kernel_size,
        )

    def all(self) -> list[Any]:
        out = self.recurrent + self.corrections + self.keygate
        return out + (self.conv or []) + (self.conv_window or [])


def _commit_row_code(row: np.void, num_blocks: int, max_requests: int, num_counts: int | None) -> int:
    req, sb, bb = int(row["request"]), int(row["state_block"]), int(row["boundary_block"])
    code = 0
    if req >= max_requests or (num_counts is not None and int(row["count_index"]) >= num_counts):
        code |= ERR_ARGS
    if sb >= num_blocks or (bb >= 0 and (bb < 1 or bb >= num_blocks or bb == sb)):
        code |= ERR_BLOCK
    return code


def reference_recover_commit(
    tensors: CommitTensors,
    rows: Any,
    num_accepted: Any = None,
    *,
    num_blocks: int,
    max_requests: int,
    err: np.ndarray | None = None,
) -> np.ndarray:
    """The commit kernel's semantics, executed in place on ``tensors`` with the torch reference
    (:func:`recoverssm_rs.speculative.recurrence.commit` with boundary states, and
    :func:`~recoverssm_rs.speculative.recurrence.compact_conv_window`) -- the same calls ``StateCache.commit``
    makes. Returns the error word the kernel reports for ``rows``.

    Per row: ``state_block <= 0`` is padding; a row the kernel rejects (request / block out of
    range, boundary block equal to the state block) changes nothing; ``count`` is
    ``min(row.count, Q)``, or ``clamp(num_accepted[request], 0, row.count)`` with ``num_accepted``;
    ``count == 0`` changes nothing; the boundary is written when ``boundary_block >= 0`` and
    ``1 <= boundary_len <= count``.
    """
    import torch

    rw = records_of(rows, COMMIT_ROW_DTYPE, "rows")
    counts_in = None if num_accepted is None else np.asarray(num_accepted, dtype=np.int64).reshape(-1)
    if err is None:
        err = np.zeros(3, dtype=np.int32)
    n = len(rw)
    ok = np.zeros(n, dtype=bool)
    for i in range(n):
        if int(rw[i]["state_block"]) <= 0:
            continue
        code = _commit_row_code(rw[i], num_blocks, max_requests, None if counts_in is None else counts_in.size)
        if code:
            _report(err, code, i, n)
        else:
            ok[i] = True
    r = rw[ok]
    if len(r) == 0:
        return err
    cnt = r["count"].astype(np.int64)
    if counts_in is not None:
        cnt = np.clip(counts_in[r["count_index"].astype(np.int64)], 0, cnt)
    for layer in range(len(tensors.recurrent)):
        rec, corr, kg = tensors.recurrent[layer], tensors.corrections[layer], tensors.keygate[layer]
        q = int(corr.shape[2])
        nl = np.minimum(cnt, q)
        moved = nl > 0
        if not moved.any():
            continue
        rm, nm = r[moved], nl[moved]
        blen = rm["boundary_len"].astype(np.int64)
        has_b = (rm["boundary_block"] >= 0) & (blen >= 1) & (blen <= nm)
        dev = rec.device
        req = torch.as_tensor(rm["request"].astype(np.int64), device=dev)
        sb = torch.as_tensor(rm["state_block"].astype(np.int64), device=dev)
        n_t = torch.as_tensor(nm, device=dev)
        s0 = rec[sb]
        bout = torch.empty_like(s0) if has_b.any() else None
        bcounts = torch.as_tensor(np.where(has_b, blen, -1), device=dev)
        new = recurrence.commit(
            s0, corr[req], kg[req], n_t, boundary_counts=bcounts if bout is not None else None, boundary_out=bout
        )
        bmask = torch.as_tensor(has_b, device=dev)
        bb = torch.as_tensor(rm["boundary_block"][has_b].astype(np.int64), device=dev)
        if bout is not None:
            rec[bb] = bout[bmask]
        rec[sb] = new
        if tensors.conv is not None and tensors.conv_window is not None:
            conv, win = tensors.conv[layer], tensors.conv_window[layer][req]
            kc_, lay = tensors.conv_kernel_size, tensors.conv_layout
            if bout is not None:
                conv[bb] = recurrence.compact_conv_window(win[bmask], bcounts[bmask], kc_, lay)
            conv[sb] = recurrence.compact_conv_window(win, n_t, kc_, lay)
    return err
