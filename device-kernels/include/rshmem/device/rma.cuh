// rshmem/device/rma.cuh — put/get/p/g, put_signal, signal_op/fetch, quiet, fence, ptr.
//
// Owns: the RMA and signal families of the device API at thread, warp and block scope,
// typed (rshmem_<type>_put ...) and untyped (rshmem_putmem ...) names, and the C++
// templates behind them (rshmem_put<T> ...). Semantics: docs/device-api.md.
// Must not: be included by host C++ (device-only; rshmem/rshmem.cuh includes it under nvcc).
//
// rshmem-check: device-only (device function bodies; see rshmem/rshmem.cuh)
//
// Scopes. _warp: every lane of the warp (rshmemi_warp_lanes: 32, fewer in a block's last
// partial warp) calls with the same arguments (converged); the
// lanes split the copy. _block: every thread of the block calls with the same arguments;
// the threads split the copy. Both end with __syncwarp() / __syncthreads(), so after the
// call every participant may rely on the whole operation having been issued (put) or
// completed (get). Copies use 16-byte accesses when dest ≡ source (mod 16), else 8/4/1
// bytes, with byte-wise heads and tails (rshmem/device/copy.cuh).
//
// Completion (p2p transport). A put is a sequence of stores into the peer's mapped heap:
// the source is reusable on return, and the data is visible to the target no later than
// the next rshmem_quiet / barrier_all of the calling thread. The _nbi forms have the same
// code today but keep OpenSHMEM's weaker contract (complete at quiet) so programs stay
// correct on transports where they differ. A get is complete (data in dest) on return.
//
// Completion (IBGDA transport, rshmem/device/ibgda.cuh). In the warp/block forms the
// scope's first thread posts the whole operation (one WQE, or one per GiB / per 256-byte
// inline piece) and the scope barrier follows. A blocking put returns once its source may
// be reused (an SGE WRITE waits for its completion); an _nbi put completes at quiet. Gets
// (also _nbi) are complete on return. quiet/fence act on every queue of the table (and
// on this PE's own stores, as on p2p).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "rshmem/device/copy.cuh"
#include "rshmem/device/core.cuh"
#include "rshmem/device/ibgda.cuh"

#if defined(__CUDACC__)

// NVSHMEM's `half` and `bfloat16` RMA types come from the CUDA headers. They are included
// where the compiler finds them (nvcc; NVRTC when given the CUDA include directory), and
// the typed names below exist whenever the types do (also when the kernel source included
// the headers itself). RSHMEM_NO_FP16_TYPES keeps the headers and the names out.
#if !defined(RSHMEM_NO_FP16_TYPES) && defined(__has_include)
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#endif
#if __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#endif

enum { RSHMEMI_THREAD = 0, RSHMEMI_WARP = 1, RSHMEMI_BLOCK = 2 };

template <int S>
RSHMEM_DEVICE uint32_t rshmemi_scope_rank() {
  return S == RSHMEMI_THREAD ? 0u : S == RSHMEMI_WARP ? rshmemi_lane() : rshmemi_block_thread();
}
template <int S>
RSHMEM_DEVICE uint32_t rshmemi_scope_size() {
  return S == RSHMEMI_THREAD ? 1u : S == RSHMEMI_WARP ? rshmemi_warp_lanes() : rshmemi_block_threads();
}
template <int S>
RSHMEM_DEVICE void rshmemi_scope_sync() {
  if (S == RSHMEMI_WARP) __syncwarp(rshmemi_warp_mask());
  if (S == RSHMEMI_BLOCK) __syncthreads();
}

// ---- queries ----------------------------------------------------------------------------

RSHMEM_DEVICE int rshmem_my_pe() {
  rshmemi_require_bound("rshmem_my_pe");
  return rshmemi_device_state.my_pe;
}

RSHMEM_DEVICE int rshmem_n_pes() {
  rshmemi_require_bound("rshmem_n_pes");
  return rshmemi_device_state.n_pes;
}

