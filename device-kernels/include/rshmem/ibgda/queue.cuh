// rshmem/ibgda/queue.cuh — the many-producer mlx5 send-queue protocol (the CUDA twin of
// Rust's `rshmem::softhca::SendQueue`, host/src/softhca/queue.rs: same protocol, same names).
//
// Owns: reserve → write → publish in order → doorbell record → doorbell (batched), CQ
// polling and the completion counter, quiet, fence, and the posting of RDMA WRITE (SGE and
// inline), READ, ATOMIC FA/CS, masked 4/8-byte atomics and put-with-signal on one
// rshmem_ibgda_qp_t (rshmem/ibgda/layout.cuh). Every function is RSHMEM_HOST_DEVICE: the
// same code runs in GPU threads and, compiled by g++, in CPU threads against the soft HCA
// (host/tests/ibgda_cpp_producer.rs). Only the primitives of rshmem/ibgda/ordering.cuh and
// the device-only helpers at the end (warp batching, trap) differ between the two.
// Must not: know about PEs, the heap or the device state (the device API, rshmem.cuh,
// picks the descriptor: table->qps[peers[pe].qp], and turns a status into a trap).
//
// Counters (unwrapped 64-bit WQEBB indices; the 16-bit WQE index is their low 16 bits):
//
//   completed <= rung <= ready <= reserved          completed + wqe_cnt >= reserved-being-written
//   |-- done --|-- rung, in flight --|-- published, not rung --|-- reserved, being written --|
//
// Protocol (docs/ibgda-device.md has the diagram and the reasoning):
// 1. reserve(n): idx = reserved.fetch_add(n); wait (bounded) until idx + n <= completed +
//    wqe_cnt, ringing and polling the CQ meanwhile — a slot is never overwritten before the
//    CQE of the WQE that held it was consumed.
// 2. Build the WQE (rshmem/mlx5.cuh builders) into a local buffer and store it into the
//    slots idx .. idx+n, WQEBB by WQEBB (the ring wraps between WQEBBs).
// 3. publish(idx, n): fence; wait until ready == idx (no hole is ever published); ready =
//    idx + n (release). The producer that finds no later reservation rings (batching: a
//    later producer rings for us; every waiter rings before it waits).
// 4. ring: under ring_lock, doorbell record [1] = BE32(ready & 0xffff) (release, system
//    scope), then the 8-byte doorbell word (release, system scope; an MMIO store after a
//    fence when the doorbell is a NIC register, doorbell_mode).
// 5. poll_cq (one poller at a time, try-lock): consume CQEs (owner bit per pass in normal
//    mode; CQE 0 in collapsed mode), unwrap each CQE's 16-bit wqe_counter against
//    `completed`, add the WQE's size (read from its ds in the slot, which cannot have been
//    reused yet), record the first error CQE, store the CQ doorbell record, then
//    completed (release).
// 6. quiet: wait until completed >= reserved as read at entry; an error CQE at or before
//    that point → RSHMEM_IBGDA_ERR_CQE. fence: a NOP with fence mode FENCE (0x40), which
//    the soft HCA starts only after every earlier WQE of the QP completed, and before
//    every later one; a WQE that must follow the caller's earlier ones (a signal) carries
//    FENCE itself. On a ConnectX the fence waits for the earlier READs and atomics, as
//    the IB fence indicator does, and an RC QP executes WRITEs and atomics at the target
//    in the order posted: what OpenSHMEM's fence and put-then-signal need. A fenced WQE
//    is never proof that earlier WRITEs completed (nothing here takes it as one). The mark is a WQE, not a flag for "the next reservation":
//    with concurrent producers the next reservation may be another thread's, reserved
//    before the caller's earlier WQEs were (a flag could land on a WQE that orders
//    nothing the caller posted).
//
// Every wait is bounded by qp->timeout_ns and returns RSHMEM_IBGDA_ERR_TIMEOUT; a timeout
// while holding an unpublished reservation marks the queue broken (later posts fail at
// once with RSHMEM_IBGDA_ERR_BROKEN instead of waiting behind the hole).
#pragma once

#include <stdint.h>
#if !defined(__CUDACC_RTC__)  // NVRTC declares memcpy itself and has no string.h
#include <string.h>
#endif

#include "rshmem/ibgda/layout.cuh"
#include "rshmem/ibgda/ordering.cuh"
#include "rshmem/mlx5.cuh"
#include "rshmem/qualifiers.cuh"
#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

