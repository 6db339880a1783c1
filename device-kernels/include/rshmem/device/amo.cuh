// rshmem/device/amo.cuh — remote atomics and the point-to-point wait/test family.
//
// Owns: rshmem_<type>_atomic_{fetch,set,swap,compare_swap,fetch_add,add,fetch_inc,inc,
// fetch_and,and,fetch_or,or,fetch_xor,xor} on 32/64-bit integers, fetch/set/swap on float
// and double (the extended AMO types),
// rshmem_<type>_wait_until / rshmem_<type>_test, their array forms
// rshmem_<type>_{wait_until,test}_{all,any,some}[_vector] (+ the templates behind them).
// Must not: be included by host C++ (device-only; rshmem/rshmem.cuh includes it under nvcc).
//
// rshmem-check: device-only (device function bodies; see rshmem/rshmem.cuh)
//
// Ordering (as the host API, docs/runtime.md): fetch = acquire load, set = release store,
// the fetching read-modify-writes (swap, compare_swap, fetch_*) are acq_rel, the
// non-fetching ones (add, inc, and, or, xor) are release reductions. All at system scope
// (atom/red .sys): atomic with respect to every other PE's atomics on the word, on this GPU
// or another one. Signed types use the two's complement bit operations of their unsigned
// twins (add/inc wrap). Over IBGDA the NIC / soft HCA executes them (rshmem/device/ibgda.cuh
// says how each maps to mlx5 atomics); fetching ones wait for their completion,
// non-fetching ones (set, add, inc, and, or) complete at quiet; xor always waits.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "rshmem/device/core.cuh"
#include "rshmem/device/ibgda.cuh"

#if defined(__CUDACC__)

// The unsigned word type with T's size (the operand type of the PTX instruction).
template <int N>
struct rshmemi_word;
template <>
struct rshmemi_word<4> {
  typedef uint32_t type;
};
template <>
struct rshmemi_word<8> {
  typedef uint64_t type;
};
template <typename T>
using rshmemi_word_t = typename rshmemi_word<sizeof(T)>::type;

// One atomic on `dest` at `pe`: a PTX atomic on the mapped word (p2p), or WQEs on the
// peer's queue (IBGDA; also the own PE under RSHMEM_STATE_SELF_IBGDA). Op is one of
// RSHMEMI_AMO_* (rshmem/device/ibgda.cuh), a constant at every call site, so each entry
// point keeps one PTX instruction on the p2p path. a, b: the operands (CAS: cond, value).
template <int Op, bool Fetch, typename T>
RSHMEM_DEVICE T rshmemi_amo(const T *dest, rshmemi_word_t<T> a, rshmemi_word_t<T> b, int pe,
                            const char *what) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "rshmem atomics take 32- or 64-bit integers");
  static_assert(static_cast<T>(0.5) == static_cast<T>(0),
                "rshmem atomics on float/double: only fetch, set and swap (rshmem_float_atomic_*, "
                "rshmem_double_atomic_*)");
  typedef rshmemi_word_t<T> W;
  // Fetch and set are a load and a store on the p2p path: not refused over a link without
  // native atomics (rmw).
  const rshmemi_target_t t =
      rshmemi_resolve(dest, sizeof(T), pe, what, true, Op != RSHMEMI_AMO_FETCH && Op != RSHMEMI_AMO_SET);
  rshmemi_check_aligned(dest, sizeof(T), pe, what);
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P: {
      W *w = reinterpret_cast<W *>(t.addr);
      switch (Op) {
        case RSHMEMI_AMO_FETCH: return static_cast<T>(rshmemi_ld_acquire_sys(w));
        case RSHMEMI_AMO_SET: rshmemi_st_release_sys(w, a); return T();
        case RSHMEMI_AMO_SWAP: return static_cast<T>(rshmemi_atom_exch(w, a));
        case RSHMEMI_AMO_CAS: return static_cast<T>(rshmemi_atom_cas(w, a, b));
        case RSHMEMI_AMO_ADD:
          if (Fetch) return static_cast<T>(rshmemi_atom_add(w, a));
          rshmemi_red_add(w, a);
          return T();
        case RSHMEMI_AMO_AND:
          if (Fetch) return static_cast<T>(rshmemi_atom_and(w, a));
          rshmemi_red_and(w, a);
          return T();
        case RSHMEMI_AMO_OR:
          if (Fetch) return static_cast<T>(rshmemi_atom_or(w, a));
          rshmemi_red_or(w, a);
          return T();
        default:  // XOR
          if (Fetch) return static_cast<T>(rshmemi_atom_xor(w, a));
          rshmemi_red_xor(w, a);
          return T();
      }
    }
    case RSHMEM_TRANSPORT_IBGDA:
      if (RSHMEMI_IBGDA_ENABLED)
        return static_cast<T>(static_cast<W>(rshmemi_ibgda_amo(pe, t.addr, sizeof(T), Op, a, b, Fetch, what)));
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(dest), sizeof(T), what);
      return T();
  }
}

