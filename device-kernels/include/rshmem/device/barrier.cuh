// rshmem/device/barrier.cuh — device-side barriers over all PEs.
//
// Owns: rshmem_barrier_all / rshmem_sync_all (device-wide: every thread of every block of
// the launch on every PE calls them; needs a co-resident grid, i.e. a collective launch)
// rshmem_barrier_all_block / rshmem_sync_all_block (exactly one block per PE calls them,
// all of its threads) and rshmem_barrier_all_warp / rshmem_sync_all_warp (exactly one
// warp per PE, all its lanes). The words they use live in the device sync scratch; the
// layout is in rshmem/device/layout.cuh.
// Must not: be included by host C++ (device-only; rshmem/rshmem.cuh includes it under nvcc).
//
// rshmem-check: device-only (device function bodies; see rshmem/rshmem.cuh)
//
// Semantics (OpenSHMEM/NVSHMEM): barrier_all = quiet (every calling thread's puts, AMOs
// and signals complete) + sync; sync_all = the synchronisation only: no thread leaves
// before every PE arrived, and local stores made before the sync are visible to every PE
// after it. Every PE must make the same sequence of these calls (they share one epoch
// counter). Every wait is bounded (RSHMEM_TIMEOUT_MS): a grid that is not co-resident, or
// a PE that never arrives, traps with the word it waited for instead of hanging.
//
// Algorithm.
//  PE level (one block, or one warp): thread 0 takes the next epoch e (pe_epoch + 1) and
//  the group gets it; thread i announces e to PEs i, i + group size, ... (release store of
//  e into arrival[my_pe] in that PE's scratch, system scope) and then waits for
//  arrival[i] >= e in its own scratch (acquire, system scope); a __syncthreads
//  (__syncwarp) ends it. Arrival words only grow: no reset, no race
//  between consecutive barriers.
//  Device-wide: each block's thread 0 reads grid_gen, then adds 1 to grid_arrive (acq_rel,
//  .gpu: only this PE's blocks touch these words and they share the GPU's L2). The block
//  that brings it to the grid size runs the PE-level step with all its threads, stores 0
//  to grid_arrive and then releases grid_gen + 1; the other blocks wait until grid_gen
//  differs from what they read. The acquire/release chain (block writes -> grid_arrive ->
//  last block -> arrival words of all PEs -> grid_gen -> every block) carries causality.
#pragma once

#include <stdint.h>

#include "rshmem/device/core.cuh"
#include "rshmem/device/rma.cuh"

#if defined(__CUDACC__)

// Takes this PE's next barrier epoch (one thread of the one group per PE that runs the
// PE-level step). Only one group per PE runs it at a time (it is collective), so the
// increment is uncontended; atomic so that its value carries over to whichever block or
// warp runs the next barrier (another one, or the next kernel launch).
RSHMEM_DEVICE uint64_t rshmemi_take_epoch(uint64_t base, const char *what) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  if (static_cast<uint64_t>(s.n_pes) > rshmemi_sync_max_pes(s.sync_bytes))
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, s.n_pes, base, s.sync_bytes, 0, 0, what,
                 "too many PEs for the device sync scratch");
  return rshmemi_atom_add(reinterpret_cast<uint64_t *>(base + RSHMEMI_SYNC_PE_EPOCH), 1ull) + 1;
}

// Stores epoch e into the word at symmetric address `word` on PE `pe`, so that what this
// thread stored or synchronised with before is visible to PE `pe` once it sees e. Used by
// every barrier: one writer per word, values only grow.
RSHMEM_DEVICE void rshmemi_announce(uint64_t *word, uint64_t e, int pe, const char *what) {
  const rshmemi_target_t t = rshmemi_resolve(word, 8, pe, what);
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P:
      // Release: this thread's earlier stores, and everything it synchronised with (the
      // block or warp barrier, the grid counters), are visible to PE `pe` once it sees e.
      rshmemi_st_release_sys(reinterpret_cast<uint64_t *>(t.addr), e);
      return;
    case RSHMEM_TRANSPORT_IBGDA:
      // An 8-byte inline RDMA WRITE of e. Publishing the WQE fences at system scope
      // (queue.cuh publish), so what this thread stored or synchronised with before is
      // visible before the engine executes the write; a barrier's quiet already
      // completed the PE's earlier WQEs.
      if (RSHMEMI_IBGDA_ENABLED) {
        rshmemi_ibgda_p(pe, reinterpret_cast<uint64_t>(word), e, 8, what);
        return;
      }
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(word), 8, what);
  }
}

// Waits (bounded) until this PE's word at `word` holds at least e. Acquire: pairs with
// the announcing thread's release (or the engine's write after the fenced WQE).
RSHMEM_DEVICE void rshmemi_await_epoch(const uint64_t *word, uint64_t e, const char *what) {
  rshmemi_poll<uint64_t>(word, RSHMEM_CMP_GE, e, [word] { return rshmemi_ld_acquire_sys(word); }, what);
}

