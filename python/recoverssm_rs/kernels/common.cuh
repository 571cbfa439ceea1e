// recoverssm_rs kernels: copy helpers shared by copy_tiles.cu, state_copy.cu and recover_commit.cu.
//
// The records, the RS_* constants and the entry points' prototypes come from rs_abi.cuh, which the
// Rust core generates from its own tables (rust/kernels/header.rs); this file holds only
// hand-written device code. Like rs_abi.cuh it compiles three ways:
//   * NVRTC (cupy.RawModule and the NVRTC check, recoverssm_rs/cuda/nvrtc.py): __CUDACC_RTC__ is defined, there is no
//     C library (rs_abi.cuh declares the fixed-width integer types);
//   * nvcc: <stdint.h>;
//   * host C++ (the test tree's emulation): tests/support/host_shim.h is force-included first; it defines
//     RS_HOST_EMULATION, the CUDA keywords, vector types, blockIdx/threadIdx, and RS_CHECK_ACCESS,
//     which records every misaligned or out-of-range data access the kernels make.
//
// Every data access of the kernels goes through rs_ld<W> / rs_st<W> (W = 1, 2, 4, 8 or 16 bytes), and
// every call site guarantees that the address is W-aligned; the host emulation proves it (see
// RS_CHECK_ACCESS). Offsets are 64-bit everywhere: a row index times a pitch, or a block id times a
// block stride, overflows 32 bits on real pools.
#pragma once

#include "rs_abi.cuh"

#ifndef RS_CHECK_ACCESS
// Device build: no checks (the host emulation defines this to record misaligned / stray accesses).
#define RS_CHECK_ACCESS(addr, bytes, align) ((void)0)
#endif

#define RS_DEVICE __device__ __forceinline__

// At most RS_THREADS threads, and registers for 3 resident CTAs per SM (<= 85 registers): ptxas 12.9
// then keeps every kernel spill-free on sm_80 and sm_90 (the NVRTC check asserts it). Plain
// __launch_bounds__(256) made it pick 48-80 registers *with* spills; 4 CTAs (64 registers) spills.
#ifndef RS_LAUNCH_BOUNDS
#define RS_LAUNCH_BOUNDS __launch_bounds__(RS_THREADS, 3)
#endif

// ------------------------------------------------------------------------------------------------
// Error word of the fused kernels (int32 err[3], zeroed by the host before the launch)
// ------------------------------------------------------------------------------------------------
// err[0] |= code bits (RS_ERR_*, rs_abi.cuh) of every failure (nonzero <=> some request was rejected);
// err[1]  = max over rejected requests r of (num_requests - r)  => first rejected = R - err[1];
// err[2]  = max over rejected requests r of (r + 1)             => last rejected  = err[2] - 1.
// All three are order-independent (atomicOr / atomicMax), so the word is deterministic and a zeroed
// word means "no error". Only thread 0 of a CTA reports.
RS_DEVICE void rs_report_error(int32_t* err, uint32_t code, int64_t request, int64_t num_requests) {
  if (err == 0 || threadIdx.x != 0) return;
  atomicOr(err, (int32_t)code);
  atomicMax(err + 1, (int32_t)(num_requests - request));
  atomicMax(err + 2, (int32_t)(request + 1));
}

// ------------------------------------------------------------------------------------------------
// Word access
// ------------------------------------------------------------------------------------------------

template <int W>
struct rs_word;
template <>
struct rs_word<16> { typedef uint4 type; };
template <>
struct rs_word<8> { typedef unsigned long long type; };
template <>
struct rs_word<4> { typedef unsigned int type; };
template <>
struct rs_word<2> { typedef unsigned short type; };
template <>
struct rs_word<1> { typedef unsigned char type; };