#define RSHMEMI_W(v) static_cast<rshmemi_word_t<T>>(v)

template <typename T>
RSHMEM_DEVICE T rshmem_atomic_fetch(const T *source, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_FETCH, true>(source, 0, 0, pe, "rshmem_atomic_fetch");
}
template <typename T>
RSHMEM_DEVICE void rshmem_atomic_set(T *dest, T value, int pe) {
  rshmemi_amo<RSHMEMI_AMO_SET, false>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_set");
}
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_swap(T *dest, T value, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_SWAP, true>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_swap");
}
// The extended AMO types of OpenSHMEM 1.5 (float, double) for fetch, set and swap: the
// integer atomic of the same size on the value's bits (the word is read, written or
// exchanged whole; no arithmetic), so NaN payloads and -0.0 pass unchanged.
template <typename F>
RSHMEM_DEVICE rshmemi_word_t<F> rshmemi_bits(F v) {
  rshmemi_word_t<F> b;
  memcpy(&b, &v, sizeof(F));
  return b;
}
template <typename F>
RSHMEM_DEVICE F rshmemi_from_bits(rshmemi_word_t<F> b) {
  F v;
  memcpy(&v, &b, sizeof(F));
  return v;
}
#define RSHMEMI_EXTENDED_AMO(F)                                                                  \
  template <>                                                                                    \
  RSHMEM_DEVICE F rshmem_atomic_fetch<F>(const F *source, int pe) {                              \
    typedef rshmemi_word_t<F> W;                                                                 \
    return rshmemi_from_bits<F>(rshmemi_amo<RSHMEMI_AMO_FETCH, true, W>(                         \
        reinterpret_cast<const W *>(source), 0, 0, pe, "rshmem_atomic_fetch"));                  \
  }                                                                                              \
  template <>                                                                                    \
  RSHMEM_DEVICE void rshmem_atomic_set<F>(F *dest, F value, int pe) {                            \
    typedef rshmemi_word_t<F> W;                                                                 \
    rshmemi_amo<RSHMEMI_AMO_SET, false, W>(reinterpret_cast<W *>(dest), rshmemi_bits(value), 0,  \
                                           pe, "rshmem_atomic_set");                             \
  }                                                                                              \
  template <>                                                                                    \
  RSHMEM_DEVICE F rshmem_atomic_swap<F>(F *dest, F value, int pe) {                              \
    typedef rshmemi_word_t<F> W;                                                                 \
    return rshmemi_from_bits<F>(rshmemi_amo<RSHMEMI_AMO_SWAP, true, W>(                          \
        reinterpret_cast<W *>(dest), rshmemi_bits(value), 0, pe, "rshmem_atomic_swap"));         \
  }                                                                                              \
  RSHMEM_DEVICE F rshmem_##F##_atomic_fetch(const F *source, int pe) {                           \
    return rshmem_atomic_fetch<F>(source, pe);                                                   \
  }                                                                                              \
  RSHMEM_DEVICE void rshmem_##F##_atomic_set(F *dest, F value, int pe) {                         \
    rshmem_atomic_set<F>(dest, value, pe);                                                       \
  }                                                                                              \
  RSHMEM_DEVICE F rshmem_##F##_atomic_swap(F *dest, F value, int pe) {                           \
    return rshmem_atomic_swap<F>(dest, value, pe);                                               \
  }
RSHMEMI_EXTENDED_AMO(float)
RSHMEMI_EXTENDED_AMO(double)
#undef RSHMEMI_EXTENDED_AMO

