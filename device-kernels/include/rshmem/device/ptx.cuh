// rshmem/device/ptx.cuh — the inline-PTX primitives of the device API: the clock, the
// lane id, and the acquire/release/relaxed loads, stores and read-modify-writes at system
// and GPU scope that every other device header builds on.
//
// Owns: every `asm` statement of the device API, and nothing else, so that a host build of
// the API (the CPU emulation in host/tests/device-emu/, which supplies its own ptx.cuh
// with the same functions over host atomics) replaces exactly this file and runs the rest
// of the API's code unchanged.
// Must not: be included directly (rshmem/device/core.cuh includes it under nvcc/NVRTC);
// hold any logic beyond one PTX instruction per function.
//
// rshmem-check: device-only (inline PTX)
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"

#if defined(__CUDACC__)
RSHMEM_DEVICE uint64_t rshmemi_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

RSHMEM_DEVICE uint32_t rshmemi_lane() {
  uint32_t l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

// Acquire loads: later loads of this thread see everything the writer released before
// the value was written.
RSHMEM_DEVICE uint32_t rshmemi_ld_acquire_sys(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint64_t rshmemi_ld_acquire_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint32_t rshmemi_ld_acquire_gpu(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Release stores: every earlier load/store of this thread (and what it has observed) is
// visible to a thread that acquires this value.
RSHMEM_DEVICE void rshmemi_st_release_sys(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
RSHMEM_DEVICE void rshmemi_st_release_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
RSHMEM_DEVICE void rshmemi_st_release_gpu(uint32_t *p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Relaxed strong store: atomic (never torn), no ordering of its own; used after a fence.
RSHMEM_DEVICE void rshmemi_st_relaxed_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
RSHMEM_DEVICE void rshmemi_st_relaxed_gpu(uint32_t *p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Read-modify-writes on 32/64-bit words at system scope. The fetching forms are acq_rel
// (as the host API's AcqRel RMWs, docs/runtime.md); the non-fetching `red` forms are
// release (they publish; nothing is read back to acquire from).
#define RSHMEMI_ATOM(name, ptxop, ty, cty, reg)                                       \
  RSHMEM_DEVICE cty name(cty *p, cty v) {                                             \
    cty old;                                                                          \
    asm volatile("atom.acq_rel.sys.global." ptxop "." ty " %0, [%1], %2;"             \
                 : "=" reg(old)                                                       \
                 : "l"(p), reg(v)                                                     \
                 : "memory");                                                         \
    return old;                                                                       \
  }
RSHMEMI_ATOM(rshmemi_atom_add, "add", "u32", uint32_t, "r")
RSHMEMI_ATOM(rshmemi_atom_add, "add", "u64", uint64_t, "l")
RSHMEMI_ATOM(rshmemi_atom_exch, "exch", "b32", uint32_t, "r")
RSHMEMI_ATOM(rshmemi_atom_exch, "exch", "b64", uint64_t, "l")
RSHMEMI_ATOM(rshmemi_atom_and, "and", "b32", uint32_t, "r")
RSHMEMI_ATOM(rshmemi_atom_and, "and", "b64", uint64_t, "l")
RSHMEMI_ATOM(rshmemi_atom_or, "or", "b32", uint32_t, "r")
RSHMEMI_ATOM(rshmemi_atom_or, "or", "b64", uint64_t, "l")
RSHMEMI_ATOM(rshmemi_atom_xor, "xor", "b32", uint32_t, "r")
RSHMEMI_ATOM(rshmemi_atom_xor, "xor", "b64", uint64_t, "l")
#undef RSHMEMI_ATOM

#define RSHMEMI_RED(name, ptxop, ty, cty, reg)                                             \
  RSHMEM_DEVICE void name(cty *p, cty v) {                                                 \
    asm volatile("red.release.sys.global." ptxop "." ty " [%0], %1;" ::"l"(p), reg(v)      \
                 : "memory");                                                              \
  }
RSHMEMI_RED(rshmemi_red_add, "add", "u32", uint32_t, "r")
RSHMEMI_RED(rshmemi_red_add, "add", "u64", uint64_t, "l")
RSHMEMI_RED(rshmemi_red_and, "and", "b32", uint32_t, "r")
RSHMEMI_RED(rshmemi_red_and, "and", "b64", uint64_t, "l")
RSHMEMI_RED(rshmemi_red_or, "or", "b32", uint32_t, "r")
RSHMEMI_RED(rshmemi_red_or, "or", "b64", uint64_t, "l")
RSHMEMI_RED(rshmemi_red_xor, "xor", "b32", uint32_t, "r")
RSHMEMI_RED(rshmemi_red_xor, "xor", "b64", uint64_t, "l")
#undef RSHMEMI_RED

// Relaxed add (no ordering): the signal ADD of the warp/block forms, which fence first.
RSHMEM_DEVICE void rshmemi_red_add_relaxed_sys(uint64_t *p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
RSHMEM_DEVICE uint32_t rshmemi_atom_add_gpu(uint32_t *p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}

RSHMEM_DEVICE uint32_t rshmemi_atom_cas(uint32_t *p, uint32_t cmp, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.sys.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(cmp), "r"(v)
               : "memory");
  return old;
}
RSHMEM_DEVICE uint64_t rshmemi_atom_cas(uint64_t *p, uint64_t cmp, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.sys.global.cas.b64 %0, [%1], %2, %3;"
               : "=l"(old)
               : "l"(p), "l"(cmp), "l"(v)
               : "memory");
  return old;
}

#endif  // __CUDACC__
