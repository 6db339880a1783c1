// rshmem_device_bench.cu — device-initiated benchmark kernels (ptx/rshmem_device_bench.ptx).
//
// Owns: rshmem_bench_<op>_<kind>_<scope>(rshmem_harness_args_t a), modelled on NVSHMEM's
// perftest shmem_p_ping_pong_latency / shmem_put_latency / shmem_put_bw:
//   op    put (putmem), get (getmem), p (rshmem_uint64_p), atomic (uint64 fetch_add),
//         signal (putmem_signal, SET for latency, ADD for bandwidth)
//   kind  lat (latency) or bw (bandwidth)
//   scope thread, warp, block (p and atomic: thread only)
// The manifest (rshmem_device_tests.json, "benches") lists every kernel with its grid and
// block. Must not: check correctness (the test kernels do) beyond the checksum below.
//
// Arguments (rshmem/internal/harness.cuh): param0 = message size in bytes (put, get,
// signal; p and atomic move 8 bytes per operation and ignore it in latency mode),
// param1 = timed iterations, param2 = the peer PE (1 <= peer < n_pes). All PEs launch the
// kernel; only PE 0 and the peer take part, the others return at once. The scratch range
// must be zeroed before every launch (as for the test kernels) and hold
// 4096 + 2 * roundup(param0, 4096) bytes: [0, 4096) flags, then the source buffer
// (filled with rshmem_pattern_u64(seed + pe, i): never all-zero data), then the
// destination buffer. a.result points at PE 0's rshmem_bench_record_t (the peer's
// record is not written).
//
// Latency (kind lat; grid 1; block 1 / 32 / the manifest's block for thread / warp /
// block scope). kWarmup = 16 untimed iterations precede param1 timed ones.
//   put, p, signal: ping-pong. Iteration i (1-based flag value v = i, different every
//     iteration): PE 0 sends (put: putmem of param0 bytes, then rshmem_fence and
//     rshmem_uint64_p of v into the peer's ping word; p: rshmem_uint64_p(v) of the ping
//     word itself; signal: putmem_signal of param0 bytes with SET v on the ping word) and
//     waits until its own pong word == v; the peer waits for ping == v and answers the
//     same way into PE 0's pong word. One iteration = one round trip: the one-way latency
//     is (end_ns - start_ns) / iters / 2.
//   get, atomic: one-sided round trips by PE 0 (blocking getmem of param0 bytes from the
//     peer's source buffer / rshmem_uint64_atomic_fetch_add(1) on the peer's word); the
//     peer only fills its source and signals "ready" first. Latency = (end - start) / iters.
//   start_ns: %globaltimer before the first timed iteration; end_ns: after the last.
//   bytes = param0 * iters (p, atomic: 8 * iters); checksum: put/signal/get: XOR of the
//   first and last received 8-byte words (the peer's pattern) of the final iteration;
//   p: the last pong value (= kWarmup + iters); atomic: the last fetched value
//   (= kWarmup + iters - 1).
//
// Bandwidth (kind bw; the manifest's grid, which must be co-resident, e.g. 32 blocks):
//   only PE 0 issues operations, to the peer. Per iteration the grid moves param0 bytes:
//   the units (threads / warps / blocks) split [0, param0) into equal chunks (the last
//   unit takes the remainder); every iteration rewrites the same peer buffer. p: each
//   thread p's its chunk's 8-byte words one by one; atomic: one fetch_add per 8-byte word
//   of the chunk (on the peer's destination words); signal: putmem_signal of the chunk
//   with ADD 1 on the peer's counter. One untimed warm-up iteration per unit; then all
//   blocks meet (local counter), block 0 records start_ns; after param1 iterations every
//   thread quiets, and the last block to finish records end_ns. bytes = param0 * param1
//   (param0 rounded down to 8 for p/atomic); bandwidth = bytes / (end_ns - start_ns).
//   get: PE 0 reads the chunks from the peer (after the peer's "ready" signal).
//   copy (rshmem_bench_copy_bw_block): PE 0 puts to itself (a local copy through the
//   device API), param2 ignored; the other PEs return at once.
// Every transport: the device API picks p2p or IBGDA (proxy / NIC queues) per peer, so
// `rshmem bench ... --device gpu --transport p2p|proxy|ibgda` uses these same kernels.
// Launch bounds are 256 threads (the manifest's blocks are at most 256 for this
// reason): the IBGDA arms are calls, around which ptxas saves the caller's live
// registers, and at 1024 threads (64 registers each) that spilled. At 256 there is room
// (about 110 registers at most, no spills; scripts/check-device-code checks).
#include <stdint.h>

