// recoverssm_rs: fused align-mode copy of the persistent states (GDN_ATTN / Mamba / KDA layouts),
// compact per-request form (docs/design.md section 3, vLLM 0.33 align mode). One entry point,
// rs_state_copy, with the destination columns given or the align decision taken on the device
// (RS_FLAG_DECIDE).
#include "common.cuh"

// Bytes of one state copy per CTA: a state uses min(gridDim.x, ceil(state_bytes / this)) CTAs (at
// least one). The core owns the value (rust/kernels/constants.rs); a test checks this copy.
#define RS_STATE_CHUNK_BYTES 32768u

// Flags of the fused kernel.
#define RS_FLAG_HAS_TEMPORAL 1u  // some StateMeta is TEMPORAL: validate the temporal source column /
                                 // block for the whole request (so a bad request is skipped in
                                 // every state, not only in the temporal ones)
#define RS_FLAG_DECIDE 2u        // the align decision is taken on the device: the second vector is
                                 // `running` and block_size is used (see rs_state_copy)
#define RS_FLAG_PRE_COPY 4u      // vLLM's pre-copy semantics: src_col == dst_col is a no-op whatever
                                 // the accepted count (without it the window shifts in place)

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

// rs_state_copy
// -------------
// Explicit form (flags without RS_FLAG_DECIDE): `dst_or_running` is dst_col.
// For each request r (a = num_accepted[r]) and each state m of metas[0 .. num_meta):
//   conv SD / DS: state[bt[dst_col], columns 0 .. width-a] = state[bt[src_col], columns a-1 .. width-1]
//   temporal:     state[bt[dst_col]] = state[bt[src_col + a - 1]]  (skipped when that block is bt[dst_col])
// with bt = block_table row r of the state's group (int32, row stride bt_row_stride elements,
// bt_cols columns, groups bt_group_stride elements apart: one launch serves every recurrent group of
// a model, each state meta naming its group).
// Skipped silently, as by the host planner: padding (src_col < 0 or dst_col < 0), a null-block row
// (bt[src_col] == bt[dst_col] == 0), no-op (src_col == dst_col and a == 1, or any a with
// RS_FLAG_PRE_COPY).
// Skipped in every state and reported in err (see common.cuh): a outside [1, max_accepted]; a
// column outside [0, bt_cols) (src_col, dst_col, and src_col + a - 1 when flags has
// RS_FLAG_HAS_TEMPORAL); a block id outside [1, num_blocks) for the destination or the temporal
// source (the latter only with RS_FLAG_HAS_TEMPORAL), or outside [0, num_blocks) for bt[src_col].
// These checks use kernel parameters and the request's row of the state's group only, so every CTA
// of a (request, group) takes the same decision; a request can be rejected in one group and copied
// in another (the host plan rejects the whole step instead). A conv state whose source bt[src_col]
// is the null block is skipped and reported as a block error (the host planner rejects the whole
// step instead).
// Skipped in one state and reported: a state that cannot take the request (RS_ERR_META: a block id
// beyond that tensor's num_blocks, a window not wider than the shift, width*dim*elem > state_bytes,
// an unknown kind) -- a host/bind-time inconsistency; the request's other states are still copied.
// (Without RS_FLAG_HAS_TEMPORAL a temporal state re-checks its own source column / block the same
// way.) Nothing is ever written out of bounds, and the device never synchronises with the host.
//
// num_accepted_out (may be null): each request's accepted count after the step, written once per
// request by thread 0 of CTA (0, y, 0) -- rs_next_accepted: 1 where the running state moved or was
// shifted in place, the request's num_accepted elsewhere (padding, a null-block row of group 0, a
// column outside the row and a count out of range included). It is request-level (the same in
// every group); a request reported in err has an undefined state, so a step with a non-zero err
// must not be continued. It must share no byte with any input (the core checks it): every CTA of a
// request reads num_accepted[r].
//
// Device decision (flags with RS_FLAG_DECIDE; vLLM's GPU path: the host never waits for
// num_accepted): `dst_or_running` is running[r] (= computed + scheduled - drafts; < 0 is
// RS_ERR_ARGS, as is block_size < 1); s = src_col[r] < 0 is padding. new = running + a - 1;
// aligned = new / block_size * block_size. The request copies iff aligned >= running and
// aligned >= block_size, and then behaves exactly like the explicit form with
// dst_col = aligned / block_size - 1 and accepted count a_eff = aligned - running + 1.
//
// Launch shape: grid (chunks, min(num_requests, 65535), min(num_meta, 65535)), block (RS_THREADS,
// at most 256, see RS_LAUNCH_BOUNDS).
// blockIdx.x cuts each state copy into gridDim.x pieces (16 for 2 MiB temporal states keeps 132 SMs
// busy with a single request); blockIdx.y / blockIdx.z walk requests / states grid-stride, so any
// gridDim.y / gridDim.z >= 1 is correct (folding). No shared memory, no barriers: CUDA-graph
// capturable with a fixed shape for a fixed number of requests.
//
// Concurrency and memmove safety: the host guarantees that no request's destination block is a
// source block of another request, so CTAs of different requests never touch each other's bytes;
// CTAs of one request touch disjoint chunks. An in-place conv shift (bt[src_col] == bt[dst_col]) is
// a left shift: SD runs the per-lane ascending row walk (rs_lanes_rows), DS one thread per row with
// an ascending memmove (rs_move with one lane) -- the same disciplines as copy_tiles' modes 1 and 2.
extern "C" __global__ void RS_LAUNCH_BOUNDS rs_state_copy(
    const StateMeta* __restrict__ metas, uint32_t num_meta, const int32_t* __restrict__ block_table,
    int64_t bt_row_stride, int32_t bt_cols, int64_t bt_group_stride, const int32_t* __restrict__ src_col,
    const int32_t* __restrict__ dst_or_running, const int32_t* __restrict__ num_accepted,
    int32_t* __restrict__ num_accepted_out, int32_t block_size,
    int32_t num_requests, int32_t max_accepted, int64_t num_blocks, uint32_t flags, int32_t* err) {
  const bool align = (flags & RS_FLAG_DECIDE) != 0;
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  const uint64_t chunk = blockIdx.x, nchunks = gridDim.x;
  const int64_t cols = bt_cols;
  const bool reporter = blockIdx.x == 0;  // one CTA per (request, state) reports
  // The accepted counts after the step: one thread of the CTAs (0, y, 0), a loop of its own (so
  // the output pointer is not live in the copy loop below).
  if (num_accepted_out != nullptr && blockIdx.x == 0 && blockIdx.z == 0 && tid == 0) {
    for (int64_t r = blockIdx.y; r < num_requests; r += gridDim.y)
      num_accepted_out[r] = rs_next_accepted(block_table + r * bt_row_stride, cols, src_col[r], dst_or_running[r],
                                             num_accepted[r], max_accepted, block_size, flags);
  }
  for (int64_t r = blockIdx.y; r < num_requests; r += gridDim.y) {
    const int64_t s = src_col[r];
    const int64_t a = num_accepted[r];
    const int64_t x = dst_or_running[r];
    for (uint32_t mi = blockIdx.z; mi < num_meta; mi += gridDim.z) {
      const StateMeta m = metas[mi];
      // The state's group selects its block table (bt_group_stride elements apart); the decision
      // reads only that row and kernel parameters, so every CTA of a (request, group) takes the
      // same decision.
      const int32_t* bt_row = block_table + (int64_t)m.group * bt_group_stride + r * bt_row_stride;
      RsRequest q;
      uint32_t code = 0;
      q.a = 0;
      if (!align) {
        code = rs_decide(bt_row, cols, s, x, a, max_accepted, num_blocks, flags, &q);
      } else if (s >= 0) {
        // new = running + a - 1; aligned = new / block_size * block_size; copy iff aligned >= running
        // and aligned >= block_size; then dst_col = aligned / block_size - 1, a_eff = aligned - running + 1.
        if (a < 1 || a > max_accepted) {
          code = RS_ERR_ACCEPTED;
        } else if (block_size < 1 || x < 0) {
          code = RS_ERR_ARGS;
        } else {
          const int64_t bs = block_size;
          const int64_t aligned = (x + a - 1) / bs * bs;
          if (aligned >= x && aligned >= bs) {
            code = rs_decide(bt_row, cols, s, aligned / bs - 1, aligned - x + 1, max_accepted, num_blocks, flags, &q);
          }
        }
      }
      if (code != 0) {
        if (reporter) rs_report_error(err, code, r, num_requests);
        continue;
      }
      if (q.a == 0) continue;
      // A state takes only as many of the gridDim.x CTAs as its size calls for (one per
      // RS_STATE_CHUNK_BYTES): small conv windows next to 2 MiB recurrent states are not cut into
      // slivers. CTA 0 always takes part, so per-state errors are still reported.
      const uint64_t want = rs_ceil_div(m.state_bytes, RS_STATE_CHUNK_BYTES);
      const uint64_t mchunks = rs_min_u64(nchunks, want > 0 ? want : 1);
      if (chunk >= mchunks) continue;
      const uint32_t c = rs_copy_state(m, bt_row, cols, num_blocks, q, chunk, mchunks, tid, nthreads);
      if (c != 0 && reporter) rs_report_error(err, c, r, num_requests);
    }
  }
}

#if defined(RS_HOST_EMULATION)
RS_HOST_ENTRY(rs_state_copy)
#endif