namespace rshmem {
namespace ibgda {

// Puts of at most this many bytes go inline in a one-WQEBB WQE (ctrl 16 + raddr 16 +
// inline header 4 + 28 = 64 B): no local key needed, the source is read by the producer.
constexpr uint32_t SMALL_INLINE = 28;
// Longest inline payload post_write_inline accepts (the soft HCA's default max_inline).
constexpr uint32_t MAX_INLINE = 256;
constexpr uint32_t MAX_INLINE_WQEBBS = (2 + (MAX_INLINE + 4 + 15) / 16 + 3) / 4;  // 5
// Polls a waiter spins before it checks the clock and starts backing off.
constexpr uint32_t SPIN_POLLS = 256;

// A posted WQE (or batch): its unwrapped index and size (Rust: `Posted`).
struct posted {
  uint64_t index;
  uint32_t wqebbs;
};

#if !RSHMEM_DEVICE_COMPILE
// Host builds only: the CPU test lets the soft HCA know about doorbells and lets waiting
// producers drive it (Rust's `Waker::wake` / `Waker::assist`). Set before producers start.
struct host_hooks {
  void (*doorbell)(void *ctx);  // after every doorbell write
  int (*relax)(void *ctx);      // in a backing-off wait; non-zero = did engine work (no yield)
  void *ctx;
};
inline host_hooks &hooks() {
  static host_hooks h = {nullptr, nullptr, nullptr};
  return h;
}
#endif

// A bounded wait: spin SPIN_POLLS polls, then check the clock on every poll and back off.
struct waiter {
  uint64_t start;
  uint32_t polls;
};
RSHMEM_HOST_DEVICE bool expired(const rshmem_ibgda_qp_t *qp, waiter &w) {
  if (++w.polls < SPIN_POLLS) return false;
  uint64_t t = now_ns();
  if (w.start == 0) {
    w.start = t;
  } else if (t - w.start >= qp->timeout_ns) {
    return true;
  }
#if RSHMEM_DEVICE_COMPILE
  relax();
#else
  if (!(hooks().relax && hooks().relax(hooks().ctx))) relax();
#endif
  return false;
}

// A wait gave up: records what it waited for, for the error report. The first one only:
// a claim (0 -> a marker no wait uses, acquire) makes one thread the writer, which stores
// the index and then `what` (release), so a reader that acquires `what` sees its index,
// never another thread's.
RSHMEM_HOST_DEVICE void note_timeout(rshmem_ibgda_qp_t *qp, uint32_t what, uint64_t index) {
  if (cas_acquire_gpu_u32(&qp->timeout_what, 0, 0xffffffffu)) {
    st_relaxed_gpu_u64(&qp->timeout_index, index);
    st_release_gpu_u32(&qp->timeout_what, what);
  }
}

RSHMEM_HOST_DEVICE uint8_t *slot_addr(const rshmem_ibgda_qp_t *qp, uint64_t index) {
  return (uint8_t *)(uintptr_t)qp->sq + mlx5::slot_offset((uint32_t)index, qp->wqe_cnt);
}

// The control fields of the WQE at `index` (every rshmem WQE requests a CQE).
RSHMEM_HOST_DEVICE mlx5::wqe_ctrl ctrl_at(const rshmem_ibgda_qp_t *qp, uint64_t index,
                                          bool fence) {
  mlx5::wqe_ctrl c;
  c.wqe_index = (uint16_t)index;
  c.qpn = qp->qpn;
  c.fence = fence ? mlx5::fence_mode::fence : mlx5::fence_mode::none;
  c.cq_update = true;
  c.solicited = false;
  return c;
}

// The descriptor of queue `index` in `table` (what rshmem_device_state_t.ibgda points at;
// the queue to PE p is index peers[p].qp), or null when the table is not one (magic,
// version) or the index is out of range — the caller reports that as a bad PE.
RSHMEM_HOST_DEVICE rshmem_ibgda_qp_t *table_qp(const rshmem_ibgda_table_t *table,
                                               uint32_t index) {
  if (table == nullptr || table->magic != RSHMEM_IBGDA_TABLE_MAGIC ||
      table->version != RSHMEM_IBGDA_VERSION || index >= table->n_qps)
    return nullptr;
  return (rshmem_ibgda_qp_t *)(uintptr_t)table->qps + index;
}

// ---- doorbell ---------------------------------------------------------------------------

// Rings the doorbell for everything published so far (if not rung yet). The record never
// moves backwards: ringers take ring_lock (a try-lock retried while someone else rings; the
// holder does a bounded amount of work). Bounded all the same, like every wait: a lock
// word that is never released (a descriptor not zeroed) breaks the queue after the
// timeout instead of hanging, and the waits then report it. Returns
// RSHMEM_IBGDA_ERR_TIMEOUT when it gave up (what was published may never be rung), else OK.
RSHMEM_HOST_DEVICE int ring(rshmem_ibgda_qp_t *qp) {
  waiter w = {0, 0};
  // What this call must see rung: what was published when it started. Later
  // publications are rung by their own publishers; chasing them could keep a thread that
  // keeps losing the lock here until its timeout under a steady stream of posts, and
  // break a healthy queue. Any holder that takes the lock after this point rings at least
  // `target`, so the wait is bounded by one holder's short critical section.
  // Acquire: the WQE stores of every producer that published up to `ready` happen before
  // what we do next (in particular before our record store, which releases them to the
  // NIC: release is cumulative).
  const uint64_t target = ld_acquire_gpu_u64(&qp->ready);
  for (;;) {
    if (ld_acquire_gpu_u64(&qp->rung) >= target) return RSHMEM_IBGDA_OK;
    // Acquire: enter after the previous ringer left (its record store is before ours).
    if (cas_acquire_gpu_u32(&qp->ring_lock, 0, 1)) {
      // Acquire, as for `target`: the holder rings all that is published by now.
      const uint64_t ready = ld_acquire_gpu_u64(&qp->ready);
      if (ld_relaxed_gpu_u64(&qp->rung) < ready) {
        // Release, system scope: the NIC / soft HCA reads WQEs after reading the record,
        // so every WQE store up to `ready` must be visible system-wide before it.
        st_release_sys_u32((uint32_t *)(uintptr_t)(qp->qp_dbrec + 4),
                           mlx5::send_counter((uint32_t)ready).raw);
        // Release, system scope: the doorbell comes after the record it announces. On a
        // NIC it is a UAR register, which takes an MMIO store (ordering.cuh); the soft
        // HCA's doorbell word is memory.
        uint64_t *db = (uint64_t *)(uintptr_t)qp->doorbell;
        const uint64_t word = mlx5::doorbell_word((uint16_t)ready, qp->qpn);
        if (qp->doorbell_mode == RSHMEM_IBGDA_DOORBELL_MMIO) {
          st_release_mmio_sys_u64(db, word);
          // System scope, inside the lock: the next ringer's doorbell (after our release of
          // ring_lock, at GPU scope) must not reach the NIC before ours, which a GPU-scope
          // release alone does not say of an MMIO store. (The Rust producer drains its
          // device store the same way.)
          fence_acq_rel_sys();
        } else {
          st_release_sys_u64(db, word);
        }
        // Release: whoever sees `rung` >= x knows the record holds at least x.
        st_release_gpu_u64(&qp->rung, ready);
      }
      // Release: leave the critical section after our stores.
      st_release_gpu_u32(&qp->ring_lock, 0);
#if !RSHMEM_DEVICE_COMPILE
      if (hooks().doorbell) hooks().doorbell(hooks().ctx);
#endif
      return RSHMEM_IBGDA_OK;
    }
    if (expired(qp, w)) {
      note_timeout(qp, RSHMEM_IBGDA_WAIT_RING, target);
      st_release_gpu_u32(&qp->broken, 1);
      return RSHMEM_IBGDA_ERR_TIMEOUT;
    }
  }
}

// ---- completion queue -------------------------------------------------------------------

// Applies one CQE (bytes 56..63 in w7, read with acquire) at `cqe`: advances *done past the
// WQE it names; false if it names a WQE already retired (collapsed CQ seen again).
RSHMEM_HOST_DEVICE bool retire(rshmem_ibgda_qp_t *qp, const uint8_t *cqe, uint64_t w7,
                               uint64_t *done) {
  // w7 holds CQE bytes 56..63 little-endian: sop_drop_qpn (BE32) @56, wqe_counter (BE16)
  // @60, signature @62, op_own @63.
  uint16_t counter = mlx5::bswap16((uint16_t)(w7 >> 32));
  // In-flight WQEs lie within wqe_cnt <= 2^14 of `done`: a signed 16-bit distance recovers
  // the unwrapped index; a negative one is an old CQE seen again.
  int16_t d = (int16_t)(uint16_t)(counter - (uint16_t)*done);
  if (d < 0) return false;
  uint64_t index = *done + (uint64_t)d;
  // The WQE's size from its own ds: its slots are not reused before `completed` passes
  // them, which only this poller (under cq_lock) advances, after this read. Relaxed: the
  // producer's stores of the slot happen before the CQE we acquired.
  uint32_t qpn_ds = mlx5::bswap32(ld_relaxed_sys_u32((const uint32_t *)(slot_addr(qp, index) + 4)));
  uint32_t n = mlx5::wqebbs(qpn_ds & 0xffu);
  if (n < 1) n = 1;
  if (n > mlx5::MAX_WQEBBS) n = mlx5::MAX_WQEBBS;
  uint8_t cqe_opcode = (uint8_t)(w7 >> 60);
  if ((cqe_opcode == mlx5::CQE_REQ_ERR || cqe_opcode == mlx5::CQE_RESP_ERR) &&
      ld_relaxed_gpu_u32(&qp->first_error) == 0) {
    // Bytes 48..55: vendor_err_synd @54, syndrome @55. Relaxed: ordered after the acquire
    // of w7. (Collapsed CQ: the engine may have rewritten these bytes since; normal-mode
    // CQs give the exact syndrome.)
    uint64_t w6 = ld_relaxed_sys_u64((const uint64_t *)(cqe + 48));
    qp->first_error_syndrome = (uint8_t)(w6 >> 56);
    qp->first_error_vendor = (uint8_t)(w6 >> 48);
    qp->first_error_wqe_opcode = (uint8_t)(mlx5::bswap32((uint32_t)w7) >> 24);
    qp->first_error_cqe_opcode = cqe_opcode;
    qp->first_error_index = index;
    // Release: the fields above are written before anyone sees the flag.
    st_release_gpu_u32(&qp->first_error, 1);
  }
  if (index + n > *done) *done = index + n;
  return true;
}

// Consumes new CQEs (one poller at a time; the others return 0 at once and re-check
// `completed`). Returns the number of CQEs consumed.
RSHMEM_HOST_DEVICE uint32_t poll_cq(rshmem_ibgda_qp_t *qp) {
  if (!cas_acquire_gpu_u32(&qp->cq_lock, 0, 1)) return 0;
  // Relaxed: under the lock; the previous holder's release of the lock orders its stores.
  uint64_t done = ld_relaxed_gpu_u64(&qp->completed);
  const uint8_t *cq = (const uint8_t *)(uintptr_t)qp->cq;
  uint32_t n = 0;
  if (qp->cq_mode == RSHMEM_IBGDA_CQ_NORMAL) {
    uint32_t ci = ld_relaxed_gpu_u32(&qp->cq_ci);
    for (;;) {
      const uint8_t *cqe = cq + (size_t)(ci & (qp->cqe_cnt - 1)) * mlx5::CQE_SIZE;
      // Acquire, system scope: pairs with the NIC's / engine's last (releasing) store of
      // the CQE; the rest of the CQE, and the engine's reads of the WQE's slots and its
      // writes of fetched values, happen before what we do after seeing it.
      uint64_t w7 = ld_acquire_sys_u64((const uint64_t *)(cqe + 56));
      if (!mlx5::sw_owns((uint8_t)(w7 >> 56), ci, qp->cqe_cnt)) break;
      retire(qp, cqe, w7, &done);
      ++ci;
      ++n;
    }
    if (n) {
      st_relaxed_gpu_u32(&qp->cq_ci, ci);
      // Release, system scope: the NIC may overwrite the entries once it sees the new
      // consumer index; our reads of them come first.
      st_release_sys_u32((uint32_t *)(uintptr_t)qp->cq_dbrec, mlx5::cq_consumer_index(ci).raw);
    }
  } else {
    uint64_t w7 = ld_acquire_sys_u64((const uint64_t *)(cq + 56));
    if ((uint8_t)(w7 >> 60) != mlx5::CQE_INVALID && retire(qp, cq, w7, &done)) n = 1;
  }
  if (n) {
    st_relaxed_gpu_u64(&qp->cqes, ld_relaxed_gpu_u64(&qp->cqes) + n);
    // Release: pairs with the acquire loads of `completed` in reserve / wait_index — the
    // NIC's reads of the retired slots and its writes of results (acquired with the CQEs)
    // happen before a producer reuses a slot or reads a result.
    st_release_gpu_u64(&qp->completed, done);
  }
  // Release: the next poller sees our cq_ci / completed.
  st_release_gpu_u32(&qp->cq_lock, 0);
  return n;
}

// ---- producer ---------------------------------------------------------------------------

// Reserves n WQEBBs (one WQE or a batch); on success *index is the first. Waits
// (bounded) until the slots are free.
RSHMEM_HOST_DEVICE int reserve(rshmem_ibgda_qp_t *qp, uint32_t n, uint64_t *index) {
  if (n == 0 || n > qp->wqe_cnt) return RSHMEM_IBGDA_ERR_TOO_BIG;
  // Acquire: a producer that sees the queue broken sees why (the timed-out waiter's state).
  if (ld_acquire_gpu_u32(&qp->broken)) return RSHMEM_IBGDA_ERR_BROKEN;
  // Relaxed: reservations are totally ordered by this read-modify-write alone; nothing is
  // published by it (slot reuse is ordered by the acquire of `completed` below).
  uint64_t idx = fetch_add_relaxed_gpu_u64(&qp->reserved, n);
  *index = idx;
  // Acquire: the NIC finished reading the slots before the CQEs that advanced `completed`.
  if (idx + n <= ld_acquire_gpu_u64(&qp->completed) + qp->wqe_cnt) return RSHMEM_IBGDA_OK;
  waiter w = {0, 0};
  for (;;) {
    // Ring first: the WQEs we wait for may be published but not rung (batching).
    ring(qp);
    poll_cq(qp);
    if (idx + n <= ld_acquire_gpu_u64(&qp->completed) + qp->wqe_cnt) return RSHMEM_IBGDA_OK;
    if (ld_acquire_gpu_u32(&qp->broken)) return RSHMEM_IBGDA_ERR_BROKEN;
    if (expired(qp, w)) {
      // Our reservation can never be published: later producers would wait forever.
      note_timeout(qp, RSHMEM_IBGDA_WAIT_SLOTS, idx + n);
      st_release_gpu_u32(&qp->broken, 1);
      return RSHMEM_IBGDA_ERR_TIMEOUT;
    }
  }
}

// Stores a WQE (or a batch of WQEs) built contiguously at `wqe` into the slots index ..
// index+n, one WQEBB at a time (the ring may wrap between any two). Plain stores: the NIC
// reads them only after the doorbell record published them (see publish and ring).
RSHMEM_HOST_DEVICE void write_wqe(rshmem_ibgda_qp_t *qp, uint64_t index, const uint8_t *wqe,
                                  uint32_t n) {
  for (uint32_t k = 0; k < n; ++k) {
    uint8_t *slot = slot_addr(qp, index + k);
#if RSHMEM_DEVICE_COMPILE
    // Four 16-byte stores per WQEBB (one PCIe write each when the ring is in host memory).
    const uint4 *s = (const uint4 *)(wqe + (size_t)k * mlx5::WQEBB);
    uint4 *d = (uint4 *)slot;
    d[0] = s[0];
    d[1] = s[1];
    d[2] = s[2];
    d[3] = s[3];
#else
    memcpy(slot, wqe + (size_t)k * mlx5::WQEBB, mlx5::WQEBB);
#endif
  }
}

// Publishes the reservation index .. index+n in order, and rings if no one reserved after
// it (a later producer rings when it publishes; every waiter rings before it waits).
RSHMEM_HOST_DEVICE int publish(rshmem_ibgda_qp_t *qp, uint64_t index, uint32_t n) {
  // acq_rel, system scope: our WQE stores (and, in a warp batch, the lanes' stores we
  // synchronised with) are ordered before the release of `ready` and so before whichever
  // producer's doorbell-record store publishes them to the NIC.
  fence_acq_rel_sys();
  if (ld_acquire_gpu_u64(&qp->ready) != index) {
    waiter w = {0, 0};
    // Acquire: the chain of ready heads stays ordered for whoever reads ours.
    while (ld_acquire_gpu_u64(&qp->ready) != index) {
      if (ld_acquire_gpu_u32(&qp->broken)) return RSHMEM_IBGDA_ERR_BROKEN;
      if (expired(qp, w)) {
        note_timeout(qp, RSHMEM_IBGDA_WAIT_PUBLISH, index);
        st_release_gpu_u32(&qp->broken, 1);
        return RSHMEM_IBGDA_ERR_TIMEOUT;
      }
    }
  }
  // Release: the WQE bytes (and everything earlier producers published, which we acquired)
  // happen before whatever acquires this head — the ringer.
  st_release_gpu_u64(&qp->ready, index + n);
  // Relaxed: a batching hint; if a later reservation exists, its producer will publish
  // after us (it waits for ready == its index) and ring then.
  // A ring that gave up fails this post: its WQE is published but may never be rung
  // (before 2026-12-07 the post returned OK, and a put with no later quiet was lost
  // without a word).
  if (ld_relaxed_gpu_u64(&qp->reserved) == index + n) return ring(qp);
  return RSHMEM_IBGDA_OK;
}

// Waits until every WQEBB before `end` completed; RSHMEM_IBGDA_ERR_CQE if the QP entered
// the error state at or before it.
RSHMEM_HOST_DEVICE int wait_index(rshmem_ibgda_qp_t *qp, uint64_t end) {
  // Acquire: pairs with poll_cq's release — the results of the completed WQEs are visible.
  if (ld_acquire_gpu_u64(&qp->completed) < end) {
    ring(qp);
    waiter w = {0, 0};
    for (;;) {
      poll_cq(qp);
      if (ld_acquire_gpu_u64(&qp->completed) >= end) break;
      // A broken queue (a reservation that will never be published, or a doorbell lock
      // never released): what we wait for may never complete, and every later post
      // fails anyway (before 2026-12-07 this waited out a second timeout).
      if (ld_acquire_gpu_u32(&qp->broken)) return RSHMEM_IBGDA_ERR_BROKEN;
      if (expired(qp, w)) {
        note_timeout(qp, RSHMEM_IBGDA_WAIT_COMPLETE, end);
        return RSHMEM_IBGDA_ERR_TIMEOUT;
      }
    }
  }
  // Acquire: pairs with the release of the flag in retire (the fields are valid). A
  // collapsed CQ may show a later WR_FLUSH CQE instead of the first error (the engine
  // rewrites CQE 0), so there any error fails every wait; a normal CQ names the exact WQE.
  if (ld_acquire_gpu_u32(&qp->first_error) &&
      (qp->first_error_index < end || qp->cq_mode == RSHMEM_IBGDA_CQ_COLLAPSED))
    return RSHMEM_IBGDA_ERR_CQE;
  return RSHMEM_IBGDA_OK;
}

// Waits until the WQE(s) `p` completed.
RSHMEM_HOST_DEVICE int wait_posted(rshmem_ibgda_qp_t *qp, posted p) {
  return wait_index(qp, p.index + p.wqebbs);
}

// Waits until everything reserved before the call has completed (OpenSHMEM quiet).
RSHMEM_HOST_DEVICE int quiet(rshmem_ibgda_qp_t *qp) {
  // Acquire: reservations made before this load (by this thread, or observed by it) are
  // covered; their producers publish them even while we wait (every waiter rings).
  return wait_index(qp, ld_acquire_gpu_u64(&qp->reserved));
}


// ---- posting ---------------------------------------------------------------------------

// WQEBBs of an inline RDMA WRITE of len bytes.
RSHMEM_HOST_DEVICE uint32_t write_inline_wqebbs(uint32_t len) {
  return mlx5::wqebbs(2 + mlx5::inline_ds(len));
}

// Reserve n WQEBBs, build with `build(buf, ctrl)` into a local buffer of MAXBB WQEBBs,
// store, publish. The local buffer keeps the WQE in registers for fixed-size WQEs and
// turns the ring stores into 16-byte stores. `fenced`: the WQE carries fence mode FENCE
// (ordered after every earlier WQE of the QP at the target; see step 6 above).
template <uint32_t MAXBB, typename Build>
RSHMEM_HOST_DEVICE int post(rshmem_ibgda_qp_t *qp, uint32_t n, const Build &build,
                            posted *out, bool fenced = false) {
  if (n > MAXBB) return RSHMEM_IBGDA_ERR_TOO_BIG;
  uint64_t idx;
  int st = reserve(qp, n, &idx);
  if (st != RSHMEM_IBGDA_OK) return st;
  alignas(16) uint8_t buf[MAXBB * mlx5::WQEBB];
  build(buf, ctrl_at(qp, idx, fenced));
  write_wqe(qp, idx, buf, n);
  if (out) {
    out->index = idx;
    out->wqebbs = n;
  }
  return publish(qp, idx, n);
}

// OpenSHMEM fence on this QP: a NOP with fence mode FENCE. Every WQE reserved before the
// call (the caller's earlier ones included) takes effect at the target before any WQE
// reserved after it (the caller's later ones): on the soft HCA the NOP starts after the
// earlier WQEs completed; on a ConnectX, RC order plus the fence (step 6). One WQEBB. The
// NOP's index is recorded in last_fence (see fence_needed).
RSHMEM_HOST_DEVICE int fence(rshmem_ibgda_qp_t *qp, posted *out = nullptr) {
  posted p = {0, 0};
  const int st =
      post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) { mlx5::nop(b, c); }, &p, true);
  // Release: whoever acquires this value and then reserves comes after the NOP's
  // reservation in `reserved`'s order (its own fetch-add happens after ours).
  if (st == RSHMEM_IBGDA_OK) fetch_max_release_gpu_u64(&qp->last_fence, p.index + 1);
  if (out) *out = p;
  return st;
}

