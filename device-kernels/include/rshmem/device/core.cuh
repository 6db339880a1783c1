// rshmem/device/core.cuh — the device API's foundation: the bound state, error reporting,
// bounded polling and peer resolution (its PTX primitives: rshmem/device/ptx.cuh).
//
// Owns: the `__constant__ rshmem_device_state_t rshmemi_device_state` global (one per
// module: docs/gpu-design.md "Binding a module to a PE"), rshmemi_fail (error record +
// printf + __trap), rshmemi_resolve (PE + heap checks, the per-peer transport) and
// bounded polling. The PTX primitives (ordering, atomics, clock) are in
// rshmem/device/ptx.cuh.
// Must not: be included by host C++ (device-only); users include rshmem/rshmem.cuh.
//
// rshmem-check: device-only (__constant__ state and device code; rshmem/rshmem.cuh is the
// host-compilable entry point and only includes this under nvcc)
//
// Memory scope. Cross-PE operations use system scope (.sys): a peer may be another GPU
// reached over NVLink/PCIe P2P, whose accesses are only ordered with ours at system scope.
// Keep .sys for PEs on the same GPU too: PTX's .gpu scope is the threads of one program's
// grids on the device, and a peer on this GPU may be another process (several PEs per
// GPU under `rshmem run`), which .gpu does not cover. Words that only this PE's own blocks
// touch (the grid-barrier counters) use .gpu.
#pragma once

#include <stdint.h>
#if !defined(__CUDACC_RTC__)
#include <stdio.h>  // printf; NVRTC has it built in (and no stdio.h)
#endif

#include "rshmem/device/layout.cuh"
#include "rshmem/device/ptx.cuh"
#include "rshmem/qualifiers.cuh"
#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

#if defined(__CUDACC__)

// The module's state, written by the host when it binds the module to a PE
// (GpuPe::bind_module). Unmangled (extern "C") so the loader finds it by
// RSHMEM_STATE_SYMBOL. One definition per translation unit: each .cu that includes the
// device API is compiled to its own module (whole-program compilation, the default for
// -ptx and NVRTC). Relocatable device code (-rdc) linking several such TUs is not
// supported: they would define the symbol twice.
extern "C" {
__constant__ rshmem_device_state_t rshmemi_device_state;
}

// ---- thread geometry --------------------------------------------------------------

RSHMEM_DEVICE uint32_t rshmemi_block_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

RSHMEM_DEVICE uint32_t rshmemi_block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

// Lanes of the calling thread's warp: 32, or fewer in the last warp of a block whose thread
// count is not a multiple of 32 (warps are cut from the block's linear thread index, and
// %laneid is that index mod 32). A warp-scope call is made by every one of them; the work
// is shared among them (NVSHMEM's warp calls do the same). Before 2026-12-07 warp calls
// assumed 32 lanes: a partial warp's put left the missing lanes' share uncopied, and its
// sync_all skipped the PEs those lanes would have announced to.
//
// A kernel whose blocks are always whole warps may define RSHMEM_FULL_WARPS before it
// includes the headers: warp calls then take 32 lanes as a constant (the library's EP
// kernels, blocks of EP_LL_THREADS = 512: the count read at run time cost their send
// kernels register spills).
#ifdef RSHMEM_FULL_WARPS
RSHMEM_DEVICE uint32_t rshmemi_warp_lanes() { return 32u; }
#else
RSHMEM_DEVICE uint32_t rshmemi_warp_lanes() {
  const uint32_t left = rshmemi_block_threads() - (rshmemi_block_thread() & ~31u);
  return left < 32u ? left : 32u;
}
#endif

// The mask of rshmemi_warp_lanes() lanes, for __syncwarp and the shuffles.
RSHMEM_DEVICE uint32_t rshmemi_warp_mask() {
  const uint32_t n = rshmemi_warp_lanes();
  return n == 32u ? 0xffffffffu : (1u << n) - 1u;
}

RSHMEM_DEVICE uint32_t rshmemi_grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }

// The calling block's linear index in its grid (x fastest), as error records name it.
RSHMEM_DEVICE uint32_t rshmemi_grid_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

// ---- state and errors -------------------------------------------------------------------