// The address through which this thread can load/store `ptr` (a symmetric address) on PE
// `pe` directly, or nullptr when it cannot: PE out of range, ptr outside the heap, or no
// load/store path (transport other than P2P). Never traps (except for an unbound module).
RSHMEM_DEVICE void *rshmem_ptr(const void *ptr, int pe) {
  rshmemi_require_bound("rshmem_ptr");
  const rshmem_device_state_t &s = rshmemi_device_state;
  const uint64_t addr = reinterpret_cast<uint64_t>(ptr);
  if (pe < 0 || pe >= s.n_pes || !rshmemi_range_in_heap(s.heap_base, s.heap_size, addr, 1))
    return nullptr;
  if (pe == s.my_pe) return const_cast<void *>(ptr);
  const rshmem_peer_t *peer = reinterpret_cast<const rshmem_peer_t *>(s.peers) + pe;
  if (__ldg(&peer->transport) != RSHMEM_TRANSPORT_P2P) return nullptr;
  return reinterpret_cast<void *>(rshmemi_translate(s.heap_base, __ldg(&peer->heap_base), addr));
}

// ---- ordering ---------------------------------------------------------------------------

// Completes every put, p, AMO and signal this thread issued before: fence.sc.sys makes
// all of this thread's earlier stores and atomics performed at system scope (visible to
// every PE, on this GPU or another) before any later memory operation of the thread.
// p2p has nothing else in flight. Gets are already complete when they return.
RSHMEM_DEVICE void rshmem_quiet() {
  __threadfence_system();
  if (RSHMEMI_IBGDA_ENABLED && rshmemi_device_state.ibgda != 0) rshmemi_ibgda_quiet();
}

// Orders this thread's puts/AMOs/signals to each PE: those before the fence become visible
// before those after it to a PE that observes a later one with an acquiring read (a
// wait/test, signal wait, atomic fetch). On p2p the same system-scope fence as quiet; the
// later "flag" must be written with a strong store (rshmem_<T>_p, signal_op, an atomic)
// for the PTX memory model to give that guarantee (a plain put of the flag works on
// today's GPUs but is formally a data race).
RSHMEM_DEVICE void rshmem_fence() {
  __threadfence_system();
  if (RSHMEMI_IBGDA_ENABLED && rshmemi_device_state.ibgda != 0) rshmemi_ibgda_fence();
}

// ---- put / get --------------------------------------------------------------------------

template <int S, bool Nbi = false>
RSHMEM_DEVICE void rshmemi_putmem(void *dest, const void *source, size_t bytes, int pe,
                                  const char *what) {
  // Warp/block scope: what any thread of the group wrote to source before the call is what
  // the group sends (a thread's copy share, or rank 0's WQE, reads other threads' words).
  rshmemi_scope_sync<S>();
  const rshmemi_target_t t = rshmemi_resolve(dest, bytes, pe, what);
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P:
      rshmemi_copy(reinterpret_cast<void *>(t.addr), source, bytes, rshmemi_scope_rank<S>(),
                   rshmemi_scope_size<S>());
      break;
    case RSHMEM_TRANSPORT_IBGDA:
      if (RSHMEMI_IBGDA_ENABLED) {
        if (rshmemi_scope_rank<S>() == 0) rshmemi_ibgda_put(pe, t.addr, source, bytes, !Nbi, what);
        break;
      }
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(dest), bytes, what);
  }
  rshmemi_scope_sync<S>();
}

template <int S>
RSHMEM_DEVICE void rshmemi_getmem(void *dest, const void *source, size_t bytes, int pe,
                                  const char *what) {
  // Warp/block scope: every thread of the group is done with dest before any writes it.
  rshmemi_scope_sync<S>();
  const rshmemi_target_t t = rshmemi_resolve(source, bytes, pe, what);
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P:
      rshmemi_copy<true>(dest, reinterpret_cast<const void *>(t.addr), bytes,
                         rshmemi_scope_rank<S>(), rshmemi_scope_size<S>());
      break;
    case RSHMEM_TRANSPORT_IBGDA:
      if (RSHMEMI_IBGDA_ENABLED) {
        if (rshmemi_scope_rank<S>() == 0) rshmemi_ibgda_get(pe, dest, t.addr, bytes, what);
        break;
      }
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(source), bytes, what);
  }
  rshmemi_scope_sync<S>();
}