// Stores value when *dest == cond; returns the previous *dest either way.
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_compare_swap(T *dest, T cond, T value, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_CAS, true>(dest, RSHMEMI_W(cond), RSHMEMI_W(value), pe,
                                            "rshmem_atomic_compare_swap");
}
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_fetch_add(T *dest, T value, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_ADD, true>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_fetch_add");
}
template <typename T>
RSHMEM_DEVICE void rshmem_atomic_add(T *dest, T value, int pe) {
  rshmemi_amo<RSHMEMI_AMO_ADD, false>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_add");
}
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_fetch_inc(T *dest, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_ADD, true>(dest, RSHMEMI_W(1), 0, pe, "rshmem_atomic_fetch_inc");
}
template <typename T>
RSHMEM_DEVICE void rshmem_atomic_inc(T *dest, int pe) {
  rshmemi_amo<RSHMEMI_AMO_ADD, false>(dest, RSHMEMI_W(1), 0, pe, "rshmem_atomic_inc");
}
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_fetch_and(T *dest, T value, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_AND, true>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_fetch_and");
}
template <typename T>
RSHMEM_DEVICE void rshmem_atomic_and(T *dest, T value, int pe) {
  rshmemi_amo<RSHMEMI_AMO_AND, false>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_and");
}
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_fetch_or(T *dest, T value, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_OR, true>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_fetch_or");
}
template <typename T>
RSHMEM_DEVICE void rshmem_atomic_or(T *dest, T value, int pe) {
  rshmemi_amo<RSHMEMI_AMO_OR, false>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_or");
}
template <typename T>
RSHMEM_DEVICE T rshmem_atomic_fetch_xor(T *dest, T value, int pe) {
  return rshmemi_amo<RSHMEMI_AMO_XOR, true>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_fetch_xor");
}
template <typename T>
RSHMEM_DEVICE void rshmem_atomic_xor(T *dest, T value, int pe) {
  rshmemi_amo<RSHMEMI_AMO_XOR, false>(dest, RSHMEMI_W(value), 0, pe, "rshmem_atomic_xor");
}

// ---- wait / test ------------------------------------------------------------------------

// Waits (bounded by RSHMEM_TIMEOUT_MS; on expiry: error record, one printf line naming PE,
// address, cmp, expected and last observed value, __trap) until `*ivar <cmp> value`, where
// ivar is a symmetric address on this PE. Returns the value that satisfied the comparison
// (NVSHMEM's returns void). Acquire loads at system scope: what the writer released before
// the value is visible afterwards.
template <typename T>
RSHMEM_DEVICE T rshmem_wait_until(const T *ivar, int cmp, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "rshmem waits take 32- or 64-bit integers");
  rshmemi_check_local(ivar, sizeof(T), rshmemi_device_state.my_pe, "rshmem_wait_until");
  rshmemi_check_aligned(ivar, sizeof(T), rshmemi_device_state.my_pe, "rshmem_wait_until");
  const rshmemi_word_t<T> *w = reinterpret_cast<const rshmemi_word_t<T> *>(ivar);
  return rshmemi_poll<T>(ivar, cmp, value, [w] { return static_cast<T>(rshmemi_ld_acquire_sys(w)); },
                         "rshmem_wait_until");
}

// 1 when `*ivar <cmp> value` now (one acquire load), else 0. An invalid cmp traps (BAD_ARG).
template <typename T>
RSHMEM_DEVICE int rshmem_test(const T *ivar, int cmp, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "rshmem waits take 32- or 64-bit integers");
  rshmemi_check_local(ivar, sizeof(T), rshmemi_device_state.my_pe, "rshmem_test");
  rshmemi_check_aligned(ivar, sizeof(T), rshmemi_device_state.my_pe, "rshmem_test");
  const T v = static_cast<T>(rshmemi_ld_acquire_sys(reinterpret_cast<const rshmemi_word_t<T> *>(ivar)));
  if (!rshmemi_cmp_valid(cmp))
    rshmemi_wait_failed(ivar, cmp, static_cast<uint64_t>(value), static_cast<uint64_t>(v), "rshmem_test");
  return rshmemi_cmp_holds(v, cmp, value) ? 1 : 0;
}

