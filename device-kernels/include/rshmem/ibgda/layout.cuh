// rshmem/ibgda/layout.cuh — the IBGDA queue table and queue-pair descriptor, shared with Rust.
//
// Owns: rshmem_ibgda_table_t (what rshmem_device_state_t.ibgda points at) and
// rshmem_ibgda_qp_t (one send queue's addresses plus the producers' counters), the status
// codes of the producer (rshmem/ibgda/queue.cuh), and the CQ modes.
// Must not: include CUDA headers or hold code; this header compiles as plain C/C++ and its
// layout is a contract with host/src/softhca/ibgda_table.rs (`IbgdaTable`, `IbgdaQp`),
// pinned on both sides by size/offset asserts (and by host/tests/ibgda_cpp_producer.rs,
// which compares g++'s offsetof with Rust's offset_of!).
//
// Who writes what:
// - The host fills line 0 of each descriptor (queue addresses as the producer addresses
//   them: device VAs on a GPU, host VAs in CPU tests) and zeroes the rest before any
//   producer runs. Producers never write line 0.
// - Producers (GPU threads; CPU threads in tests) own lines 1-4 and access them only with
//   the atomics of rshmem/ibgda/ordering.cuh. The host may read them after the kernels
//   ended (diagnostics: the first error CQE, how far the queue got).
// - Every control word sits on its own 64-byte line, so the reservation head, the ready
//   head and the completion counter do not false-share.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
#define RSHMEM_IBGDA_ALIGN64 alignas(64)
extern "C" {
#else
#define RSHMEM_IBGDA_ALIGN64 _Alignas(64)
#endif

// "ibgq" little-endian.
#define RSHMEM_IBGDA_TABLE_MAGIC 0x71676269u
// Bumped whenever a field changes meaning or place (2: doorbell_mode).
#define RSHMEM_IBGDA_VERSION 2u

// rshmem_ibgda_qp_t.cq_mode
#define RSHMEM_IBGDA_CQ_NORMAL 0u     // a ring of cqe_cnt CQEs with owner bits
#define RSHMEM_IBGDA_CQ_COLLAPSED 1u  // always CQE 0; wqe_counter tells how far the QP got

// rshmem_ibgda_qp_t.doorbell_mode: what `doorbell` points at, which decides how it is
// stored to (rshmem/ibgda/queue.cuh, ring).
#define RSHMEM_IBGDA_DOORBELL_MEMORY 0u  // a word in memory (the soft HCA's doorbell word)
#define RSHMEM_IBGDA_DOORBELL_MMIO 1u    // a NIC register (the UAR's BlueFlame) mapped into the GPU

// Status of every producer operation (0 = success). On the device the caller turns a
// non-zero status into the device error record and a trap (rshmem::ibgda::fail); host
// builds return it.
#define RSHMEM_IBGDA_OK 0
#define RSHMEM_IBGDA_ERR_TIMEOUT 1   // a bounded wait expired (timeout_ns)
#define RSHMEM_IBGDA_ERR_CQE 2       // an error CQE: the QP is in the error state (first_error_*)
#define RSHMEM_IBGDA_ERR_BROKEN 3    // an earlier timeout left a reservation unpublished
#define RSHMEM_IBGDA_ERR_TOO_BIG 4   // a WQE or batch larger than the ring / 16 WQEBBs / inline limit

// One send queue (and its CQ) as producers see it. 320 bytes, 64-byte aligned.
// What a timed-out wait waited for (rshmem_ibgda_qp_t.timeout_what; 0: none yet).
#define RSHMEM_IBGDA_WAIT_SLOTS 1u     // reserve: free slots (earlier WQEs to complete)
#define RSHMEM_IBGDA_WAIT_PUBLISH 2u   // publish: the producers before this one to publish
#define RSHMEM_IBGDA_WAIT_COMPLETE 3u  // quiet / a fetch: WQEs up to the index to complete
#define RSHMEM_IBGDA_WAIT_RING 4u      // ring: the doorbell lock

typedef struct rshmem_ibgda_qp {
  // Line 0 — configuration, written by the host, read-only for producers.
  RSHMEM_IBGDA_ALIGN64 uint64_t sq;  // SQ ring: wqe_cnt x 64-B WQEBBs
  uint64_t qp_dbrec;    // QP doorbell record: 2 x BE32, producers store [1] (send counter)
  uint64_t doorbell;    // 8-B doorbell: the soft HCA's doorbell word, or UAR + 0x800 (BlueFlame)
  uint64_t cq;          // CQ ring: cqe_cnt x 64-B CQEs
  uint64_t cq_dbrec;    // CQ doorbell record: 2 x BE32, producers store [0] (consumer index)
  uint64_t timeout_ns;  // bound of every wait (RSHMEM_TIMEOUT_MS), %globaltimer / steady clock
  uint32_t wqe_cnt;     // SQ ring size in WQEBBs, a power of two <= 2^14
  uint32_t cqe_cnt;     // CQ ring size, a power of two
  uint32_t qpn;         // 24-bit QP number
  uint32_t cq_mode;     // RSHMEM_IBGDA_CQ_*
  // Line 1 — the reservation head: WQEBBs reserved so far (unwrapped), atomic fetch-add.
  // `doorbell_mode` (RSHMEM_IBGDA_DOORBELL_*) is host-written configuration that did not
  // fit line 0: read-only for producers, read only when ringing.
  uint64_t reserved;
  uint32_t doorbell_mode;
  uint32_t pad1a;
  uint64_t pad1[6];
  // Line 2 — publication: `ready` = WQEBBs published in order; `rung` = the value the
  // doorbell record was last set to; `ring_lock` serialises ringers (the record never
  // moves backwards); `last_fence` = 1 + the index of the latest FENCEd NOP that fence
  // reserved (0: none), so a fence that finds it is the latest reservation posts no
  // other. (`pad2a` held a "fence the next reservation" flag until
  // 2026-12-06: fence is a FENCEd NOP now, see queue.cuh.)
  uint64_t ready;
  uint64_t rung;
  uint32_t ring_lock;
  uint32_t pad2a;
  uint64_t last_fence;
  uint64_t pad2[4];
  // Line 3 — completion: every WQEBB before `completed` has completed (its CQE was
  // consumed); `cq_ci` = CQEs consumed (normal mode); `cq_lock` = one CQ poller at a time;
  // `broken` = a reservation will never be published (a wait timed out holding one), or
  // the doorbell lock was never released (ring timed out). `timeout_what`
  // (RSHMEM_IBGDA_WAIT_*) and `timeout_index`: the wait that timed out first and the index
  // it waited for, stored (relaxed) by the thread that gave up, for the error report.
  uint64_t completed;
  uint32_t cq_ci;
  uint32_t cq_lock;
  uint32_t broken;
  uint32_t timeout_what;
  uint64_t timeout_index;
  uint64_t pad3[4];
  // Line 4 — the first error CQE (the QP's error state). `first_error` is stored last
  // (release) and is 1 once the other fields are valid.
  uint32_t first_error;
  uint8_t first_error_syndrome;
  uint8_t first_error_vendor;
  uint8_t first_error_wqe_opcode;
  uint8_t first_error_cqe_opcode;
  uint64_t first_error_index;   // unwrapped index of the failed WQE's first WQEBB
  uint64_t cqes;                // CQEs consumed in total (diagnostics)
  uint64_t pad4[5];
} rshmem_ibgda_qp_t;

// What rshmem_device_state_t.ibgda points at. 64 bytes. The descriptor of the queue to
// PE p is qps[peers[p].qp].
typedef struct rshmem_ibgda_table {
  uint32_t magic;    // RSHMEM_IBGDA_TABLE_MAGIC
  uint32_t version;  // RSHMEM_IBGDA_VERSION
  uint32_t n_qps;    // entries in qps
  uint32_t flags;    // 0 (reserved for future use)
  uint64_t qps;      // pointer to rshmem_ibgda_qp_t[n_qps] (64-byte aligned)
  // Result slots of the device API's fetching operations (atomics, g, signal scratch):
  // results -> uint64_t[n_results + 1] in memory the NIC / soft HCA writes (registered
  // under results_lkey, mapped into the GPU; the last slot is a shared discard slot for
  // values nobody reads); result_locks -> uint32_t[n_results] in device memory, 0 = free.
  // A thread holds one slot (CAS 0 -> 1) from posting its WQE until it has read the value.
  // 0 / 0 when the table's owner offers no fetching operations.
  uint64_t results;
  uint64_t result_locks;
  uint32_t n_results;
  uint32_t results_lkey;
  uint64_t reserved[2];
} rshmem_ibgda_table_t;

#ifdef __cplusplus
}  // extern "C"

static_assert(sizeof(rshmem_ibgda_qp_t) == 320, "rshmem_ibgda_qp_t layout");
static_assert(alignof(rshmem_ibgda_qp_t) == 64, "rshmem_ibgda_qp_t alignment");
static_assert(sizeof(rshmem_ibgda_table_t) == 64, "rshmem_ibgda_table_t layout");
#if !defined(__CUDACC_RTC__)  // NVRTC has no __builtin_offsetof; nvcc and g++ check these
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, timeout_ns) == 40, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, cq_mode) == 60, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, reserved) == 64, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, doorbell_mode) == 72, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, ready) == 128, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, ring_lock) == 144, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, last_fence) == 152, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, completed) == 192, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, broken) == 208, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, first_error) == 256, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, first_error_index) == 264, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_qp_t, cqes) == 272, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_table_t, qps) == 16, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_table_t, results) == 24, "layout");
static_assert(__builtin_offsetof(rshmem_ibgda_table_t, n_results) == 40, "layout");
#endif
#endif