// Whether the calling thread's fence needs a NOP on this QP: not when every WQE reserved
// so far completed (nothing to order), nor when the latest reservation so far is a FENCEd
// NOP (last_fence >= reserved: no WQE starts at or after the NOP's end, so every other
// one lies below it, the caller's earlier ones included, which are below `reserved` as
// read here since its own fetch-adds come first in that word's order; its later ones
// will be reserved after that NOP, whose reservation happens before the release of
// last_fence acquired here). Saves a warp of fencing threads 31 NOPs.
RSHMEM_HOST_DEVICE bool fence_needed(rshmem_ibgda_qp_t *qp) {
  // Acquire all three: `reserved` covers this thread's reservations; `completed` pairs
  // with poll_cq's release; `last_fence` with fence's release.
  const uint64_t end = ld_acquire_gpu_u64(&qp->reserved);
  if (ld_acquire_gpu_u64(&qp->completed) >= end) return false;
  return ld_acquire_gpu_u64(&qp->last_fence) < end;
}

// RDMA WRITE of `bytes` from registered local memory (laddr, lkey). One WQEBB.
RSHMEM_HOST_DEVICE int post_write(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                  uint64_t laddr, uint32_t lkey, uint32_t bytes,
                                  posted *out = nullptr) {
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::rdma_write(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::make_data_seg(bytes, lkey, laddr));
  }, out);
}

