// recoverssm_rs: RecoverSSM commit (GDN / KDA) of every layer and every request in ONE launch.
//
// After sampling, each request folds its first `count` verified records (u_t, k_t, gate_t) into its
// persistent recurrent state, in place, and the block's conv window becomes the verified window
// compacted by `count`; in align mode the state / window after `boundary_len` tokens also go to the
// prefix-cache block crossed inside the window (docs/design.md section 5; the torch reference is
// recoverssm_rs.recurrence.commit + compact_conv_window, driven as StateCache.commit drives them).
#include "common.cuh"

#if defined(RS_HOST_EMULATION)
#define RS_RC_UNROLL
#else
#define RS_RC_UNROLL _Pragma("unroll")
#endif

// Element types of CommitMeta.state_dtype / kg_dtype.
#define RS_DT_F32 0u
#define RS_DT_BF16 1u
#define RS_DT_F16 2u
// CommitMeta.kind.
#define RS_RC_GDN 0u  // scalar gate per (head, token): key+gate record [K + 1], gate at [K]
#define RS_RC_KDA 1u  // gate per key channel: record [2K], gate in [K, 2K)
// Value rows of the recurrent state each thread keeps in registers (x 4 key channels).
#define RS_RC_ROWS 8
// CommitMeta.conv_layout: 0 = no conv state, else RS_KIND_CONV_SD / RS_KIND_CONV_DS (common.cuh).
#define RS_RC_NO_CONV 0u

// One request's commit, shared by every layer (rust/commit.rs CommitRow, plan_format.COMMIT_ROW_DTYPE).
struct CommitRow {
  uint32_t request;        // workspace row of the request
  uint32_t count;          // tokens to fold in (with a num_accepted vector: the cap, see below)
  int64_t state_block;     // running-state block (read and written in place); <= 0: padding row
  int64_t boundary_block;  // prefix-cache block of the crossed boundary, or -1
  uint32_t boundary_len;   // tokens up to the boundary (1 ..= count)
  uint32_t reserved;
};

// One layer of the commit kernel (gpu.COMMIT_META_DTYPE), built once per StateCache. Byte
// addresses and byte strides; inside a block / workspace row every tensor is dense (C order).
struct CommitMeta {
  uint64_t rec_base;           // recurrent pool, block 0: [num_blocks, H, V, K]
  uint64_t rec_block_stride;   // bytes between blocks
  uint64_t corr_base;          // corrections, row 0: [max_requests, H, Q, V] float32
  uint64_t corr_row_stride;
  uint64_t kg_base;            // key+gate records, row 0: [max_requests, H, Q, kg_width]
  uint64_t kg_row_stride;
  uint64_t conv_base;          // conv pool, block 0: [num_blocks, W, D] (SD) or [num_blocks, D, W] (DS)
  uint64_t conv_block_stride;
  uint64_t win_base;           // verified conv windows, row 0: [max_requests, same as a block]
  uint64_t win_row_stride;
  uint32_t heads;              // H
  uint32_t head_v;             // V
  uint32_t head_k;             // K
  uint32_t window;             // Q (tokens per verified window)
  uint32_t kg_width;           // K + 1 (GDN) or 2K (KDA)
  uint32_t kind;               // RS_RC_GDN / RS_RC_KDA
  uint32_t state_dtype;        // RS_DT_*
  uint32_t kg_dtype;           // RS_DT_*
  uint32_t conv_layout;        // RS_RC_NO_CONV, RS_KIND_CONV_SD, RS_KIND_CONV_DS
  uint32_t conv_width;         // W = conv_kernel_size - 1 + Q - 1
  uint32_t conv_dim;           // D
  uint16_t conv_hist;          // conv_kernel_size - 1
  uint16_t conv_elem;          // bytes per conv element (1, 2, 4 or 8)
};

static_assert(sizeof(CommitRow) == 32, "CommitRow must be 32 bytes");
static_assert(sizeof(CommitMeta) == 128, "CommitMeta must be 128 bytes");
#if defined(RS_HOST_EMULATION)
static_assert(__builtin_offsetof(CommitRow, count) == 4 && __builtin_offsetof(CommitRow, state_block) == 8 &&
                  __builtin_offsetof(CommitRow, boundary_block) == 16 &&
                  __builtin_offsetof(CommitRow, boundary_len) == 24,
              "CommitRow layout");
