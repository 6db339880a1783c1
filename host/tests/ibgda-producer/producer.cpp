// The device-side IBGDA producer (device-kernels/include/rshmem/ibgda/queue.cuh) compiled
// as host C++: N std::threads run op lists that Rust planned, against queue memory and a
// soft HCA engine that Rust owns (host/tests/ibgda_cpp_producer.rs builds this file into a
// shared library at test time and loads it).
//
// Nothing here re-implements the protocol: single ops call queue.cuh's post_* / blocking
// functions; batches use its reserve / write_wqe / publish with the mlx5.cuh builders.
#include <stddef.h>
#include <stdint.h>

#include <thread>
#include <vector>

#include "rshmem/ibgda/queue.cuh"

namespace ib = rshmem::ibgda;
namespace m5 = rshmem::mlx5;

extern "C" {

// One planned operation (72 bytes; Rust: `TestOp`).
struct ibgda_test_op {
  uint32_t kind;  // IBGDA_OP_*
  uint32_t len;   // bytes (writes, reads)
  uint64_t raddr;
  uint64_t laddr;  // source (writes), destination (reads), result (atomics)
  uint64_t a;      // add / swap / signal value
  uint64_t b;      // compare / signal op
  uint64_t c;      // swap_mask / field boundary / signal raddr
  uint64_t d;      // compare_mask / where a blocking op stores the value it returns
  uint32_t rkey;
  uint32_t lkey;
  uint32_t batch;  // on the first op of a batch: ops in it (this one and the next batch-1)
  uint32_t pad;
};
static_assert(sizeof(ibgda_test_op) == 72, "ibgda_test_op");

enum {
  IBGDA_OP_WRITE = 1,         // post_write (SGE)
  IBGDA_OP_PUT = 2,           // put (inline when <= 28 B)
  IBGDA_OP_WRITE_INLINE = 3,  // post_write_inline (up to 256 B, several WQEBBs)
  IBGDA_OP_READ = 4,          // post_read
  IBGDA_OP_GET = 5,           // get (blocking)
  IBGDA_OP_FA = 6,            // post_atomic_fa
  IBGDA_OP_FETCH_ADD = 7,     // fetch_add (blocking; value stored at d)
  IBGDA_OP_CS = 8,            // post_atomic_cs
  IBGDA_OP_COMPARE_SWAP = 9,  // compare_swap (blocking; value stored at d)
  IBGDA_OP_MASKED_FA32 = 10,
  IBGDA_OP_MASKED_CS32 = 11,
  IBGDA_OP_MASKED_CS64 = 12,
  IBGDA_OP_PUT_SIGNAL = 13,  // put_signal (b = RSHMEM_SIGNAL_SET/ADD, c = signal raddr, d = scratch)
  IBGDA_OP_QUIET = 14,
  IBGDA_OP_FENCE = 15,        // fence (a FENCEd NOP)
  IBGDA_OP_SIGNAL = 16,       // a signal update as the device API posts it, FENCEd: b = SET
                              // (8-byte inline WRITE of a) or ADD (fetch-add of a, old value
                              // to d) at raddr
};

struct ibgda_test_run {
  rshmem_ibgda_qp_t *qp;
  const ibgda_test_op *ops;  // every thread's ops, concatenated
  const uint64_t *starts;    // thread t runs ops[starts[t] .. starts[t + 1])
  uint32_t threads;
  uint32_t skip_quiet;  // 1: threads return after their last op without a final quiet
  int32_t *status;    // per thread: RSHMEM_IBGDA_* of the first failure (0 = none)
  uint64_t *failed;   // per thread: index of the op that failed
};

}  // extern "C"

