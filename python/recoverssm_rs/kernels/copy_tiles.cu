// recoverssm_rs: tiled batched copy of a planned wave of segments.
#include "common.cuh"

// rs_copy_tiles(segments, tiles, first_tile, num_tiles)
// ------------------------------------------------------
// Executes tiles[first_tile .. first_tile + num_tiles) of one wave (the planner's
// wave_starts[w] .. wave_starts[w+1]); waves are ordered by launching them one after another on the
// same stream (a launch boundary is the barrier between waves).
//
// Launch shape: 1-D grid, any gridDim.x >= 1 (gridDim.x = num_tiles gives one CTA per tile; a
// smaller grid walks the tiles grid-stride: tile t is run by CTA t % gridDim.x); 1-D CTAs of
// RS_THREADS (256) threads (any blockDim.x <= 256 works; see RS_LAUNCH_BOUNDS). No shared memory, no
// barriers, no atomics, no host synchronisation: the launch is CUDA-graph capturable.
//
// Semantics per tile (segment s = segments[tile.segment]):
//  * byte units (s.rows == 1 || s.mode == ROWS_ASCENDING): copy bytes [begin, begin+count) of every
//    row of s;
//  * row units (otherwise): copy rows [begin, begin+count) of s entirely.
//
// How each case is executed, and why it is memmove-safe:
//  * DISJOINT, rows == 1: the whole CTA copies the byte range (rs_move -> rs_span_par_w: 16-byte
//    words when src and dst are congruent mod 16, else the widest common word; head/tail bytes
//    peeled). Nothing in the wave writes what it reads, so any order is fine.
//  * DISJOINT, rows > 1: rows shorter than 128 bytes are cut in words spread flat over the CTA
//    (rs_rows_flat); longer rows get a CTA per row when the tile has fewer rows than the CTA has
//    warps, else a warp per row.
//  * ROWS_ASCENDING (rows overlap each other: src = dst + shift*pitch): rs_lanes_rows. Each lane
//    unit (a byte, or a W-byte word when src, dst and pitch are congruent mod W) is owned by one
//    thread that walks the rows ascending, reading row r of the source (= row r+shift of the
//    destination) before it writes row r, so every byte is read before it is overwritten. Lanes are
//    independent, so threads and tiles (disjoint byte ranges) need no mutual order. (If a planner
//    ever emits src < dst, the walk runs descending: still memmove-correct.)
//  * WITHIN_ROW, rows > 1 (overlap only inside each row: src = dst + shift*elem_bytes): one thread
//    per row, copying it with rs_move(nlanes = 1), a memmove (ascending for a left shift, in words as
//    wide as the common alignment allows; each word is loaded before it is stored, and a store only
//    overlaps source bytes already read). Rows are disjoint, so rows run in parallel.
//  * rows == 1 with mode != DISJOINT: if source and destination do not overlap (|src - dst| >=
//    row_bytes, e.g. an SD shift by width-1 columns) it is run like DISJOINT. A row that does overlap
//    itself (an in-place DS shift with dim == 1) is memmoved serially by thread 0 of the CTA; such a
//    row must be a single tile (the planner must not cut an overlapping row across tiles: a later
//    tile would overwrite source bytes an earlier tile has not read yet).
// A misaligned vector access is never issued: every word access is at an address that is a
// multiple of its width (checked by the host emulation on every access).
extern "C" __global__ void RS_LAUNCH_BOUNDS rs_copy_tiles(const Segment* __restrict__ segments,
                                                         const Tile* __restrict__ tiles, uint32_t first_tile,
                                                         uint32_t num_tiles) {
  const uint32_t tid = threadIdx.x;
  const uint32_t nthreads = blockDim.x;
  const uint32_t warp = nthreads < 32u ? nthreads : 32u;
  const uint32_t ngroups = nthreads / warp;
  for (uint32_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const Tile tile = tiles[(uint64_t)first_tile + t];
    const Segment seg = segments[tile.segment];
    if (tile.count == 0) continue;
    const uint64_t pitch = seg.pitch;
    if (seg.mode == RS_MODE_ROWS_ASCENDING && seg.rows > 1) {
      // Byte units; rows overlap each other: per-lane row walk.
      rs_lanes_rows(seg.dst, seg.src, tile.begin, tile.count, seg.rows, pitch, tid, nthreads);
      continue;
    }
    // Everything else is "copy n bytes at row offsets r*pitch for r = r0, r0 + rstep, ... < r_end,
    // with `nlanes` threads per row" (rs_move: cooperative when nlanes > 1, a memmove when 1).
    uint64_t dst = seg.dst, src = seg.src, n = seg.row_bytes;
    uint64_t r0, rstep = 1, r_end;
    uint32_t lane = tid, nlanes = nthreads;
    if (seg.rows == 1) {
      // Byte units of a single row.
      dst += tile.begin;
      src += tile.begin;
      n = tile.count;
      r0 = 0;
      r_end = 1;
      const uint64_t dist = seg.src > seg.dst ? seg.src - seg.dst : seg.dst - seg.src;
      if (seg.mode != RS_MODE_DISJOINT && dist < seg.row_bytes) {
        // One row overlapping itself (an in-place DS shift with dim == 1): thread 0 memmoves it.
        lane = 0;
        nlanes = 1;
        if (tid != 0) r0 = r_end;
      }
    } else {
      // Row units.
      r_end = (uint64_t)tile.begin + tile.count;
      if (seg.mode == RS_MODE_DISJOINT && n < 128u) {
        // Short disjoint rows: their words spread flat over the CTA (coalesced across rows).
        rs_rows_flat(dst, src, n, pitch, tile.begin, r_end, tid, nthreads);
        continue;
      }
      if (seg.mode == RS_MODE_WITHIN_ROW || (tile.count >= ngroups && n < 128u)) {
        r0 = (uint64_t)tile.begin + tid;  // a thread per row (memmove for WITHIN_ROW)
        rstep = nthreads;
        lane = 0;
        nlanes = 1;
      } else if (tile.count < ngroups) {
        r0 = tile.begin;  // few rows: the whole CTA on each row
      } else {
        const uint32_t group = tid / warp;  // a warp per row
        r0 = group < ngroups ? (uint64_t)tile.begin + group : r_end;
        rstep = ngroups;
        lane = tid % warp;
        nlanes = warp;
      }
    }
    for (uint64_t r = r0; r < r_end; r += rstep) rs_move(dst + r * pitch, src + r * pitch, n, lane, nlanes);
  }
}

#if defined(RS_HOST_EMULATION)
RS_HOST_ENTRY(rs_copy_tiles)
#endif
