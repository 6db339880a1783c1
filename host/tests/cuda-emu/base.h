// cuda-emu/base.h — the generic part of the CPU emulation of CUDA
// (host/tests/device-emu/emu/cuda_emu.h builds the block model on it; the EP kernels'
// emulator host/tests/ep-cuda/ll_emulator.cpp uses the same): the CUDA
// keywords, the built-in index variables, vector types, the plain intrinsics and atomics,
// and the fiber scheduler (each GPU thread a ucontext fiber on one OS thread, switched
// round-robin at the emulation's yield points) with its reusable barrier. Each emulation
// adds its own block model and warp primitives on top. Test code only.
#pragma once

#include <sched.h>
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
inline EmuDim blockDim{1, 1, 1};
inline EmuDim gridDim{1, 1, 1};

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
[[noreturn]] inline void __trap() {
  // A trap ends the launch: the emulation's driver sees the process die by SIGABRT.
  fflush(stdout);
  abort();
}

inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
inline int atomicCAS(int *p, int cmp, int v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
// System scope is the only scope here (every block is a process on one shared mapping).
inline unsigned long long atomicCAS_system(unsigned long long *p, unsigned long long cmp,
                                           unsigned long long v) {
  return atomicCAS(p, cmp, v);
}
inline int atomicCAS_system(int *p, int cmp, int v) { return atomicCAS(p, cmp, v); }
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

// ---- fibers ------------------------------------------------------------------------------
struct EmuFiber {
  ucontext_t ctx;
  char *stack;
  bool done;
};
inline EmuFiber *emu_fibers = nullptr;
inline unsigned emu_nfibers = 0;
inline unsigned emu_cur = 0;

// Switches to the next unfinished fiber (round-robin) and returns when resumed. Once per
// round (and whenever this fiber is the only one left) the process yields its core: what
// a fiber polls for may be another process's to write.
inline void emu_yield() {
  const unsigned from = emu_cur;
  unsigned next = from;
  do {
    next = (next + 1) % emu_nfibers;
    if (next == 0) sched_yield();
  } while (emu_fibers[next].done && next != from);
  if (next == from) {
    sched_yield();
    return;
  }
  emu_cur = next;
  threadIdx.x = next;
  swapcontext(&emu_fibers[from].ctx, &emu_fibers[next].ctx);
  emu_cur = from;
  threadIdx.x = from;
}

// A barrier of `n` fibers (generation-counted, reusable).
struct EmuBarrier {
  unsigned n = 0, count = 0, gen = 0;
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
