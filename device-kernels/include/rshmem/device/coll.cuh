// rshmem/device/coll.cuh — collectives over a team at block scope.
//
// Owns: rshmem_{broadcast,fcollect,alltoall}mem_block, their typed forms
// rshmem_<type>_{broadcast,fcollect,alltoall}_block (the RMA types), and the reductions
// rshmem_<type>_<op>_reduce_block (and, or, xor, max, min, sum, prod on the AMO integer
// types; max, min, sum, prod on float and double), as NVSHMEM's nvshmemx_*_block forms.
// Must not: be included by host C++ (device-only; rshmem/rshmem.cuh includes it under nvcc).
//
// rshmem-check: device-only (device function bodies; see rshmem/rshmem.cuh)
//
// Semantics: OpenSHMEM 1.5 team collectives (the host API's, host/src/collectives.rs,
// which is their oracle). Exactly one block per member PE of the team calls, every thread
// of it, with the same arguments on every member; a team this PE is not a member of traps
// (BAD_ARG; teams: rshmem/device/team.cuh). PE numbers (root, block order) are team
// numbers. broadcast writes the root's dest too; fcollect puts every member's block in
// team order; alltoall sends block j of source to member j at block team_my_pe; a reduce
// combines the members' sources in team order (integer sum/prod wrap; float max/min
// ignore a NaN operand, as fmax does), so every member computes the same bits, and its
// dest may be its source. On return dest holds the result on the calling PE and source
// may be reused.
// For broadcast, fcollect and alltoall, dest must not overlap source; a reduce's dest is
// its source or apart from it (a partial overlap is undefined, as in OpenSHMEM). Every PE
// calls with the same block size.
//
// Algorithm: a team barrier_block first (this PE's earlier puts complete, every member
// entered: sources written, dests free), then the block's threads push with
// putmem_nbi_block (broadcast: the root; fcollect, alltoall: every member, starting with
// the next one), then a team barrier_block (quiet + sync). A reduce is a reduce-scatter
// then an allgather (after the same entry barrier): member m owns elements
// [nreduce m / n, nreduce (m + 1) / n); its threads read each owned element from every
// member (rshmem_g, combined in team order) and write the result into every member's
// dest (rshmem_p). Nobody else reads or writes those elements, so dest may be source
// with no sync between the reads and the writes; a team barrier_block ends it. Simple
// and correct on any transport (p2p or IBGDA); not tuned.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "rshmem/device/amo.cuh"
#include "rshmem/device/barrier.cuh"
#include "rshmem/device/core.cuh"
#include "rshmem/device/rma.cuh"
#include "rshmem/device/team.cuh"

#if defined(__CUDACC__)

// Entry and exit of a collective: quiet + sync of the team's one block per member.
RSHMEM_DEVICE void rshmemi_coll_barrier(rshmem_team_t team, const char *what) {
  rshmem_quiet();
  rshmemi_team_sync_block(team, what);
}

RSHMEM_DEVICE void rshmem_broadcastmem_block(rshmem_team_t team, void *dest, const void *source, size_t nbytes,
                                             int root) {
  const char *what = "rshmem_broadcastmem_block";
  const rshmemi_team_view v = rshmemi_team_get(team, what);
  if (root < 0 || root >= v.size)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_PE, root, reinterpret_cast<uint64_t>(dest), nbytes, 0, 0, what,
                 "root out of range (a PE number in the team)");
  rshmemi_coll_barrier(team, what);
  if (v.my == root && nbytes > 0)
    for (int k = 1; k <= v.size; ++k) rshmem_putmem_nbi_block(dest, source, nbytes, v.world((root + k) % v.size));
  rshmemi_coll_barrier(team, what);
}