static_assert(__builtin_offsetof(CommitMeta, heads) == 80 && __builtin_offsetof(CommitMeta, kg_width) == 96 &&
                  __builtin_offsetof(CommitMeta, conv_layout) == 112 &&
                  __builtin_offsetof(CommitMeta, conv_hist) == 124 && __builtin_offsetof(CommitMeta, conv_elem) == 126,
              "CommitMeta layout");
#endif

// ------------------------------------------------------------------------------------------------
// Scalars: bit casts, exp / fma, 16-bit float conversions (bit exact, identical on host and device)
// ------------------------------------------------------------------------------------------------

RS_DEVICE float rs_rc_u2f(uint32_t u) {
#if defined(RS_HOST_EMULATION)
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#else
  return __uint_as_float(u);
#endif
}

RS_DEVICE uint32_t rs_rc_f2u(float f) {
#if defined(RS_HOST_EMULATION)
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#else
  return __float_as_uint(f);
#endif
}

RS_DEVICE float rs_rc_exp(float x) {
#if defined(RS_HOST_EMULATION)
  return __builtin_expf(x);  // libm expf (correctly rounded in glibc for float)
#else
  return expf(x);  // the accurate one (not __expf): the commit must match torch.exp to ~1 ulp
#endif
}

RS_DEVICE float rs_rc_fma(float a, float b, float c) {
#if defined(RS_HOST_EMULATION)
  return __builtin_fmaf(a, b, c);
#else
  return fmaf(a, b, c);
#endif
}

// 16-bit pattern -> float (bf16: the high half of a float; f16: IEEE binary16). On the device the
// f16 conversions are the hardware's (cvt: exact / round-to-nearest-even, IEEE-defined results); the
// host emulation uses the bit-exact software versions below, which the tests check against torch.
RS_DEVICE float rs_rc_h2f(uint32_t h, uint32_t dt) {
  if (dt == RS_DT_BF16) return rs_rc_u2f(h << 16);
#if defined(RS_HOST_EMULATION)
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact (a normal float)
    return sign ? -v : v;
  }
  if (e == 31) return rs_rc_u2f(sign | 0x7f800000u | (m << 13));
  return rs_rc_u2f(sign | ((e + 112u) << 23) | (m << 13));
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
#endif
}

// float -> 16-bit pattern, round to nearest even (torch's c10::BFloat16 / c10::Half conversions).
// bf16 is integer arithmetic on every target (the emulation runs the device's code; no sm_80-only
// cvt.bf16, so the module still builds for older GPUs).
RS_DEVICE uint32_t rs_rc_f2h(float f, uint32_t dt) {
  const uint32_t x = rs_rc_f2u(f);
  if (dt == RS_DT_BF16) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  }
#if defined(RS_HOST_EMULATION)
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (ax >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16 (and inf): inf
  if (ax < 0x38800000u) {                        // below 2^-14: a subnormal half (or zero)
    if (ax < 0x33000000u) return sign;           // below 2^-25 (2^-25 itself is a tie -> 0)
    const uint32_t e = ax >> 23;                 // 102 .. 112
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // |f| / 2^-24 = m / 2^shift, shift in 14 .. 24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | q;
  }
  uint32_t h = (ax - 0x38000000u) >> 13;  // rebias 127 -> 15, 10 mantissa bits
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
  return sign | h;
#else
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#endif
}

RS_DEVICE uint32_t rs_rc_esize(uint32_t dt) { return dt == RS_DT_F32 ? 4u : 2u; }

// One element of type dt at an element-aligned address, as float.
RS_DEVICE float rs_rc_ld1(uint64_t addr, uint32_t dt) {
  if (dt == RS_DT_F32) return rs_rc_u2f(rs_ld<4>(addr));
  return rs_rc_h2f(rs_ld<2>(addr), dt);
}

RS_DEVICE void rs_rc_st1(uint64_t addr, uint32_t dt, float v) {
  if (dt == RS_DT_F32) {
    rs_st<4>(addr, rs_rc_f2u(v));
  } else {
    rs_st<2>(addr, (unsigned short)rs_rc_f2h(v, dt));
  }
}