// Load / store one W-byte word at a W-aligned byte address (plain, coherent accesses: the in-place
// shifts read what the same kernel writes, so no __ldg / non-coherent loads anywhere).
template <int W>
RS_DEVICE typename rs_word<W>::type rs_ld(uint64_t addr) {
  RS_CHECK_ACCESS(addr, W, W);
  return *reinterpret_cast<const typename rs_word<W>::type*>(addr);
}
template <int W>
RS_DEVICE void rs_st(uint64_t addr, typename rs_word<W>::type v) {
  RS_CHECK_ACCESS(addr, W, W);
  *reinterpret_cast<typename rs_word<W>::type*>(addr) = v;
}
template <int W>
RS_DEVICE void rs_mv(uint64_t dst, uint64_t src) {
  rs_st<W>(dst, rs_ld<W>(src));
}

RS_DEVICE uint64_t rs_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
RS_DEVICE uint64_t rs_ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The widest word W in {1, 2, 4, 8, 16} such that dst and src are congruent modulo W and W divides
// `pitch` (pass 0 when rows do not matter): then dst + k and src + k are W-aligned for the same k,
// on every row.
RS_DEVICE uint32_t rs_common_align(uint64_t dst, uint64_t src, uint64_t pitch) {
  uint64_t x = (dst ^ src) | pitch | 16u;
  return (uint32_t)(x & (~x + 1));  // lowest set bit
}

// Bytes to peel before dst reaches W alignment (at most n).
template <int W>
RS_DEVICE uint64_t rs_head(uint64_t dst, uint64_t n) {
  return rs_min_u64(n, (uint64_t)((W - (uint32_t)(dst & (W - 1))) & (W - 1)));
}

// ------------------------------------------------------------------------------------------------
// Copy patterns (each one is race-free for the overlaps it is documented for; no barriers)
// ------------------------------------------------------------------------------------------------

// Cooperative copy of n bytes by `nlanes` threads (this one is `lane`): head bytes up to W alignment
// of dst, then W-byte words (four loads in flight per thread before the four stores), then tail
// bytes. Source and destination must be disjoint unless nlanes == 1 and src >= dst (see rs_move).
template <int W>
RS_DEVICE void rs_span_par_w(uint64_t dst, uint64_t src, uint64_t n, uint32_t lane, uint32_t nlanes) {
  const uint64_t head = rs_head<W>(dst, n);
  for (uint64_t i = lane; i < head; i += nlanes) rs_mv<1>(dst + i, src + i);
  const uint64_t d = dst + head, s = src + head;
  const uint64_t nvec = (n - head) / W;
  const uint64_t step = (uint64_t)nlanes * 4u;
  uint64_t v = lane;
  for (; v + 3u * nlanes < nvec; v += step) {
    typename rs_word<W>::type w0 = rs_ld<W>(s + (v)*W);
    typename rs_word<W>::type w1 = rs_ld<W>(s + (v + nlanes) * W);
    typename rs_word<W>::type w2 = rs_ld<W>(s + (v + 2u * nlanes) * W);
    typename rs_word<W>::type w3 = rs_ld<W>(s + (v + 3u * nlanes) * W);
    rs_st<W>(d + (v)*W, w0);
    rs_st<W>(d + (v + nlanes) * W, w1);
    rs_st<W>(d + (v + 2u * nlanes) * W, w2);
    rs_st<W>(d + (v + 3u * nlanes) * W, w3);
  }
  for (; v < nvec; v += nlanes) rs_mv<W>(d + v * W, s + v * W);
  for (uint64_t i = head + nvec * W + lane; i < n; i += nlanes) rs_mv<1>(dst + i, src + i);
}

// Backward copy of n bytes by ONE thread, for src < dst with any overlap (a right shift): words of
// the common alignment W, walking down. The store of word k (after its load) overlaps only source
// bytes above it, which were read already (src and dst are congruent mod W, so a nonzero distance is
// >= W and words never straddle). The planner only emits left shifts (src > dst); this direction
// exists so that rs_move is a true memmove.
template <int W>
RS_DEVICE void rs_move_down_w(uint64_t dst, uint64_t src, uint64_t n) {
  const uint64_t head = rs_head<W>(dst, n);
  const uint64_t body_end = head + (n - head) / W * W;
  for (uint64_t i = n; i > body_end; --i) rs_mv<1>(dst + i - 1, src + i - 1);
  for (uint64_t i = body_end; i > head; i -= W) rs_mv<W>(dst + i - W, src + i - W);
  for (uint64_t i = head; i > 0; --i) rs_mv<1>(dst + i - 1, src + i - 1);
}

