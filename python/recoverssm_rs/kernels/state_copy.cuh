// recoverssm_rs: the per-request decisions and the per-state copy of the fused align-mode copy,
// shared by rs_state_copy (state_copy.cu) and rs_state_copy_slots (state_copy_slots.cu).
#pragma once

#include "rs_abi.cuh"
#include "common.cuh"

// What one request does, decided identically by every CTA that handles it.
struct RsRequest {
  int64_t src_blk;  // bt[src_col] (conv source)
  int64_t dst_blk;  // bt[dst_col]
  int64_t src_col;
  int64_t a;        // effective accepted count (>= 1)
};

// Request-level validation (explicit form), in the host planner's order (rust/plan/step.rs).
// Returns 0 and fills *q when the request copies, returns 0 with q->a = 0 when it is skipped
// silently (padding, a null-block row, a no-op), else RS_ERR_* bits (skip + report).
// Order: padding -> column range -> null row -> accepted range -> accepted column -> no-op -> ids.
// The null block 0 is never a destination and never a source (a conv state checks its own source
// in rs_copy_state, as a layout without conv state has no use for bt[src_col]).
RS_DEVICE uint32_t rs_decide(const int32_t* bt_row, int64_t cols, int64_t s, int64_t d, int64_t a,
                             int64_t max_accepted, int64_t num_blocks, uint32_t flags, RsRequest* q) {
  q->a = 0;
  if (s < 0 || d < 0) return 0;  // padding row
  if (s >= cols || d >= cols) return RS_ERR_COLUMN;
  const int64_t src_blk = bt_row[s];
  const int64_t dst_blk = bt_row[d];
  if (src_blk == 0 && dst_blk == 0) return 0;             // a null-block row
  if (a < 1 || a > max_accepted) return RS_ERR_ACCEPTED;  // bad accepted count
  const bool temporal = (flags & RS_FLAG_HAS_TEMPORAL) != 0;
  if (temporal && s + a - 1 >= cols) return RS_ERR_COLUMN;
  if (s == d && (a == 1 || (flags & RS_FLAG_PRE_COPY) != 0)) return 0;  // no-op
  if (dst_blk < 1 || dst_blk >= num_blocks || src_blk < 0 || src_blk >= num_blocks) return RS_ERR_BLOCK;
  if (temporal) {
    const int64_t t = bt_row[s + a - 1];
    if (t < 1 || t >= num_blocks) return RS_ERR_BLOCK;
  }
  q->src_blk = src_blk;
  q->dst_blk = dst_blk;
  q->src_col = s;
  q->a = a;
  return 0;
}

// The decision form (RS_FLAG_DECIDE): s = src_col (< 0: padding), x = running. new = running + a - 1;
// aligned = new / block_size * block_size; copy iff aligned >= running and aligned >= block_size; then
// the explicit form with dst_col = aligned / block_size - 1 and a_eff = aligned - running + 1.
RS_DEVICE uint32_t rs_decide_aligned(const int32_t* bt_row, int64_t cols, int64_t s, int64_t x, int64_t a,
                                     int64_t block_size, int64_t max_accepted, int64_t num_blocks, uint32_t flags,
                                     RsRequest* q) {
  q->a = 0;
  if (s < 0) return 0;
  if (a < 1 || a > max_accepted) return RS_ERR_ACCEPTED;
  if (block_size < 1 || x < 0) return RS_ERR_ARGS;
  const int64_t aligned = (x + a - 1) / block_size * block_size;
  if (!(aligned >= x && aligned >= block_size)) return 0;
  return rs_decide(bt_row, cols, s, aligned / block_size - 1, aligned - x + 1, max_accepted, num_blocks, flags, q);
}