// Load n (1..4) consecutive elements of type dt starting at the element-aligned address addr into
// out[0..n) (the rest is 0): one 16-byte (f32) / 8-byte (16-bit) word when n == 4 and the address
// is aligned to it, else element by element. Never a misaligned access.
RS_DEVICE void rs_rc_ld4(uint64_t addr, uint32_t n, uint32_t dt, float (&out)[4]) {
  const uint32_t es = rs_rc_esize(dt);
  if (n == 4 && (addr & (4u * es - 1u)) == 0) {
    if (es == 4) {
      const uint4 w = rs_ld<16>(addr);
      out[0] = rs_rc_u2f(w.x);
      out[1] = rs_rc_u2f(w.y);
      out[2] = rs_rc_u2f(w.z);
      out[3] = rs_rc_u2f(w.w);
    } else {
      const unsigned long long w = rs_ld<8>(addr);
      RS_RC_UNROLL
      for (int i = 0; i < 4; ++i) out[i] = rs_rc_h2f((uint32_t)(w >> (16 * i)) & 0xffffu, dt);
    }
    return;
  }
  RS_RC_UNROLL
  for (uint32_t i = 0; i < 4; ++i) out[i] = i < n ? rs_rc_ld1(addr + i * es, dt) : 0.0f;
}

// Store v[0..n) (n in 1..4) at addr, the mirror of rs_rc_ld4.
RS_DEVICE void rs_rc_st4(uint64_t addr, uint32_t n, uint32_t dt, const float (&v)[4]) {
  const uint32_t es = rs_rc_esize(dt);
  if (n == 4 && (addr & (4u * es - 1u)) == 0) {
    if (es == 4) {
      rs_st<16>(addr, make_uint4(rs_rc_f2u(v[0]), rs_rc_f2u(v[1]), rs_rc_f2u(v[2]), rs_rc_f2u(v[3])));
    } else {
      unsigned long long w = 0;
      RS_RC_UNROLL
      for (int i = 0; i < 4; ++i) w |= (unsigned long long)rs_rc_f2h(v[i], dt) << (16 * i);
      rs_st<8>(addr, w);
    }
    return;
  }
  RS_RC_UNROLL
  for (uint32_t i = 0; i < 4; ++i) {
    if (i < n) rs_rc_st1(addr + i * es, dt, v[i]);
  }
}

// ------------------------------------------------------------------------------------------------
// Metadata
// ------------------------------------------------------------------------------------------------

RS_DEVICE CommitMeta rs_rc_load_meta(uint64_t a) {
  CommitMeta m;
  m.rec_base = rs_ld<8>(a + 0);
  m.rec_block_stride = rs_ld<8>(a + 8);
  m.corr_base = rs_ld<8>(a + 16);
  m.corr_row_stride = rs_ld<8>(a + 24);
  m.kg_base = rs_ld<8>(a + 32);
  m.kg_row_stride = rs_ld<8>(a + 40);
  m.conv_base = rs_ld<8>(a + 48);
  m.conv_block_stride = rs_ld<8>(a + 56);
  m.win_base = rs_ld<8>(a + 64);
  m.win_row_stride = rs_ld<8>(a + 72);
  m.heads = rs_ld<4>(a + 80);
  m.head_v = rs_ld<4>(a + 84);
  m.head_k = rs_ld<4>(a + 88);
  m.window = rs_ld<4>(a + 92);
  m.kg_width = rs_ld<4>(a + 96);
  m.kind = rs_ld<4>(a + 100);
  m.state_dtype = rs_ld<4>(a + 104);
  m.kg_dtype = rs_ld<4>(a + 108);
  m.conv_layout = rs_ld<4>(a + 112);
  m.conv_width = rs_ld<4>(a + 116);
  m.conv_dim = rs_ld<4>(a + 120);
  const uint32_t hist_elem = rs_ld<4>(a + 124);
  m.conv_hist = (uint16_t)(hist_elem & 0xffffu);
  m.conv_elem = (uint16_t)(hist_elem >> 16);
  return m;
}

// Value tiles of one head: the recurrent part of a (layer, request) needs heads x vtiles CTAs.
RS_DEVICE uint32_t rs_rc_vtiles(const CommitMeta& m, uint32_t nthreads) {
  const uint32_t groups = (m.head_k + 3u) / 4u;
  const uint32_t per_cta = groups <= nthreads ? (nthreads / groups) * RS_RC_ROWS : 1u;
  return (m.head_v + per_cta - 1u) / per_cta;
}