RSHMEM_DEVICE const rshmem_device_state_t &rshmemi_state() { return rshmemi_device_state; }

RSHMEM_DEVICE uint64_t rshmemi_sync_base() {
  return rshmemi_device_state.heap_base + rshmemi_device_state.sync_offset;
}

// Reports a fatal device-side error and kills the kernel: writes the error record (when
// the state has one and this thread is the first to fail on this PE), prints one line and
// executes __trap(). `what` names the operation, `why` the reason. Out of line so that
// the many call sites cost a call, not a printf each.
[[noreturn]] __device__ __noinline__ inline void rshmemi_fail(uint32_t code, int pe, uint64_t addr,
                                                 uint64_t len_or_expected, uint64_t observed,
                                                 uint32_t cmp, const char *what,
                                                 const char *why) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  const bool bound = s.magic == RSHMEM_STATE_MAGIC && s.version == RSHMEM_STATE_VERSION;
  if (bound && s.error != 0 && s.sync_bytes > RSHMEMI_SYNC_ERROR_CLAIM) {
    uint32_t *claim = reinterpret_cast<uint32_t *>(rshmemi_sync_base() + RSHMEMI_SYNC_ERROR_CLAIM);
    if (rshmemi_atom_cas(claim, 0u, 1u) == 0u) {
      volatile rshmem_device_error_t *e = reinterpret_cast<volatile rshmem_device_error_t *>(s.error);
      e->pe = pe;
      e->addr = addr;
      e->expected = len_or_expected;
      e->observed = observed;
      e->cmp = cmp;
      e->block = rshmemi_grid_block();
      e->thread = rshmemi_block_thread();
      // The host may read the record after the context died: every field reaches host
      // memory before the code that says the record is valid.
      __threadfence_system();
      e->code = code;
      __threadfence_system();
    }
  }
  if (code == RSHMEM_DEVICE_ERR_WAIT_TIMEOUT) {
    printf("rshmem: PE %d: %s: %s: *0x%llx cmp %u expected %llu (0x%llx), last observed %llu "
           "(0x%llx) [block %u thread %u]\n",
           bound ? s.my_pe : -1, what, why, (unsigned long long)addr, cmp,
           (unsigned long long)len_or_expected, (unsigned long long)len_or_expected,
           (unsigned long long)observed, (unsigned long long)observed, rshmemi_grid_block(),
           rshmemi_block_thread());
  } else {
    printf("rshmem: PE %d: %s: %s (target PE %d, addr 0x%llx, bytes %llu) [block %u thread %u]\n",
           bound ? s.my_pe : -1, what, why, pe, (unsigned long long)addr,
           (unsigned long long)len_or_expected, rshmemi_grid_block(), rshmemi_block_thread());
  }
  __trap();
}

// Reports why an operation on [addr, addr + len) at `pe` was refused: the module is not
// bound (UNBOUND), the PE is out of range (BAD_PE) or the range is outside this PE's heap
// (OUT_OF_HEAP), in that order. Callers test the cheap conditions inline and call this
// out of line only when one failed, so every call site costs one compare chain and one
// four-argument call.
[[noreturn]] __device__ __noinline__ inline void rshmemi_refuse(int pe, uint64_t addr, uint64_t len,
                                                              const char *what) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  if (s.magic != RSHMEM_STATE_MAGIC || s.version != RSHMEM_STATE_VERSION)
    rshmemi_fail(RSHMEM_DEVICE_ERR_UNBOUND, -1, s.magic, s.version, 0, 0, what,
                 "module not bound to a PE (magic/version mismatch; call bind_module)");
  if (pe < 0 || pe >= s.n_pes)
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_PE, pe, addr, len, 0, 0, what, "PE out of range");
  rshmemi_fail(RSHMEM_DEVICE_ERR_OUT_OF_HEAP, pe, addr, len, 0, 0, what,
               "address range outside the symmetric heap");
}

RSHMEM_DEVICE bool rshmemi_bound() {
  return rshmemi_device_state.magic == RSHMEM_STATE_MAGIC &&
         rshmemi_device_state.version == RSHMEM_STATE_VERSION;
}