// The accepted count request r carries after the step (num_accepted_out): 1 where its running state
// was moved or shifted (the state now sits at the start of its window), else its count unchanged.
// Request-level (the same for every group; bt_row is group 0's row): explicit form, a valid row
// (both columns inside the row, not both on the null block, count in range) whose copy is not a
// no-op; decision form, a crossed boundary whose save column is the running column itself (the shift
// in place; a save elsewhere leaves the running state alone) and not the null block.
RS_DEVICE int32_t rs_next_accepted(const int32_t* bt_row, int64_t cols, int64_t s, int64_t x, int64_t a,
                                   int64_t max_accepted, int64_t block_size, uint32_t flags) {
  if (s < 0 || s >= cols || a < 1 || a > max_accepted) return (int32_t)a;
  int64_t d = x;
  if ((flags & RS_FLAG_DECIDE) != 0) {
    if (block_size < 1 || x < 0) return (int32_t)a;
    const int64_t aligned = (x + a - 1) / block_size * block_size;
    if (!(aligned >= x && aligned >= block_size && aligned / block_size - 1 == s)) return (int32_t)a;
    d = s;  // the shift in place (a save elsewhere returned above)
  } else if (d < 0 || d >= cols || (s == d && (a == 1 || (flags & RS_FLAG_PRE_COPY) != 0))) {
    return (int32_t)a;  // padding, a column error (reported by the copy), or a no-op
  }
  if (bt_row[s] == 0 && bt_row[d] == 0) return (int32_t)a;  // a null-block row: skipped
  return 1;
}