namespace {

uint32_t wqebbs_of(const ibgda_test_op &o) {
  switch (o.kind) {
    case IBGDA_OP_WRITE_INLINE: return ib::write_inline_wqebbs(o.len);
    case IBGDA_OP_MASKED_CS64: return 2;
    default: return 1;
  }
}

// Builds one batchable op at `wqe` with `c` (the same builders post_* use).
void build(uint8_t *wqe, const m5::wqe_ctrl &c, const ibgda_test_op &o) {
  m5::raddr_seg r = m5::make_raddr_seg(o.raddr, o.rkey);
  m5::sge8 res{o.laddr, o.lkey};
  switch (o.kind) {
    case IBGDA_OP_WRITE: m5::rdma_write(wqe, c, r, m5::make_data_seg(o.len, o.lkey, o.laddr)); break;
    case IBGDA_OP_WRITE_INLINE:
      m5::rdma_write_inline(wqe, c, r, (const void *)(uintptr_t)o.laddr, o.len);
      break;
    case IBGDA_OP_READ: m5::rdma_read(wqe, c, r, m5::make_data_seg(o.len, o.lkey, o.laddr)); break;
    case IBGDA_OP_FA: m5::atomic_fa(wqe, c, r, res, o.a); break;
    case IBGDA_OP_CS: m5::atomic_cs(wqe, c, r, res, o.b, o.a); break;
    case IBGDA_OP_MASKED_FA32: m5::masked_fa32(wqe, c, r, res, (uint32_t)o.a, (uint32_t)o.c); break;
    case IBGDA_OP_MASKED_CS32:
      m5::masked_cs32(wqe, c, r, res, (uint32_t)o.a, (uint32_t)o.b, (uint32_t)o.c, (uint32_t)o.d);
      break;
    case IBGDA_OP_MASKED_CS64: m5::masked_cs64(wqe, c, r, res, o.a, o.b, o.c, o.d); break;
    default: break;  // the planner only batches the kinds above
  }
}

// A batch: one reservation, the WQEs built back to back, one publish (one doorbell at most)
// — what a warp does on the GPU.
int run_batch(rshmem_ibgda_qp_t *qp, const ibgda_test_op *ops, uint32_t n) {
  uint32_t total = 0;
  for (uint32_t i = 0; i < n; ++i) total += wqebbs_of(ops[i]);
  if (total > m5::MAX_WQEBBS) return RSHMEM_IBGDA_ERR_TOO_BIG;
  uint64_t idx;
  int st = ib::reserve(qp, total, &idx);
  if (st != RSHMEM_IBGDA_OK) return st;
  alignas(16) uint8_t buf[m5::MAX_WQEBBS * m5::WQEBB];
  uint32_t at = 0;
  for (uint32_t i = 0; i < n; ++i) {
    build(buf + at * m5::WQEBB, ib::ctrl_at(qp, idx + at, false), ops[i]);
    at += wqebbs_of(ops[i]);
  }
  ib::write_wqe(qp, idx, buf, total);
  return ib::publish(qp, idx, total);
}

int run_one(rshmem_ibgda_qp_t *qp, const ibgda_test_op &o) {
  switch (o.kind) {
    case IBGDA_OP_WRITE: return ib::post_write(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.len);
    case IBGDA_OP_PUT: return ib::put(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.len);
    case IBGDA_OP_WRITE_INLINE:
      return ib::post_write_inline(qp, o.raddr, o.rkey, (const void *)(uintptr_t)o.laddr, o.len);
    case IBGDA_OP_READ: return ib::post_read(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.len);
    case IBGDA_OP_GET: return ib::get(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.len);
    case IBGDA_OP_FA: return ib::post_atomic_fa(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.a);
    case IBGDA_OP_FETCH_ADD: {
      uint64_t v = 0;
      int st = ib::fetch_add(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.a, &v);
      if (st == RSHMEM_IBGDA_OK) *(uint64_t *)(uintptr_t)o.d = v;
      return st;
    }
    case IBGDA_OP_CS: return ib::post_atomic_cs(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.b, o.a);
    case IBGDA_OP_COMPARE_SWAP: {
      uint64_t v = 0;
      int st = ib::compare_swap(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.b, o.a, &v);
      if (st == RSHMEM_IBGDA_OK) *(uint64_t *)(uintptr_t)o.d = v;
      return st;
    }
    case IBGDA_OP_MASKED_FA32:
      return ib::post_masked_fa32(qp, o.raddr, o.rkey, o.laddr, o.lkey, (uint32_t)o.a, (uint32_t)o.c);
    case IBGDA_OP_MASKED_CS32:
      return ib::post_masked_cs32(qp, o.raddr, o.rkey, o.laddr, o.lkey, (uint32_t)o.a,
                                  (uint32_t)o.b, (uint32_t)o.c, (uint32_t)o.d);
    case IBGDA_OP_MASKED_CS64:
      return ib::post_masked_cs64(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.a, o.b, o.c, o.d);
    case IBGDA_OP_PUT_SIGNAL:
      // The plans keep the signal's scratch word in the source's region: one key for both.
      return ib::put_signal(qp, o.raddr, o.rkey, o.laddr, o.lkey, o.len, o.c, o.a, (uint32_t)o.b, o.d,
                            o.lkey);
    case IBGDA_OP_QUIET: return ib::quiet(qp);
    case IBGDA_OP_FENCE: return ib::fence(qp);
    case IBGDA_OP_SIGNAL:
      return o.b == RSHMEM_SIGNAL_ADD
                 ? ib::post_atomic_fa(qp, o.raddr, o.rkey, o.d, o.lkey, o.a, nullptr, true)
                 : ib::post_write_inline_small(qp, o.raddr, o.rkey, &o.a, 8, nullptr, true);
    default: return -1;
  }
}

void producer(const ibgda_test_run *r, uint32_t t) {
  uint64_t i = r->starts[t], end = r->starts[t + 1];
  while (i < end) {
    const ibgda_test_op &o = r->ops[i];
    uint32_t n = o.batch > 1 ? o.batch : 1;
    int st = n > 1 ? run_batch(r->qp, &o, n) : run_one(r->qp, o);
    if (st != RSHMEM_IBGDA_OK) {
      r->status[t] = st;
      r->failed[t] = i;
      return;
    }
    i += n;
  }
  if (r->skip_quiet) return;
  int st = ib::quiet(r->qp);
  if (st != RSHMEM_IBGDA_OK) {
    r->status[t] = st;
    r->failed[t] = end;
  }
}

}  // namespace

