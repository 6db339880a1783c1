// rshmem/device/ibgda.cuh — the device API's IBGDA transport: every operation on a peer
// whose rshmem_peer_t.transport is RSHMEM_TRANSPORT_IBGDA becomes mlx5 WQEs on the queue
// peers[pe].qp of the table at state.ibgda (rshmem/ibgda/queue.cuh), executed by a NIC or
// the soft HCA.
//
// Owns: the out-of-line bodies the `case RSHMEM_TRANSPORT_IBGDA:` arms of rma.cuh, amo.cuh
// and barrier.cuh call (put, get, p, g, put_signal, signal_op, atomics, quiet, fence), the
// per-thread result slots of fetching operations, and the translation of a queue status
// into the device error record + trap (rshmem::ibgda::check).
// Must not: be included by host C++ (device-only; users include rshmem/rshmem.cuh).
//
// rshmem-check: device-only (reads the __constant__ state; see rshmem/rshmem.cuh)
//
// Addresses. A symmetric address `addr` of this PE names `peer.raddr + (addr -
// heap_base)` on the peer under `peer.rkey`; local buffers are named by their device
// address under `state.lkey` (the host registers this PE's heap at its device addresses).
// So the local side of a WQE must be in the heap, except where the producer reads it
// itself (inline WRITEs: p, puts of <= 28 bytes, and puts from non-heap memory, sent in
// inline pieces of <= 256 bytes) or the value lands in a result slot (g, atomics, gets
// into non-heap memory, 8 bytes per READ).
//
// Completion. put/p/put_signal/signal_op/non-fetching atomics: posted; a blocking put
// whose WQE reads the source (an SGE WRITE) waits for that WQE so the source may be
// reused on return, as OpenSHMEM requires; _nbi puts return at once (source reusable after
// quiet). Gets, g and fetching atomics wait for their WQE. Gets _nbi are blocking too
// (a stronger guarantee than OpenSHMEM's: complete on return, as on p2p). quiet waits for
// everything reserved on every queue of the table; fence posts a FENCEd NOP on every
// queue that has work in flight (the NIC starts it after the earlier WQEs of that queue
// completed, and the later ones after it). Signal updates carry FENCE on their own WQE so
// they land after this queue's earlier WRITEs (put_signal's rule, applied to signal_op
// too).
//
// Atomics (ConnectX has FA and CS, plus the masked 4/8-byte forms): fetch = FA 0 (4 B:
// masked FA 0); add/inc = FA; compare_swap = CS (4 B: masked CS with full masks); swap and
// set = masked CS with compare mask 0 (always swaps); and = masked CS swapping in 0 where
// the operand has 0 bits; or = masked CS swapping in 1 where it has 1 bits; xor = a
// fetch and a CS retried until it takes (bounded by the wait timeout). All are executed by
// the NIC / soft HCA: a word they touch must not also be updated by GPU atomics
// (RSHMEM_STATE_SELF_IBGDA routes the own PE's atomics through the loopback queue).
#pragma once

#include <stdint.h>

#include "rshmem/device/core.cuh"
#include "rshmem/ibgda/queue.cuh"

// RSHMEM_NO_IBGDA (defined before including rshmem/rshmem.cuh): the module drops the
// IBGDA arms (an IBGDA peer then traps as unreachable, saying why). For p2p-only kernels
// under tight launch bounds: the arms are calls that return, around which ptxas saves the
// caller's live registers — spills when the budget is 64 (1024-thread blocks).
#if defined(RSHMEM_NO_IBGDA)
#define RSHMEMI_IBGDA_ENABLED 0
#else
#define RSHMEMI_IBGDA_ENABLED 1
#endif

#if defined(__CUDACC__)

// Atomic operations of rshmemi_ibgda_amo.
enum {
  RSHMEMI_AMO_FETCH = 0,
  RSHMEMI_AMO_SET = 1,
  RSHMEMI_AMO_SWAP = 2,
  RSHMEMI_AMO_CAS = 3,  // a = cond, b = value
  RSHMEMI_AMO_ADD = 4,
  RSHMEMI_AMO_AND = 5,
  RSHMEMI_AMO_OR = 6,
  RSHMEMI_AMO_XOR = 7,
};