// ---- wait / test on arrays ----------------------------------------------------------------
// OpenSHMEM 1.5 / NVSHMEM point-to-point synchronisation on a set of words: the set is
// ivars[0, nelems) without the elements whose status entry is non-zero (status may be
// null: nothing excluded; it is local memory, ivars is symmetric on this PE).
// wait_until_all returns once every element of the set has satisfied the comparison (an
// element that held is done and not read again, as OpenSHMEM's "until all entries have
// satisfied" allows). The _vector forms compare element i with cmp_values[i] instead of
// one value. Loads are acquire at
// system scope, as rshmem_wait_until's; waits are bounded the same way, and a timeout
// reports the first element of the set that kept the wait going (its address, operand and
// last value). An invalid cmp traps (BAD_ARG) even when the set is empty. Results for an
// empty set (nelems 0 or everything excluded), as OpenSHMEM 1.5 says: wait_until_all and
// test_all return at once (test_all: 1), wait_until_any and test_any return SIZE_MAX,
// wait_until_some and test_some return 0. _any returns the lowest index that holds;
// _some writes the indices that hold in increasing order and returns their count.

// What one pass over the set looks for.
enum rshmemi_set_mode { RSHMEMI_SET_ALL = 0, RSHMEMI_SET_ANY = 1, RSHMEMI_SET_SOME = 2 };

// One pass over the set. ALL: SIZE_MAX when every element holds, else the first that does
// not. ANY: the first that holds, else SIZE_MAX. SOME: writes every index that holds to
// `indices` and returns the count. The scan starts at element `from` (ALL resumes where
// its last scan stopped: an element that held once counts as satisfied, as OpenSHMEM's
// "until all have satisfied" means; 0 otherwise). `*pending` gets the first element of
// the set that does not hold (SIZE_MAX: none) and `*seen` its value: what a timeout
// reports.
template <int Mode, typename T>
RSHMEM_DEVICE size_t rshmemi_scan_set(const T *ivars, size_t nelems, size_t from, size_t *indices,
                                      const int *status, int cmp, T value, const T *cmp_values,
                                      size_t *pending, T *seen) {
  typedef rshmemi_word_t<T> W;
  const size_t none = ~static_cast<size_t>(0);
  size_t found = 0;
  *pending = none;
  for (size_t i = from; i < nelems; ++i) {
    if (status != nullptr && status[i] != 0) continue;
    const T v = static_cast<T>(rshmemi_ld_acquire_sys(reinterpret_cast<const W *>(ivars + i)));
    const bool holds = rshmemi_cmp_holds(v, cmp, cmp_values != nullptr ? cmp_values[i] : value);
    if (!holds && *pending == none) {
      *pending = i;
      *seen = v;
      if (Mode == RSHMEMI_SET_ALL) return i;
    }
    if (holds && Mode == RSHMEMI_SET_ANY) return i;
    if (holds && Mode == RSHMEMI_SET_SOME) indices[found++] = i;
  }
  return Mode == RSHMEMI_SET_SOME ? found : none;
}

// The checks every set operation makes first: ivars inside this PE's heap, a valid cmp.
// The length saturates, so an nelems whose byte count would wrap is refused too.
template <typename T>
RSHMEM_DEVICE void rshmemi_check_set(const T *ivars, size_t nelems, int cmp, T value, const char *what) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "rshmem waits take 32- or 64-bit integers");
  const uint64_t n = static_cast<uint64_t>(nelems);
  const uint64_t len = n > ~0ull / sizeof(T) ? ~0ull : n * sizeof(T);
  rshmemi_check_local(ivars, len, rshmemi_device_state.my_pe, what);
  rshmemi_check_aligned(ivars, sizeof(T), rshmemi_device_state.my_pe, what);
  if (!rshmemi_cmp_valid(cmp)) rshmemi_wait_failed(ivars, cmp, static_cast<uint64_t>(value), 0, what);
}

