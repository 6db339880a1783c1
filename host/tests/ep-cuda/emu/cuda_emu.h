// cuda_emu.h — just enough of CUDA to run device-kernels/src/ep_ll.cu on the host CPU,
// one block at a time, each GPU thread a cooperative fiber (ucontext) on one OS thread
// (force-included by the emulator build in host/tests/ep_cuda_parity.rs). Blocks run
// sequentially, so `__shared__` becomes `static`; a fiber runs until it reaches a barrier
// (__syncthreads, or a warp barrier inside __syncwarp / shuffles / ballots), then yields
// round-robin. Test code only: it checks the kernels' logic (slot assignment, signalling,
// unpacking, reduction), not GPU memory ordering or timing.
#pragma once

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct EmuDim {
  unsigned x, y, z;
};
inline EmuDim threadIdx{0, 0, 0};  // of the running fiber
inline EmuDim blockIdx{0, 0, 0};
inline EmuDim blockDim{0, 1, 1};
inline EmuDim gridDim{0, 1, 1};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
struct int2 {
  int x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
template <class T>
inline T __ldg(const T *p) {
  return *p;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { abort(); }

inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v) {
  unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) {
  unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}

// Fibers of the running block.
struct EmuFiber {
  ucontext_t ctx;
  char *stack;
  bool done;
};
inline EmuFiber *emu_fibers = nullptr;
inline unsigned emu_nfibers = 0;
inline unsigned emu_cur = 0;

// Switches to the next unfinished fiber (round-robin); returns when resumed.
inline void emu_yield() {
  const unsigned from = emu_cur;
  unsigned next = from;
  do {
    next = (next + 1) % emu_nfibers;
  } while (emu_fibers[next].done && next != from);
  if (next == from) return;
  emu_cur = next;
  threadIdx.x = next;
  swapcontext(&emu_fibers[from].ctx, &emu_fibers[next].ctx);
  emu_cur = from;
  threadIdx.x = from;
}

struct EmuBarrier {
  unsigned n, count = 0, gen = 0;
  void wait() {
    const unsigned g = gen;
    if (++count == n) {
      count = 0;
      ++gen;
      return;
    }
    while (gen == g) emu_yield();
  }
};

// One block's barriers (the emulator creates them per block launch).
struct EmuWarp {
  EmuBarrier bar{32};
  uint64_t v[32];
};
struct EmuBlock {
  EmuBarrier bar;
  EmuWarp warps[32];
  explicit EmuBlock(unsigned threads) : bar{threads} {}
};
inline EmuBlock *emu_block = nullptr;

inline void __syncthreads() { emu_block->bar.wait(); }
inline EmuWarp &emu_warp() { return emu_block->warps[threadIdx.x / 32]; }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp().bar.wait(); }

// Every lane publishes `mine`; returns all 32 values (a copy) after the warp barrier.
struct EmuAll {
  uint64_t v[32];
};
inline EmuAll emu_exchange(uint64_t mine) {
  EmuWarp &w = emu_warp();
  w.v[threadIdx.x % 32] = mine;
  w.bar.wait();
  EmuAll a;
  memcpy(a.v, w.v, sizeof a.v);
  w.bar.wait();
  return a;
}
template <class T>
inline uint64_t emu_bits(T v) {
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T emu_from(uint64_t b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  return emu_from<T>(emu_exchange(emu_bits(v)).v[(threadIdx.x % 32) ^ o]);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, int o) {
  const int lane = threadIdx.x % 32;
  return emu_from<T>(emu_exchange(emu_bits(v)).v[lane >= o ? lane - o : lane]);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return emu_from<T>(emu_exchange(emu_bits(v)).v[src]);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  EmuAll a = emu_exchange(pred != 0);
  unsigned m = 0;
  for (int i = 0; i < 32; ++i) m |= (a.v[i] ? 1u : 0u) << i;
  return m;
}
inline unsigned __match_any_sync(unsigned, int value) {
  EmuAll a = emu_exchange(emu_bits(value));
  unsigned m = 0;
  for (int i = 0; i < 32; ++i) m |= (a.v[i] == emu_bits(value) ? 1u : 0u) << i;
  return m;
}