// RDMA WRITE with the payload inline, len <= SMALL_INLINE: one WQEBB. `fenced`: after
// every earlier WQE of the QP (a signal SET).
RSHMEM_HOST_DEVICE int post_write_inline_small(rshmem_ibgda_qp_t *qp, uint64_t raddr,
                                               uint32_t rkey, const void *data, uint32_t len,
                                               posted *out = nullptr, bool fenced = false) {
  if (len > SMALL_INLINE) return RSHMEM_IBGDA_ERR_TOO_BIG;
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::rdma_write_inline(b, c, mlx5::make_raddr_seg(raddr, rkey), data, len);
  }, out, fenced);
}

// RDMA WRITE with the payload inline, len <= MAX_INLINE (up to 5 WQEBBs).
RSHMEM_HOST_DEVICE int post_write_inline(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                         const void *data, uint32_t len,
                                         posted *out = nullptr) {
  if (len > MAX_INLINE) return RSHMEM_IBGDA_ERR_TOO_BIG;
  return post<MAX_INLINE_WQEBBS>(qp, write_inline_wqebbs(len), [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::rdma_write_inline(b, c, mlx5::make_raddr_seg(raddr, rkey), data, len);
  }, out);
}

// put: inline when small (the producer reads the source), else an SGE WRITE.
RSHMEM_HOST_DEVICE int put(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                           uint64_t laddr, uint32_t lkey, uint32_t bytes,
                           posted *out = nullptr) {
  if (bytes <= SMALL_INLINE)
    return post_write_inline_small(qp, raddr, rkey, (const void *)(uintptr_t)laddr, bytes, out);
  return post_write(qp, raddr, rkey, laddr, lkey, bytes, out);
}

