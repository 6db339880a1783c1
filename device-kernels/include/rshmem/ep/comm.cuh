// rshmem/ep/comm.cuh — what the EP kernels (device-kernels/src/ep_ll.cu) need on top of
// the device API: heap offsets as symmetric addresses, the per-destination choice between
// stores through a peer mapping (P2P) and RDMA WRITEs posted to a queue (IBGDA, also the
// proxy transport's soft HCA), signal words, the bounded waits on tagged words and the
// trap path that names the expert waited for. Private to the EP kernels.
//
// Owns: ep_comm::fail (EP message + the device API's error record and trap), sym/local,
// peer_ptr (rshmem_ptr of a heap offset), signal (rshmem_signal_op SET of a tagged
// word), wait_tag / wait_ge.
// Must not: define the state global or any PTX itself (the device API owns both).
// rshmem-check: device-only (device functions; not host C++)
//
// Memory ordering. A P2P destination gets plain (weak) stores through its mapping; a
// signal word is written with rshmem_signal_op (P2P: st.release.sys) after the writer's
// block has made its data visible at system scope (ep_ll.cu arrive_last: __syncthreads,
// fence.sc.sys, a completion counter, fence.sc.sys in the last block), and read with
// ld.acquire.sys, so a receiver that sees the word also sees the data. An IBGDA
// destination gets WRITE WQEs on the one queue pair to that PE; the signal is an inline
// WRITE posted (with the FENCE bit) after every data WQE of the call was reserved on that
// queue (the same completion counter orders the reservations), and a queue executes in
// order, so the word lands after the data. System scope because peers may be other GPUs
// (NVLink/PCIe P2P) or a NIC / the CPU-hosted soft HCA.
#pragma once

#include <stdint.h>

#include "rshmem/ep/layout.cuh"
#include "rshmem/rshmem.cuh"

#if defined(__CUDACC__)

namespace ep_comm {

__device__ __forceinline__ const rshmem_device_state_t &state() { return rshmemi_device_state; }

// Prints the EP view of a fatal error (which expert a wait was for), then writes the
// device error record and traps through the device API (rshmemi_fail: first failing
// thread of the PE writes the record). `what` names the EP object.
[[noreturn]] __device__ __noinline__ inline void fail(uint32_t code, int32_t pe, uint64_t addr,
                                                      uint64_t expected, uint64_t observed,
                                                      uint32_t cmp, const char *what,
                                                      int32_t expert) {
  printf("rshmem ep: PE %d block %u thread %u: %s (PE %d, expert %d) at %#llx: expected %#llx, "
         "last seen %#llx, code %#x\n",
         state().my_pe, blockIdx.x, threadIdx.x, what, pe, expert, (unsigned long long)addr,
         (unsigned long long)expected, (unsigned long long)observed, code);
  rshmemi_fail(code, pe, addr, expected, observed, cmp, what, "EP kernel");
}

// Checks that the module is bound (magic/version).
__device__ __forceinline__ void check_bound() {
  if (!rshmemi_bound())
    fail(RSHMEM_DEVICE_ERR_UNBOUND, -1, 0, RSHMEM_STATE_MAGIC, state().magic, RSHMEM_CMP_EQ,
         "module not bound to a PE", -1);
}

// This PE's address of heap offset `off` (also its symmetric address).
__device__ __forceinline__ uint8_t *local(uint64_t off) {
  return reinterpret_cast<uint8_t *>(state().heap_base + off);
}

// Peer `pe`'s copy of heap offset `off` when this thread can store to it (P2P, or this
// PE), else nullptr: the destination is reached through its queue (IBGDA).
__device__ __forceinline__ uint8_t *peer_ptr(int32_t pe, uint64_t off) {
  return static_cast<uint8_t *>(rshmem_ptr(local(off), pe));
}

// Sets the signal word at heap offset `off` on `pe` to `value`: st.release.sys through
// the mapping (P2P), or a fenced 8-byte inline WRITE on pe's queue (IBGDA).
__device__ __forceinline__ void signal(int32_t pe, uint64_t off, uint64_t value) {
  rshmem_signal_op(reinterpret_cast<uint64_t *>(local(off)), value, RSHMEM_SIGNAL_SET, pe);
}

__device__ __forceinline__ uint64_t ld_acquire(const uint64_t *p) { return rshmemi_ld_acquire_sys(p); }

// Waits until the high 32 bits (the tag) of the word at `p` equal `tag`; returns the
// word. Bounded by state.timeout_ns; on timeout reports (peer, expert, what) and traps.
// `sent`: only the value the PE sent counts, not a shrink marker carrying the tag (a unit
// that settled the word itself may still read back its own marker after another unit
// decided the word came: it waits for the sent value, which that decision says exists).
__device__ __forceinline__ uint64_t wait_tag(const uint64_t *p, uint64_t tag, int32_t peer_pe,
                                             int32_t expert, const char *what, bool sent = false) {
  const auto ok = [&](uint64_t v) {
    return (v >> 32) == tag && !(sent && (v & 0xffffffffu) == EP_SHRUNK);
  };
  uint64_t v = ld_acquire(p);
  if (ok(v)) return v;
  const uint64_t start = rshmemi_globaltimer();
  const uint64_t bound = rshmemi_effective_timeout(state().timeout_ns);
  for (;;) {
    v = ld_acquire(p);
    if (ok(v)) return v;
    if (rshmemi_globaltimer() - start > bound)
      fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, peer_pe, reinterpret_cast<uint64_t>(p), tag << 32, v,
           RSHMEM_CMP_EQ, what, expert);
  }
}