#include "rshmem/internal/harness.cuh"
#include "rshmem/pattern.cuh"
#include "rshmem/rshmem.cuh"

// Internal helpers live in a named namespace, not an anonymous one: nvcc names the
// function-local __shared__ variables of anonymous-namespace functions with a hash of
// the source path, which would make ptx/ differ between checkouts.
namespace rshmem_device_bench_detail {}
using namespace rshmem_device_bench_detail;

namespace rshmem_device_bench_detail {

constexpr uint64_t kWarmup = 16;
// Flag words (offsets into the scratch range).
constexpr uint64_t kPing = 0, kPong = 64, kReady = 128, kCounter = 192, kStarted = 256,
                   kFinished = 320, kAtomicWord = 384;

enum Op { OP_PUT, OP_GET, OP_P, OP_ATOMIC, OP_SIGNAL, OP_COPY };

struct Bufs {
  unsigned char *s;
  unsigned char *src;
  unsigned char *dst;
  __device__ uint64_t *word(uint64_t off) const { return reinterpret_cast<uint64_t *>(s + off); }
};

__device__ __forceinline__ Bufs bufs(const rshmem_harness_args_t &a) {
  Bufs b;
  b.s = reinterpret_cast<unsigned char *>(rshmemi_device_state.heap_base + a.scratch);
  b.src = b.s + 4096;
  b.dst = b.src + ((a.param0 + 4095) & ~4095ull);
  return b;
}

template <int S>
__device__ __forceinline__ void fill_source(const rshmem_harness_args_t &a, const Bufs &b, uint64_t first,
                                            uint64_t stride) {
  uint64_t *w = reinterpret_cast<uint64_t *>(b.src);
  const uint64_t words = (a.param0 + 7) / 8;
  for (uint64_t i = first; i < words; i += stride) w[i] = rshmem_pattern_u64(a.seed + rshmem_my_pe(), i);
  rshmemi_scope_sync<S>();
}

template <int S>
__device__ __forceinline__ void putmem_scope(void *d, const void *s, size_t n, int pe) {
  if (S == RSHMEMI_THREAD) rshmem_putmem(d, s, n, pe);
  else if (S == RSHMEMI_WARP) rshmem_putmem_warp(d, s, n, pe);
  else rshmem_putmem_block(d, s, n, pe);
}
template <int S>
__device__ __forceinline__ void getmem_scope(void *d, const void *s, size_t n, int pe) {
  if (S == RSHMEMI_THREAD) rshmem_getmem(d, s, n, pe);
  else if (S == RSHMEMI_WARP) rshmem_getmem_warp(d, s, n, pe);
  else rshmem_getmem_block(d, s, n, pe);
}
template <int S>
__device__ __forceinline__ void put_signal_scope(void *d, const void *s, size_t n, uint64_t *sig,
                                                 uint64_t v, int op, int pe) {
  if (S == RSHMEMI_THREAD) rshmem_putmem_signal_nbi(d, s, n, sig, v, op, pe);
  else if (S == RSHMEMI_WARP) rshmem_putmem_signal_nbi_warp(d, s, n, sig, v, op, pe);
  else rshmem_putmem_signal_nbi_block(d, s, n, sig, v, op, pe);
}

__device__ __forceinline__ uint64_t edge_checksum(const unsigned char *d, uint64_t bytes) {
  if (bytes < 8) return bytes ? d[0] : 0;
  const uint64_t *w = reinterpret_cast<const uint64_t *>(d);
  return w[0] ^ w[bytes / 8 - 1];
}

// One ping-pong send of iteration value v into `flag` on `pe` (put / p / signal).
template <Op O, int S>
__device__ __forceinline__ void pp_send(const Bufs &b, uint64_t bytes, uint64_t *flag, uint64_t v, int pe) {
  const bool leader = rshmemi_scope_rank<S>() == 0;
  if (O == OP_PUT) {
    putmem_scope<S>(b.dst, b.src, bytes, pe);
    if (leader) {
      rshmem_fence();
      rshmem_uint64_p(flag, v, pe);
    }
  } else if (O == OP_P) {
    rshmem_uint64_p(flag, v, pe);
  } else {
    put_signal_scope<S>(b.dst, b.src, bytes, flag, v, RSHMEM_SIGNAL_SET, pe);
  }
}

template <int S>
__device__ __forceinline__ void scope_wait(uint64_t *flag, uint64_t v) {
  if (rshmemi_scope_rank<S>() == 0) rshmem_signal_wait_until(flag, RSHMEM_CMP_EQ, v);
  rshmemi_scope_sync<S>();
}

template <Op O, int S>
__device__ __forceinline__ void latency(const rshmem_harness_args_t &a) {
  const int me = rshmem_my_pe();
  const int peer = static_cast<int>(a.param2);
  if (me != 0 && me != peer) return;
  const Bufs b = bufs(a);
  const uint64_t bytes = (O == OP_P || O == OP_ATOMIC) ? 8 : a.param0;
  const uint64_t iters = a.param1, total = kWarmup + iters;
  const bool leader = rshmemi_scope_rank<S>() == 0;
  fill_source<S>(a, b, rshmemi_scope_rank<S>(), rshmemi_scope_size<S>());
  rshmem_bench_record_t *rec = reinterpret_cast<rshmem_bench_record_t *>(a.result);
  uint64_t start = 0, checksum = 0;

  if (O == OP_GET || O == OP_ATOMIC) {
    if (me == peer) {  // source ready -> PE 0
      if (leader) {
        rshmem_quiet();
        rshmem_signal_op(b.word(kReady), 1, RSHMEM_SIGNAL_SET, 0);
      }
      return;
    }
    scope_wait<S>(b.word(kReady), 1);
    for (uint64_t i = 0; i < total; ++i) {
      if (i == kWarmup) start = rshmemi_globaltimer();
      if (O == OP_GET) {
        getmem_scope<S>(b.dst, b.src, bytes, peer);
      } else {
        checksum = rshmem_uint64_atomic_fetch_add(b.word(kAtomicWord), 1, peer);
      }
    }
    if (O == OP_GET) checksum = edge_checksum(b.dst, bytes);
  } else {
    uint64_t *ping = b.word(kPing), *pong = b.word(kPong);
    if (me == peer) {
      for (uint64_t v = 1; v <= total; ++v) {
        scope_wait<S>(ping, v);
        pp_send<O, S>(b, bytes, pong, v, 0);
      }
      return;
    }
    for (uint64_t v = 1; v <= total; ++v) {
      if (v == kWarmup + 1) start = rshmemi_globaltimer();
      pp_send<O, S>(b, bytes, ping, v, peer);
      scope_wait<S>(pong, v);
    }
    checksum = O == OP_P ? rshmem_signal_fetch(pong) : edge_checksum(b.dst, bytes);
  }
  const uint64_t end = rshmemi_globaltimer();
  if (leader) {
    rec->start_ns = start;
    rec->end_ns = end;
    rec->iters = iters;
    rec->bytes = bytes * iters;
    rec->checksum = checksum;
  }
}

template <int S>
__device__ __forceinline__ uint32_t unit_index() {
  const uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
  return S == RSHMEMI_THREAD ? g : S == RSHMEMI_WARP ? g / 32 : blockIdx.x;
}
template <int S>
__device__ __forceinline__ uint32_t unit_count() {
  return S == RSHMEMI_THREAD ? gridDim.x * blockDim.x
                             : S == RSHMEMI_WARP ? gridDim.x * blockDim.x / 32 : gridDim.x;
}

// Every block's thread 0 counts itself in at `word` and waits for the whole grid.
__device__ __forceinline__ void grid_meet(uint32_t *word) {
  __syncthreads();
  if (threadIdx.x == 0) {
    rshmemi_atom_add_gpu(word, 1u);
    rshmemi_poll<uint32_t>(word, RSHMEM_CMP_GE, gridDim.x, [word] { return rshmemi_ld_acquire_gpu(word); },
                           "rshmem bench: waiting for all blocks to start (grid not co-resident?)");
  }
  __syncthreads();
}

template <Op O, int S>
__device__ __forceinline__ void bandwidth(const rshmem_harness_args_t &a) {
  const int me = rshmem_my_pe();
  // copy: PE 0 alone, into its own destination buffer.
  const int peer = O == OP_COPY ? 0 : static_cast<int>(a.param2);
  if (me != 0 && (O == OP_COPY || me != peer)) return;
  const Bufs b = bufs(a);
  const uint32_t rank = rshmemi_scope_rank<S>();
  const uint64_t bytes = (O == OP_P || O == OP_ATOMIC) ? (a.param0 & ~7ull) : a.param0;
  const uint64_t units = unit_count<S>(), u = unit_index<S>();
  uint64_t chunk = bytes / units;
  if (O == OP_P || O == OP_ATOMIC) chunk &= ~7ull;
  const uint64_t off = chunk * u;
  const uint64_t len = u + 1 == units ? bytes - off : chunk;
  // Every thread fills the source words of the whole buffer it may read (grid-stride).
  {
    uint64_t *w = reinterpret_cast<uint64_t *>(b.src);
    const uint64_t words = (a.param0 + 7) / 8;
    for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
      w[i] = rshmem_pattern_u64(a.seed + me, i);
  }
  if (O == OP_GET) {
    if (me == peer) {
      rshmem_quiet();
      grid_meet(reinterpret_cast<uint32_t *>(b.word(kStarted)));
      if (blockIdx.x == 0 && threadIdx.x == 0) rshmem_signal_op(b.word(kReady), 1, RSHMEM_SIGNAL_SET, 0);
      return;
    }
    if (threadIdx.x == 0) rshmem_signal_wait_until(b.word(kReady), RSHMEM_CMP_EQ, 1);
    __syncthreads();
  } else if (O != OP_COPY && me == peer) {
    return;
  }
  __syncthreads();
  uint64_t checksum = 0;
  for (uint64_t it = 0; it <= a.param1; ++it) {
    if (it == 1) {
      grid_meet(reinterpret_cast<uint32_t *>(b.word(kStarted)));
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        reinterpret_cast<rshmem_bench_record_t *>(a.result)->start_ns = rshmemi_globaltimer();
      }
    }
    if (O == OP_PUT || O == OP_COPY) {
      // copy: a put to this PE itself is the device API's local copy, the same code and
      // the same loop as the put, timed the same way.
      putmem_scope<S>(b.dst + off, b.src + off, len, peer);
    } else if (O == OP_GET) {
      getmem_scope<S>(b.dst + off, b.src + off, len, peer);
    } else if (O == OP_SIGNAL) {
      put_signal_scope<S>(b.dst + off, b.src + off, len, b.word(kCounter), 1, RSHMEM_SIGNAL_ADD, peer);
    } else if (O == OP_P) {
      const uint64_t *sw = reinterpret_cast<const uint64_t *>(b.src + off);
      uint64_t *dw = reinterpret_cast<uint64_t *>(b.dst + off);
      for (uint64_t i = 0; i < len / 8; ++i) rshmem_uint64_p(dw + i, sw[i], peer);
    } else {
      uint64_t *dw = reinterpret_cast<uint64_t *>(b.dst + off);
      for (uint64_t i = 0; i < len / 8; ++i) checksum += rshmem_uint64_atomic_fetch_add(dw + i, 1, peer);
    }
  }
  rshmem_quiet();
  __syncthreads();
  if (O == OP_GET && rank == 0 && len >= 8) checksum = edge_checksum(b.dst + off, len);
  if (threadIdx.x == 0) {
    if (O != OP_GET && O != OP_ATOMIC) checksum = len;
    uint32_t *fin = reinterpret_cast<uint32_t *>(b.word(kFinished));
    if (rshmemi_atom_add_gpu(fin, 1u) == gridDim.x - 1) {
      rshmem_bench_record_t *rec = reinterpret_cast<rshmem_bench_record_t *>(a.result);
      rec->end_ns = rshmemi_globaltimer();
      rec->iters = a.param1;
      rec->bytes = bytes * a.param1;
      rec->checksum = checksum;
    }
  }
}

}  // namespace

