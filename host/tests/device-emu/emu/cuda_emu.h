// cuda_emu.h — enough of CUDA to run the device API's test kernels
// (device-kernels/src/rshmem_device_tests.cu) on the host CPU, with several PEs whose
// kernels wait on each other (force-included by the build in host/tests/device_emu.rs).
//
// Model: every block of every PE's launch is its own process (forked by
// device_emulator.cpp after the heaps were mapped shared), so all blocks of all PEs are
// co-resident and run concurrently, as a collective launch on a GPU, and `__shared__`
// (made `static`) is per block. Inside a block every GPU thread is a cooperative fiber
// (ucontext) on the process's one OS thread; a fiber runs until it reaches a barrier
// (__syncthreads, __syncwarp) or an acquire load (every poll of the device API goes
// through one: rshmem/device/ptx.cuh of this emulation), then yields round-robin. Global
// memory is the shared mapping; atomics are the host's (__atomic builtins, seq_cst or the
// PTX instruction's order).
//
// What this checks: the device API's and the test kernels' logic (addresses, peer
// translation, copy splitting at thread/warp/block scope, signals, waits, barriers, the
// error paths and their records), with real concurrency between PEs and blocks. What it
// does not: GPU memory ordering (x86 is stronger than PTX), warp divergence, timing.
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
inline EmuDim blockIdx{0, 0, 0};   // of this process
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
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
template <class T>
inline T __ldg(const T *p) {
  return *p;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() {
  // A trap ends the launch; the driver reports this block's process as killed by SIGABRT.
  fflush(stdout);
  abort();
}

inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}

// ---- fibers of this block -------------------------------------------------------------
struct EmuFiber {
  ucontext_t ctx;
  bool done;
};
inline EmuFiber *emu_fibers = nullptr;
inline unsigned emu_nfibers = 0;
inline unsigned emu_cur = 0;

// Switches to the next unfinished fiber (round-robin) and returns when resumed. Once per
// round (and whenever this fiber is the only one left) the process yields its core: the
// other blocks and PEs are other processes, and a fiber that polls may wait for them.
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

inline EmuBarrier emu_block_bar;
inline EmuBarrier *emu_warp_bars = nullptr;  // one per warp (the last may be partial)

inline void __syncthreads() { emu_block_bar.wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bars[threadIdx.x / 32].wait(); }
inline unsigned emu_lane() { return threadIdx.x % 32; }

// Warp intrinsics for converged warps (every lane of the warp makes the call, as the
// IBGDA warp-batched post requires): __activemask is the warp's lanes, a shuffle is an
// exchange through the warp's slots between two warp barriers.
inline uint64_t *emu_warp_vals = nullptr;  // 32 per warp
inline unsigned __activemask() {
  const unsigned n = emu_warp_bars[threadIdx.x / 32].n;
  return n == 32 ? 0xffffffffu : (1u << n) - 1u;
}
inline int __ffs(unsigned v) { return __builtin_ffs(static_cast<int>(v)); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  const unsigned w = threadIdx.x / 32;
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  emu_warp_vals[32 * w + threadIdx.x % 32] = b;
  emu_warp_bars[w].wait();
  const uint64_t r = emu_warp_vals[32 * w + static_cast<unsigned>(src)];
  emu_warp_bars[w].wait();
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}

// ---- the IBGDA arms -----------------------------------------------------------------------
// rshmem/ibgda/queue.cuh compiles its device-only part (the warp-batched post and the error
// path, rshmem::ibgda::fail / check) for this emulation too; its waits back off through the host hooks, which the driver points
// at emu_yield so that a waiting fiber lets the others of its block run.
#define RSHMEM_EMULATED_DEVICE 1