// fcollect and alltoall: between the entry and exit barriers, this member's block goes to
// block `my` of every member's dest, starting with the next member; member j's block is
// source + j * src_stride (fcollect: the same source for all, stride 0; alltoall: nbytes).
RSHMEM_DEVICE void rshmemi_push_blocks_block(rshmem_team_t team, void *dest, const void *source, size_t nbytes,
                                             size_t src_stride, const char *what) {
  const rshmemi_team_view v = rshmemi_team_get(team, what);
  rshmemi_coll_barrier(team, what);
  unsigned char *d = static_cast<unsigned char *>(dest) + static_cast<size_t>(v.my) * nbytes;
  const unsigned char *s = static_cast<const unsigned char *>(source);
  if (nbytes > 0)
    for (int k = 1; k <= v.size; ++k) {
      const int j = (v.my + k) % v.size;
      rshmem_putmem_nbi_block(d, s + static_cast<size_t>(j) * src_stride, nbytes, v.world(j));
    }
  rshmemi_coll_barrier(team, what);
}

RSHMEM_DEVICE void rshmem_fcollectmem_block(rshmem_team_t team, void *dest, const void *source, size_t nbytes) {
  rshmemi_push_blocks_block(team, dest, source, nbytes, 0, "rshmem_fcollectmem_block");
}

RSHMEM_DEVICE void rshmem_alltoallmem_block(rshmem_team_t team, void *dest, const void *source, size_t nbytes) {
  rshmemi_push_blocks_block(team, dest, source, nbytes, nbytes, "rshmem_alltoallmem_block");
}

// ---- reductions -------------------------------------------------------------------------

enum { RSHMEMI_RED_AND, RSHMEMI_RED_OR, RSHMEMI_RED_XOR, RSHMEMI_RED_MAX, RSHMEMI_RED_MIN, RSHMEMI_RED_SUM,
       RSHMEMI_RED_PROD };

// How a reduce combines two values. Integers: sum and prod wrap (computed in the unsigned
// type of the same size). Floats: no bitwise operators (their typed names do not exist);
// max/min as fmax/fmin (a NaN operand is ignored, as the host's f64::max); sum and prod
// are a single rounded operation each (nothing to contract into an FMA), so the bits
// match the host's.
template <int Op, typename T>
struct rshmemi_reducer {
  static RSHMEM_DEVICE T combine(T a, T b) {
    typedef typename rshmemi_uint_n<sizeof(T)>::type U;
    switch (Op) {
      case RSHMEMI_RED_AND: return a & b;
      case RSHMEMI_RED_OR: return a | b;
      case RSHMEMI_RED_XOR: return a ^ b;
      case RSHMEMI_RED_MAX: return a > b ? a : b;
      case RSHMEMI_RED_MIN: return a < b ? a : b;
      case RSHMEMI_RED_SUM: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      default: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    }
  }
};
template <int Op>
struct rshmemi_reducer<Op, float> {
  static RSHMEM_DEVICE float combine(float a, float b) {
    switch (Op) {
      case RSHMEMI_RED_MAX: return fmaxf(a, b);
      case RSHMEMI_RED_MIN: return fminf(a, b);
      case RSHMEMI_RED_SUM: return a + b;
      default: return a * b;
    }
  }
};
template <int Op>
struct rshmemi_reducer<Op, double> {
  static RSHMEM_DEVICE double combine(double a, double b) {
    switch (Op) {
      case RSHMEMI_RED_MAX: return fmax(a, b);
      case RSHMEMI_RED_MIN: return fmin(a, b);
      case RSHMEMI_RED_SUM: return a + b;
      default: return a * b;
    }
  }
};

template <int Op, typename T>
RSHMEM_DEVICE int rshmemi_reduce_block(rshmem_team_t team, T *dest, const T *source, size_t nreduce,
                                       const char *what) {
  const rshmemi_team_view v = rshmemi_team_get(team, what);
  rshmemi_coll_barrier(team, what);  // this PE's earlier puts complete; every member's source is written
  // Member my owns elements [lo, hi): it alone reads them (from every member's source) and
  // then writes them (into every member's dest), so dest may be source without a sync
  // between the reads and the writes.
  const size_t tid = rshmemi_block_thread(), nt = rshmemi_block_threads();
  const size_t lo = nreduce * static_cast<size_t>(v.my) / static_cast<size_t>(v.size);
  const size_t hi = nreduce * static_cast<size_t>(v.my + 1) / static_cast<size_t>(v.size);
  for (size_t i = lo + tid; i < hi; i += nt) {
    T acc = rshmem_g<T>(source + i, v.world(0));
    for (int p = 1; p < v.size; ++p) acc = rshmemi_reducer<Op, T>::combine(acc, rshmem_g<T>(source + i, v.world(p)));
    for (int k = 1; k <= v.size; ++k) rshmem_p<T>(dest + i, acc, v.world((v.my + k) % v.size));
  }
  rshmemi_coll_barrier(team, what);  // quiet + sync: dest complete on every member
  return 0;
}
// ---- typed names ------------------------------------------------------------------------