// The bounded wait behind wait_until_{all,any,some}[_vector]: scans until the set
// satisfies Mode (ALL: every element has held; ANY and SOME: one holds, or the set is
// empty) and returns what the last scan returned. The clock starts after the first scan
// fails.
// Out of line (as is rshmemi_test_set): one copy per (Mode, T) however many call sites,
// where inlining a loop per call made the typed self-test's PTX 600 KB; a call costs
// little next to a scan of memory.
template <int Mode, typename T>
__device__ __noinline__ size_t rshmemi_wait_set(const T *ivars, size_t nelems, size_t *indices, const int *status,
                                      int cmp, T value, const T *cmp_values, const char *what) {
  rshmemi_check_set(ivars, nelems, cmp, value, what);
  const size_t none = ~static_cast<size_t>(0);
  size_t pending;
  T seen = T();
  bool started = false;
  uint64_t limit = 0, t0 = 0;
  for (;;) {
    // ALL resumes at its pending element (those before it held); ANY and SOME rescan all.
    const size_t from = Mode == RSHMEMI_SET_ALL && started ? pending : 0;
    const size_t r =
        rshmemi_scan_set<Mode, T>(ivars, nelems, from, indices, status, cmp, value, cmp_values, &pending, &seen);
    // ALL is done when nothing is pending; ANY/SOME when something holds or the set is
    // empty (then nothing is pending either).
    if (Mode == RSHMEMI_SET_ALL ? r == none
                                : (Mode == RSHMEMI_SET_ANY ? r != none : r != 0) || pending == none)
      return r;
    if (!started) {  // the clock starts after the first scan fails, as rshmemi_poll's
      started = true;
      limit = rshmemi_effective_timeout(rshmemi_device_state.timeout_ns);
      t0 = rshmemi_globaltimer();
    } else if (rshmemi_globaltimer() - t0 > limit) {
      const T operand = cmp_values != nullptr ? cmp_values[pending] : value;
      rshmemi_wait_failed(ivars + pending, cmp, static_cast<uint64_t>(operand), static_cast<uint64_t>(seen), what);
    }
  }
}

// One pass behind test_{all,any,some}[_vector].
template <int Mode, typename T>
__device__ __noinline__ size_t rshmemi_test_set(const T *ivars, size_t nelems, size_t *indices, const int *status,
                                      int cmp, T value, const T *cmp_values, const char *what) {
  rshmemi_check_set(ivars, nelems, cmp, value, what);
  size_t pending;
  T seen = T();
  return rshmemi_scan_set<Mode, T>(ivars, nelems, 0, indices, status, cmp, value, cmp_values, &pending, &seen);
}