// RS_ERR_META when this launch cannot run layer m (a host/bind-time inconsistency), else 0.
RS_DEVICE uint32_t rs_rc_check_meta(const CommitMeta& m, uint32_t nthreads, uint32_t rec_ctas, uint32_t conv_ctas) {
  // Element types: a float32 state with float32 / bfloat16 / float16 records, or a bfloat16 (float16)
  // state with bfloat16 (float16) records -- the instantiations of rs_rc_state_tile.
  const bool types = m.state_dtype == RS_DT_F32 ? m.kg_dtype <= RS_DT_F16
                                                 : (m.state_dtype <= RS_DT_F16 && m.kg_dtype == m.state_dtype);
  bool ok = types && m.heads >= 1 && m.head_v >= 1 &&
            m.head_k >= 1 && m.window >= 1 && (m.head_k + 3u) / 4u <= nthreads &&
            (uint64_t)m.head_k * 4u < (1ull << 32) && (uint64_t)m.head_v * 4u < (1ull << 32) &&
            (uint64_t)m.kg_width * 4u < (1ull << 32);
  ok = ok && (m.kind == RS_RC_KDA ? m.kg_width == 2u * m.head_k : (m.kind == RS_RC_GDN && m.kg_width == m.head_k + 1u));
  ok = ok && (uint64_t)m.heads * rs_rc_vtiles(m, nthreads) <= rec_ctas;
  if (m.conv_layout != RS_RC_NO_CONV) {
    const uint32_t e = m.conv_elem;
    ok = ok && conv_ctas >= 1 && (m.conv_layout == RS_KIND_CONV_SD || m.conv_layout == RS_KIND_CONV_DS) &&
         (e == 1 || e == 2 || e == 4 || e == 8) && m.conv_dim >= 1 &&
         m.conv_width >= (uint32_t)m.conv_hist + m.window - 1u;
  }
  return ok ? 0u : (uint32_t)RS_ERR_META;
}

// ------------------------------------------------------------------------------------------------
// Recurrent state: one (head, value tile) of one request
// ------------------------------------------------------------------------------------------------
// Thread layout: the K key channels of a row are cut in G = ceil(K/4) groups of 4; thread tid owns
// group g = tid % G of the RS_RC_ROWS consecutive rows v0 .. v0 + ROWS - 1, v0 = (tile*P + tid/G) *
// ROWS with P = nthreads / G, i.e. ROWS x 4 state elements, held in registers across the tokens. A
// warp covers whole rows (G >= 32 for K >= 128, two rows for K = 64, ...), so every state access of a
// warp is a contiguous run of K elements per row. Per token a thread loads the record's 4 keys (and 4
// gates for KDA, one for GDN: exp() once per thread and token, shared by its rows), coalesced across
// the lanes of a row, and u_t[v0 .. v0 + ROWS) as two 16-byte words that every lane of the row reads
// at the same address (a broadcast). The records of a (request, head) are a few KiB, re-read by the
// CTA's warps from L1; the state is read once and written once (plus the boundary state).
// Threads with tid >= P*G, or whose rows start at or beyond V, idle.

#if defined(RS_HOST_EMULATION)
#define RS_RC_OPAQUE(x) ((void)0)
#else
// Hides a value's provenance from the compiler: the address chains of the final stores are then
// recomputed after the token loop instead of being kept live across it (register pressure).
#define RS_RC_OPAQUE(x) asm volatile("" : "+l"(x))
#endif

