// recoverssm_rs: host shim that lets the kernel sources (.cu) compile and run as host C++.
//
// The test tree's emulation (tests/support/emulation.py) compiles every kernel source with
//   g++ -x c++ -std=c++17 -O1 -fno-strict-aliasing -fvisibility=hidden -fno-gnu-unique
//       -include host_shim.h -shared -fPIC
// and calls the RS_HOST_ENTRY wrappers through ctypes on numpy buffers (the kernels work on raw byte
// addresses, so host memory works). A wrapper takes the argument buffer the core builds for the CUDA
// driver (rust/kernels/abi.rs: the bytes of the kernel's parameter record) and unpacks it as the
// kernel's own C++ parameter, the struct of the generated header (its size checked here, its field
// offsets by the header's static_asserts in this build), so every emulated launch also checks the
// core's record against the kernel's declaration. Each wrapper runs the kernel body once per
// (block, thread) of the whole grid, sequentially, in a chosen order (natural, reversed, or a seeded
// shuffle of all threads of the grid). The kernels are written so that every thread's work is
// independent of the others (no __syncthreads, no shared memory), so any order must give the same
// bytes; running the orders and comparing catches cross-thread / cross-CTA races in the copy
// decomposition.
//
// Every data access goes through rs_ld / rs_st (common.cuh), which call RS_CHECK_ACCESS: the shim
// counts accesses whose address is not a multiple of their width (a misaligned vector access faults
// on GPUs) and accesses outside the memory ranges the caller registered. A __syncthreads() call is
// counted too (sequential emulation cannot honour a barrier). The wrapper returns these counters.
#pragma once

#define RS_HOST_EMULATION 1

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

// ---- CUDA keywords -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)

// ---- vector types ----------------------------------------------------------------------------------
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

namespace rs_host {

// Built-in index variables of the thread being emulated (thread_local: ctypes may call from
// several Python threads).
inline thread_local uint3 block_idx{0, 0, 0};
inline thread_local uint3 thread_idx{0, 0, 0};
inline thread_local dim3 block_dim{1, 1, 1};
inline thread_local dim3 grid_dim{1, 1, 1};

// Counters returned by every RS_HOST_ENTRY wrapper (long long[4]).
enum { kMisaligned = 0, kOutOfRange = 1, kBarriers = 2, kAccesses = 3, kNumCounters = 4 };
inline thread_local long long counters[kNumCounters];
inline thread_local const unsigned long long* ranges = nullptr;  // [lo0, hi0, lo1, hi1, ...]
inline thread_local int num_ranges = 0;

inline void check_access(std::uint64_t addr, unsigned bytes, unsigned align) {
  ++counters[kAccesses];
  if (addr % align != 0) ++counters[kMisaligned];
  if (num_ranges > 0) {
    bool inside = false;
    for (int i = 0; i < num_ranges && !inside; ++i) {
      inside = addr >= ranges[2 * i] && addr + bytes <= ranges[2 * i + 1];
    }
    if (!inside) ++counters[kOutOfRange];
  }
}

inline void syncthreads() { ++counters[kBarriers]; }

// Run `body` once per thread of the grid. order 0: natural (CTA by CTA, x fastest, threads in
// order); 1: the exact reverse; other values: a shuffle of all threads of the grid seeded by `order`.
template <class F>
inline int run_grid(const unsigned* grid, const unsigned* block, unsigned long long order,
                    const unsigned long long* mem_ranges, int n_ranges, long long* out, F&& body) {
  for (long long& c : counters) c = 0;
  ranges = mem_ranges;
  num_ranges = n_ranges;
  grid_dim = dim3{grid[0], grid[1], grid[2]};
  block_dim = dim3{block[0], block[1], block[2]};
  const std::uint64_t nthreads = (std::uint64_t)block[0] * block[1] * block[2];
  const std::uint64_t nblocks = (std::uint64_t)grid[0] * grid[1] * grid[2];
  const std::uint64_t total = nthreads * nblocks;
  auto run_one = [&](std::uint64_t i) {
    std::uint64_t t = i % nthreads, b = i / nthreads;
    thread_idx = uint3{(unsigned)(t % block[0]), (unsigned)((t / block[0]) % block[1]),
                       (unsigned)(t / ((std::uint64_t)block[0] * block[1]))};
    block_idx = uint3{(unsigned)(b % grid[0]), (unsigned)((b / grid[0]) % grid[1]),
                      (unsigned)(b / ((std::uint64_t)grid[0] * grid[1]))};
    body();
  };
  if (order == 0) {
    for (std::uint64_t i = 0; i < total; ++i) run_one(i);
  } else if (order == 1) {
    for (std::uint64_t i = total; i > 0; --i) run_one(i - 1);
  } else {
    std::vector<std::uint64_t> perm(total);
    for (std::uint64_t i = 0; i < total; ++i) perm[i] = i;
    std::uint64_t x = order * 0x9E3779B97F4A7C15ull + 1;
    for (std::uint64_t i = total; i > 1; --i) {  // Fisher-Yates with splitmix64
      x += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      std::swap(perm[i - 1], perm[z % i]);
    }
    for (std::uint64_t i = 0; i < total; ++i) run_one(perm[i]);
  }
  for (int i = 0; i < kNumCounters; ++i) out[i] = counters[i];
  ranges = nullptr;
  num_ranges = 0;
  return 0;
}

}  // namespace rs_host