extern "C" {

void ibgda_set_hooks(void (*doorbell)(void *), int (*relax)(void *), void *ctx) {
  ib::hooks() = ib::host_hooks{doorbell, relax, ctx};
}

// Runs every thread's op list concurrently; returns once all joined.
void ibgda_run(const ibgda_test_run *r) {
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < r->threads; ++t) ts.emplace_back(producer, r, t);
  for (auto &t : ts) t.join();
}

// queue.cuh's table lookup.
rshmem_ibgda_qp_t *ibgda_table_qp(const rshmem_ibgda_table_t *table, uint32_t index) {
  return ib::table_qp(table, index);
}

// offsetof of every descriptor and table field, in the order Rust lists them.
size_t ibgda_layout(uint64_t *out, size_t cap) {
#define OFF(T, f) __builtin_offsetof(T, f)
  const uint64_t v[] = {
      sizeof(rshmem_ibgda_qp_t), alignof(rshmem_ibgda_qp_t),
      OFF(rshmem_ibgda_qp_t, sq), OFF(rshmem_ibgda_qp_t, qp_dbrec),
      OFF(rshmem_ibgda_qp_t, doorbell), OFF(rshmem_ibgda_qp_t, cq),
      OFF(rshmem_ibgda_qp_t, cq_dbrec), OFF(rshmem_ibgda_qp_t, timeout_ns),
      OFF(rshmem_ibgda_qp_t, wqe_cnt), OFF(rshmem_ibgda_qp_t, cqe_cnt),
      OFF(rshmem_ibgda_qp_t, qpn), OFF(rshmem_ibgda_qp_t, cq_mode),
      OFF(rshmem_ibgda_qp_t, reserved), OFF(rshmem_ibgda_qp_t, doorbell_mode),
      OFF(rshmem_ibgda_qp_t, ready),
      OFF(rshmem_ibgda_qp_t, rung), OFF(rshmem_ibgda_qp_t, ring_lock),
      OFF(rshmem_ibgda_qp_t, last_fence), OFF(rshmem_ibgda_qp_t, completed),
      OFF(rshmem_ibgda_qp_t, cq_ci), OFF(rshmem_ibgda_qp_t, cq_lock),
      OFF(rshmem_ibgda_qp_t, broken), OFF(rshmem_ibgda_qp_t, timeout_what),
      OFF(rshmem_ibgda_qp_t, timeout_index), OFF(rshmem_ibgda_qp_t, first_error),
      OFF(rshmem_ibgda_qp_t, first_error_syndrome), OFF(rshmem_ibgda_qp_t, first_error_vendor),
      OFF(rshmem_ibgda_qp_t, first_error_wqe_opcode), OFF(rshmem_ibgda_qp_t, first_error_cqe_opcode),
      OFF(rshmem_ibgda_qp_t, first_error_index), OFF(rshmem_ibgda_qp_t, cqes),
      sizeof(rshmem_ibgda_table_t), OFF(rshmem_ibgda_table_t, magic),
      OFF(rshmem_ibgda_table_t, version), OFF(rshmem_ibgda_table_t, n_qps),
      OFF(rshmem_ibgda_table_t, flags), OFF(rshmem_ibgda_table_t, qps),
      OFF(rshmem_ibgda_table_t, results), OFF(rshmem_ibgda_table_t, result_locks),
      OFF(rshmem_ibgda_table_t, n_results), OFF(rshmem_ibgda_table_t, results_lkey),
      RSHMEM_IBGDA_TABLE_MAGIC, RSHMEM_IBGDA_VERSION, RSHMEM_IBGDA_CQ_NORMAL,
      RSHMEM_IBGDA_CQ_COLLAPSED, RSHMEM_IBGDA_DOORBELL_MEMORY, RSHMEM_IBGDA_DOORBELL_MMIO,
      RSHMEM_IBGDA_OK, RSHMEM_IBGDA_ERR_TIMEOUT,
      RSHMEM_IBGDA_ERR_CQE, RSHMEM_IBGDA_ERR_BROKEN, RSHMEM_IBGDA_ERR_TOO_BIG,
  };
#undef OFF
  size_t n = sizeof(v) / sizeof(v[0]);
  for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
  return n;
}

}  // extern "C"
