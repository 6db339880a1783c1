// rshmem/ibgda/ordering.cuh — the memory-order primitives of the IBGDA producer, by intent.
//
// Owns: the loads, stores, read-modify-writes and fences that rshmem/ibgda/queue.cuh uses,
// each named by its ordering and scope, with one implementation for the device (inline
// PTX, under RSHMEM_DEVICE_COMPILE) and one for host C++ (GCC __atomic builtins), so the
// very same protocol code runs on a GPU and in the CPU tests against the soft HCA.
// Must not: hold protocol logic.
//
// Scopes. Two kinds of memory, two scopes:
// - `_sys`: queue memory shared with the NIC or the soft HCA (doorbell record, doorbell,
//   CQEs, CQ doorbell record, WQE slots). The other party is outside the GPU, so these
//   are system-scope operations (PTX `.sys`).
// - `_gpu`: the producers' counters in rshmem_ibgda_qp_t lines 1-4, touched only by the
//   threads of one GPU (`.gpu` scope is enough and cheaper than `.sys`).
// On the host both map to the same C++ atomics (the "GPU" is the process).
//
// Every access to a word another agent writes concurrently goes through these functions;
// plain stores are used only for WQE bytes, which the NIC reads after acquiring the
// doorbell record (see queue.cuh for the chain).
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"

#if !RSHMEM_DEVICE_COMPILE
#include <sched.h>
#include <time.h>
#endif

namespace rshmem {
namespace ibgda {

#if RSHMEM_DEVICE_COMPILE

// ---- device: inline PTX (generic addresses: device memory or host memory mapped into
// the GPU alike) --------------------------------------------------------------------------
RSHMEM_DEVICE uint64_t ld_acquire_sys_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint64_t ld_relaxed_sys_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint32_t ld_relaxed_sys_u32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE void st_release_sys_u32(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
RSHMEM_DEVICE void st_release_sys_u64(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// A release store to a device register (a NIC's UAR page mapped into the GPU). PTX gives
// ordinary loads and stores no defined effect on I/O space; `st.mmio` is performed exactly
// once and uncached, and the system-scope fence before it orders every earlier access of
// this thread (and, cumulatively, what it acquired: the WQEs) before the register write,
// which a plain relaxed MMIO store would not. This is how DOCA GPUNetIO rings mlx5
// doorbells; `.mmio` needs PTX 8.2 and sm_70.
RSHMEM_DEVICE void st_release_mmio_sys_u64(uint64_t *p, uint64_t v) {
  asm volatile("fence.acq_rel.sys;\n\tst.mmio.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v)
               : "memory");
}
RSHMEM_DEVICE uint64_t ld_acquire_gpu_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint32_t ld_acquire_gpu_u32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint64_t ld_relaxed_gpu_u64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE uint32_t ld_relaxed_gpu_u32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
RSHMEM_DEVICE void st_release_gpu_u64(uint64_t *p, uint64_t v) {
  asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
RSHMEM_DEVICE void st_release_gpu_u32(uint32_t *p, uint32_t v) {
  asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
RSHMEM_DEVICE void st_relaxed_gpu_u32(uint32_t *p, uint32_t v) {
  asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
RSHMEM_DEVICE void st_relaxed_gpu_u64(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
RSHMEM_DEVICE uint64_t fetch_add_relaxed_gpu_u64(uint64_t *p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
RSHMEM_DEVICE void fetch_max_release_gpu_u64(uint64_t *p, uint64_t v) {
  asm volatile("red.release.gpu.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// true when *p was `expect` and is now `desired`.
RSHMEM_DEVICE bool cas_acquire_gpu_u32(uint32_t *p, uint32_t expect, uint32_t desired) {
  uint32_t old;
  asm volatile("atom.acquire.gpu.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(expect), "r"(desired)
               : "memory");
  return old == expect;
}
RSHMEM_DEVICE void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
RSHMEM_DEVICE uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A waiting thread backs off briefly (frees issue slots for the threads it waits on).
RSHMEM_DEVICE void relax() { __nanosleep(64); }

#else

// ---- host C++: GCC/Clang __atomic builtins on the same words ---------------------------
inline uint64_t ld_acquire_sys_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint64_t ld_relaxed_sys_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline uint32_t ld_relaxed_sys_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void st_release_sys_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void st_release_sys_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
// Host builds drive soft-HCA queues only (a CPU rings a real NIC from Rust, not from here).
inline void st_release_mmio_sys_u64(uint64_t *p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
inline uint64_t ld_acquire_gpu_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint32_t ld_acquire_gpu_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint64_t ld_relaxed_gpu_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline uint32_t ld_relaxed_gpu_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void st_release_gpu_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void st_release_gpu_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void st_relaxed_gpu_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void st_relaxed_gpu_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline uint64_t fetch_add_relaxed_gpu_u64(uint64_t *p, uint64_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline void fetch_max_release_gpu_u64(uint64_t *p, uint64_t v) {
  uint64_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}
inline bool cas_acquire_gpu_u32(uint32_t *p, uint32_t expect, uint32_t desired) {
  return __atomic_compare_exchange_n(p, &expect, desired, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED);
}
inline void fence_acq_rel_sys() { __atomic_thread_fence(__ATOMIC_ACQ_REL); }
inline uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
inline void relax() { sched_yield(); }

#endif

}  // namespace ibgda
}  // namespace rshmem