// RDMA READ of `bytes` into registered local memory (laddr, lkey). One WQEBB.
RSHMEM_HOST_DEVICE int post_read(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                 uint64_t laddr, uint32_t lkey, uint32_t bytes,
                                 posted *out = nullptr) {
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::rdma_read(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::make_data_seg(bytes, lkey, laddr));
  }, out);
}

// 8-byte fetch-add; the old value lands at (result, lkey) in host byte order (fetched_u64).
// One WQEBB.
// `fenced`: after every earlier WQE of the QP (a signal ADD).
RSHMEM_HOST_DEVICE int post_atomic_fa(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                      uint64_t result, uint32_t lkey, uint64_t add,
                                      posted *out = nullptr, bool fenced = false) {
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::atomic_fa(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::sge8{result, lkey}, add);
  }, out, fenced);
}

// 8-byte compare-and-swap; the old value lands at (result, lkey) in host byte order. One
// WQEBB.
RSHMEM_HOST_DEVICE int post_atomic_cs(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                      uint64_t result, uint32_t lkey, uint64_t compare,
                                      uint64_t swap, posted *out = nullptr) {
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::atomic_cs(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::sge8{result, lkey}, compare, swap);
  }, out);
}

// 4-byte masked fetch-add (field boundary 0 = a plain 32-bit fetch-add). One WQEBB.
RSHMEM_HOST_DEVICE int post_masked_fa32(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                        uint64_t result, uint32_t lkey, uint32_t add,
                                        uint32_t field_boundary, posted *out = nullptr) {
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::masked_fa32(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::sge8{result, lkey}, add,
                      field_boundary);
  }, out);
}