// Fold one token's record into s: S <- S * exp(gate_t) + u_t k_t^T (recurrence.commit's
// S.mul_(decay); S.addcmul_(u, k)). rec: the record's key channel k0; gate: its gate (KDA: gate
// channel k0; GDN: the scalar gate); ur: u_t[v0].
template <uint32_t KDT>
RS_DEVICE void rs_rc_token(float (&s)[RS_RC_ROWS][4], uint64_t rec, uint64_t gate, uint64_t ur, uint32_t nk,
                           uint32_t nv, bool kda) {
  float kk[4], dd[4];
  rs_rc_ld4(rec, nk, KDT, kk);
  if (kda) {
    rs_rc_ld4(gate, nk, KDT, dd);
    RS_RC_UNROLL
    for (int i = 0; i < 4; ++i) dd[i] = rs_rc_exp(dd[i]);
  } else {
    const float d = rs_rc_exp(rs_rc_ld1(gate, KDT));
    RS_RC_UNROLL
    for (int i = 0; i < 4; ++i) dd[i] = d;
  }
  RS_RC_UNROLL
  for (int q = 0; q < RS_RC_ROWS / 4; ++q) {
    float u[4];
    const uint32_t left = nv > 4u * q ? nv - 4u * q : 0u;
    if (left != 0) {
      rs_rc_ld4(ur + 16u * q, left < 4u ? left : 4u, RS_DT_F32, u);
    } else {
      RS_RC_UNROLL
      for (int i = 0; i < 4; ++i) u[i] = 0.0f;
    }
    RS_RC_UNROLL
    for (int j = 0; j < 4; ++j) {
      RS_RC_UNROLL
      for (int i = 0; i < 4; ++i) s[4 * q + j][i] = rs_rc_fma(u[j], kk[i], s[4 * q + j][i] * dd[i]);
    }
  }
}

template <uint32_t SDT>
RS_DEVICE void rs_rc_store_rows(const float (&s)[RS_RC_ROWS][4], uint64_t addr, uint32_t row_bytes, uint32_t nk,
                                uint32_t nv) {
  RS_RC_OPAQUE(addr);
  RS_RC_UNROLL
  for (int j = 0; j < RS_RC_ROWS; ++j) {
    if ((uint32_t)j < nv) rs_rc_st4(addr, nk, SDT, s[j]);
    addr += row_bytes;
  }
}

// One (head h, value tile) of one request of the layer whose CommitMeta is at ma. SDT / KDT: the
// state's and the records' element types (compile-time: each combination is straight-line code).
// The tile loads the layer's fields itself, so nothing of the metadata stays live around it.
template <uint32_t SDT, uint32_t KDT>
RS_DEVICE void rs_rc_state_tile(uint64_t ma, uint64_t req, int64_t sb, int64_t bb, uint32_t blen, uint32_t cnt,
                                uint32_t h, uint32_t tile, uint32_t tid, uint32_t nthreads) {
  const CommitMeta m = rs_rc_load_meta(ma);
  const uint32_t K = m.head_k, V = m.head_v, Q = m.window;
  if (h >= m.heads) return;
  const uint32_t G = (K + 3u) / 4u;
  const uint32_t P = nthreads / G;
  if (tid >= P * G) return;
  const uint32_t v0 = (tile * P + tid / G) * RS_RC_ROWS;
  if (v0 >= V) return;
  const uint32_t nv = V - v0 < (uint32_t)RS_RC_ROWS ? V - v0 : (uint32_t)RS_RC_ROWS;
  const uint32_t k0 = 4u * (tid % G);
  const uint32_t nk = K - k0 < 4u ? K - k0 : 4u;
  const uint32_t ses = rs_rc_esize(SDT), kes = rs_rc_esize(KDT);
  const uint32_t row_bytes = K * ses;         // < 2^32: checked at bind time
  const uint32_t rec_bytes = m.kg_width * kes;
  const uint32_t u_bytes = V * 4u;
  const bool kda = m.kind == RS_RC_KDA;
  const uint64_t off = (((uint64_t)h * V + v0) * K + k0) * ses;
  // Record t of (req, h): key channel k0 at rec + t*rec_bytes, gate at + gate_off; u_t[v0] at ur.
  uint64_t rec = m.kg_base + req * m.kg_row_stride + (uint64_t)h * Q * rec_bytes + (uint64_t)k0 * kes;
  const uint32_t gate_off = kda ? K * kes : (K - k0) * kes;
  uint64_t ur = m.corr_base + req * m.corr_row_stride + ((uint64_t)h * Q * V + v0) * 4u;
  const uint64_t st = m.rec_base + (uint64_t)sb * m.rec_block_stride + off;
  const uint64_t bst = m.rec_base + (uint64_t)(blen != 0 ? bb : sb) * m.rec_block_stride + off;

  float s[RS_RC_ROWS][4];
  {
    uint64_t addr = st;
    RS_RC_UNROLL
    for (int j = 0; j < RS_RC_ROWS; ++j) {
      if ((uint32_t)j < nv) {
        rs_rc_ld4(addr, nk, SDT, s[j]);
      } else {
        RS_RC_UNROLL
        for (int i = 0; i < 4; ++i) s[j][i] = 0.0f;
      }
      addr += row_bytes;
    }
  }
  for (uint32_t t = 1; t <= cnt; ++t, rec += rec_bytes, ur += u_bytes) {
    rs_rc_token<KDT>(s, rec, rec + gate_off, ur, nk, nv, kda);
    // The state after boundary_len tokens -> the prefix-cache block.
    if (t == blen) rs_rc_store_rows<SDT>(s, bst, row_bytes, nk, nv);
  }
  rs_rc_store_rows<SDT>(s, st, row_bytes, nk, nv);
}