// Copy n bytes from src to dst with `nlanes` threads (this one is `lane`).
//  * nlanes > 1: source and destination must be DISJOINT (rs_span_par_w).
//  * nlanes == 1: a memmove, safe for any overlap. For src >= dst it is rs_span_par_w with one lane,
//    which walks ascending: the source byte a store overwrites sits src - dst bytes below the
//    destination byte, i.e. earlier in the walk or in the same group of four words (whose loads are
//    issued before its stores), so it has been read already. For src < dst it walks down
//    (rs_move_down_w).
RS_DEVICE void rs_move(uint64_t dst, uint64_t src, uint64_t n, uint32_t lane, uint32_t nlanes) {
  const uint32_t w = rs_common_align(dst, src, 0);
  if (nlanes == 1 && src < dst) {
    switch (w) {
      case 16: rs_move_down_w<16>(dst, src, n); break;
      case 8: rs_move_down_w<8>(dst, src, n); break;
      case 4: rs_move_down_w<4>(dst, src, n); break;
      case 2: rs_move_down_w<2>(dst, src, n); break;
      default: rs_move_down_w<1>(dst, src, n); break;
    }
    return;
  }
  switch (w) {
    case 16: rs_span_par_w<16>(dst, src, n, lane, nlanes); break;
    case 8: rs_span_par_w<8>(dst, src, n, lane, nlanes); break;
    case 4: rs_span_par_w<4>(dst, src, n, lane, nlanes); break;
    case 2: rs_span_par_w<2>(dst, src, n, lane, nlanes); break;
    default: rs_span_par_w<1>(dst, src, n, lane, nlanes); break;
  }
}

// Advance the (row, column) of a flat unit index by q rows and d columns (d < upr): the unit index
// moved by q*upr + d, without a division.
RS_DEVICE void rs_flat_step(uint64_t& r, uint64_t& c, uint64_t q, uint64_t d, uint64_t upr) {
  c += d;
  r += q;
  if (c >= upr) {
    c -= upr;
    ++r;
  }
}

// Rows [r_begin, r_end) of a 2-D copy whose source and destination are DISJOINT: row r copies n
// bytes from src + r*pitch to dst + r*pitch. The bytes of all those rows are cut in W-byte units (W
// the widest word dividing dst, src, pitch and n, so every unit is W-aligned on both sides) and the
// units form one flat index space spread over the threads: consecutive threads touch consecutive
// words of a row, then of the next row. Short rows (a bf16 conv window of a few columns in the DS
// layout) are then read and written in nearly contiguous warps instead of one thread per row
// striding by the pitch. Four loads are in flight per thread before the four stores.
template <int W>
RS_DEVICE void rs_rows_flat_w(uint64_t dst, uint64_t src, uint64_t n, uint64_t pitch, uint64_t r_begin,
                              uint64_t r_end, uint32_t tid, uint32_t nthreads) {
  const uint64_t upr = n / W;  // units per row (W divides n)
  if (upr == 0 || r_end <= r_begin) return;
  const uint64_t units = (r_end - r_begin) * upr;
  const uint64_t d0 = dst + r_begin * pitch, s0 = src + r_begin * pitch;
  // Thread tid walks units tid, tid + nthreads, ...: its (row, column) advances by (q, d) per step,
  // so the loop divides nothing (a 64-bit division per unit would cost more than the copy).
  const uint64_t q = nthreads / upr, d = nthreads % upr;
  uint64_t r = tid / upr, c = tid % upr;
  uint64_t u = tid;
  for (; u + 3u * nthreads < units; u += (uint64_t)nthreads * 4u) {
    uint64_t o[4];
    typename rs_word<W>::type w[4];
    for (int k = 0; k < 4; ++k) {
      o[k] = r * pitch + c * W;
      w[k] = rs_ld<W>(s0 + o[k]);
      rs_flat_step(r, c, q, d, upr);
    }
    for (int k = 0; k < 4; ++k) rs_st<W>(d0 + o[k], w[k]);
  }
  for (; u < units; u += nthreads) {
    const uint64_t o = r * pitch + c * W;
    rs_mv<W>(d0 + o, s0 + o);
    rs_flat_step(r, c, q, d, upr);
  }
}

