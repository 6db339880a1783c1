// rshmem/device/team.cuh — teams on the device: queries and team barriers.
//
// Owns: rshmem_team_my_pe, rshmem_team_n_pes, rshmem_team_translate_pe (any thread),
// rshmem_team_sync / rshmem_barrier (exactly one thread per member PE calls),
// rshmem_team_sync_block / rshmem_barrier_block (exactly one block per member PE calls,
// all of its threads) and rshmem_team_sync_warp / rshmem_barrier_warp (exactly one warp
// per member PE, all its lanes), as NVSHMEM's nvshmem_team_sync / nvshmem_barrier and
// nvshmemx_*_block/_warp;
// and rshmemi_team_view, through which the collectives (coll.cuh) see a team.
// Must not: be included by host C++ (device-only; rshmem/rshmem.cuh includes it under nvcc).
//
// rshmem-check: device-only (device function bodies; see rshmem/rshmem.cuh)
//
// Teams. A device team handle (rshmem_team_t, types.cuh) is the team's slot, which the host
// agreed among the members when it created the team (host/src/team.rs), so it is the same
// number on every member. RSHMEM_TEAM_WORLD needs nothing from memory. Any other team is
// the rshmem_team_entry_t (state.cuh) that the host wrote into slot `team` of this PE's
// sync scratch: GpuPe writes RSHMEM_TEAM_SHARED (the node's PEs) at start-up and every
// team made with GpuPe::team_split_strided, and clears the slot in GpuPe::team_destroy.
// Device teams are strided in world ranks (start, stride, size), as NVSHMEM's.
//
// Semantics (OpenSHMEM 1.5 / NVSHMEM): team_my_pe and team_n_pes return -1 for
// RSHMEM_TEAM_INVALID or a team this PE does not belong to; team_translate_pe returns -1
// when either team is invalid or the PE is not in both. The barriers and the collectives
// trap (BAD_ARG) when called with a team this PE is not a member of. team_sync = every
// member arrived, and local stores made before it are visible to every member after it;
// barrier = quiet + sync. Every member makes the same sequence of barriers on a team
// (block and warp forms share the team's epoch). Every wait is bounded.
//
// Algorithm (teams other than WORLD): a dissemination barrier. One thread (the caller,
// thread 0 of the block, lane 0 of the warp) takes the team's next epoch e and, for r = 0, 1, ... while
// 2^r < size, stores e into round word r of member (me + 2^r) mod size and waits until its
// own round word r holds >= e (it is written only by member (me - 2^r) mod size). Words
// only grow, so no reset races; ceil(log2(size)) rounds of one store and one wait each.
// WORLD keeps the all-to-all exchange of barrier.cuh (one round, every thread helping; at
// thread scope the one thread announces to and waits for every PE).
#pragma once

#include <stdint.h>

#include "rshmem/device/barrier.cuh"
#include "rshmem/device/core.cuh"
#include "rshmem/device/rma.cuh"

#if defined(__CUDACC__)

// A team as the device API uses it. `area` is the address of the team's slot in this PE's
// sync scratch (its words are symmetric: the same offset on every member); 0 for WORLD.
struct rshmemi_team_view {
  int start, stride, size, my;
  uint64_t area;
  RSHMEM_DEVICE int world(int i) const { return rshmemi_team_world_pe(start, stride, i); }
};

// Looks `team` up; false when it is not a team on this PE (invalid handle, an empty slot,
// a module that is not bound). Any thread; reads the entry the host wrote (it does not
// change while a kernel may use the team).
RSHMEM_DEVICE bool rshmemi_team_lookup(rshmem_team_t team, rshmemi_team_view *v) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  if (!rshmemi_bound()) return false;
  if (team == RSHMEM_TEAM_WORLD) {
    *v = rshmemi_team_view{0, 1, s.n_pes, s.my_pe, 0};
    return true;
  }
  if (team < 0 || static_cast<uint32_t>(team) >= RSHMEM_TEAM_SLOTS ||
      s.sync_bytes < RSHMEMI_SYNC_ARRIVAL)
    return false;
  const uint64_t area = rshmemi_sync_base() + rshmemi_team_area_offset(static_cast<uint32_t>(team));
  const rshmem_team_entry_t *e = reinterpret_cast<const rshmem_team_entry_t *>(area);
  const int size = e->size, stride = e->stride, start = e->start, my = e->my_pe;
  if (size <= 0 || stride <= 0 || my < 0 || my >= size) return false;
  *v = rshmemi_team_view{start, stride, size, my, area};
  return true;
}

// The team of a barrier or collective: traps (BAD_ARG, naming the handle) unless this PE
// is a member of `team`.
RSHMEM_DEVICE rshmemi_team_view rshmemi_team_get(rshmem_team_t team, const char *what) {
  rshmemi_require_bound(what);
  rshmemi_team_view v;
  if (!rshmemi_team_lookup(team, &v))
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, rshmemi_device_state.my_pe, 0, static_cast<uint64_t>(team), 0, 0,
                 what, "not a team of this PE on the device (invalid handle, or not created or destroyed by the host)");
  if (rshmemi_team_rounds(v.size) > RSHMEM_TEAM_MAX_ROUNDS && team != RSHMEM_TEAM_WORLD)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, rshmemi_device_state.my_pe, 0, static_cast<uint64_t>(v.size), 0, 0,
                 what, "team larger than the device team barrier holds (2^RSHMEM_TEAM_MAX_ROUNDS PEs)");
  return v;
}