// Shrink mode (EP_LL_SHRINK). Settles the signal word at `p` for the call of `tag`: waits
// up to `budget_ns` (less once `give_up()` says the PE was given up on in this call) for
// it to carry `tag`; when it does not, replaces it by tag << 32 | EP_SHRUNK with a
// compare-and-swap against the value last seen. So every reader of one word in one call
// gets the same thing — the word as its PE sent it, or the marker — and kernels whose
// blocks share out the work (the dispatch receive's packing) agree on each source's
// counts. A word that arrives after it was settled still overwrites the marker; a reader
// that comes later sees it: only a PE that answers after the whole timeout can make the
// blocks of that one call disagree. Which CAS: on a host-memory heap (the proxy
// transport, RSHMEM_STATE_HOST_HEAP) the word is written by the soft HCA's engine threads
// with CPU stores, and a GPU atomic on mapped host memory is not atomic against those
// (the engine's write could fall between the CAS's read and write and be lost), so the
// CAS is the device API's on this PE, which goes through the loopback queue and is done
// by the engine. On a GPU heap (P2P peers, or a NIC's RDMA WRITEs) it is atomicCAS_system:
// L2 serialises it with the incoming 8-byte stores, while a NIC's own atomic (what the
// device API would post on a NIC's loopback queue) is atomic only against other NIC
// atomics, not against a WRITE arriving on another queue pair. Memory ordering: the found
// word is read with ld.acquire; a CAS that finds the word arrived is followed by a system
// fence before the caller reads the data the word announces.
template <class GiveUp>
__device__ uint64_t settle_tag(uint64_t *p, uint64_t tag, uint64_t budget_ns, GiveUp give_up) {
  uint64_t v = ld_acquire(p);
  if ((v >> 32) == tag) return v;
  const uint64_t start = rshmemi_globaltimer();
  while (!give_up() && rshmemi_globaltimer() - start <= budget_ns) {
    v = ld_acquire(p);
    if ((v >> 32) == tag) return v;
  }
  const uint64_t marker = tag << 32 | EP_SHRUNK;
  for (;;) {
    const uint64_t old =
        (state().flags & RSHMEM_STATE_HOST_HEAP) != 0
            ? rshmem_atomic_compare_swap<uint64_t>(p, v, marker, state().my_pe)
            : static_cast<uint64_t>(atomicCAS_system(reinterpret_cast<unsigned long long *>(p),
                                                     static_cast<unsigned long long>(v),
                                                     static_cast<unsigned long long>(marker)));
    if (old == v) return marker;
    v = old;
    if ((v >> 32) == tag) {
      __threadfence_system();
      return v;
    }
  }
}

// Shrink mode: waits until the word at `p` is >= `value`, up to `budget_ns` or until
// `give_up()`; false when it gave up.
template <class GiveUp>
__device__ bool wait_ge_or_give_up(const uint64_t *p, uint64_t value, uint64_t budget_ns,
                                   GiveUp give_up) {
  if (ld_acquire(p) >= value) return true;
  const uint64_t start = rshmemi_globaltimer();
  while (!give_up() && rshmemi_globaltimer() - start <= budget_ns)
    if (ld_acquire(p) >= value) return true;
  return false;
}

// Waits until the word at `p` is >= `value` (credits).
__device__ __forceinline__ uint64_t wait_ge(const uint64_t *p, uint64_t value, int32_t peer_pe,
                                            const char *what) {
  uint64_t v = ld_acquire(p);
  if (v >= value) return v;
  const uint64_t start = rshmemi_globaltimer();
  const uint64_t bound = rshmemi_effective_timeout(state().timeout_ns);
  for (;;) {
    v = ld_acquire(p);
    if (v >= value) return v;
    if (rshmemi_globaltimer() - start > bound)
      fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, peer_pe, reinterpret_cast<uint64_t>(p), value, v,
           RSHMEM_CMP_GE, what, -1);
  }
}

}  // namespace ep_comm

#endif  // __CUDACC__