template <typename T>
RSHMEM_DEVICE void rshmem_wait_until_all(const T *ivars, size_t nelems, const int *status, int cmp, T value) {
  rshmemi_wait_set<RSHMEMI_SET_ALL, T>(ivars, nelems, nullptr, status, cmp, value, nullptr, "rshmem_wait_until_all");
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_wait_until_any(const T *ivars, size_t nelems, const int *status, int cmp, T value) {
  return rshmemi_wait_set<RSHMEMI_SET_ANY, T>(ivars, nelems, nullptr, status, cmp, value, nullptr,
                                           "rshmem_wait_until_any");
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_wait_until_some(const T *ivars, size_t nelems, size_t *indices, const int *status,
                                            int cmp, T value) {
  return rshmemi_wait_set<RSHMEMI_SET_SOME, T>(ivars, nelems, indices, status, cmp, value, nullptr,
                                            "rshmem_wait_until_some");
}
template <typename T>
RSHMEM_DEVICE void rshmem_wait_until_all_vector(const T *ivars, size_t nelems, const int *status, int cmp,
                                                const T *cmp_values) {
  rshmemi_wait_set<RSHMEMI_SET_ALL, T>(ivars, nelems, nullptr, status, cmp, T(), cmp_values,
                                    "rshmem_wait_until_all_vector");
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_wait_until_any_vector(const T *ivars, size_t nelems, const int *status, int cmp,
                                                  const T *cmp_values) {
  return rshmemi_wait_set<RSHMEMI_SET_ANY, T>(ivars, nelems, nullptr, status, cmp, T(), cmp_values,
                                           "rshmem_wait_until_any_vector");
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_wait_until_some_vector(const T *ivars, size_t nelems, size_t *indices,
                                                   const int *status, int cmp, const T *cmp_values) {
  return rshmemi_wait_set<RSHMEMI_SET_SOME, T>(ivars, nelems, indices, status, cmp, T(), cmp_values,
                                            "rshmem_wait_until_some_vector");
}
template <typename T>
RSHMEM_DEVICE int rshmem_test_all(const T *ivars, size_t nelems, const int *status, int cmp, T value) {
  return rshmemi_test_set<RSHMEMI_SET_ALL, T>(ivars, nelems, nullptr, status, cmp, value, nullptr,
                                           "rshmem_test_all") == ~static_cast<size_t>(0);
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_test_any(const T *ivars, size_t nelems, const int *status, int cmp, T value) {
  return rshmemi_test_set<RSHMEMI_SET_ANY, T>(ivars, nelems, nullptr, status, cmp, value, nullptr, "rshmem_test_any");
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_test_some(const T *ivars, size_t nelems, size_t *indices, const int *status, int cmp,
                                      T value) {
  return rshmemi_test_set<RSHMEMI_SET_SOME, T>(ivars, nelems, indices, status, cmp, value, nullptr,
                                            "rshmem_test_some");
}
template <typename T>
RSHMEM_DEVICE int rshmem_test_all_vector(const T *ivars, size_t nelems, const int *status, int cmp,
                                         const T *cmp_values) {
  return rshmemi_test_set<RSHMEMI_SET_ALL, T>(ivars, nelems, nullptr, status, cmp, T(), cmp_values,
                                           "rshmem_test_all_vector") == ~static_cast<size_t>(0);
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_test_any_vector(const T *ivars, size_t nelems, const int *status, int cmp,
                                            const T *cmp_values) {
  return rshmemi_test_set<RSHMEMI_SET_ANY, T>(ivars, nelems, nullptr, status, cmp, T(), cmp_values,
                                           "rshmem_test_any_vector");
}
template <typename T>
RSHMEM_DEVICE size_t rshmem_test_some_vector(const T *ivars, size_t nelems, size_t *indices, const int *status,
                                             int cmp, const T *cmp_values) {
  return rshmemi_test_set<RSHMEMI_SET_SOME, T>(ivars, nelems, indices, status, cmp, T(), cmp_values,
                                            "rshmem_test_some_vector");
}

#undef RSHMEMI_W

// The standard AMO / point-to-point synchronisation types: (NAME, TYPE).
#define RSHMEM_AMO_TYPES(X)    \
  X(int, int)                  \
  X(long, long)                \
  X(longlong, long long)       \
  X(uint, unsigned int)        \
  X(ulong, unsigned long)      \
  X(ulonglong, unsigned long long) \
  X(int32, int32_t)            \
  X(int64, int64_t)            \
  X(uint32, uint32_t)          \
  X(uint64, uint64_t)          \
  X(size, size_t)              \
  X(ptrdiff, ptrdiff_t)

#define RSHMEMI_TYPED_AMO(NAME, TYPE)                                                           \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_fetch(const TYPE *source, int pe) {                 \
    return rshmem_atomic_fetch<TYPE>(source, pe);                                               \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_atomic_set(TYPE *dest, TYPE value, int pe) {               \
    rshmem_atomic_set<TYPE>(dest, value, pe);                                                   \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_swap(TYPE *dest, TYPE value, int pe) {              \
    return rshmem_atomic_swap<TYPE>(dest, value, pe);                                           \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_compare_swap(TYPE *dest, TYPE cond, TYPE value,     \
                                                         int pe) {                              \
    return rshmem_atomic_compare_swap<TYPE>(dest, cond, value, pe);                             \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_fetch_add(TYPE *dest, TYPE value, int pe) {         \
    return rshmem_atomic_fetch_add<TYPE>(dest, value, pe);                                      \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_atomic_add(TYPE *dest, TYPE value, int pe) {               \
    rshmem_atomic_add<TYPE>(dest, value, pe);                                                   \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_fetch_inc(TYPE *dest, int pe) {                     \
    return rshmem_atomic_fetch_inc<TYPE>(dest, pe);                                             \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_atomic_inc(TYPE *dest, int pe) {                           \
    rshmem_atomic_inc<TYPE>(dest, pe);                                                          \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_fetch_and(TYPE *dest, TYPE value, int pe) {         \
    return rshmem_atomic_fetch_and<TYPE>(dest, value, pe);                                      \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_atomic_and(TYPE *dest, TYPE value, int pe) {               \
    rshmem_atomic_and<TYPE>(dest, value, pe);                                                   \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_fetch_or(TYPE *dest, TYPE value, int pe) {          \
    return rshmem_atomic_fetch_or<TYPE>(dest, value, pe);                                       \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_atomic_or(TYPE *dest, TYPE value, int pe) {                \
    rshmem_atomic_or<TYPE>(dest, value, pe);                                                    \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_atomic_fetch_xor(TYPE *dest, TYPE value, int pe) {         \
    return rshmem_atomic_fetch_xor<TYPE>(dest, value, pe);                                      \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_atomic_xor(TYPE *dest, TYPE value, int pe) {               \
    rshmem_atomic_xor<TYPE>(dest, value, pe);                                                   \
  }                                                                                             \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_wait_until(const TYPE *ivar, int cmp, TYPE value) {        \
    return rshmem_wait_until<TYPE>(ivar, cmp, value);                                           \
  }                                                                                             \
  RSHMEM_DEVICE int rshmem_##NAME##_test(const TYPE *ivar, int cmp, TYPE value) {               \
    return rshmem_test<TYPE>(ivar, cmp, value);                                                 \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_wait_until_all(const TYPE *ivars, size_t nelems,           \
      const int *status, int cmp, TYPE value) {                                                 \
    rshmem_wait_until_all<TYPE>(ivars, nelems, status, cmp, value);                             \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_wait_until_any(const TYPE *ivars, size_t nelems,         \
      const int *status, int cmp, TYPE value) {                                                 \
    return rshmem_wait_until_any<TYPE>(ivars, nelems, status, cmp, value);                      \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_wait_until_some(const TYPE *ivars, size_t nelems,        \
      size_t *indices, const int *status, int cmp, TYPE value) {                                \
    return rshmem_wait_until_some<TYPE>(ivars, nelems, indices, status, cmp, value);            \
  }                                                                                             \
  RSHMEM_DEVICE void rshmem_##NAME##_wait_until_all_vector(const TYPE *ivars, size_t nelems,    \
      const int *status, int cmp, const TYPE *cmp_values) {                                     \
    rshmem_wait_until_all_vector<TYPE>(ivars, nelems, status, cmp, cmp_values);                 \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_wait_until_any_vector(const TYPE *ivars, size_t nelems,  \
      const int *status, int cmp, const TYPE *cmp_values) {                                     \
    return rshmem_wait_until_any_vector<TYPE>(ivars, nelems, status, cmp, cmp_values);          \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_wait_until_some_vector(const TYPE *ivars, size_t nelems, \
      size_t *indices, const int *status, int cmp, const TYPE *cmp_values) {                    \
    return rshmem_wait_until_some_vector<TYPE>(ivars, nelems,                                   \
                                               indices, status, cmp, cmp_values);               \
  }                                                                                             \
  RSHMEM_DEVICE int rshmem_##NAME##_test_all(const TYPE *ivars, size_t nelems,                  \
      const int *status, int cmp, TYPE value) {                                                 \
    return rshmem_test_all<TYPE>(ivars, nelems, status, cmp, value);                            \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_test_any(const TYPE *ivars, size_t nelems,               \
      const int *status, int cmp, TYPE value) {                                                 \
    return rshmem_test_any<TYPE>(ivars, nelems, status, cmp, value);                            \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_test_some(const TYPE *ivars, size_t nelems,              \
      size_t *indices, const int *status, int cmp, TYPE value) {                                \
    return rshmem_test_some<TYPE>(ivars, nelems, indices, status, cmp, value);                  \
  }                                                                                             \
  RSHMEM_DEVICE int rshmem_##NAME##_test_all_vector(const TYPE *ivars, size_t nelems,           \
      const int *status, int cmp, const TYPE *cmp_values) {                                     \
    return rshmem_test_all_vector<TYPE>(ivars, nelems, status, cmp, cmp_values);                \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_test_any_vector(const TYPE *ivars, size_t nelems,        \
      const int *status, int cmp, const TYPE *cmp_values) {                                     \
    return rshmem_test_any_vector<TYPE>(ivars, nelems, status, cmp, cmp_values);                \
  }                                                                                             \
  RSHMEM_DEVICE size_t rshmem_##NAME##_test_some_vector(const TYPE *ivars, size_t nelems,       \
      size_t *indices, const int *status, int cmp, const TYPE *cmp_values) {                    \
    return rshmem_test_some_vector<TYPE>(ivars, nelems, indices, status, cmp, cmp_values);      \
  }
RSHMEM_AMO_TYPES(RSHMEMI_TYPED_AMO)
#undef RSHMEMI_TYPED_AMO

#endif  // __CUDACC__
