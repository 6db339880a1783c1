// rshmem_ibgda_producer.cu — kernels that drive the IBGDA send-queue producer directly
// (compiled to ptx/rshmem_ibgda_producer.ptx).
//
// Owns: kernels that post to one rshmem_ibgda_qp_t descriptor without the device API (no
// PE, no state): the producer-rate benchmark and a fetch-add check. The host hands them a
// descriptor whose queue memory is mapped into the GPU (host-pinned QueueMemory registered
// with cuMemHostRegister, or a NIC's queues) — docs/ibgda-device.md, "Running it on a GPU".
// Must not: depend on rshmem.cuh (the device API calls the same producer through its
// IBGDA transport branch).
//
// Launch contract: any 1-D grid; blocks of up to 256 threads (RSHMEM_IBGDA_MAX_THREADS). Every failure traps after
// filling the error record `err` (rshmem/state.cuh; may be null: then it only traps).
#include <stdint.h>

#include "rshmem/ibgda/queue.cuh"

namespace ib = rshmem::ibgda;

#define RSHMEM_IBGDA_MAX_THREADS 256

// Every thread posts `iters` RDMA WRITEs of `bytes` from (laddr, lkey) to raddr + thread *
// bytes (so the remote region must hold grid threads x bytes), warp-batched (one
// reservation and one doorbell per warp per round) when warp_batch != 0, then quiets.
// times[2 * block] / times[2 * block + 1]: %globaltimer (ns) when the block's thread 0
// started posting / returned from quiet — the WQEs/s the GPU posts is
// grid threads x iters / (max end - min start). With an engine that discards (advances
// completions without executing) this is the producer's rate alone.
extern "C" __global__ void __launch_bounds__(RSHMEM_IBGDA_MAX_THREADS, 1)
rshmem_ibgda_post_writes(rshmem_ibgda_qp_t *qp, uint64_t raddr,
                                                    uint32_t rkey, uint64_t laddr,
                                                    uint32_t lkey, uint32_t bytes,
                                                    uint32_t iters, uint32_t warp_batch,
                                                    rshmem_device_error_t *err,
                                                    uint64_t *times) {
  const uint64_t tid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  const uint64_t dst = raddr + tid * bytes;
  if (threadIdx.x == 0 && times) times[2 * blockIdx.x] = ib::now_ns();
  for (uint32_t i = 0; i < iters; ++i) {
    // post_write_warp batches the lanes __activemask() names; a warp need not be
    // converged here (lane 0 just ran the timestamp branch, and each round ends in
    // divergent checks), so converge it first or a round may split into several
    // reservations and skew the rate. Every lane runs every round; lanes past blockDim
    // do not exist and count as exited.
    if (warp_batch) __syncwarp();
    int st = warp_batch ? ib::post_write_warp(qp, dst, rkey, laddr, lkey, bytes)
                        : ib::post_write(qp, dst, rkey, laddr, lkey, bytes);
    ib::check(qp, st, err, -1);
  }
  ib::check(qp, ib::quiet(qp), err, -1);
  __syncthreads();
  if (threadIdx.x == 0 && times) times[2 * blockIdx.x + 1] = ib::now_ns();
}

// Every thread does `iters` blocking 8-byte fetch-adds of 1 on the word at raddr, the old
// value landing at result + 8 * thread (registered with lkey), and stores the values it
// got at out[thread * iters + i]. A correct run: out is a permutation of 0 .. threads x
// iters - 1 and the word ends at its start value + threads x iters.
extern "C" __global__ void __launch_bounds__(RSHMEM_IBGDA_MAX_THREADS, 1)
rshmem_ibgda_fetch_add(rshmem_ibgda_qp_t *qp, uint64_t raddr,
                                                  uint32_t rkey, uint64_t result,
                                                  uint32_t lkey, uint32_t iters,
                                                  rshmem_device_error_t *err,
                                                  uint64_t *out) {
  const uint64_t tid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  for (uint32_t i = 0; i < iters; ++i) {
    uint64_t old = 0;
    ib::check(qp, ib::fetch_add(qp, raddr, rkey, result + 8 * tid, lkey, 1, &old), err, -1);
    out[tid * iters + i] = old;
  }
}