// The volatile access of one element. Scalars (arithmetic types, enums, pointers) are
// accessed as themselves; classes (__half, __nv_bfloat16, __half2, float2, ...: their
// volatile assignment and copy are not all defined) through an unsigned integer of their
// size, the same 1/2/4/8-byte access.
template <int N>
struct rshmemi_uint_n;
template <>
struct rshmemi_uint_n<1> {
  typedef uint8_t type;
};
template <>
struct rshmemi_uint_n<2> {
  typedef uint16_t type;
};
template <>
struct rshmemi_uint_n<4> {
  typedef uint32_t type;
};
template <>
struct rshmemi_uint_n<8> {
  typedef uint64_t type;
};
template <typename T, bool Class = __is_class(T)>
struct rshmemi_volatile {
  static RSHMEM_DEVICE void store(uint64_t addr, T v) { *reinterpret_cast<volatile T *>(addr) = v; }
  static RSHMEM_DEVICE T load(uint64_t addr) { return *reinterpret_cast<const volatile T *>(addr); }
};
template <typename T>
struct rshmemi_volatile<T, true> {
  typedef typename rshmemi_uint_n<sizeof(T)>::type U;
  static RSHMEM_DEVICE void store(uint64_t addr, T v) {
    U b;
    memcpy(&b, &v, sizeof(T));
    *reinterpret_cast<volatile U *>(addr) = b;
  }
  static RSHMEM_DEVICE T load(uint64_t addr) {
    const U b = *reinterpret_cast<const volatile U *>(addr);
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
  }
};

// One element, thread scope. A volatile access is a strong relaxed access at system scope
// (never torn for naturally aligned 1/2/4/8-byte types), so a p can serve as the flag
// after rshmem_fence and a g sees the latest value.
template <typename T>
RSHMEM_DEVICE void rshmem_p(T *dest, T value, int pe) {
  const rshmemi_target_t t = rshmemi_resolve(dest, sizeof(T), pe, "rshmem_p");
  // Aligned to the access's width, sizeof(T), not alignof(T): a class type such as
  // struct { float x, y; } (size 8, alignment 4) is stored as one 8-byte word.
  rshmemi_check_aligned(dest, sizeof(T), pe, "rshmem_p");
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P: rshmemi_volatile<T>::store(t.addr, value); break;
    case RSHMEM_TRANSPORT_IBGDA:
      if (RSHMEMI_IBGDA_ENABLED) {
        static_assert(sizeof(T) <= 8, "rshmem_p takes types of at most 8 bytes");
        uint64_t bits = 0;
        memcpy(&bits, &value, sizeof(T));
        rshmemi_ibgda_p(pe, t.addr, bits, sizeof(T), "rshmem_p");
        break;
      }
      [[fallthrough]];
    default: rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(dest), sizeof(T), "rshmem_p");
  }
}

template <typename T>
RSHMEM_DEVICE T rshmem_g(const T *source, int pe) {
  const rshmemi_target_t t = rshmemi_resolve(source, sizeof(T), pe, "rshmem_g");
  rshmemi_check_aligned(source, sizeof(T), pe, "rshmem_g");  // the access's width, as in p
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P: return rshmemi_volatile<T>::load(t.addr);
    case RSHMEM_TRANSPORT_IBGDA:
      if (RSHMEMI_IBGDA_ENABLED) {
        static_assert(sizeof(T) <= 8, "rshmem_g takes types of at most 8 bytes");
        const uint64_t bits = rshmemi_ibgda_read_small(pe, t.addr, sizeof(T), "rshmem_g");
        T v;
        memcpy(&v, &bits, sizeof(T));
        return v;
      }
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(source), sizeof(T), "rshmem_g");
      return T();
  }
}

#define RSHMEMI_DEF_MEM(suffix, S, nbi)                                                        \
  RSHMEM_DEVICE void rshmem_putmem##suffix(void *dest, const void *source, size_t bytes,       \
                                           int pe) {                                           \
    rshmemi_putmem<S, nbi>(dest, source, bytes, pe, "rshmem_putmem" #suffix);                  \
  }                                                                                            \
  RSHMEM_DEVICE void rshmem_getmem##suffix(void *dest, const void *source, size_t bytes,       \
                                           int pe) {                                           \
    rshmemi_getmem<S>(dest, source, bytes, pe, "rshmem_getmem" #suffix);                       \
  }                                                                                            \
  template <typename T>                                                                        \
  RSHMEM_DEVICE void rshmem_put##suffix(T *dest, const T *source, size_t nelems, int pe) {     \
    rshmemi_putmem<S, nbi>(dest, source, rshmemi_bytes<T>(nelems), pe, "rshmem_put" #suffix);  \
  }                                                                                            \
  template <typename T>                                                                        \
  RSHMEM_DEVICE void rshmem_get##suffix(T *dest, const T *source, size_t nelems, int pe) {     \
    rshmemi_getmem<S>(dest, source, rshmemi_bytes<T>(nelems), pe, "rshmem_get" #suffix);       \
  }
RSHMEMI_DEF_MEM(, RSHMEMI_THREAD, false)
RSHMEMI_DEF_MEM(_nbi, RSHMEMI_THREAD, true)
RSHMEMI_DEF_MEM(_warp, RSHMEMI_WARP, false)
RSHMEMI_DEF_MEM(_nbi_warp, RSHMEMI_WARP, true)
RSHMEMI_DEF_MEM(_block, RSHMEMI_BLOCK, false)
RSHMEMI_DEF_MEM(_nbi_block, RSHMEMI_BLOCK, true)
#undef RSHMEMI_DEF_MEM

// ---- signals ----------------------------------------------------------------------------

// The signal update of a thread-scope put_signal / signal_op: a release operation at
// system scope, so the data this thread stored before is visible to whoever acquires the
// signal (signal_wait_until, signal_fetch). SET stores, ADD adds atomically.
RSHMEM_DEVICE void rshmemi_signal_release(uint64_t *remote, uint64_t signal, int sig_op, int pe,
                                          const char *what) {
  if (sig_op == RSHMEM_SIGNAL_SET) {
    rshmemi_st_release_sys(remote, signal);
  } else if (sig_op == RSHMEM_SIGNAL_ADD) {
    rshmemi_red_add(remote, signal);
  } else {
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, pe, reinterpret_cast<uint64_t>(remote), 8, 0,
                 static_cast<uint32_t>(sig_op), what, "invalid signal operator (not SET or ADD)");
  }
}