// The PE-level exchange (see above): thread `rank` of the `size` threads of the group
// announces epoch e to PEs rank, rank + size, ... and then waits for their arrival words.
// The group has synchronised before (its earlier stores are ordered before each
// thread's release) and synchronises after.
RSHMEM_DEVICE void rshmemi_pe_exchange(uint64_t base, uint64_t e, uint32_t rank, uint32_t size, const char *what) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  uint64_t *slot = reinterpret_cast<uint64_t *>(base + rshmemi_sync_arrival_offset(s.my_pe));
  for (uint32_t p = rank; p < static_cast<uint32_t>(s.n_pes); p += size)
    rshmemi_announce(slot, e, static_cast<int>(p), what);
  for (uint32_t p = rank; p < static_cast<uint32_t>(s.n_pes); p += size)
    rshmemi_await_epoch(reinterpret_cast<const uint64_t *>(base + rshmemi_sync_arrival_offset(static_cast<int>(p))),
                        e, what);
}

// One block synchronises with one block of every other PE (see above). All threads of the
// block call it.
RSHMEM_DEVICE void rshmemi_pe_sync_block(const char *what) {
  __shared__ uint64_t rshmemi_epoch;
  rshmemi_require_bound(what);
  const uint32_t tid = rshmemi_block_thread();
  const uint64_t base = rshmemi_sync_base();
  if (tid == 0) rshmemi_epoch = rshmemi_take_epoch(base, what);
  __syncthreads();
  rshmemi_pe_exchange(base, rshmemi_epoch, tid, rshmemi_block_threads(), what);
  __syncthreads();
}

// One warp synchronises with one warp of every other PE: as the block step, with
// __syncwarp (which orders memory among the warp's lanes, as __syncthreads does for a
// block) and the epoch passed by a shuffle. Every lane of the warp calls it (fewer than 32
// in a block's last partial warp: rshmemi_warp_lanes).
RSHMEM_DEVICE void rshmemi_pe_sync_warp(const char *what) {
  rshmemi_require_bound(what);
  const uint32_t lane = rshmemi_lane();
  const uint64_t base = rshmemi_sync_base();
  const uint32_t mask = rshmemi_warp_mask();
  __syncwarp(mask);
  uint64_t e = 0;
  if (lane == 0) e = rshmemi_take_epoch(base, what);
  e = __shfl_sync(mask, e, 0);
  rshmemi_pe_exchange(base, e, lane, rshmemi_warp_lanes(), what);
  __syncwarp(mask);
}

// All threads of all blocks of the launch (co-resident grid) call it.
RSHMEM_DEVICE void rshmemi_grid_sync(const char *what) {
  __shared__ uint32_t rshmemi_last;
  __shared__ uint32_t rshmemi_gen;
  rshmemi_require_bound(what);
  const uint64_t base = rshmemi_sync_base();
  uint32_t *arrive = reinterpret_cast<uint32_t *>(base + RSHMEMI_SYNC_GRID_ARRIVE);
  uint32_t *gen = reinterpret_cast<uint32_t *>(base + RSHMEMI_SYNC_GRID_GEN);
  const uint32_t tid = rshmemi_block_thread();
  __syncthreads();
  if (tid == 0) {
    // Read the generation before arriving: it cannot advance until this block arrived.
    const uint32_t g = rshmemi_ld_acquire_gpu(gen);
    rshmemi_gen = g;
    rshmemi_last = rshmemi_atom_add_gpu(arrive, 1u) == rshmemi_grid_blocks() - 1 ? 1u : 0u;
  }
  __syncthreads();
  if (rshmemi_last) {
    rshmemi_pe_sync_block(what);
    if (tid == 0) {
      rshmemi_st_relaxed_gpu(arrive, 0u);  // ordered before the release below
      rshmemi_st_release_gpu(gen, rshmemi_gen + 1u);
    }
  } else if (tid == 0) {
    const uint32_t g = rshmemi_gen;
    rshmemi_poll<uint32_t>(gen, RSHMEM_CMP_NE, g, [gen] { return rshmemi_ld_acquire_gpu(gen); }, what);
  }
  __syncthreads();
}

// quiet + device-wide sync. Every thread of every block of the (co-resident) launch calls.
RSHMEM_DEVICE void rshmem_barrier_all() {
  rshmem_quiet();
  rshmemi_grid_sync("rshmem_barrier_all");
}

// Device-wide sync without quiet. Every thread of every block calls.
RSHMEM_DEVICE void rshmem_sync_all() { rshmemi_grid_sync("rshmem_sync_all"); }

// quiet + sync of one block per PE (every thread of that block calls; other blocks of the
// launch must not call a barrier at the same time).
RSHMEM_DEVICE void rshmem_barrier_all_block() {
  rshmem_quiet();
  rshmemi_pe_sync_block("rshmem_barrier_all_block");
}

RSHMEM_DEVICE void rshmem_sync_all_block() {
  __syncthreads();
  rshmemi_pe_sync_block("rshmem_sync_all_block");
}

// quiet + sync of one warp per PE (all lanes of that warp call; no other warp or block
// of the launch may call a barrier at the same time).
RSHMEM_DEVICE void rshmem_barrier_all_warp() {
  rshmem_quiet();
  rshmemi_pe_sync_warp("rshmem_barrier_all_warp");
}

RSHMEM_DEVICE void rshmem_sync_all_warp() { rshmemi_pe_sync_warp("rshmem_sync_all_warp"); }

#endif  // __CUDACC__
