// Host emulation of device-kernels/include/rshmem/ep/p2p.cuh for the EP kernel emulator
// (host/tests/ep-cuda/ll_emulator.cpp): the same functions, with host atomics for the
// acquire/release signal words and std::chrono for the bounded waits. The address
// computations are the real header's.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

inline rshmem_device_state_t rshmemi_device_state;

namespace ep_p2p {

inline const rshmem_device_state_t &state() { return rshmemi_device_state; }

inline uint64_t globaltimer() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] inline void fail(uint32_t code, int32_t pe, uint64_t addr, uint64_t expected,
                              uint64_t observed, uint32_t, const char *what, int32_t expert) {
  fprintf(stderr,
          "emulated trap: PE %d block %u thread %u: %s (PE %d, expert %d) at %#llx: expected "
          "%#llx, last seen %#llx, code %u\n",
          state().my_pe, blockIdx.x, threadIdx.x, what, pe, expert, (unsigned long long)addr,
          (unsigned long long)expected, (unsigned long long)observed, code);
  abort();
}

inline void check_bound() {
  if (state().magic != RSHMEM_STATE_MAGIC) fail(RSHMEM_DEVICE_ERR_UNBOUND, -1, 0, 0, 0, 0, "unbound", -1);
}

inline uint8_t *local(uint64_t off) { return reinterpret_cast<uint8_t *>(state().heap_base + off); }

inline uint8_t *peer(int32_t pe, uint64_t off) {
  const rshmem_device_state_t &s = state();
  const rshmem_peer_t *peers = reinterpret_cast<const rshmem_peer_t *>(s.peers);
  if (pe < 0 || pe >= s.n_pes || peers[pe].transport != RSHMEM_TRANSPORT_P2P)
    fail(RSHMEM_DEVICE_ERR_BAD_PE, pe, off, 0, 0, 0, "not a P2P peer", -1);
  return reinterpret_cast<uint8_t *>(peers[pe].heap_base + off);
}

inline uint64_t ld_acquire(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void st_release(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

inline uint64_t wait_tag(const uint64_t *p, uint64_t tag, int32_t peer_pe, int32_t expert,
                         const char *what) {
  const uint64_t start = globaltimer();
  for (;;) {
    const uint64_t v = ld_acquire(p);
    if ((v >> 32) == tag) return v;
    emu_yield();  // the writer may be another fiber of this block, or another process
    if (globaltimer() - start > state().timeout_ns)
      fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, peer_pe, reinterpret_cast<uint64_t>(p), tag << 32, v,
           RSHMEM_CMP_EQ, what, expert);
  }
}

inline uint64_t wait_ge(const uint64_t *p, uint64_t value, int32_t peer_pe, const char *what) {
  const uint64_t start = globaltimer();
  for (;;) {
    const uint64_t v = ld_acquire(p);
    if (v >= value) return v;
    emu_yield();
    if (globaltimer() - start > state().timeout_ns)
      fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, peer_pe, reinterpret_cast<uint64_t>(p), value, v,
           RSHMEM_CMP_GE, what, -1);
  }
}

}  // namespace ep_p2p