// Warp/block put_signal: after the scope barrier the leader fences at system scope
// (fence.sc.sys, cumulative over the other threads' stores it synchronised with at the
// barrier) and then updates the signal with a relaxed strong operation — the pattern
// NVSHMEM's p2p block put_signal uses.
RSHMEM_DEVICE void rshmemi_signal_after_fence(uint64_t *remote, uint64_t signal, int sig_op,
                                              int pe, const char *what) {
  __threadfence_system();
  if (sig_op == RSHMEM_SIGNAL_SET) {
    rshmemi_st_relaxed_sys(remote, signal);
  } else if (sig_op == RSHMEM_SIGNAL_ADD) {
    rshmemi_red_add_relaxed_sys(remote, signal);
  } else {
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, pe, reinterpret_cast<uint64_t>(remote), 8, 0,
                 static_cast<uint32_t>(sig_op), what, "invalid signal operator (not SET or ADD)");
  }
}

// Traps unless sig_op is SET or ADD: checked before anything is sent (before 2026-12-07 a
// put_signal over P2P copied its data to the peer and then trapped on the operator).
RSHMEM_DEVICE void rshmemi_check_sig_op(const uint64_t *sig_addr, int sig_op, int pe, const char *what) {
  if (sig_op != RSHMEM_SIGNAL_SET && sig_op != RSHMEM_SIGNAL_ADD)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, pe, reinterpret_cast<uint64_t>(sig_addr), 8, 0,
                 static_cast<uint32_t>(sig_op), what, "invalid signal operator (not SET or ADD)");
}

// Atomically updates the signal word sig_addr (symmetric, 8-byte aligned) on `pe`.
RSHMEM_DEVICE void rshmem_signal_op(uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) {
  rshmemi_check_sig_op(sig_addr, sig_op, pe, "rshmem_signal_op");
  const rshmemi_target_t t =
      rshmemi_resolve(sig_addr, 8, pe, "rshmem_signal_op", true, sig_op == RSHMEM_SIGNAL_ADD);
  rshmemi_check_aligned(sig_addr, 8, pe, "rshmem_signal_op");
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P:
      rshmemi_signal_release(reinterpret_cast<uint64_t *>(t.addr), signal, sig_op, pe,
                             "rshmem_signal_op");
      break;
    case RSHMEM_TRANSPORT_IBGDA:
      if (RSHMEMI_IBGDA_ENABLED) {
        rshmemi_ibgda_signal(pe, t.addr, signal, sig_op, "rshmem_signal_op");
        break;
      }
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(sig_addr), 8, "rshmem_signal_op");
  }
}

// Acquire load of this PE's signal word.
RSHMEM_DEVICE uint64_t rshmem_signal_fetch(const uint64_t *sig_addr) {
  rshmemi_check_local(sig_addr, 8, rshmemi_device_state.my_pe, "rshmem_signal_fetch");
  rshmemi_check_aligned(sig_addr, 8, rshmemi_device_state.my_pe, "rshmem_signal_fetch");
  return rshmemi_ld_acquire_sys(sig_addr);
}