RS_DEVICE void rs_rows_flat(uint64_t dst, uint64_t src, uint64_t n, uint64_t pitch, uint64_t r_begin,
                            uint64_t r_end, uint32_t tid, uint32_t nthreads) {
  const uint64_t x = dst | src | pitch | n | 16u;
  switch ((uint32_t)(x & (~x + 1))) {  // lowest set bit
    case 16: rs_rows_flat_w<16>(dst, src, n, pitch, r_begin, r_end, tid, nthreads); break;
    case 8: rs_rows_flat_w<8>(dst, src, n, pitch, r_begin, r_end, tid, nthreads); break;
    case 4: rs_rows_flat_w<4>(dst, src, n, pitch, r_begin, r_end, tid, nthreads); break;
    case 2: rs_rows_flat_w<2>(dst, src, n, pitch, r_begin, r_end, tid, nthreads); break;
    default: rs_rows_flat_w<1>(dst, src, n, pitch, r_begin, r_end, tid, nthreads); break;
  }
}

// Lane walk for rows that overlap each other (ROWS_ASCENDING, and the in-place SD conv shift): copy
// bytes [lane_begin, lane_begin + lane_count) of every row, row r from src + r*pitch to dst + r*pitch.
// The lanes must lie within one pitch (lane_begin + lane_count <= pitch), so that a byte address
// determines its (row, lane): rows overlap each other, lanes do not.
// A lane unit is a W-byte word (W divides pitch, so a unit covers the same lanes on every row) or a
// head / tail byte; each unit is owned by exactly one thread, which walks the rows ascending when
// src > dst (row r's source is row r+shift of the destination: read before it is overwritten) and
// descending when src < dst. Different units touch disjoint bytes, so threads and CTAs need no order.
template <int W>
RS_DEVICE void rs_lanes_rows_w(uint64_t dst, uint64_t src, uint64_t lane_begin, uint64_t lane_count,
                               uint64_t rows, uint64_t pitch, uint32_t tid, uint32_t nthreads) {
  const uint64_t d0 = dst + lane_begin, s0 = src + lane_begin;
  const uint64_t head = rs_head<W>(d0, lane_count);
  const uint64_t nvec = (lane_count - head) / W;
  const uint64_t tail = lane_count - head - nvec * W;
  const uint64_t units = head + nvec + tail;
  const bool ascending = src >= dst;
  for (uint64_t u = tid; u < units; u += nthreads) {
    const bool word = u >= head && u < head + nvec;
    const uint64_t off = u < head ? u : (word ? head + (u - head) * W : u - nvec + nvec * W);
    for (uint64_t k = 0; k < rows; ++k) {
      const uint64_t r = ascending ? k : rows - 1 - k;
      const uint64_t o = off + r * pitch;
      if (word) {
        rs_mv<W>(d0 + o, s0 + o);
      } else {
        rs_mv<1>(d0 + o, s0 + o);
      }
    }
  }
}

RS_DEVICE void rs_lanes_rows(uint64_t dst, uint64_t src, uint64_t lane_begin, uint64_t lane_count,
                             uint64_t rows, uint64_t pitch, uint32_t tid, uint32_t nthreads) {
  switch (rs_common_align(dst, src, rows > 1 ? pitch : 0)) {
    case 16: rs_lanes_rows_w<16>(dst, src, lane_begin, lane_count, rows, pitch, tid, nthreads); break;
    case 8: rs_lanes_rows_w<8>(dst, src, lane_begin, lane_count, rows, pitch, tid, nthreads); break;
    case 4: rs_lanes_rows_w<4>(dst, src, lane_begin, lane_count, rows, pitch, tid, nthreads); break;
    case 2: rs_lanes_rows_w<2>(dst, src, lane_begin, lane_count, rows, pitch, tid, nthreads); break;
    default: rs_lanes_rows_w<1>(dst, src, lane_begin, lane_count, rows, pitch, tid, nthreads); break;
  }
}
