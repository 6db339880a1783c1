// examples/gpu_ring/ring.cu — a user kernel on the rshmem device API: a ring exchange.
//
// Every PE sends `words` 8-byte words to its right neighbour with one put_signal per
// round (block scope: the whole block copies, thread 0 raises the signal), waits for its
// left neighbour's data with signal_wait_until, and checks every word. Round r's payload
// is rshmem_pattern_u64(seed + origin_pe * 1000 + r, i), so a word from the wrong PE or
// the wrong round is recognised. The signal carries r + 1 (SET), a value that changes
// every round, so a round can never be mistaken for the previous one.
//
// Build: scripts/build-ptx compiles it with the library's nvcc flags to
// examples/gpu_ring/ring.ptx (committed, checked for freshness); by hand:
//   nvcc -arch=sm_90 -ptx -I device-kernels/include examples/gpu_ring/ring.cu -o ring.ptx
// Run: load the PTX once per PE, bind it (Rust: GpuPe::bind_module), allocate a
// symmetric buffer of 2 * words * 8 + 64 bytes plus 8 bytes of zeroed signal word, and
// launch ring_exchange<<<1, 256>>> on every PE at once. After the kernel, *errors is the
// number of mismatched words (0 when correct) and *checked the number compared.
// The Rust launcher doing exactly that is examples/gpu_ring/main.rs
// (cargo run --release --example gpu_ring -- --pes 4).
#include <stdint.h>

#include <rshmem/pattern.cuh>
#include <rshmem/rshmem.cuh>

// Bounds (256, 1): the launcher's block size; with the default 1024-thread bound ptxas
// caps the kernel at 64 registers and spills around the device API's IBGDA calls.
extern "C" __global__ void __launch_bounds__(256, 1)
    ring_exchange(uint64_t *sym_buf, uint64_t *sym_signal, uint64_t words, uint64_t rounds,
                  uint64_t seed, unsigned long long *errors, unsigned long long *checked) {
  const int me = rshmem_my_pe();
  const int n = rshmem_n_pes();
  const int right = (me + 1) % n;
  const int left = (me + n - 1) % n;
  uint64_t *send = sym_buf;          // what this PE sends (local)
  uint64_t *recv = sym_buf + words;  // where the left neighbour's data lands
  unsigned long long bad = 0, seen = 0;

  for (uint64_t r = 0; r < rounds; ++r) {
    for (uint64_t i = threadIdx.x; i < words; i += blockDim.x)
      send[i] = rshmem_pattern_u64(seed + static_cast<uint64_t>(me) * 1000 + r, i);
    __syncthreads();
    // Data first, then the signal: the right neighbour sees all of `recv` once it sees r + 1.
    rshmem_uint64_put_signal_block(recv, send, words, sym_signal, r + 1, RSHMEM_SIGNAL_SET, right);
    if (threadIdx.x == 0) rshmem_signal_wait_until(sym_signal, RSHMEM_CMP_EQ, r + 1);
    __syncthreads();
    for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) {
      ++seen;
      if (recv[i] != rshmem_pattern_u64(seed + static_cast<uint64_t>(left) * 1000 + r, i)) ++bad;
    }
    // Nobody may overwrite `recv` (next round) before its owner has checked it, and the
    // next round's signal value must not arrive before this PE waited for this one:
    // a barrier of one block per PE orders the rounds.
    rshmem_barrier_all_block();
  }
  atomicAdd(errors, bad);
  atomicAdd(checked, seen);
}
