// rshmem/device/layout.cuh — the pure arithmetic of the device API, shared with host C++.
//
// Owns: heap bounds and symmetric-address translation, the comparison predicate of the
// wait/test family, and the layout of the device sync scratch (the 32 KiB at
// state.sync_offset). Everything here is RSHMEM_HOST_DEVICE and side-effect free, so
// device-kernels/tests/host_logic_test.cpp checks it with g++ (scripts/check-device-code).
// Must not: use CUDA intrinsics, inline PTX or touch memory.
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"
#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

// True when [addr, addr + len) lies inside [base, base + size). Overflow-safe: a range
// that wraps around the address space is outside. A zero-length range is inside when addr
// is inside or equal to the end (an empty put at the very end of the heap is allowed).
RSHMEM_HOST_DEVICE bool rshmemi_range_in_heap(uint64_t base, uint64_t size, uint64_t addr,
                                              uint64_t len) {
  if (addr < base) return false;
  const uint64_t off = addr - base;
  if (off > size) return false;
  return len <= size - off;
}

// A symmetric address is an address in this PE's heap; the same object on `peer` lives at
// the same offset from the peer's heap base as this context maps it.
RSHMEM_HOST_DEVICE uint64_t rshmemi_translate(uint64_t my_base, uint64_t peer_base,
                                              uint64_t addr) {
  return peer_base + (addr - my_base);
}

// `value <cmp> target` for the wait/test family (rshmem_cmp_t values from types.cuh). An
// unknown cmp is false (the wait then times out and reports the cmp it was given).
template <typename T>
RSHMEM_HOST_DEVICE bool rshmemi_cmp_holds(T value, int cmp, T target) {
  switch (cmp) {
    case RSHMEM_CMP_EQ: return value == target;
    case RSHMEM_CMP_NE: return value != target;
    case RSHMEM_CMP_GT: return value > target;
    case RSHMEM_CMP_GE: return value >= target;
    case RSHMEM_CMP_LT: return value < target;
    case RSHMEM_CMP_LE: return value <= target;
    default: return false;
  }
}

RSHMEM_HOST_DEVICE bool rshmemi_cmp_valid(int cmp) {
  return cmp >= RSHMEM_CMP_EQ && cmp <= RSHMEM_CMP_LE;
}

// Layout of the device sync scratch (heap offset state.sync_offset, state.sync_bytes =
// 32 KiB, zeroed by the host when the heap is created; docs/gpu-design.md). Offsets are
// relative to the start of the scratch. Every word is only ever written by the device
// API; none is ever reset by a later barrier, so there is no reset race between barriers
// or kernel launches:
//
//   0     u32 grid_arrive   device-wide barrier: blocks of this PE's launch that have
//                           arrived at the current grid barrier. The last block to arrive
//                           sets it back to 0 before it releases the others (it is 0
//                           whenever no grid barrier is in progress, also between launches).
//   4     u32 grid_gen      device-wide barrier: generation, +1 per completed grid barrier
//                           (wraps; blocks wait for it to differ from the value they read
//                           before arriving).
//   64    u64 pe_epoch      PE-level barriers this PE has started (barrier_all, sync_all and
//                           their _block forms all share it; they are collective over all
//                           PEs, so every PE counts the same sequence).
//   128   u32 error_claim   the first thread of this PE that fails (bad PE, out of heap,
//                           timeout) CAS-es it 0 -> 1 and alone writes the error record.
//   1024  team[64]          one 128-byte area per team slot s (RSHMEM_TEAM_SLOTS), at
//                           1024 + 128 s:
//           +0  rshmem_team_entry_t  the team in slot s as this PE knows it (state.cuh),
//                           written by the host; size 0 = no team.
//           +16 u64 epoch   team barriers this PE started on this team (block and warp
//                           forms share it; every member counts the same sequence).
//           +32 u64 round[12]  dissemination barrier: round[r] = the highest epoch that
//                           member (me - 2^r) mod size has announced to this PE in round r
//                           (only that member writes it; values only grow).
//                           The host zeroes the area when the team is destroyed.
//   9216  u64 arrival[n]    arrival[p] = the highest epoch PE p has announced to this PE.
//                           PE p writes it (release store, system scope) when it reaches
//                           its epoch e; this PE waits for arrival[p] >= e. Values only
//                           grow, so a fast PE announcing e + 1 before this PE has looked
//                           at e cannot be missed.
//
// 64-byte spacing keeps the grid words, the epoch and the arrival array on separate
// cache lines / L2 sectors from each other.
#define RSHMEMI_SYNC_GRID_ARRIVE 0u
#define RSHMEMI_SYNC_GRID_GEN 4u
#define RSHMEMI_SYNC_PE_EPOCH 64u
#define RSHMEMI_SYNC_ERROR_CLAIM 128u
#define RSHMEMI_SYNC_TEAMS 1024u
#define RSHMEMI_TEAM_AREA_BYTES 128u
#define RSHMEMI_TEAM_EPOCH 16u
#define RSHMEMI_TEAM_ROUND 32u
#define RSHMEMI_SYNC_ARRIVAL (RSHMEMI_SYNC_TEAMS + RSHMEM_TEAM_SLOTS * RSHMEMI_TEAM_AREA_BYTES)

// Offset (from the scratch start) of team slot `slot`'s area (its rshmem_team_entry_t).
RSHMEM_HOST_DEVICE uint64_t rshmemi_team_area_offset(uint32_t slot) {
  return RSHMEMI_SYNC_TEAMS + static_cast<uint64_t>(RSHMEMI_TEAM_AREA_BYTES) * slot;
}

// The world rank of member `i` of a strided team.
RSHMEM_HOST_DEVICE int rshmemi_team_world_pe(int start, int stride, int i) { return start + stride * i; }

// The member number of world rank `pe` in a strided team, or -1.
RSHMEM_HOST_DEVICE int rshmemi_team_index_of(int start, int stride, int size, int pe) {
  if (pe < start || stride <= 0) return -1;
  const int d = pe - start;
  if (d % stride != 0) return -1;
  const int i = d / stride;
  return i < size ? i : -1;
}

// Dissemination rounds of a team of `size` members: ceil(log2(size)).
RSHMEM_HOST_DEVICE uint32_t rshmemi_team_rounds(int size) {
  uint32_t r = 0;
  for (int64_t d = 1; d < size; d <<= 1) ++r;
  return r;
}

// How many PEs the arrival array of a sync scratch of `sync_bytes` bytes can hold.
RSHMEM_HOST_DEVICE uint64_t rshmemi_sync_max_pes(uint64_t sync_bytes) {
  return sync_bytes <= RSHMEMI_SYNC_ARRIVAL ? 0 : (sync_bytes - RSHMEMI_SYNC_ARRIVAL) / 8;
}

// Offset (from the scratch start) of arrival[pe].
RSHMEM_HOST_DEVICE uint64_t rshmemi_sync_arrival_offset(int pe) {
  return RSHMEMI_SYNC_ARRIVAL + 8ull * static_cast<uint64_t>(pe);
}

// Wait timeout when the bound state says 0 (the host always sets RSHMEM_TIMEOUT_MS; this
// only guards a hand-made state): 10 s.
#define RSHMEMI_DEFAULT_TIMEOUT_NS 10000000000ull

RSHMEM_HOST_DEVICE uint64_t rshmemi_effective_timeout(uint64_t timeout_ns) {
  return timeout_ns == 0 ? RSHMEMI_DEFAULT_TIMEOUT_NS : timeout_ns;
}
