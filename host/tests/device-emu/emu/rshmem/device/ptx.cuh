// The CPU emulation's stand-in for device-kernels/include/rshmem/device/ptx.cuh: the same
// functions, over host atomics with the PTX instruction's ordering (x86 gives at least
// that). Every acquire load yields to the next GPU-thread fiber first, so a poll loop
// lets the threads it waits for run (host/tests/device-emu/emu/cuda_emu.h).
#pragma once

#include <stdint.h>
#include <time.h>

#include "rshmem/qualifiers.cuh"

RSHMEM_DEVICE uint64_t rshmemi_globaltimer() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

RSHMEM_DEVICE uint32_t rshmemi_lane() { return emu_lane(); }

template <class T>
RSHMEM_DEVICE T rshmemi_emu_ld_acquire(const T *p) {
  emu_yield();
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
RSHMEM_DEVICE uint32_t rshmemi_ld_acquire_sys(const uint32_t *p) { return rshmemi_emu_ld_acquire(p); }
RSHMEM_DEVICE uint64_t rshmemi_ld_acquire_sys(const uint64_t *p) { return rshmemi_emu_ld_acquire(p); }
RSHMEM_DEVICE uint32_t rshmemi_ld_acquire_gpu(const uint32_t *p) { return rshmemi_emu_ld_acquire(p); }

RSHMEM_DEVICE void rshmemi_st_release_sys(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
RSHMEM_DEVICE void rshmemi_st_release_sys(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
RSHMEM_DEVICE void rshmemi_st_release_gpu(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
RSHMEM_DEVICE void rshmemi_st_relaxed_sys(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
RSHMEM_DEVICE void rshmemi_st_relaxed_gpu(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

#define RSHMEMI_EMU_RMW(name, builtin, order)                                      \
  RSHMEM_DEVICE uint32_t name(uint32_t *p, uint32_t v) { return builtin(p, v, order); } \
  RSHMEM_DEVICE uint64_t name(uint64_t *p, uint64_t v) { return builtin(p, v, order); }
RSHMEMI_EMU_RMW(rshmemi_atom_add, __atomic_fetch_add, __ATOMIC_ACQ_REL)
RSHMEMI_EMU_RMW(rshmemi_atom_exch, __atomic_exchange_n, __ATOMIC_ACQ_REL)
RSHMEMI_EMU_RMW(rshmemi_atom_and, __atomic_fetch_and, __ATOMIC_ACQ_REL)
RSHMEMI_EMU_RMW(rshmemi_atom_or, __atomic_fetch_or, __ATOMIC_ACQ_REL)
RSHMEMI_EMU_RMW(rshmemi_atom_xor, __atomic_fetch_xor, __ATOMIC_ACQ_REL)
#undef RSHMEMI_EMU_RMW

#define RSHMEMI_EMU_RED(name, builtin)                                                        \
  RSHMEM_DEVICE void name(uint32_t *p, uint32_t v) { (void)builtin(p, v, __ATOMIC_RELEASE); } \
  RSHMEM_DEVICE void name(uint64_t *p, uint64_t v) { (void)builtin(p, v, __ATOMIC_RELEASE); }
RSHMEMI_EMU_RED(rshmemi_red_add, __atomic_fetch_add)
RSHMEMI_EMU_RED(rshmemi_red_and, __atomic_fetch_and)
RSHMEMI_EMU_RED(rshmemi_red_or, __atomic_fetch_or)
RSHMEMI_EMU_RED(rshmemi_red_xor, __atomic_fetch_xor)
#undef RSHMEMI_EMU_RED

RSHMEM_DEVICE void rshmemi_red_add_relaxed_sys(uint64_t *p, uint64_t v) {
  (void)__atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
RSHMEM_DEVICE uint32_t rshmemi_atom_add_gpu(uint32_t *p, uint32_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
RSHMEM_DEVICE uint32_t rshmemi_atom_cas(uint32_t *p, uint32_t cmp, uint32_t v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return cmp;
}
RSHMEM_DEVICE uint64_t rshmemi_atom_cas(uint64_t *p, uint64_t cmp, uint64_t v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return cmp;
}