// The part of one (request, state) copy that CTA `chunk` of `nchunks` owns. Returns RS_ERR_* bits
// when this state cannot take the request (nothing is written then).
RS_DEVICE uint32_t rs_copy_state(const StateMeta& m, const int32_t* bt_row, int64_t cols, int64_t num_blocks,
                                 const RsRequest& q, uint64_t chunk, uint64_t nchunks, uint32_t tid,
                                 uint32_t nthreads) {
  const int64_t meta_blocks = (int64_t)m.num_blocks;
  if (q.dst_blk >= meta_blocks) return RS_ERR_META;
  // Every case but the in-place SD shift is "copy n bytes at row offsets r*pitch, r = r0, r0+rstep,
  // ... < r_end, with nlanes threads per row" (rs_move); one call site keeps the code small.
  uint64_t dst, src, n, pitch = 0, r0 = 0, rstep = 1, r_end = 1;
  uint32_t lane = tid, nlanes = nthreads;
  if (m.kind == RS_KIND_TEMPORAL) {
    // state[bt[dst_col]] = state[bt[src_col + a - 1]]: one contiguous span, cut in nchunks pieces.
    const int64_t col = q.src_col + q.a - 1;
    if (col >= cols) return RS_ERR_COLUMN;  // only reachable without RS_FLAG_HAS_TEMPORAL
    const int64_t sb = bt_row[col];
    if (sb < 1 || sb >= num_blocks) return RS_ERR_BLOCK;  // likewise
    if (sb >= meta_blocks) return RS_ERR_META;
    if (sb == q.dst_blk) return 0;
    src = m.base + (uint64_t)sb * m.block_stride;
    dst = m.base + (uint64_t)q.dst_blk * m.block_stride;
    n = m.state_bytes;
  } else {
    if (m.kind != RS_KIND_CONV_SD && m.kind != RS_KIND_CONV_DS) return RS_ERR_META;
    // Conv window: dst columns [0, width-(a-1)) = src columns [a-1, width).
    const uint64_t width = m.width, dim = m.dim, elem = m.elem_bytes;
    if (q.src_blk < 1) return RS_ERR_BLOCK;  // the null block holds no window
    if (q.src_blk >= meta_blocks) return RS_ERR_META;
    if (width == 0 || dim == 0 || elem == 0 || (uint64_t)(q.a - 1) >= width ||
        width * dim * elem > m.state_bytes)
      return RS_ERR_META;
    if (q.src_blk == q.dst_blk && q.a == 1) return 0;  // identity
    const uint64_t shift = (uint64_t)(q.a - 1);
    const uint64_t ncols = width - shift;
    const uint64_t src_state = m.base + (uint64_t)q.src_blk * m.block_stride;
    dst = m.base + (uint64_t)q.dst_blk * m.block_stride;
    if (m.kind == RS_KIND_CONV_SD) {
      // [width, dim]: a column is a row of L = dim*elem contiguous bytes; the window is contiguous.
      const uint64_t L = dim * elem;
      src = src_state + shift * L;
      if (q.src_blk == q.dst_blk) {
        // In place: source row r is destination row r+shift. The L lanes of a row are cut in
        // nchunks pieces; within a piece each lane unit is owned by one thread that walks the rows
        // ascending (rs_lanes_rows), so every byte is read before it is overwritten.
        const uint64_t lb = (rs_ceil_div(L, nchunks) + 15u) & ~(uint64_t)15u;
        const uint64_t lo = rs_min_u64(L, chunk * lb), hi = rs_min_u64(L, lo + lb);
        if (hi > lo) rs_lanes_rows(dst, src, lo, hi - lo, ncols, L, tid, nthreads);
        return 0;
      }
      n = ncols * L;  // different blocks: one contiguous, disjoint span
    } else {
      // [dim, width]: each of the dim rows (width*elem bytes) shifts left by shift elements. Rows are
      // cut in nchunks pieces.
      pitch = width * elem;
      src = src_state + shift * elem;
      n = ncols * elem;
      if (shift == 0) {
        // The whole window to another block (the same block with a == 1 returned above): one
        // contiguous, disjoint span, copied by the cooperative path below in 16-byte words.
        n = dim * pitch;
        pitch = 0;
      } else {
        const uint64_t rc = rs_ceil_div(dim, nchunks);
        const uint64_t lo = rs_min_u64(dim, chunk * rc);
        if (q.src_blk != q.dst_blk) {
          // Different blocks: disjoint, so the rows' words are spread flat over the CTA (coalesced).
          rs_rows_flat(dst, src, n, pitch, lo, rs_min_u64(dim, lo + rc), tid, nthreads);
          return 0;
        }
        // In place: one thread per row, rs_move(nlanes = 1) = an ascending memmove; rows are disjoint.
        r0 = lo + tid;
        rstep = nthreads;
        r_end = rs_min_u64(dim, lo + rc);
        lane = 0;
        nlanes = 1;
      }
    }
  }
  if (nlanes > 1) {
    // A contiguous disjoint span (temporal, SD across blocks, an unshifted DS window across blocks):
    // this CTA's piece, 16-byte multiples.
    const uint64_t cb = (rs_ceil_div(n, nchunks) + 15u) & ~(uint64_t)15u;
    const uint64_t lo = rs_min_u64(n, chunk * cb), hi = rs_min_u64(n, lo + cb);
    dst += lo;
    src += lo;
    n = hi - lo;
    if (n == 0) return 0;
  }
  for (uint64_t r = r0; r < r_end; r += rstep) rs_move(dst + r * pitch, src + r * pitch, n, lane, nlanes);
  return 0;
}

// CTA `chunk`'s part of request q's copy of state m (nothing when q.a == 0: the request is skipped).
// A state takes only as many of the `nchunks` CTAs as its size calls for (one per
// RS_STATE_CHUNK_BYTES): small conv windows next to 2 MiB recurrent states are not cut into slivers.
// CTA 0 always takes part, so per-state errors are still reported. Returns rs_copy_state's bits.
RS_DEVICE uint32_t rs_copy_state_chunk(const StateMeta& m, const int32_t* bt_row, int64_t cols, int64_t num_blocks,
                                       const RsRequest& q, uint64_t chunk, uint64_t nchunks, uint32_t tid,
                                       uint32_t nthreads) {
  if (q.a == 0) return 0;
  const uint64_t want = rs_ceil_div(m.state_bytes, RS_STATE_CHUNK_BYTES);
  const uint64_t mchunks = rs_min_u64(nchunks, want > 0 ? want : 1);
  if (chunk >= mchunks) return 0;
  return rs_copy_state(m, bt_row, cols, num_blocks, q, chunk, mchunks, tid, nthreads);
}