// Waits (bounded by RSHMEM_TIMEOUT_MS) until `*sig_addr <cmp> value` on this PE; returns
// the value that satisfied it. Acquire: data put before the signal is visible afterwards.
RSHMEM_DEVICE uint64_t rshmem_signal_wait_until(const uint64_t *sig_addr, int cmp, uint64_t value) {
  rshmemi_check_local(sig_addr, 8, rshmemi_device_state.my_pe, "rshmem_signal_wait_until");
  rshmemi_check_aligned(sig_addr, 8, rshmemi_device_state.my_pe, "rshmem_signal_wait_until");
  return rshmemi_poll<uint64_t>(sig_addr, cmp, value,
                                [sig_addr] { return rshmemi_ld_acquire_sys(sig_addr); },
                                "rshmem_signal_wait_until");
}

// putmem then the signal update, ordered: the target sees the data whenever it sees the
// signal (acquire). The _nbi forms: same order guarantee, completion at quiet.
template <int S, bool Nbi = false>
RSHMEM_DEVICE void rshmemi_putmem_signal(void *dest, const void *source, size_t bytes,
                                         uint64_t *sig_addr, uint64_t signal, int sig_op, int pe,
                                         const char *what) {
  rshmemi_check_sig_op(sig_addr, sig_op, pe, what);
  // Warp/block scope: the group's writes to source before the call are what it sends.
  rshmemi_scope_sync<S>();
  // amo: the signal is an atomic update (the whole operation takes the loopback queue
  // when the state routes the own PE's atomics through it); rmw only for the signal, and
  // only an ADD is a read-modify-write.
  const rshmemi_target_t t = rshmemi_resolve(dest, bytes, pe, what, true);
  const rshmemi_target_t ts = rshmemi_resolve(sig_addr, 8, pe, what, true, sig_op == RSHMEM_SIGNAL_ADD);
  rshmemi_check_aligned(sig_addr, 8, pe, what);
  switch (t.transport) {
    case RSHMEM_TRANSPORT_P2P:
      rshmemi_copy(reinterpret_cast<void *>(t.addr), source, bytes, rshmemi_scope_rank<S>(),
                   rshmemi_scope_size<S>());
      if (S == RSHMEMI_THREAD) {
        rshmemi_signal_release(reinterpret_cast<uint64_t *>(ts.addr), signal, sig_op, pe, what);
      } else {
        rshmemi_scope_sync<S>();
        if (rshmemi_scope_rank<S>() == 0)
          rshmemi_signal_after_fence(reinterpret_cast<uint64_t *>(ts.addr), signal, sig_op, pe, what);
      }
      break;
    case RSHMEM_TRANSPORT_IBGDA:
      // One reservation: the WRITE, then the FENCEd signal WQE (lands after the data).
      if (RSHMEMI_IBGDA_ENABLED) {
        if (rshmemi_scope_rank<S>() == 0)
          rshmemi_ibgda_put_signal(pe, t.addr, source, bytes, ts.addr, signal, sig_op, !Nbi, what);
        break;
      }
      [[fallthrough]];
    default:
      rshmemi_no_transport(t.transport, pe, reinterpret_cast<uint64_t>(dest), bytes, what);
  }
  rshmemi_scope_sync<S>();
}