// 4-byte masked compare-and-swap. One WQEBB.
RSHMEM_HOST_DEVICE int post_masked_cs32(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                        uint64_t result, uint32_t lkey, uint32_t swap,
                                        uint32_t compare, uint32_t swap_mask,
                                        uint32_t compare_mask, posted *out = nullptr) {
  return post<1>(qp, 1, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::masked_cs32(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::sge8{result, lkey}, swap,
                      compare, swap_mask, compare_mask);
  }, out);
}

// 8-byte masked compare-and-swap. Two WQEBBs.
RSHMEM_HOST_DEVICE int post_masked_cs64(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                        uint64_t result, uint32_t lkey, uint64_t swap,
                                        uint64_t compare, uint64_t swap_mask,
                                        uint64_t compare_mask, posted *out = nullptr) {
  return post<2>(qp, 2, [&](uint8_t *b, const mlx5::wqe_ctrl &c) {
    mlx5::masked_cs64(b, c, mlx5::make_raddr_seg(raddr, rkey), mlx5::sge8{result, lkey}, swap,
                      compare, swap_mask, compare_mask);
  }, out);
}

// put with signal: WRITE (inline when bytes <= SMALL_INLINE) then, FENCEd so it lands
// after the data, the signal update of the 8-byte word at sig_raddr (same rkey: the signal
// lives in the same remote heap): RSHMEM_SIGNAL_ADD =
// ATOMIC_FA (old value to (scratch, scratch_lkey), 8 bytes), RSHMEM_SIGNAL_SET = an
// 8-byte inline WRITE of the value. One reservation of two WQEBBs (one doorbell).
// scratch has a key of its own: it is not in the source's region (the device API's
// discard slot lives with the result slots; with the source's lkey the NIC refuses the
// FA with LOCAL_PROT).
RSHMEM_HOST_DEVICE int put_signal(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                  uint64_t laddr, uint32_t lkey, uint32_t bytes,
                                  uint64_t sig_raddr, uint64_t sig_value, uint32_t sig_op,
                                  uint64_t scratch, uint32_t scratch_lkey,
                                  posted *out = nullptr) {
  uint64_t idx;
  int st = reserve(qp, 2, &idx);
  if (st != RSHMEM_IBGDA_OK) return st;
  alignas(16) uint8_t buf[2 * mlx5::WQEBB];
  mlx5::raddr_seg r = mlx5::make_raddr_seg(raddr, rkey);
  if (bytes <= SMALL_INLINE)
    mlx5::rdma_write_inline(buf, ctrl_at(qp, idx, false), r, (const void *)(uintptr_t)laddr, bytes);
  else
    mlx5::rdma_write(buf, ctrl_at(qp, idx, false), r, mlx5::make_data_seg(bytes, lkey, laddr));
  mlx5::wqe_ctrl c2 = ctrl_at(qp, idx + 1, true);
  mlx5::raddr_seg s = mlx5::make_raddr_seg(sig_raddr, rkey);
  if (sig_op == RSHMEM_SIGNAL_ADD)
    mlx5::atomic_fa(buf + mlx5::WQEBB, c2, s, mlx5::sge8{scratch, scratch_lkey}, sig_value);
  else
    mlx5::rdma_write_inline(buf + mlx5::WQEBB, c2, s, &sig_value, 8);
  write_wqe(qp, idx, buf, 2);
  if (out) {
    out->index = idx;
    out->wqebbs = 2;
  }
  return publish(qp, idx, 2);
}