#define RSHMEMI_TYPED_COLL(NAME, TYPE)                                                           \
  RSHMEM_DEVICE void rshmem_##NAME##_broadcast_block(rshmem_team_t team, TYPE *dest, const TYPE *source, \
                                                     size_t nelems, int root) {                  \
    rshmem_broadcastmem_block(team, dest, source, rshmemi_bytes<TYPE>(nelems), root);                  \
  }                                                                                              \
  RSHMEM_DEVICE void rshmem_##NAME##_fcollect_block(rshmem_team_t team, TYPE *dest, const TYPE *source, \
                                                    size_t nelems) {                             \
    rshmem_fcollectmem_block(team, dest, source, rshmemi_bytes<TYPE>(nelems));                         \
  }                                                                                              \
  RSHMEM_DEVICE void rshmem_##NAME##_alltoall_block(rshmem_team_t team, TYPE *dest, const TYPE *source, \
                                                    size_t nelems) {                             \
    rshmem_alltoallmem_block(team, dest, source, rshmemi_bytes<TYPE>(nelems));                         \
  }
RSHMEM_RMA_TYPES(RSHMEMI_TYPED_COLL)
#undef RSHMEMI_TYPED_COLL

#define RSHMEMI_REDUCE(NAME, TYPE, OPNAME, OP)                                                   \
  RSHMEM_DEVICE int rshmem_##NAME##_##OPNAME##_reduce_block(rshmem_team_t team, TYPE *dest,     \
                                                            const TYPE *source, size_t nreduce) { \
    return rshmemi_reduce_block<OP, TYPE>(team, dest, source, nreduce,                           \
                                          "rshmem_" #NAME "_" #OPNAME "_reduce_block");           \
  }
#define RSHMEMI_REDUCE_INT(NAME, TYPE)                    \
  RSHMEMI_REDUCE(NAME, TYPE, and, RSHMEMI_RED_AND)        \
  RSHMEMI_REDUCE(NAME, TYPE, or, RSHMEMI_RED_OR)          \
  RSHMEMI_REDUCE(NAME, TYPE, xor, RSHMEMI_RED_XOR)        \
  RSHMEMI_REDUCE(NAME, TYPE, max, RSHMEMI_RED_MAX)        \
  RSHMEMI_REDUCE(NAME, TYPE, min, RSHMEMI_RED_MIN)        \
  RSHMEMI_REDUCE(NAME, TYPE, sum, RSHMEMI_RED_SUM)        \
  RSHMEMI_REDUCE(NAME, TYPE, prod, RSHMEMI_RED_PROD)
RSHMEM_AMO_TYPES(RSHMEMI_REDUCE_INT)
#undef RSHMEMI_REDUCE_INT
#define RSHMEMI_REDUCE_FLOAT(NAME, TYPE)                  \
  RSHMEMI_REDUCE(NAME, TYPE, max, RSHMEMI_RED_MAX)        \
  RSHMEMI_REDUCE(NAME, TYPE, min, RSHMEMI_RED_MIN)        \
  RSHMEMI_REDUCE(NAME, TYPE, sum, RSHMEMI_RED_SUM)        \
  RSHMEMI_REDUCE(NAME, TYPE, prod, RSHMEMI_RED_PROD)
RSHMEMI_REDUCE_FLOAT(float, float)
RSHMEMI_REDUCE_FLOAT(double, double)
#undef RSHMEMI_REDUCE_FLOAT
#undef RSHMEMI_REDUCE

#endif  // __CUDACC__