// ------------------------------------------------------------------------------------------------
// Conv window: chunk `chunk` of `nchunks` of one destination window
// ------------------------------------------------------------------------------------------------
// dst = the verified window src with its first hist columns replaced by columns shift .. shift+hist-1
// (recurrence.compact_conv_window with shift = n - 1). src (workspace) and dst (pool) never overlap.
// The window's bytes are cut in nchunks 16-byte-aligned ranges, one per conv CTA.
//  * SD [W, D]: a column is a contiguous row of L = D*elem bytes, so dst is two contiguous spans:
//    bytes [0, hist*L) from src + shift*L, bytes [hist*L, W*L) from the same offsets of src --
//    cooperative copies (rs_move: 16-byte words when src and dst are congruent mod 16, peeled
//    heads / tails otherwise).
//  * DS [D, W]: element e = d*W + c takes element d*W + (c < hist ? c + shift : c); one element per
//    thread and step, consecutive threads on consecutive elements (coalesced stores).
RS_DEVICE void rs_rc_conv(uint64_t ma, uint64_t req, int64_t blk, uint32_t shift, uint32_t chunk, uint32_t nchunks,
                          uint32_t tid, uint32_t nthreads) {
  const CommitMeta m = rs_rc_load_meta(ma);
  const uint64_t dst = m.conv_base + (uint64_t)blk * m.conv_block_stride;
  const uint64_t src = m.win_base + req * m.win_row_stride;
  const uint64_t es = m.conv_elem, W = m.conv_width, D = m.conv_dim, hist = m.conv_hist;
  const uint64_t n = W * D * es;
  const uint64_t cb = (rs_ceil_div(n, nchunks) + 15u) & ~(uint64_t)15u;
  const uint64_t lo = rs_min_u64(n, (uint64_t)chunk * cb), hi = rs_min_u64(n, lo + cb);
  if (hi <= lo) return;
  if (m.conv_layout == RS_KIND_CONV_SD) {
    const uint64_t L = D * es, split = hist * L;
    // One rs_move call site (its word-size switch is large): piece 0 = the head columns, 1 = the rest.
    for (uint32_t piece = 0; piece < 2u; ++piece) {
      const uint64_t a = piece == 0 ? lo : (lo > split ? lo : split);
      const uint64_t b = piece == 0 ? rs_min_u64(hi, split) : hi;
      const uint64_t off = piece == 0 ? shift * L : 0;
      if (b > a) rs_move(dst + a, src + off + a, b - a, tid, nthreads);
    }
    return;
  }
  // DS: lo and hi are multiples of es (16-byte aligned chunk bounds, or the end).
  const uint64_t e_end = hi / es;
  uint64_t e = lo / es + tid;
  if (e >= e_end) return;
  uint64_t d = e / W, c = e % W;
  const uint64_t dstep = nthreads / W, cstep = nthreads % W;
  for (; e < e_end; e += nthreads) {
    const uint64_t se = d * W + (c < hist ? c + shift : c);
    switch (es) {
      case 1: rs_mv<1>(dst + e, src + se); break;
      case 2: rs_mv<2>(dst + e * 2u, src + se * 2u); break;
      case 4: rs_mv<4>(dst + e * 4u, src + se * 4u); break;
      default: rs_mv<8>(dst + e * 8u, src + se * 8u); break;
    }
    c += cstep;
    d += dstep;
    if (c >= W) {
      c -= W;
      ++d;
    }
  }
}