#define RSHMEMI_BENCH(op, OP, scope, S, threads)                                                     \
  extern "C" __global__ void __launch_bounds__(threads, 1)                                          \
      rshmem_bench_##op##_lat_##scope(rshmem_harness_args_t a) {                                    \
    latency<OP, S>(a);                                                                              \
  }                                                                                                 \
  extern "C" __global__ void __launch_bounds__(256, 1) rshmem_bench_##op##_bw_##scope(rshmem_harness_args_t a) { \
    bandwidth<OP, S>(a);                                                                            \
  }

RSHMEMI_BENCH(put, OP_PUT, thread, RSHMEMI_THREAD, 32)
RSHMEMI_BENCH(put, OP_PUT, warp, RSHMEMI_WARP, 32)
RSHMEMI_BENCH(put, OP_PUT, block, RSHMEMI_BLOCK, 256)
RSHMEMI_BENCH(get, OP_GET, thread, RSHMEMI_THREAD, 32)
RSHMEMI_BENCH(get, OP_GET, warp, RSHMEMI_WARP, 32)
RSHMEMI_BENCH(get, OP_GET, block, RSHMEMI_BLOCK, 256)
RSHMEMI_BENCH(signal, OP_SIGNAL, thread, RSHMEMI_THREAD, 32)
RSHMEMI_BENCH(signal, OP_SIGNAL, warp, RSHMEMI_WARP, 32)
RSHMEMI_BENCH(signal, OP_SIGNAL, block, RSHMEMI_BLOCK, 256)
RSHMEMI_BENCH(p, OP_P, thread, RSHMEMI_THREAD, 32)
RSHMEMI_BENCH(atomic, OP_ATOMIC, thread, RSHMEMI_THREAD, 32)
#undef RSHMEMI_BENCH

// The device-to-device copy timed as the bandwidth kernels are (inside one launch, after
// all blocks met, no launch gaps): PE 0 copies param0 bytes from its source buffer to its
// destination buffer per iteration, block scope. `rshmem bench copy` holds the put against
// the best of this, rshmem_copy and cuMemcpyDtoD; the latter two are timed with events
// around back-to-back launches, which count the gaps between launches (a microsecond or
// so each, a third of an 8 MiB copy on an H100) and so understate the copy.
extern "C" __global__ void __launch_bounds__(256, 1) rshmem_bench_copy_bw_block(rshmem_harness_args_t a) {
  bandwidth<OP_COPY, RSHMEMI_BLOCK>(a);
}
