// cuda_emu.h — just enough of CUDA to run device-kernels/src/ep_ll.cu on the host CPU,
// one block at a time, each GPU thread a cooperative fiber (ucontext) on one OS thread
// (force-included by the emulator build in host/tests/ep_cuda_parity.rs). Blocks run
// sequentially, so `__shared__` becomes `static`; a fiber runs until it reaches a barrier
// (__syncthreads, or a warp barrier inside __syncwarp / shuffles / ballots), then yields
// round-robin. Test code only: it checks the kernels' logic (slot assignment, signalling,
// unpacking, reduction), not GPU memory ordering or timing.
#pragma once

#include "../../cuda-emu/base.h"

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
