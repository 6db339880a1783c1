// rshmem/ep/p2p.cuh — the few device-side primitives the EP kernels need, written against
// the state struct directly. TEMPORARY: to be replaced by the device API
// (rshmem/rshmem.cuh: rshmem_ptr, signal/wait, the error path) once it lands; the
// functions here are named after what they will become. Private to the EP kernels.
//
// Owns: the module's state global (unless the device API already defines it), peer
// addresses for P2P peers, system-scope acquire loads / release stores of signal words,
// bounded waits, and the trap path that fills rshmem_device_error_t.
// rshmem-check: device-only (device functions and __constant__; not host C++)
//
// Memory ordering. Data goes to peers with plain (weak) stores through the peer mapping.
// A signal word is written with st.release.sys after the writer's block has made its
// data stores visible (see ep_ll.cu: __syncthreads, __threadfence_system, a completion
// counter, __threadfence_system in the last block), and read with ld.acquire.sys, so a
// receiver that sees the word also sees the data. System scope because peers may be
// other GPUs (NVLink/PCIe P2P) and, for the CPU-hosted soft HCA later, the host.
#pragma once

#include <stdint.h>

#include "rshmem/device/ptx.cuh"
#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

#if defined(__CUDACC__)

#ifndef RSHMEM_DEVICE_STATE_DEFINED
#define RSHMEM_DEVICE_STATE_DEFINED 1
// The one global the host binds (RSHMEM_STATE_SYMBOL; docs/gpu-design.md). A
// namespace-scope variable's PTX name is unmangled. When the device API lands it defines
// this global and RSHMEM_DEVICE_STATE_DEFINED.
__constant__ rshmem_device_state_t rshmemi_device_state;
#endif

namespace ep_p2p {

__device__ __forceinline__ const rshmem_device_state_t &state() { return rshmemi_device_state; }

__device__ __forceinline__ uint64_t globaltimer() { return rshmemi_globaltimer(); }

// Writes the error record (first writer wins on a best-effort basis: the code is checked
// before and written last) and traps. `what` names the EP object waited for.
__device__ __noinline__ void fail(uint32_t code, int32_t pe, uint64_t addr, uint64_t expected,
                                  uint64_t observed, uint32_t cmp, const char *what,
                                  int32_t expert) {
  const rshmem_device_state_t &s = state();
  if (s.error != 0) {
    rshmem_device_error_t *e = reinterpret_cast<rshmem_device_error_t *>(s.error);
    if (*reinterpret_cast<volatile uint32_t *>(&e->code) == 0) {
      e->pe = pe;
      e->addr = addr;
      e->expected = expected;
      e->observed = observed;
      e->cmp = cmp;
      e->block = blockIdx.x;
      e->thread = threadIdx.x;
      // Ordered before the code: the host reads the code first.
      __threadfence_system();
      *reinterpret_cast<volatile uint32_t *>(&e->code) = code;
      __threadfence_system();
    }
  }
  printf("rshmem ep: PE %d block %u thread %u: %s (PE %d, expert %d) at %#llx: expected %#llx, "
         "last seen %#llx, code %u\n",
         s.my_pe, blockIdx.x, threadIdx.x, what, pe, expert, (unsigned long long)addr,
         (unsigned long long)expected, (unsigned long long)observed, code);
  __trap();
}

// Checks that the module is bound (magic/version).
__device__ __forceinline__ void check_bound() {
  const rshmem_device_state_t &s = state();
  if (s.magic != RSHMEM_STATE_MAGIC || s.version != RSHMEM_STATE_VERSION)
    fail(RSHMEM_DEVICE_ERR_UNBOUND, -1, 0, RSHMEM_STATE_MAGIC, s.magic, RSHMEM_CMP_EQ,
         "module not bound to a PE", -1);
}

// This PE's address of heap offset `off`.
__device__ __forceinline__ uint8_t *local(uint64_t off) {
  return reinterpret_cast<uint8_t *>(state().heap_base + off);
}

// Peer `pe`'s copy of heap offset `off`, through its P2P mapping (rshmem_ptr to come).
// Traps when the peer is not reachable by loads/stores.
__device__ __forceinline__ uint8_t *peer(int32_t pe, uint64_t off) {
  const rshmem_device_state_t &s = state();
  const rshmem_peer_t *peers = reinterpret_cast<const rshmem_peer_t *>(s.peers);
  if (pe < 0 || pe >= s.n_pes || peers[pe].transport != RSHMEM_TRANSPORT_P2P)
    fail(RSHMEM_DEVICE_ERR_BAD_PE, pe, off, RSHMEM_TRANSPORT_P2P,
         (pe >= 0 && pe < s.n_pes) ? peers[pe].transport : 0, RSHMEM_CMP_EQ,
         "EP kernels need a P2P peer (IBGDA/proxy EP path not written yet)", -1);
  return reinterpret_cast<uint8_t *>(peers[pe].heap_base + off);
}

// The device API's primitives (rshmem/device/ptx.cuh), system scope.
__device__ __forceinline__ uint64_t ld_acquire(const uint64_t *p) { return rshmemi_ld_acquire_sys(p); }

__device__ __forceinline__ void st_release(uint64_t *p, uint64_t v) { rshmemi_st_release_sys(p, v); }

// Waits until the high 32 bits (the tag) of the word at `p` equal `tag`; returns the
// word. Bounded by state.timeout_ns; on timeout reports (peer, expert, what) and traps.
__device__ __forceinline__ uint64_t wait_tag(const uint64_t *p, uint64_t tag, int32_t peer_pe,
                                             int32_t expert, const char *what) {
  uint64_t v = ld_acquire(p);
  if ((v >> 32) == tag) return v;
  const uint64_t start = globaltimer();
  const uint64_t bound = state().timeout_ns;
  for (;;) {
    v = ld_acquire(p);
    if ((v >> 32) == tag) return v;
    if (globaltimer() - start > bound)
      fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, peer_pe, reinterpret_cast<uint64_t>(p), tag << 32, v,
           RSHMEM_CMP_EQ, what, expert);
  }
}

// Waits until the word at `p` is >= `value` (credits).
__device__ __forceinline__ uint64_t wait_ge(const uint64_t *p, uint64_t value, int32_t peer_pe,
                                            const char *what) {
  uint64_t v = ld_acquire(p);
  if (v >= value) return v;
  const uint64_t start = globaltimer();
  const uint64_t bound = state().timeout_ns;
  for (;;) {
    v = ld_acquire(p);
    if (v >= value) return v;
    if (globaltimer() - start > bound)
      fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, peer_pe, reinterpret_cast<uint64_t>(p), value, v,
           RSHMEM_CMP_GE, what, -1);
  }
}

}  // namespace ep_p2p

#endif  // __CUDACC__
