// rshmem/state.cuh — the one struct through which kernels see the runtime.
//
// Owns: rshmem_device_state_t (this PE, the heap, the peer table, the transport per peer,
// the wait bound, where device errors go) and rshmem_peer_t; the name of the module
// global the host writes it into; the device error record.
// Must not: include CUDA headers or declare device functions; this header compiles as
// plain host C++ (scripts/check-device-code checks that with g++), and its layout is a
// contract with host/src/gpu/state.rs (`DeviceState`, `DevicePeer`, `DeviceError`),
// pinned on both sides by size/offset asserts.
//
// How it reaches a kernel: every module that includes the device API (rshmem/rshmem.cuh)
// carries one `__constant__ rshmem_device_state_t rshmemi_device_state`. The host binds a
// loaded module to a PE (Rust: `GpuPe::bind_module`), which writes this PE's state into
// that global with cuModuleGetGlobal + a copy. Several GPU PEs in one process (one
// context) therefore load a module once per PE: one module instance = one PE.
//
// Addresses are device virtual addresses in the binding PE's context, stored as uint64_t
// so that the layout does not depend on the host pointer size.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// "rshs" little-endian; a kernel whose module was never bound sees 0 and traps.
#define RSHMEM_STATE_MAGIC 0x73687372u
// Bumped whenever a field changes meaning or place (2: device teams in the sync scratch,
// rshmem/device/layout.cuh; 3: rshmem_peer_t.flags).
#define RSHMEM_STATE_VERSION 3u
// Name of the __constant__ global in every module that includes the device API.
#define RSHMEM_STATE_SYMBOL "rshmemi_device_state"

// How this PE reaches one peer (rshmem_peer_t.transport).
typedef enum rshmem_transport {
  RSHMEM_TRANSPORT_NONE = 0,   // unreachable from the device: any operation traps
  RSHMEM_TRANSPORT_P2P = 1,    // loads/stores at rshmem_peer_t.heap_base (same GPU, P2P, NVLink)
  RSHMEM_TRANSPORT_IBGDA = 2,  // mlx5 WQEs on queue rshmem_peer_t.qp (a NIC or the soft HCA)
} rshmem_transport_t;

// state.flags bits.
#define RSHMEM_STATE_CHECKS 0x1u  // validate PE and heap range on every call (trap on violation)
// Atomics and signal updates addressed to this PE itself go through its loopback IBGDA
// queue (peers[my_pe], transport IBGDA) instead of GPU atomics: set when the heap is host
// memory that the soft HCA updates with CPU atomics (GPU PEs over the proxy transport),
// since a word must not mix GPU atomics with the engine's (docs/ibgda-device.md).
#define RSHMEM_STATE_SELF_IBGDA 0x2u
// The heap is host memory mapped into the GPU (GPU PEs over the proxy transport; also set
// with RSHMEM_STATE_SELF_IBGDA there). Code that must update a heap word atomically
// against incoming signal stores uses the device API's atomics then (the engine performs
// them); on a GPU heap (P2P, or a NIC whose RDMA WRITEs are not atomic against its own
// atomics) a GPU atomic is the one that is atomic against the incoming 8-byte stores.
#define RSHMEM_STATE_HOST_HEAP 0x4u

// rshmem_peer_t.flags bits.
// The P2P link to this peer has no native atomics (CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_
// SUPPORTED is 0: GPUs on PCIe without atomics between them). Loads and stores go over P2P
// (puts, gets, atomic fetch/set, signal SET); a read-modify-write to the peer (swap, CAS,
// add/and/or/xor, signal ADD) traps (BAD_PE) instead of running non-atomically.
#define RSHMEM_PEER_NO_P2P_ATOMICS 0x1u

// One entry of the peer table, indexed by world rank. 32 bytes.
typedef struct rshmem_peer {
  uint64_t heap_base;  // P2P: the peer's heap mapped in this context; else 0
  uint32_t transport;  // rshmem_transport_t
  uint32_t qp;         // IBGDA: index of the queue pair in the ibgda table; else 0
  uint64_t raddr;      // IBGDA: the peer's heap base as its NIC/soft HCA addresses it
  uint32_t rkey;       // IBGDA: remote key of the peer's heap
  uint32_t flags;      // RSHMEM_PEER_*
} rshmem_peer_t;

// Where a kernel reports why it trapped (invalid PE, address outside the heap, wait
// timeout). Lives in host-pinned memory mapped into the device, so the host can read it
// after the context has died. `code` is written last (after a __threadfence_system), 0 =
// no error. 64 bytes.
typedef struct rshmem_device_error {
  uint32_t code;      // RSHMEM_DEVICE_ERR_*
  int32_t pe;         // the PE the failed operation addressed (or -1)
  uint64_t addr;      // the address involved (device VA)
  uint64_t expected;  // waits: the comparison operand
  uint64_t observed;  // waits: the last value seen
  uint32_t cmp;       // waits: rshmem_cmp_t
  uint32_t block;     // the reporting block's linear index in the grid (x fastest)
  uint32_t thread;    // the reporting thread's linear index in its block (x fastest)
  uint32_t reserved[5];
} rshmem_device_error_t;