// Where an IBGDA operation on PE pe goes: its queue, the remote address of `addr`, the rkey.
struct rshmemi_ibgda_dest_t {
  rshmem_ibgda_qp_t *qp;
  uint64_t raddr;
  uint32_t rkey;
};

RSHMEM_DEVICE const rshmem_ibgda_table_t *rshmemi_ibgda_table() {
  return reinterpret_cast<const rshmem_ibgda_table_t *>(rshmemi_device_state.ibgda);
}

RSHMEM_DEVICE rshmem_device_error_t *rshmemi_ibgda_errrec() {
  return reinterpret_cast<rshmem_device_error_t *>(rshmemi_device_state.error);
}

// Traps with the queue's error record unless st is RSHMEM_IBGDA_OK. The record is claimed
// through the same word as rshmemi_fail's, so simultaneous failures never mix fields.
RSHMEM_DEVICE void rshmemi_ibgda_check(rshmem_ibgda_qp_t *qp, int st, int pe) {
  if (st == RSHMEM_IBGDA_OK) return;
  const rshmem_device_state_t &s = rshmemi_device_state;
  uint32_t *claim =
      s.sync_bytes > RSHMEMI_SYNC_ERROR_CLAIM
          ? reinterpret_cast<uint32_t *>(rshmemi_sync_base() + RSHMEMI_SYNC_ERROR_CLAIM)
          : nullptr;
  rshmem::ibgda::fail(qp, st, rshmemi_ibgda_errrec(), pe, claim);
}

// The queue, remote address and key for the symmetric `addr` on `pe`. The peer table and
// the table header are read-only for the kernel's life (written at bind time).
__device__ __noinline__ inline rshmemi_ibgda_dest_t rshmemi_ibgda_dest(int pe, uint64_t addr,
                                                                   const char *what) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  const rshmem_peer_t *peer = reinterpret_cast<const rshmem_peer_t *>(s.peers) + pe;
  rshmemi_ibgda_dest_t d;
  d.qp = rshmem::ibgda::table_qp(rshmemi_ibgda_table(), __ldg(&peer->qp));
  if (d.qp == nullptr)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_PE, pe, addr, 0, 0, 0, what,
                 "peer table says IBGDA but state.ibgda has no such queue (bad table or qp index)");
  d.raddr = __ldg(&peer->raddr) + (addr - s.heap_base);
  d.rkey = __ldg(&peer->rkey);
  return d;
}

RSHMEM_DEVICE bool rshmemi_ibgda_in_heap(const void *p, uint64_t len) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  return rshmemi_range_in_heap(s.heap_base, s.heap_size, reinterpret_cast<uint64_t>(p), len);
}

// ---- result slots ------------------------------------------------------------------------

// Takes a free result slot (returns its index): the thread's own slot (its linear index in
// the grid, modulo the count) or the next free one. Acquire: the previous holder's read of
// the slot happens before our WQE lets the engine overwrite it. Bounded by the wait
// timeout (more threads waiting for results than slots, for longer than the timeout).
__device__ __noinline__ inline uint32_t rshmemi_ibgda_slot_take(const char *what) {
  const rshmem_ibgda_table_t *t = rshmemi_ibgda_table();
  const uint32_t n = t->n_results;
  if (n == 0)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, rshmemi_device_state.my_pe, 0, 0, 0, 0, what,
                 "the IBGDA table has no result slots (the host registered none)");
  uint32_t *locks = reinterpret_cast<uint32_t *>(t->result_locks);
  const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  uint32_t i = (block * rshmemi_block_threads() + rshmemi_block_thread()) % n;
  if (rshmem::ibgda::cas_acquire_gpu_u32(&locks[i], 0, 1)) return i;
  const uint64_t limit = rshmemi_effective_timeout(rshmemi_device_state.timeout_ns);
  const uint64_t t0 = rshmemi_globaltimer();
  for (;;) {
    i = i + 1 == n ? 0 : i + 1;
    if (rshmem::ibgda::cas_acquire_gpu_u32(&locks[i], 0, 1)) return i;
    if (rshmemi_globaltimer() - t0 > limit)
      rshmemi_fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, rshmemi_device_state.my_pe,
                   reinterpret_cast<uint64_t>(locks), 0, 1, RSHMEM_CMP_EQ, what,
                   "no free IBGDA result slot");
  }
}