// Every entry point checks that its module was bound (unconditionally: an unbound module
// also has flags == 0, so the CHECKS bit cannot gate this). One constant-cache compare.
RSHMEM_DEVICE void rshmemi_require_bound(const char *what) {
  if (__builtin_expect(!rshmemi_bound(), 0)) rshmemi_refuse(-1, 0, 0, what);
}

RSHMEM_DEVICE bool rshmemi_checks_on() {
  return (rshmemi_device_state.flags & RSHMEM_STATE_CHECKS) != 0;
}

// Checks that [addr, addr + len) is inside this PE's heap (when checks are on).
RSHMEM_DEVICE void rshmemi_check_local(const void *addr, uint64_t len, int pe, const char *what) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (__builtin_expect(!rshmemi_bound() || (rshmemi_checks_on() &&
                                            !rshmemi_range_in_heap(s.heap_base, s.heap_size, a, len)),
                       0))
    rshmemi_refuse(pe, a, len, what);
}

// A typed access (atomic, signal, wait, p, g) at an address that is not a multiple of its
// size: the GPU would fault with "misaligned address", which kills the context without
// naming the call, and a NIC answers an atomic with an error CQE. BAD_ARG, naming the PE,
// the address and the size (in `expected`).
[[noreturn]] __device__ __noinline__ inline void rshmemi_misaligned(int pe, uint64_t addr, uint64_t size,
                                                                  const char *what) {
  rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, pe, addr, size, 0, 0, what,
               "address not aligned to the operand's size (atomics, signals, waits, p and g "
               "need naturally aligned words)");
}

// Checks (when checks are on) that addr is a multiple of size (a power of two).
// The bytes of `n` elements of T, saturated: a count whose byte size would wrap asks for
// more than any heap holds (the range check then refuses it: OUT_OF_HEAP) instead of
// moving the few bytes the wrapped product names.
template <typename T>
RSHMEM_DEVICE size_t rshmemi_bytes(size_t n) {
  return n > ~size_t(0) / sizeof(T) ? ~size_t(0) : n * sizeof(T);
}

RSHMEM_DEVICE void rshmemi_check_aligned(const void *addr, uint64_t size, int pe, const char *what) {
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (__builtin_expect(rshmemi_checks_on() && (a & (size - 1)) != 0, 0)) rshmemi_misaligned(pe, a, size, what);
}

// Where an operation on `pe` goes. transport is RSHMEM_TRANSPORT_P2P (addr is the peer's
// copy of the symmetric address, directly loadable/storable), RSHMEM_TRANSPORT_IBGDA (addr
// is the symmetric address itself; rshmem/device/ibgda.cuh posts WQEs) or another value
// (rshmemi_no_transport traps).
struct rshmemi_target_t {
  uint64_t addr;
  uint32_t transport;
};

// A read-modify-write (an atomic other than fetch/set, a signal ADD) to a peer whose P2P
// link has no native atomics (RSHMEM_PEER_NO_P2P_ATOMICS): refused rather than run as a
// non-atomic read-modify-write.
[[noreturn]] __device__ __noinline__ inline void rshmemi_no_p2p_atomics(int pe, uint64_t addr, uint64_t len,
                                                                      const char *what) {
  rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_PE, pe, addr, len, 0, 0, what,
               "the P2P link to this PE has no native atomics (GPUs on PCIe without atomics): "
               "read-modify-write atomics and signal ADDs cannot reach it (loads, stores, fetch, "
               "set and signal SET can); use NVLink-connected GPUs or RSHMEM_TRANSPORT=proxy");
}

