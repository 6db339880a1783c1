// rshmem/device/amo.cuh — remote atomics and the point-to-point wait/test family.
//
// Owns: rshmem_<type>_atomic_{fetch,set,swap,compare_swap,fetch_add,add,fetch_inc,inc,
// fetch_and,and,fetch_or,or,fetch_xor,xor} on 32/64-bit integers, and
// rshmem_<type>_wait_until / rshmem_<type>_test (+ the templates behind them).
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
  typedef rshmemi_word_t<T> W;
  const rshmemi_target_t t = rshmemi_resolve(dest, sizeof(T), pe, what, true);
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
  const rshmemi_word_t<T> *w = reinterpret_cast<const rshmemi_word_t<T> *>(ivar);
  return rshmemi_poll<T>(ivar, cmp, value, [w] { return static_cast<T>(rshmemi_ld_acquire_sys(w)); },
                         "rshmem_wait_until");
}

// 1 when `*ivar <cmp> value` now (one acquire load), else 0. An invalid cmp traps (BAD_ARG).
template <typename T>
RSHMEM_DEVICE int rshmem_test(const T *ivar, int cmp, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "rshmem waits take 32- or 64-bit integers");
  rshmemi_check_local(ivar, sizeof(T), rshmemi_device_state.my_pe, "rshmem_test");
  const T v = static_cast<T>(rshmemi_ld_acquire_sys(reinterpret_cast<const rshmemi_word_t<T> *>(ivar)));
  if (!rshmemi_cmp_valid(cmp))
    rshmemi_wait_failed(ivar, cmp, static_cast<uint64_t>(value), static_cast<uint64_t>(v), "rshmem_test");
  return rshmemi_cmp_holds(v, cmp, value) ? 1 : 0;
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
  }
RSHMEM_AMO_TYPES(RSHMEMI_TYPED_AMO)
#undef RSHMEMI_TYPED_AMO

#endif  // __CUDACC__