// Releases slot i after its value was read. Release: our read comes before the next
// holder's WQE.
RSHMEM_DEVICE void rshmemi_ibgda_slot_give(uint32_t i) {
  rshmem::ibgda::st_release_gpu_u32(reinterpret_cast<uint32_t *>(rshmemi_ibgda_table()->result_locks) + i, 0);
}

RSHMEM_DEVICE uint64_t rshmemi_ibgda_slot_addr(uint32_t i) {
  return rshmemi_ibgda_table()->results + 8ull * i;
}

// The shared slot for values nobody reads (the old value of a signal ADD).
RSHMEM_DEVICE uint64_t rshmemi_ibgda_discard() {
  const rshmem_ibgda_table_t *t = rshmemi_ibgda_table();
  return t->results + 8ull * t->n_results;
}

// ---- ordering ---------------------------------------------------------------------------

// quiet on every queue of the table.
__device__ __noinline__ inline void rshmemi_ibgda_quiet() {
  const rshmem_ibgda_table_t *t = rshmemi_ibgda_table();
  if (t == nullptr) return;
  const uint32_t n = t->n_qps;
  for (uint32_t i = 0; i < n; ++i) {
    rshmem_ibgda_qp_t *qp = rshmem::ibgda::table_qp(t, i);
    if (qp == nullptr) return;  // a bad table: table_qp refuses every index
    rshmemi_ibgda_check(qp, rshmem::ibgda::quiet(qp), -1);
  }
}

// fence on every queue of the table that needs one (queue.cuh fence_needed: work in
// flight, and no FENCEd NOP reserved after it yet): a FENCEd NOP.
__device__ __noinline__ inline void rshmemi_ibgda_fence() {
  const rshmem_ibgda_table_t *t = rshmemi_ibgda_table();
  if (t == nullptr) return;
  const uint32_t n = t->n_qps;
  for (uint32_t i = 0; i < n; ++i) {
    rshmem_ibgda_qp_t *qp = rshmem::ibgda::table_qp(t, i);
    if (qp == nullptr) return;
    if (rshmem::ibgda::fence_needed(qp)) rshmemi_ibgda_check(qp, rshmem::ibgda::fence(qp), -1);
  }
}

// ---- RMA --------------------------------------------------------------------------------

// Largest WRITE/READ one WQE carries here (the data segment's byte count is 32-bit).
#define RSHMEMI_IBGDA_CHUNK (1ull << 30)

// put of `bytes` from `src` to the symmetric `dest` on pe; `wait`: return only when the
// source may be reused (blocking put).
__device__ __noinline__ inline void rshmemi_ibgda_put(int pe, uint64_t dest, const void *src,
                                                      uint64_t bytes, bool wait, const char *what) {
  if (bytes == 0) return;
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, dest, what);
  const uint8_t *sp = static_cast<const uint8_t *>(src);
  int st;
  if (bytes <= rshmem::ibgda::SMALL_INLINE) {
    st = rshmem::ibgda::post_write_inline_small(d.qp, d.raddr, d.rkey, sp, static_cast<uint32_t>(bytes));
    rshmemi_ibgda_check(d.qp, st, pe);
    return;
  }
  if (!rshmemi_ibgda_in_heap(src, bytes)) {
    // Not registered: the producer reads it, in inline pieces.
    for (uint64_t off = 0; off < bytes; off += rshmem::ibgda::MAX_INLINE) {
      const uint64_t n = bytes - off < rshmem::ibgda::MAX_INLINE ? bytes - off : rshmem::ibgda::MAX_INLINE;
      st = rshmem::ibgda::post_write_inline(d.qp, d.raddr + off, d.rkey, sp + off, static_cast<uint32_t>(n));
      rshmemi_ibgda_check(d.qp, st, pe);
    }
    return;
  }
  rshmem::ibgda::posted p = {0, 0};
  for (uint64_t off = 0; off < bytes; off += RSHMEMI_IBGDA_CHUNK) {
    const uint64_t n = bytes - off < RSHMEMI_IBGDA_CHUNK ? bytes - off : RSHMEMI_IBGDA_CHUNK;
    st = rshmem::ibgda::post_write(d.qp, d.raddr + off, d.rkey, reinterpret_cast<uint64_t>(sp + off),
                                   rshmemi_device_state.lkey, static_cast<uint32_t>(n), &p);
    rshmemi_ibgda_check(d.qp, st, pe);
  }
  // In-order completion: the last WQE done means every chunk was read.
  if (wait) rshmemi_ibgda_check(d.qp, rshmem::ibgda::wait_posted(d.qp, p), pe);
}