// rs_recover_commit
// -----------------
// Parameters:
//   metas[num_layers]      CommitMeta per layer (device memory; built once per cache).
//   rows[num_rows]         CommitRow records (device memory): the Rust commit plan, copied over.
//   num_accepted           nullable int32 device vector of num_counts entries. When given, the count
//                          of a row is clamp(num_accepted[row.request], 0, row.count): the host
//                          plans with count = query_len (the cap) and never reads num_accepted.
//                          When null, row.count is the count.
//   num_blocks             blocks of the pools (state / boundary blocks must be in [1, num_blocks)).
//   max_requests           workspace rows (row.request must be below it, and below num_counts).
//   rec_ctas               CTAs (blockIdx.x < rec_ctas) of the recurrent part of each (layer, row);
//                          blockIdx.x >= rec_ctas are the gridDim.x - rec_ctas conv CTAs.
//   err                    nullable int32[3] error word (common.cuh), zeroed by the caller.
// Per (layer, row) with count = min(count as above, Q) and state block sb:
//   * sb <= 0: a padding row, skipped silently.
//   * rejected (nothing written, error word): request >= max_requests or >= num_counts
//     (RS_ERR_ARGS); sb >= num_blocks, or a boundary_block >= 0 outside [1, num_blocks) or equal to
//     sb (RS_ERR_BLOCK); a layer this launch cannot run (RS_ERR_META: bad kind / width / dtype,
//     K > 4 * blockDim.x, conv window narrower than hist + Q - 1, no conv CTAs).
//   * count == 0: nothing is written (state and conv window bit-identical).
//   * else the recurrent state of sb becomes S_count = S_0 (.) A_{1..n} + sum_t (u_t k_t^T) (.) A_{t+1..n}
//     (forward pass S <- S * exp(gate_t) + u_t k_t^T in float32, stored in the state's dtype), and
//     sb's conv window the verified window compacted by count.
//   * align mode: when boundary_block >= 0 and 1 <= boundary_len <= count, the state after
//     boundary_len tokens and the window compacted by boundary_len go to boundary_block. (With a
//     num_accepted vector a row planned for the full window says "a boundary boundary_len tokens in":
//     it is crossed only when the device count reaches it -- exactly vLLM's align rule, since a block
//     is at least a window long.) A row with boundary_len == 0 has no boundary.
// Launch shape: grid (rec_ctas + conv_ctas, min(num_rows, 65535), min(num_layers, 65535)), block
// (RS_THREADS = 256; any blockDim.x >= ceil(K / 4) works). Rows (y) and layers (z) are walked
// grid-stride, so any gridDim.y / gridDim.z >= 1 is correct. Along x, CTA bx < rec_ctas is the
// (head bx / vtiles, value tile bx % vtiles) of every (layer, row): rec_ctas must be at least
// heads * vtiles of every layer (vtiles = ceil(V / ((blockDim.x / ceil(K/4)) * RS_RC_ROWS)); surplus
// CTAs idle; fewer is RS_ERR_META), and the conv_ctas >= 1 conv CTAs (0 when no layer has a conv
// state) cut each window into conv_ctas 16-byte-aligned byte ranges. gpu.commit_grid sizes both.
// Every decision reads only the row, num_accepted, the layer's metadata and kernel parameters, so
// all CTAs of a (layer, row) agree. No shared memory, no barriers, no atomics but the error word, no
// host synchronisation, no allocation: CUDA-graph capturable for a fixed number of rows (pad with
// state_block = -1 rows). The host guarantees that no block is written by two rows and that no row
// writes a block another row reads (the Rust commit plan checks it); every CTA then touches bytes no
// other CTA touches. Offsets are 64-bit throughout.
// Element types: float32 states with float32 / bfloat16 / float16 records, bfloat16 states with
// bfloat16 records, float16 states with float16 records (one instantiation of the recurrent path
// each); corrections are float32; conv windows are moved as bytes (1, 2, 4 or 8-byte elements).
// Arithmetic: float32 with fmaf and the accurate expf; the device runs with -ftz=true (CuPy's
// default), so subnormal intermediates flush to zero there (the host emulation keeps them).
extern "C" __global__ void RS_LAUNCH_BOUNDS rs_recover_commit(
    const CommitMeta* __restrict__ metas, uint32_t num_layers, const CommitRow* __restrict__ rows,
    uint32_t num_rows, const int32_t* __restrict__ num_accepted, uint32_t num_counts, int64_t num_blocks,
    uint32_t max_requests, uint32_t rec_ctas, int32_t* err) {
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  const uint32_t bx = blockIdx.x;
  const uint32_t conv_ctas = gridDim.x > rec_ctas ? gridDim.x - rec_ctas : 0u;
  for (uint32_t layer = blockIdx.z; layer < num_layers; layer += gridDim.z) {
    const uint64_t ma = (uint64_t)metas + (uint64_t)layer * sizeof(CommitMeta);
    for (uint32_t r = blockIdx.y; r < num_rows; r += gridDim.y) {
      const uint64_t ra = (uint64_t)rows + (uint64_t)r * sizeof(CommitRow);
      const int64_t sb = (int64_t)rs_ld<8>(ra + 8);
      if (sb <= 0) continue;  // padding
      const uint32_t req = rs_ld<4>(ra);
      uint32_t cnt = rs_ld<4>(ra + 4);
      const int64_t bb = (int64_t)rs_ld<8>(ra + 16);
      const uint32_t blen = rs_ld<4>(ra + 24);
      // The layer's metadata is (re)loaded per row -- broadcast L1 hits -- and each path loads the
      // fields it needs itself, so no metadata stays live in registers across the loops.
      uint32_t code, types, vt, window, conv_layout;
      {
        const CommitMeta m = rs_rc_load_meta(ma);
        code = rs_rc_check_meta(m, nthreads, rec_ctas, conv_ctas);
        types = m.state_dtype * 3u + m.kg_dtype;
        vt = code == 0 ? rs_rc_vtiles(m, nthreads) : 1u;
        window = m.window;
        conv_layout = m.conv_layout;
      }
      if (req >= max_requests || (num_accepted != 0 && req >= num_counts)) code |= RS_ERR_ARGS;
      if (sb >= num_blocks || (bb >= 0 && (bb < 1 || bb >= num_blocks || bb == sb))) code |= RS_ERR_BLOCK;
      if (code != 0) {
        if (bx == 0) rs_report_error(err, code, r, num_rows);
        continue;
      }
      if (num_accepted != 0) {
        const int32_t a = (int32_t)rs_ld<4>((uint64_t)num_accepted + (uint64_t)req * 4u);
        cnt = a <= 0 ? 0u : ((uint32_t)a < cnt ? (uint32_t)a : cnt);
      }
      if (cnt > window) cnt = window;
      if (cnt == 0) continue;
      const uint32_t bl = (bb >= 0 && blen >= 1 && blen <= cnt) ? blen : 0u;
      if (bx < rec_ctas) {
        const uint32_t h = bx / vt, tile = bx % vt;  // bx >= heads * vt: an idle CTA of this layer
        switch (types) {
#define RS_RC_TILE(S, K)                                                     \
  case S * 3u + K:                                                           \
    rs_rc_state_tile<S, K>(ma, req, sb, bb, bl, cnt, h, tile, tid, nthreads); \
    break;
          RS_RC_TILE(RS_DT_F32, RS_DT_F32)
          RS_RC_TILE(RS_DT_F32, RS_DT_BF16)
          RS_RC_TILE(RS_DT_F32, RS_DT_F16)
          RS_RC_TILE(RS_DT_BF16, RS_DT_BF16)
          RS_RC_TILE(RS_DT_F16, RS_DT_F16)
#undef RS_RC_TILE
          default: break;
        }
      } else if (conv_layout != RS_RC_NO_CONV) {
        // Target 0: the state block (compacted by count); 1: the boundary block (by boundary_len).
        for (uint32_t target = 0; target < (bl != 0 ? 2u : 1u); ++target) {
          const int64_t blk = target == 0 ? sb : bb;
          const uint32_t n = target == 0 ? cnt : bl;
          rs_rc_conv(ma, req, blk, n - 1u, bx - rec_ctas, conv_ctas, tid, nthreads);
        }
      }
    }
  }
}

#if defined(RS_HOST_EMULATION)
RS_HOST_ENTRY(rs_recover_commit)
#endif