// Resolves the symmetric range [sym, sym + len) on `pe`: checks the module is bound, and
// with RSHMEM_STATE_CHECKS the PE range and that the range is inside this PE's heap. The
// own PE needs no peer-table load — except for atomics (`amo`) when the state has
// RSHMEM_STATE_SELF_IBGDA: then the own PE's entry (the loopback queue) decides, so that
// the engine alone updates words it updates atomically. `rmw`: the operation is a
// read-modify-write on the peer's memory (not a plain load or store), refused towards a
// peer whose P2P link has no native atomics. The peer table is read-only for the kernel's
// life (written at bind time), so it goes through the read-only data cache.
RSHMEM_DEVICE rshmemi_target_t rshmemi_resolve(const void *sym, uint64_t len, int pe,
                                               const char *what, bool amo = false,
                                               bool rmw = false) {
  const rshmem_device_state_t &s = rshmemi_device_state;
  const uint64_t addr = reinterpret_cast<uint64_t>(sym);
  if (__builtin_expect(!rshmemi_bound() ||
                           (rshmemi_checks_on() &&
                            (pe < 0 || pe >= s.n_pes ||
                             !rshmemi_range_in_heap(s.heap_base, s.heap_size, addr, len))),
                       0))
    rshmemi_refuse(pe, addr, len, what);
  rshmemi_target_t t;
  if (pe == s.my_pe && !(amo && (s.flags & RSHMEM_STATE_SELF_IBGDA) != 0)) {
    t.addr = addr;
    t.transport = RSHMEM_TRANSPORT_P2P;
    return t;
  }
  const rshmem_peer_t *peer = reinterpret_cast<const rshmem_peer_t *>(s.peers) + pe;
  t.transport = __ldg(&peer->transport);
  if (t.transport == RSHMEM_TRANSPORT_P2P) {
    if (rmw && __builtin_expect((__ldg(&peer->flags) & RSHMEM_PEER_NO_P2P_ATOMICS) != 0, 0))
      rshmemi_no_p2p_atomics(pe, addr, len, what);
    t.addr = rshmemi_translate(s.heap_base, __ldg(&peer->heap_base), addr);
  } else {
    t.addr = addr;
  }
  return t;
}

// The default arm of every per-transport switch (P2P and IBGDA have their own arms).
[[noreturn]] __device__ __noinline__ inline void rshmemi_no_transport(uint32_t transport, int pe, uint64_t addr,
                                                         uint64_t len, const char *what) {
  rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_PE, pe, addr, len, 0, 0, what,
               transport == RSHMEM_TRANSPORT_IBGDA
                   ? "IBGDA peer, but this module was compiled with RSHMEM_NO_IBGDA (p2p only)"
                   : "no device transport to this PE (peer table says NONE or an unknown transport)");
}

// A wait that cannot succeed: an invalid comparison operator (BAD_ARG) or the bound
// expired (WAIT_TIMEOUT). Out of line: one call site per wait.
[[noreturn]] __device__ __noinline__ inline void rshmemi_wait_failed(const void *addr, int cmp, uint64_t target,
                                                                   uint64_t observed, const char *what) {
  if (!rshmemi_cmp_valid(cmp))
    rshmemi_fail(RSHMEM_DEVICE_ERR_BAD_ARG, rshmemi_device_state.my_pe, reinterpret_cast<uint64_t>(addr),
                 target, observed, static_cast<uint32_t>(cmp), what,
                 "invalid comparison operator (not a rshmem_cmp_t)");
  rshmemi_fail(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT, rshmemi_device_state.my_pe, reinterpret_cast<uint64_t>(addr),
               target, observed, static_cast<uint32_t>(cmp), what, "wait timed out");
}

// Polls `load()` until `rshmemi_cmp_holds(value, cmp, target)`, bounded by
// state.timeout_ns of %globaltimer; on timeout reports the address, cmp, target and the
// last value seen, and traps. Returns the value that satisfied the comparison. The first
// load is checked before the clock is read, so a satisfied wait costs one load.
template <typename T, typename Load>
RSHMEM_DEVICE T rshmemi_poll(const void *addr, int cmp, T target, Load load, const char *what) {
  T v = load();
  if (rshmemi_cmp_holds(v, cmp, target)) return v;
  const uint64_t limit = rshmemi_effective_timeout(rshmemi_device_state.timeout_ns);
  const uint64_t t0 = rshmemi_globaltimer();
  for (;;) {
    if (!rshmemi_cmp_valid(cmp) || rshmemi_globaltimer() - t0 > limit)
      rshmemi_wait_failed(addr, cmp, static_cast<uint64_t>(target), static_cast<uint64_t>(v), what);
    v = load();
    if (rshmemi_cmp_holds(v, cmp, target)) return v;
  }
}

#endif  // __CUDACC__