// READ of `bytes` (<= 8) at the symmetric `src` on pe into a result slot; returns the raw
// bytes (little-endian in the low bytes).
__device__ __noinline__ inline uint64_t rshmemi_ibgda_read_small(int pe, uint64_t src, uint32_t bytes,
                                                                 const char *what) {
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, src, what);
  const uint32_t slot = rshmemi_ibgda_slot_take(what);
  const uint64_t at = rshmemi_ibgda_slot_addr(slot);
  rshmemi_ibgda_check(d.qp, rshmem::ibgda::get(d.qp, d.raddr, d.rkey, at, rshmemi_ibgda_table()->results_lkey, bytes), pe);
  // Relaxed, system scope: the engine wrote the slot before the CQE that get() acquired.
  const uint64_t v = rshmem::ibgda::ld_relaxed_sys_u64(reinterpret_cast<const uint64_t *>(at));
  rshmemi_ibgda_slot_give(slot);
  return v;
}

// Blocking get of `bytes` at the symmetric `src` on pe into `dest`: one READ per chunk
// into the heap; 8-byte READs through a result slot for a destination outside it.
__device__ __noinline__ inline void rshmemi_ibgda_get(int pe, void *dest, uint64_t src, uint64_t bytes,
                                                      const char *what) {
  if (bytes == 0) return;
  uint8_t *dp = static_cast<uint8_t *>(dest);
  if (!rshmemi_ibgda_in_heap(dest, bytes)) {
    for (uint64_t off = 0; off < bytes; off += 8) {
      const uint32_t n = bytes - off < 8 ? static_cast<uint32_t>(bytes - off) : 8u;
      const uint64_t v = rshmemi_ibgda_read_small(pe, src + off, n, what);
      for (uint32_t k = 0; k < n; ++k) dp[off + k] = static_cast<uint8_t>(v >> (8 * k));
    }
    return;
  }
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, src, what);
  rshmem::ibgda::posted p = {0, 0};
  for (uint64_t off = 0; off < bytes; off += RSHMEMI_IBGDA_CHUNK) {
    const uint64_t n = bytes - off < RSHMEMI_IBGDA_CHUNK ? bytes - off : RSHMEMI_IBGDA_CHUNK;
    const int st = rshmem::ibgda::post_read(d.qp, d.raddr + off, d.rkey, reinterpret_cast<uint64_t>(dp + off),
                                            rshmemi_device_state.lkey, static_cast<uint32_t>(n), &p);
    rshmemi_ibgda_check(d.qp, st, pe);
  }
  // The data is in dest once the last READ completed (in order). The CQE was acquired at
  // system scope, so this thread's later loads of dest see the engine's stores.
  rshmemi_ibgda_check(d.qp, rshmem::ibgda::wait_posted(d.qp, p), pe);
}

// p of `bytes` (<= 8) of `bits` (little-endian): one inline WRITE.
__device__ __noinline__ inline void rshmemi_ibgda_p(int pe, uint64_t dest, uint64_t bits, uint32_t bytes,
                                                    const char *what) {
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, dest, what);
  rshmemi_ibgda_check(d.qp, rshmem::ibgda::post_write_inline_small(d.qp, d.raddr, d.rkey, &bits, bytes), pe);
}

// ---- signals ----------------------------------------------------------------------------

RSHMEM_DEVICE void rshmemi_ibgda_sig_op_check(int sig_op, int pe, uint64_t sig, const char *what) {
  if (sig_op != RSHMEM_SIGNAL_SET && sig_op != RSHMEM_SIGNAL_ADD)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, pe, sig, 8, 0, static_cast<uint32_t>(sig_op), what,
                 "invalid signal operator (not SET or ADD)");
}