RSHMEM_DEVICE int rshmem_team_my_pe(rshmem_team_t team) {
  rshmemi_team_view v;
  return rshmemi_team_lookup(team, &v) ? v.my : -1;
}

RSHMEM_DEVICE int rshmem_team_n_pes(rshmem_team_t team) {
  rshmemi_team_view v;
  return rshmemi_team_lookup(team, &v) ? v.size : -1;
}

// Number `pe` of team `src` as numbered in team `dest`, or -1.
RSHMEM_DEVICE int rshmem_team_translate_pe(rshmem_team_t src, int pe, rshmem_team_t dest) {
  rshmemi_team_view a, b;
  if (!rshmemi_team_lookup(src, &a) || !rshmemi_team_lookup(dest, &b) || pe < 0 || pe >= a.size) return -1;
  return rshmemi_team_index_of(b.start, b.stride, b.size, a.world(pe));
}

// The dissemination barrier (see above), run by one thread of the member's group. The
// group synchronised before (its stores are ordered before this thread's releases) and
// synchronises after.
RSHMEM_DEVICE void rshmemi_team_dissemination(const rshmemi_team_view &v, const char *what) {
  if (v.size <= 1) return;
  // Atomic although uncontended (one group per member runs it at a time): its value
  // carries over to whichever block or warp runs the team's next barrier.
  const uint64_t e = rshmemi_atom_add(reinterpret_cast<uint64_t *>(v.area + RSHMEMI_TEAM_EPOCH), 1ull) + 1;
  uint32_t r = 0;
  for (int d = 1; d < v.size; d <<= 1, ++r) {
    uint64_t *word = reinterpret_cast<uint64_t *>(v.area + RSHMEMI_TEAM_ROUND + 8ull * r);
    rshmemi_announce(word, e, v.world((v.my + d) % v.size), what);
    rshmemi_await_epoch(word, e, what);
  }
}

// One block of every member synchronises (all threads of the block call).
RSHMEM_DEVICE void rshmemi_team_sync_block(rshmem_team_t team, const char *what) {
  const rshmemi_team_view v = rshmemi_team_get(team, what);
  if (team == RSHMEM_TEAM_WORLD) {
    rshmemi_pe_sync_block(what);
    return;
  }
  __syncthreads();
  if (rshmemi_block_thread() == 0) rshmemi_team_dissemination(v, what);
  __syncthreads();
}

// One warp of every member synchronises (every lane of the warp calls: rshmemi_warp_lanes).
RSHMEM_DEVICE void rshmemi_team_sync_warp(rshmem_team_t team, const char *what) {
  const rshmemi_team_view v = rshmemi_team_get(team, what);
  if (team == RSHMEM_TEAM_WORLD) {
    rshmemi_pe_sync_warp(what);
    return;
  }
  __syncwarp(rshmemi_warp_mask());
  if (rshmemi_lane() == 0) rshmemi_team_dissemination(v, what);
  __syncwarp(rshmemi_warp_mask());
}

// One thread of every member synchronises (exactly one thread per member PE calls; no
// other thread of the PE may run a barrier on the team or, for WORLD, any world barrier
// at the same time).
RSHMEM_DEVICE void rshmemi_team_sync_thread(rshmem_team_t team, const char *what) {
  const rshmemi_team_view v = rshmemi_team_get(team, what);
  if (team == RSHMEM_TEAM_WORLD) {
    const uint64_t base = rshmemi_sync_base();
    rshmemi_pe_exchange(base, rshmemi_take_epoch(base, what), 0, 1, what);
    return;
  }
  rshmemi_team_dissemination(v, what);
}

RSHMEM_DEVICE void rshmem_team_sync(rshmem_team_t team) { rshmemi_team_sync_thread(team, "rshmem_team_sync"); }

// quiet + team sync (one thread per member).
RSHMEM_DEVICE void rshmem_barrier(rshmem_team_t team) {
  rshmem_quiet();
  rshmemi_team_sync_thread(team, "rshmem_barrier");
}

RSHMEM_DEVICE void rshmem_team_sync_block(rshmem_team_t team) {
  __syncthreads();
  rshmemi_team_sync_block(team, "rshmem_team_sync_block");
}

RSHMEM_DEVICE void rshmem_team_sync_warp(rshmem_team_t team) { rshmemi_team_sync_warp(team, "rshmem_team_sync_warp"); }

// quiet + team sync (one block per member, all threads).
RSHMEM_DEVICE void rshmem_barrier_block(rshmem_team_t team) {
  rshmem_quiet();
  rshmemi_team_sync_block(team, "rshmem_barrier_block");
}

// quiet + team sync (one warp per member, all its lanes).
RSHMEM_DEVICE void rshmem_barrier_warp(rshmem_team_t team) {
  rshmem_quiet();
  rshmemi_team_sync_warp(team, "rshmem_barrier_warp");
}

#endif  // __CUDACC__