// A fetched value read after its WQE completed, as the NIC writes it: an 8-byte result in
// host byte order (the mlx5 driver puts ConnectX in host-endianness mode for 8-byte atomic
// responses, and reports atomics to verbs only then), a 4-byte (masked) result big-endian.
// NVSHMEM's IBGDA reads them the same way. (Before 2026-12-06 both were swapped, which a
// real NIC would have answered byte-swapped; the soft HCA writes them alike.)
RSHMEM_HOST_DEVICE uint64_t fetched_u64(uint64_t result) {
  // Relaxed, system scope: the NIC wrote it before the CQE that wait_index acquired.
  return ld_relaxed_sys_u64((const uint64_t *)(uintptr_t)result);
}
RSHMEM_HOST_DEVICE uint32_t fetched_u32(uint64_t result) {
  return mlx5::bswap32(ld_relaxed_sys_u32((const uint32_t *)(uintptr_t)result));
}

// Blocking 8-byte fetch-add: posts, waits for the completion, returns the old value.
RSHMEM_HOST_DEVICE int fetch_add(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                 uint64_t result, uint32_t lkey, uint64_t add, uint64_t *old) {
  posted p;
  int st = post_atomic_fa(qp, raddr, rkey, result, lkey, add, &p);
  if (st == RSHMEM_IBGDA_OK) st = wait_posted(qp, p);
  if (st == RSHMEM_IBGDA_OK) *old = fetched_u64(result);
  return st;
}

// Blocking 8-byte compare-and-swap: returns the old value.
RSHMEM_HOST_DEVICE int compare_swap(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                    uint64_t result, uint32_t lkey, uint64_t compare,
                                    uint64_t swap, uint64_t *old) {
  posted p;
  int st = post_atomic_cs(qp, raddr, rkey, result, lkey, compare, swap, &p);
  if (st == RSHMEM_IBGDA_OK) st = wait_posted(qp, p);
  if (st == RSHMEM_IBGDA_OK) *old = fetched_u64(result);
  return st;
}

// Blocking get: READ, then wait for its completion (the bytes are at laddr).
RSHMEM_HOST_DEVICE int get(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                           uint64_t laddr, uint32_t lkey, uint32_t bytes) {
  posted p;
  int st = post_read(qp, raddr, rkey, laddr, lkey, bytes, &p);
  if (st == RSHMEM_IBGDA_OK) st = wait_posted(qp, p);
  return st;
}

// A short name for a status (messages).
// What a timed-out wait waited for (rshmem_ibgda_qp_t.timeout_what).
RSHMEM_HOST_DEVICE const char *wait_name(uint32_t what) {
  switch (what) {
    case RSHMEM_IBGDA_WAIT_SLOTS: return "free slots (earlier WQEs to complete)";
    case RSHMEM_IBGDA_WAIT_PUBLISH: return "earlier producers to publish";
    case RSHMEM_IBGDA_WAIT_COMPLETE: return "WQEs to complete";
    case RSHMEM_IBGDA_WAIT_RING: return "the doorbell lock";
    default: return "an unknown wait";
  }
}

RSHMEM_HOST_DEVICE const char *status_name(int status) {
  switch (status) {
    case RSHMEM_IBGDA_OK: return "ok";
    case RSHMEM_IBGDA_ERR_TIMEOUT: return "timed out";
    case RSHMEM_IBGDA_ERR_CQE: return "error completion";
    case RSHMEM_IBGDA_ERR_BROKEN: return "queue broken by an earlier timeout";
    case RSHMEM_IBGDA_ERR_TOO_BIG: return "WQE too big for the queue";
    default: return "unknown status";
  }
}

#if RSHMEM_DEVICE_COMPILE || defined(RSHMEM_EMULATED_DEVICE)
// ---- device only -------------------------------------------------------------------------
// (and the CPU emulation of GPU threads, host/tests/device-emu/, which defines
// RSHMEM_EMULATED_DEVICE and provides the warp intrinsics, blockIdx, threadIdx, printf and
// __trap, so that it runs this very code)

// This thread's lane as __activemask() numbers lanes: %laneid (threadIdx.x & 31 differs
// from it in blocks whose x extent is not a multiple of 32); the emulation's warps are 32
// consecutive threadIdx.x.
RSHMEM_DEVICE uint32_t warp_lane() {
#if RSHMEM_DEVICE_COMPILE
  uint32_t l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
#else
  return threadIdx.x & 31u;
#endif
}

// Warp-batched RDMA WRITE: every active lane posts its own WRITE, but the warp makes one
// reservation (leader: atomicAdd of the lane count) and one publish / doorbell. Returns the
// status to every lane. The ring must hold at least 32 WQEBBs.
RSHMEM_DEVICE int post_write_warp(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                  uint64_t laddr, uint32_t lkey, uint32_t bytes) {
  const unsigned mask = __activemask();
  const unsigned lane = warp_lane();
  const int leader = __ffs(mask) - 1;
  const uint32_t count = (uint32_t)__popc(mask);
  const uint32_t rank = (uint32_t)__popc(mask & ((1u << lane) - 1u));
  uint64_t idx = 0;
  int st = RSHMEM_IBGDA_OK;
  if ((int)lane == leader) st = reserve(qp, count, &idx);
  st = __shfl_sync(mask, st, leader);
  if (st != RSHMEM_IBGDA_OK) return st;
  idx = __shfl_sync(mask, idx, leader);
  alignas(16) uint8_t buf[mlx5::WQEBB];
  mlx5::rdma_write(buf, ctrl_at(qp, idx + rank, false),
                   mlx5::make_raddr_seg(raddr, rkey), mlx5::make_data_seg(bytes, lkey, laddr));
  write_wqe(qp, idx + rank, buf, 1);
  // Each lane's WQE stores before the leader's publication: fence (system scope) in every
  // lane, then the warp barrier (which orders memory among the participating lanes).
  fence_acq_rel_sys();
  __syncwarp(mask);
  if ((int)lane == leader) st = publish(qp, idx, count);
  return __shfl_sync(mask, st, leader);
}