// The signal update of the 8-byte word `sig` on pe, its own WQE FENCEd behind the queue's
// earlier WQEs (this thread's puts among them, whatever other threads post meanwhile):
// ADD = ATOMIC_FA (old value to the discard slot), SET = an 8-byte inline WRITE.
__device__ __noinline__ inline void rshmemi_ibgda_signal(int pe, uint64_t sig, uint64_t value, int sig_op,
                                                         const char *what) {
  rshmemi_ibgda_sig_op_check(sig_op, pe, sig, what);
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, sig, what);
  const int st = sig_op == RSHMEM_SIGNAL_ADD
                     ? rshmem::ibgda::post_atomic_fa(d.qp, d.raddr, d.rkey, rshmemi_ibgda_discard(),
                                                     rshmemi_ibgda_table()->results_lkey, value, nullptr,
                                                     true)
                     : rshmem::ibgda::post_write_inline_small(d.qp, d.raddr, d.rkey, &value, 8, nullptr, true);
  rshmemi_ibgda_check(d.qp, st, pe);
}

// put + signal in one reservation (queue.cuh put_signal) when the data fits one WQE;
// otherwise the put and then the FENCEd signal.
__device__ __noinline__ inline void rshmemi_ibgda_put_signal(int pe, uint64_t dest, const void *src,
                                                             uint64_t bytes, uint64_t sig, uint64_t value,
                                                             int sig_op, bool wait, const char *what) {
  rshmemi_ibgda_sig_op_check(sig_op, pe, sig, what);
  if (bytes == 0) {
    // No data: the signal alone. (The one-WQE path would post a WRITE with an empty
    // inline segment, which rdma-core never builds and a NIC may refuse.)
    rshmemi_ibgda_signal(pe, sig, value, sig_op, what);
    return;
  }
  const bool one = bytes <= rshmem::ibgda::SMALL_INLINE ||
                   (bytes <= RSHMEMI_IBGDA_CHUNK && rshmemi_ibgda_in_heap(src, bytes));
  if (!one) {
    rshmemi_ibgda_put(pe, dest, src, bytes, wait, what);
    rshmemi_ibgda_signal(pe, sig, value, sig_op, what);
    return;
  }
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, dest, what);
  rshmem::ibgda::posted p = {0, 0};
  const int st = rshmem::ibgda::put_signal(
      d.qp, d.raddr, d.rkey, reinterpret_cast<uint64_t>(src), rshmemi_device_state.lkey,
      static_cast<uint32_t>(bytes), d.raddr + (sig - dest), value, static_cast<uint32_t>(sig_op),
      rshmemi_ibgda_discard(), rshmemi_ibgda_table()->results_lkey, &p);
  rshmemi_ibgda_check(d.qp, st, pe);
  if (wait && bytes > rshmem::ibgda::SMALL_INLINE)
    rshmemi_ibgda_check(d.qp, rshmem::ibgda::wait_posted(d.qp, p), pe);
}

// ---- atomics ----------------------------------------------------------------------------