#define RSHMEMI_DEF_SIG(suffix, S, nbi)                                                          \
  RSHMEM_DEVICE void rshmem_putmem_signal##suffix(void *dest, const void *source, size_t bytes,  \
                                                  uint64_t *sig_addr, uint64_t signal,           \
                                                  int sig_op, int pe) {                          \
    rshmemi_putmem_signal<S, nbi>(dest, source, bytes, sig_addr, signal, sig_op, pe,             \
                             "rshmem_putmem_signal" #suffix);                                    \
  }                                                                                              \
  template <typename T>                                                                          \
  RSHMEM_DEVICE void rshmem_put_signal##suffix(T *dest, const T *source, size_t nelems,          \
                                               uint64_t *sig_addr, uint64_t signal, int sig_op,  \
                                               int pe) {                                         \
    rshmemi_putmem_signal<S, nbi>(dest, source, rshmemi_bytes<T>(nelems), sig_addr, signal, sig_op, pe, \
                             "rshmem_put_signal" #suffix);                                       \
  }
RSHMEMI_DEF_SIG(, RSHMEMI_THREAD, false)
RSHMEMI_DEF_SIG(_nbi, RSHMEMI_THREAD, true)
RSHMEMI_DEF_SIG(_warp, RSHMEMI_WARP, false)
RSHMEMI_DEF_SIG(_nbi_warp, RSHMEMI_WARP, true)
RSHMEMI_DEF_SIG(_block, RSHMEMI_BLOCK, false)
RSHMEMI_DEF_SIG(_nbi_block, RSHMEMI_BLOCK, true)
#undef RSHMEMI_DEF_SIG

// ---- typed names ------------------------------------------------------------------------

// The standard RMA types of OpenSHMEM 1.5 / NVSHMEM: (NAME, TYPE). NVSHMEM's `half` and
// `bfloat16` follow the list, where the CUDA headers define them.
#define RSHMEM_RMA_TYPES(X)                                                                  \
  X(float, float)                                                                            \
  X(double, double)                                                                          \
  X(char, char)                                                                              \
  X(schar, signed char)                                                                      \
  X(short, short)                                                                            \
  X(int, int)                                                                                \
  X(long, long)                                                                              \
  X(longlong, long long)                                                                     \
  X(uchar, unsigned char)                                                                    \
  X(ushort, unsigned short)                                                                  \
  X(uint, unsigned int)                                                                      \
  X(ulong, unsigned long)                                                                    \
  X(ulonglong, unsigned long long)                                                           \
  X(int8, int8_t)                                                                            \
  X(int16, int16_t)                                                                          \
  X(int32, int32_t)                                                                          \
  X(int64, int64_t)                                                                          \
  X(uint8, uint8_t)                                                                          \
  X(uint16, uint16_t)                                                                        \
  X(uint32, uint32_t)                                                                        \
  X(uint64, uint64_t)                                                                        \
  X(size, size_t)                                                                            \
  X(ptrdiff, ptrdiff_t)

#define RSHMEMI_TYPED_SCOPE(NAME, TYPE, suffix)                                                  \
  RSHMEM_DEVICE void rshmem_##NAME##_put##suffix(TYPE *dest, const TYPE *source, size_t nelems,  \
                                                 int pe) {                                       \
    rshmem_put##suffix<TYPE>(dest, source, nelems, pe);                                          \
  }                                                                                              \
  RSHMEM_DEVICE void rshmem_##NAME##_get##suffix(TYPE *dest, const TYPE *source, size_t nelems,  \
                                                 int pe) {                                       \
    rshmem_get##suffix<TYPE>(dest, source, nelems, pe);                                          \
  }                                                                                              \
  RSHMEM_DEVICE void rshmem_##NAME##_put_signal##suffix(TYPE *dest, const TYPE *source,          \
                                                        size_t nelems, uint64_t *sig_addr,       \
                                                        uint64_t signal, int sig_op, int pe) {   \
    rshmem_put_signal##suffix<TYPE>(dest, source, nelems, sig_addr, signal, sig_op, pe);         \
  }
#define RSHMEMI_TYPED_RMA(NAME, TYPE)                                                            \
  RSHMEMI_TYPED_SCOPE(NAME, TYPE, )                                                              \
  RSHMEMI_TYPED_SCOPE(NAME, TYPE, _nbi)                                                          \
  RSHMEMI_TYPED_SCOPE(NAME, TYPE, _warp)                                                         \
  RSHMEMI_TYPED_SCOPE(NAME, TYPE, _nbi_warp)                                                     \
  RSHMEMI_TYPED_SCOPE(NAME, TYPE, _block)                                                        \
  RSHMEMI_TYPED_SCOPE(NAME, TYPE, _nbi_block)                                                    \
  RSHMEM_DEVICE void rshmem_##NAME##_p(TYPE *dest, TYPE value, int pe) {                         \
    rshmem_p<TYPE>(dest, value, pe);                                                             \
  }                                                                                              \
  RSHMEM_DEVICE TYPE rshmem_##NAME##_g(const TYPE *source, int pe) {                             \
    return rshmem_g<TYPE>(source, pe);                                                           \
  }
RSHMEM_RMA_TYPES(RSHMEMI_TYPED_RMA)
// NVSHMEM's 16-bit float RMA types, where the CUDA headers define them (see the top).
#if defined(__CUDA_FP16_TYPES_EXIST__) && !defined(RSHMEM_NO_FP16_TYPES)
RSHMEMI_TYPED_RMA(half, __half)
#endif
#if defined(__CUDA_BF16_TYPES_EXIST__) && !defined(RSHMEM_NO_FP16_TYPES)
RSHMEMI_TYPED_RMA(bfloat16, __nv_bfloat16)
#endif
#undef RSHMEMI_TYPED_RMA
#undef RSHMEMI_TYPED_SCOPE

#endif  // __CUDACC__