#define blockIdx (rs_host::block_idx)
#define threadIdx (rs_host::thread_idx)
#define blockDim (rs_host::block_dim)
#define gridDim (rs_host::grid_dim)
#define __syncthreads() rs_host::syncthreads()

#define RS_CHECK_ACCESS(addr, bytes, align) rs_host::check_access((std::uint64_t)(addr), (bytes), (align))

// ---- memory fences and atomics (the emulation is single-threaded per grid) ----------------------------
inline void __threadfence() {}

inline int atomicCAS(int* p, int compare, int val) {
  int old = *p;
  if (old == compare) *p = val;
  return old;
}
inline int atomicAdd(int* p, int v) { int old = *p; *p = old + v; return old; }
inline int atomicOr(int* p, int v) { int old = *p; *p = old | v; return old; }
inline int atomicMax(int* p, int v) { int old = *p; *p = old > v ? old : v; return old; }
inline int atomicMin(int* p, int v) { int old = *p; *p = old < v ? old : v; return old; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long old = *p;
  *p = old + v;
  return old;
}

// ---- grid-runner entry points ------------------------------------------------------------------------
// The driver's packed-argument rule (CU_LAUNCH_PARAM_BUFFER_POINTER): each parameter at the next
// offset aligned to its own size.
namespace rs_host {
template <typename... A>
struct packed_args {
  static std::uint64_t size() {
    std::uint64_t off = 0;
    ((off = (off + sizeof(A) - 1) / sizeof(A) * sizeof(A) + sizeof(A)), ...);
    return off;
  }
  template <typename T>
  static T take(const unsigned char* buf, std::uint64_t& off) {
    off = (off + sizeof(T) - 1) / sizeof(T) * sizeof(T);
    T v;
    std::memcpy(&v, buf + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  // A braced list evaluates left to right, so the parameters are read in declaration order.
  struct values {
    std::tuple<A...> t;
  };
  static values unpack(const unsigned char* buf) {
    std::uint64_t off = 0;
    return values{std::tuple<A...>{take<A>(buf, off)...}};
  }
};

template <typename... A>
int call_packed(void (*kernel)(A...), const unsigned char* buf, std::uint64_t size, const unsigned* grid,
                const unsigned* block, unsigned long long order, const unsigned long long* ranges, int num_ranges,
                long long* counters) {
  if (size != packed_args<A...>::size()) return -2;  // the core packed another signature
  auto v = packed_args<A...>::unpack(buf);
  return run_grid(grid, block, order, ranges, num_ranges, counters, [&]() { std::apply(kernel, v.t); });
}
}  // namespace rs_host

// RS_HOST_ENTRY(kernel) defines
//   extern "C" int rs_host_<kernel>(const unsigned grid[3], const unsigned block[3],
//                                   unsigned long long order, const unsigned long long* ranges,
//                                   int num_ranges, long long counters[4],
//                                   const unsigned char* args, unsigned long long args_size)
// which unpacks `args` by the kernel's parameter types and runs the kernel over the whole grid (see
// rs_host::run_grid); it returns -2 when args_size is not the size of the kernel's parameters.
#define RS_HOST_ENTRY(kernel)                                                                        \
  extern "C" __attribute__((visibility("default"))) int rs_host_##kernel(                            \
      const unsigned* rs_grid, const unsigned* rs_block, unsigned long long rs_order,                \
      const unsigned long long* rs_ranges, int rs_num_ranges, long long* rs_counters,                \
      const unsigned char* rs_args, unsigned long long rs_args_size) {                               \
    return rs_host::call_packed(&kernel, rs_args, rs_args_size, rs_grid, rs_block, rs_order, rs_ranges, \
                                rs_num_ranges, rs_counters);                                         \
  }