// Posts one 4- or 8-byte atomic WQE (RSHMEMI_AMO_* except XOR) with its old value to
// `result`; returns the status.
RSHMEM_DEVICE int rshmemi_ibgda_post_amo(const rshmemi_ibgda_dest_t &d, uint32_t size, int op, uint64_t a,
                                         uint64_t b, uint64_t result, uint32_t lkey,
                                         rshmem::ibgda::posted *p) {
  namespace q = rshmem::ibgda;
  if (size == 8) {
    switch (op) {
      case RSHMEMI_AMO_FETCH: return q::post_atomic_fa(d.qp, d.raddr, d.rkey, result, lkey, 0, p);
      case RSHMEMI_AMO_ADD: return q::post_atomic_fa(d.qp, d.raddr, d.rkey, result, lkey, a, p);
      case RSHMEMI_AMO_CAS: return q::post_atomic_cs(d.qp, d.raddr, d.rkey, result, lkey, a, b, p);
      case RSHMEMI_AMO_AND:
        return q::post_masked_cs64(d.qp, d.raddr, d.rkey, result, lkey, 0, 0, ~a, 0, p);
      case RSHMEMI_AMO_OR:
        return q::post_masked_cs64(d.qp, d.raddr, d.rkey, result, lkey, a, 0, a, 0, p);
      default:  // SET, SWAP
        return q::post_masked_cs64(d.qp, d.raddr, d.rkey, result, lkey, a, 0, ~0ull, 0, p);
    }
  }
  const uint32_t a32 = static_cast<uint32_t>(a), b32 = static_cast<uint32_t>(b);
  switch (op) {
    case RSHMEMI_AMO_FETCH: return q::post_masked_fa32(d.qp, d.raddr, d.rkey, result, lkey, 0, 0, p);
    case RSHMEMI_AMO_ADD: return q::post_masked_fa32(d.qp, d.raddr, d.rkey, result, lkey, a32, 0, p);
    case RSHMEMI_AMO_CAS:
      return q::post_masked_cs32(d.qp, d.raddr, d.rkey, result, lkey, b32, a32, ~0u, ~0u, p);
    case RSHMEMI_AMO_AND:
      return q::post_masked_cs32(d.qp, d.raddr, d.rkey, result, lkey, 0, 0, ~a32, 0, p);
    case RSHMEMI_AMO_OR:
      return q::post_masked_cs32(d.qp, d.raddr, d.rkey, result, lkey, a32, 0, a32, 0, p);
    default:  // SET, SWAP
      return q::post_masked_cs32(d.qp, d.raddr, d.rkey, result, lkey, a32, 0, ~0u, 0, p);
  }
}

// An atomic of `size` (4 or 8) bytes on the symmetric `addr` of pe. `fetch`: wait and
// return the old value (zero-extended); otherwise posted (complete at quiet) with the old
// value discarded — except XOR, which always waits (fetch + CS until it takes).
__device__ __noinline__ inline uint64_t rshmemi_ibgda_amo(int pe, uint64_t addr, uint32_t size, int op,
                                                          uint64_t a, uint64_t b, bool fetch,
                                                          const char *what) {
  const rshmemi_ibgda_dest_t d = rshmemi_ibgda_dest(pe, addr, what);
  const uint32_t lkey = rshmemi_ibgda_table()->results_lkey;
  const uint64_t mask = size == 8 ? ~0ull : 0xffffffffull;
  if (!fetch && op != RSHMEMI_AMO_XOR) {
    rshmemi_ibgda_check(d.qp, rshmemi_ibgda_post_amo(d, size, op, a, b, rshmemi_ibgda_discard(), lkey, nullptr), pe);
    return 0;
  }
  const uint32_t slot = rshmemi_ibgda_slot_take(what);
  const uint64_t at = rshmemi_ibgda_slot_addr(slot);
  rshmem::ibgda::posted p = {0, 0};
  // Fetching: the value lands in the slot once the WQE completed (8 bytes in host order,
  // 4 bytes big-endian: fetched_u64 / fetched_u32).
  auto run = [&](int o, uint64_t x, uint64_t y) -> uint64_t {
    rshmemi_ibgda_check(d.qp, rshmemi_ibgda_post_amo(d, size, o, x, y, at, lkey, &p), pe);
    rshmemi_ibgda_check(d.qp, rshmem::ibgda::wait_posted(d.qp, p), pe);
    return size == 8 ? rshmem::ibgda::fetched_u64(at) : rshmem::ibgda::fetched_u32(at);
  };
  uint64_t old;
  if (op == RSHMEMI_AMO_XOR) {
    old = run(RSHMEMI_AMO_FETCH, 0, 0);
    const uint64_t limit = rshmemi_effective_timeout(rshmemi_device_state.timeout_ns);
    const uint64_t t0 = rshmemi_globaltimer();
    for (;;) {
      const uint64_t seen = run(RSHMEMI_AMO_CAS, old, (old ^ a) & mask);
      if (seen == old) break;
      old = seen;
      if (rshmemi_globaltimer() - t0 > limit)
        rshmemi_fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, pe, addr, old, seen, RSHMEM_CMP_EQ, what,
                     "atomic xor: compare-and-swap never took (the word keeps changing)");
    }
  } else {
    old = run(op, a, b);
  }
  rshmemi_ibgda_slot_give(slot);
  return old & mask;
}

#endif  // __CUDACC__