// Writes the device error record for a failed queue operation and traps. The record's
// wait fields are reused: addr = the descriptor, expected = the WQE index concerned (the
// failed WQE for an error CQE, else the reservation head), observed = completed, cmp =
// status | syndrome << 8 | WQE opcode << 16 | CQE opcode << 24.
// `claim` (may be null) is the word that makes one failing thread the record's only
// writer: the device API passes the one rshmemi_fail uses, so a queue failure and, say, a
// bad-PE trap at the same moment never mix their fields. Without it, the first reporter
// that sees the record empty fills it (two at once may mix fields; the trap ends the
// kernel either way).
// Out of line and noreturn: the cold path (printf's call ABI) costs the hot loop nothing.
inline __device__ __noinline__ __attribute__((noreturn)) void fail(rshmem_ibgda_qp_t *qp, int status,
                                                           rshmem_device_error_t *rec, int pe,
                                                           uint32_t *claim = nullptr) {
  const bool cqe = status == RSHMEM_IBGDA_ERR_CQE;
  // The timeout fields describe this failure only when it is a timeout, or a queue broken
  // by one; other statuses (a WQE too big, ...) name the reservation head.
  const bool timed = status == RSHMEM_IBGDA_ERR_TIMEOUT || status == RSHMEM_IBGDA_ERR_BROKEN;
  // Acquire: pairs with note_timeout's release (the index is the same wait's). All ones is
  // the claim of a thread still writing the fields (threads time out together when the NIC
  // stalls): wait a bounded moment for it, then name no wait rather than a half record.
  uint32_t waited = 0;
  if (timed) {
    waited = ld_acquire_gpu_u32(&qp->timeout_what);
    for (int spin = 0; waited == 0xffffffffu && spin < 100000; ++spin)
      waited = ld_acquire_gpu_u32(&qp->timeout_what);
    if (waited == 0xffffffffu) waited = 0;
  }
  // A timeout (or a queue broken by one) names the index the wait was for.
  const uint64_t expected = cqe ? qp->first_error_index
                                : (waited ? ld_relaxed_gpu_u64(&qp->timeout_index)
                                          : ld_relaxed_gpu_u64(&qp->reserved));
  const uint64_t observed = ld_relaxed_gpu_u64(&qp->completed);
  const uint32_t detail = (uint32_t)status | (uint32_t)qp->first_error_syndrome << 8 |
                          (uint32_t)qp->first_error_wqe_opcode << 16 |
                          (uint32_t)qp->first_error_cqe_opcode << 24;
  // Acquire, GPU scope: every contender is a thread of this PE's kernels on this GPU (the
  // claim word is in this PE's sync region); the winner fills the record after winning,
  // and the claim is never released (the kernel traps).
  const bool mine = rec && (claim ? cas_acquire_gpu_u32(claim, 0, 1)
                                  : *(volatile uint32_t *)&rec->code == RSHMEM_DEVICE_ERR_NONE);
  if (mine) {
    rec->pe = pe;
    rec->addr = (uint64_t)(uintptr_t)qp;
    rec->expected = expected;
    rec->observed = observed;
    rec->cmp = detail;
    // Linear indices (x fastest), as rshmemi_fail writes them.
    rec->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    rec->thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    __threadfence_system();
    // Volatile: the code is the record's "valid" flag, stored last.
    *(volatile uint32_t *)&rec->code =
        status == RSHMEM_IBGDA_ERR_TIMEOUT ? RSHMEM_DEVICE_ERR_WAIT_TIMEOUT : RSHMEM_DEVICE_ERR_QUEUE;
    __threadfence_system();
  }
  if (cqe || !waited) {
    printf("rshmem: PE %d: IBGDA QP 0x%x: %s (syndrome 0x%02x, WQE opcode 0x%02x, index %llu; "
           "reserved %llu, completed %llu)\n",
           pe, qp->qpn, status_name(status), qp->first_error_syndrome, qp->first_error_wqe_opcode,
           (unsigned long long)expected, (unsigned long long)ld_relaxed_gpu_u64(&qp->reserved),
           (unsigned long long)observed);
  } else {
    // Which wait gave up and the producer state: tells a reservation never published
    // (ready stuck below it) from one published but not rung (rung < ready) from one
    // rung that the NIC never completed (completed < rung).
    printf("rshmem: PE %d: IBGDA QP 0x%x: %s: timed out waiting for %s (index %llu; reserved "
           "%llu, ready %llu, rung %llu, completed %llu)\n",
           pe, qp->qpn, status_name(status), wait_name(waited), (unsigned long long)expected,
           (unsigned long long)ld_relaxed_gpu_u64(&qp->reserved),
           (unsigned long long)ld_relaxed_gpu_u64(&qp->ready),
           (unsigned long long)ld_relaxed_gpu_u64(&qp->rung), (unsigned long long)observed);
  }
  __trap();
}

// Traps (with the error record) unless status is RSHMEM_IBGDA_OK.
RSHMEM_DEVICE void check(rshmem_ibgda_qp_t *qp, int status, rshmem_device_error_t *rec, int pe,
                         uint32_t *claim = nullptr) {
  if (status != RSHMEM_IBGDA_OK) fail(qp, status, rec, pe, claim);
}
#endif

}  // namespace ibgda
}  // namespace rshmem
