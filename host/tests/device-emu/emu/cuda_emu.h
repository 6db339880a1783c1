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

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../cuda-emu/base.h"

// Stand-ins for the storage classes of cuda_fp16.h / cuda_bf16.h (not on g++'s path): the
// device API only moves their bits (rshmem_half_*, rshmem_bfloat16_*), so two bytes each
// and the headers' "types exist" macros are all it needs.
struct __half {
  unsigned short x;
};
typedef __half half;
struct __nv_bfloat16 {
  unsigned short x;
};
#define __CUDA_FP16_TYPES_EXIST__
#define __CUDA_BF16_TYPES_EXIST__

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
// Every lane of the warp publishes `mine`; `all` gets the warp's values (lanes past a
// partial warp's end read as 0).
inline void emu_warp_all(uint64_t mine, uint64_t all[32]) {
  const unsigned w = threadIdx.x / 32;
  emu_warp_vals[32 * w + threadIdx.x % 32] = mine;
  emu_warp_bars[w].wait();
  for (unsigned i = 0; i < 32; ++i) all[i] = i < emu_warp_bars[w].n ? emu_warp_vals[32 * w + i] : 0;
  emu_warp_bars[w].wait();
}
template <class T>
inline uint64_t emu_bits(T v) {
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T emu_lane_value(T v, unsigned src) {
  uint64_t all[32];
  emu_warp_all(emu_bits(v), all);
  T out;
  memcpy(&out, &all[src % 32], sizeof(T));
  return out;
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return emu_lane_value(v, static_cast<unsigned>(src));
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  return emu_lane_value(v, emu_lane() ^ static_cast<unsigned>(o));
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, int o) {
  const unsigned lane = emu_lane();
  return emu_lane_value(v, lane >= static_cast<unsigned>(o) ? lane - o : lane);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  uint64_t all[32];
  emu_warp_all(pred != 0, all);
  unsigned m = 0;
  for (unsigned i = 0; i < 32; ++i) m |= (all[i] ? 1u : 0u) << i;
  return m & __activemask();
}
inline unsigned __match_any_sync(unsigned, int value) {
  uint64_t all[32];
  emu_warp_all(emu_bits(value), all);
  unsigned m = 0;
  for (unsigned i = 0; i < 32; ++i) m |= (all[i] == emu_bits(value) ? 1u : 0u) << i;
  return m & __activemask();
}

// ---- the IBGDA mode's memory (host/tests/emu_ibgda) ----------------------------------------
// The test built every PE's heap, queues, tables and state in a memfd that its soft HCA
// engine serves, at "device" addresses (a fixed base, host/tests/emu_ibgda EMU_DEVICE_BASE,
// as a GPU's addresses differ from the host's). Maps the memfd RSHMEM_EMU_SHM at RSHMEM_EMU_SHM_AT
// and returns the address of the PEs' states (RSHMEM_EMU_STATES), or 0 when
// RSHMEM_EMU_SHM is unset (P2P mode); exits 4 when it cannot be mapped there.
inline uint64_t emu_map_shm() {
  const char *shm = getenv("RSHMEM_EMU_SHM");
  if (shm == nullptr) return 0;
  const uint64_t at = strtoull(getenv("RSHMEM_EMU_SHM_AT"), nullptr, 0);
  const uint64_t len = strtoull(getenv("RSHMEM_EMU_SHM_LEN"), nullptr, 0);
  const int fd = open(shm, O_RDWR);
  void *m = fd < 0 ? MAP_FAILED
                   : mmap(reinterpret_cast<void *>(at), len, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
  if (m != reinterpret_cast<void *>(at)) {
    fprintf(stderr, "cannot map %s at 0x%llx (%llu bytes): %s\n", shm, (unsigned long long)at,
            (unsigned long long)len, strerror(errno));
    exit(4);
  }
  return strtoull(getenv("RSHMEM_EMU_STATES"), nullptr, 0);
}

// ---- the IBGDA arms -----------------------------------------------------------------------
// rshmem/ibgda/queue.cuh compiles its device-only part (the warp-batched post and the error
// path, rshmem::ibgda::fail / check) for this emulation too; its waits back off through the host hooks, which the driver points
// at emu_yield so that a waiting fiber lets the others of its block run.
#define RSHMEM_EMULATED_DEVICE 1

// ---- running one block (device_emulator.cpp; hostcuda's kernel libraries) ----------------
// `emu_body` is what every GPU thread of the block runs (the kernel call of this launch).
inline void (*emu_body)() = nullptr;

inline void emu_fiber_main() {
  emu_body();
  emu_fibers[emu_cur].done = true;
  // Hand the core to a fiber that has not finished; the last one returns to the scheduler.
  for (;;) {
    unsigned live = 0;
    for (unsigned i = 0; i < emu_nfibers; ++i) live += !emu_fibers[i].done;
    if (live == 0) setcontext(&emu_fibers[emu_nfibers].ctx);  // the scheduler's own context
    emu_yield();
  }
}

// Runs this process's block: `threads` fibers, started in order, until all are done.
inline void emu_run_block(unsigned threads) {
  constexpr size_t kStack = 256u << 10;
  emu_nfibers = threads;
  emu_fibers = new EmuFiber[threads + 1]();  // [threads] = the scheduler
  emu_block_bar.n = threads;
  const unsigned warps = (threads + 31) / 32;
  emu_warp_bars = new EmuBarrier[warps];
  emu_warp_vals = new uint64_t[32 * warps]();
  for (unsigned w = 0; w < warps; ++w) emu_warp_bars[w].n = (w + 1 < warps) ? 32 : threads - 32 * w;
  for (unsigned i = 0; i < threads; ++i) {
    void *stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED) {
      perror("mmap of a fiber stack");
      _exit(3);
    }
    getcontext(&emu_fibers[i].ctx);
    emu_fibers[i].ctx.uc_stack.ss_sp = stack;
    emu_fibers[i].ctx.uc_stack.ss_size = kStack;
    emu_fibers[i].ctx.uc_link = nullptr;
    makecontext(&emu_fibers[i].ctx, emu_fiber_main, 0);
  }
  emu_cur = 0;
  threadIdx.x = 0;
  swapcontext(&emu_fibers[threads].ctx, &emu_fibers[0].ctx);
}