#define RSHMEM_DEVICE_ERR_NONE 0u
#define RSHMEM_DEVICE_ERR_UNBOUND 1u       // module not bound to a PE (magic/version mismatch)
#define RSHMEM_DEVICE_ERR_BAD_PE 2u        // PE < 0 or >= n_pes, transport NONE, or an atomic over P2P without native atomics
#define RSHMEM_DEVICE_ERR_OUT_OF_HEAP 3u   // [addr, addr + len) not inside the symmetric heap
#define RSHMEM_DEVICE_ERR_WAIT_TIMEOUT 4u  // a wait exceeded timeout_ns
#define RSHMEM_DEVICE_ERR_QUEUE 5u         // IBGDA: error CQE / queue in error state
#define RSHMEM_DEVICE_ERR_BAD_ARG 6u       // invalid rshmem_cmp_t / rshmem_signal_op_t, or too many PEs for the sync scratch

// A team as the device sees it: one entry per team slot (the slot the host agreed for the
// team, host/src/team.rs; the device handle rshmem_team_t is that slot) in the sync
// scratch of every member (rshmem/device/layout.cuh, rshmemi_team_entry_offset). The host
// writes it when the team is created (GpuPe::team_split_strided) and clears it when the
// team is destroyed; size 0 = no team in this slot on this PE. Members are world ranks
// start, start + stride, ... (strided teams, as NVSHMEM's). 16 bytes.
typedef struct rshmem_team_entry {
  int32_t start;   // world rank of team member 0
  int32_t stride;  // world-rank distance between consecutive members (>= 1)
  int32_t size;    // number of members; 0 = no team here
  int32_t my_pe;   // this PE's number in the team
} rshmem_team_entry_t;

// Team slots (the host's TEAM_SLOTS); a device team handle is in [0, RSHMEM_TEAM_SLOTS).
#define RSHMEM_TEAM_SLOTS 64u
// Rounds of a team's dissemination barrier words: teams of up to 2^12 PEs.
#define RSHMEM_TEAM_MAX_ROUNDS 12u

// Everything a kernel needs. 128 bytes.
typedef struct rshmem_device_state {
  uint32_t magic;         // RSHMEM_STATE_MAGIC
  uint32_t version;       // RSHMEM_STATE_VERSION
  int32_t my_pe;          // world rank of the bound PE
  int32_t n_pes;          // world size
  uint64_t heap_base;     // this PE's heap in this context
  uint64_t heap_size;     // bytes; the same on every PE
  uint64_t peers;         // device pointer to rshmem_peer_t[n_pes]
  uint64_t timeout_ns;    // bound of every device-side wait (RSHMEM_TIMEOUT_MS), %globaltimer ns
  uint64_t sync_offset;   // heap offset of the device barrier/sync scratch (runtime region)
  uint64_t sync_bytes;    // its size
  uint64_t error;         // device pointer to rshmem_device_error_t (host-pinned), or 0
  uint64_t ibgda;         // device pointer to the IBGDA queue table, or 0 when no peer uses it
  uint32_t flags;         // RSHMEM_STATE_* bits
  uint32_t lkey;          // IBGDA: local key of this PE's heap
  uint64_t reserved[5];
} rshmem_device_state_t;

#ifdef __cplusplus
}  // extern "C"

static_assert(sizeof(rshmem_peer_t) == 32, "rshmem_peer_t layout");
static_assert(sizeof(rshmem_device_error_t) == 64, "rshmem_device_error_t layout");
static_assert(sizeof(rshmem_device_state_t) == 128, "rshmem_device_state_t layout");
static_assert(sizeof(rshmem_team_entry_t) == 16, "rshmem_team_entry_t layout");
// Offsets: checked by nvcc and g++ (NVRTC has no __builtin_offsetof; the same
// definitions compile there, and the sizes above still hold).
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(rshmem_device_state_t, heap_base) == 16, "layout");
static_assert(__builtin_offsetof(rshmem_device_state_t, peers) == 32, "layout");
static_assert(__builtin_offsetof(rshmem_device_state_t, sync_offset) == 48, "layout");
static_assert(__builtin_offsetof(rshmem_device_state_t, error) == 64, "layout");
static_assert(__builtin_offsetof(rshmem_device_state_t, ibgda) == 72, "layout");
static_assert(__builtin_offsetof(rshmem_device_state_t, flags) == 80, "layout");
static_assert(__builtin_offsetof(rshmem_peer_t, raddr) == 16, "layout");
#endif  // !__CUDACC_RTC__
#endif
