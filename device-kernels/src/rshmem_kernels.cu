// rshmem_kernels.cu — the library's utility kernels (compiled to ptx/rshmem_kernels.ptx).
//
// Owns: kernels the runtime, self-tests and benchmarks launch on local GPU memory:
//   rshmem_fill_u64    fill a buffer with rshmem_pattern_u64(seed, i)
//   rshmem_verify_u64  find the first word that differs from that pattern
//   rshmem_copy        device-to-device copy, 16-byte vectorised (copy-bandwidth benchmark)
// Must not: touch remote memory or the network; those kernels live with the device API.
//
// Launch contract (all kernels): any 1-D grid and block up to 1024 threads; each kernel
// walks its range grid-stride, so the grid size only sets the parallelism. The entry
// points are extern "C" so the loader finds them by these names in the PTX; parameters
// are fixed-width (u64 / pointers) so the Rust side passes u64 / CUdeviceptr.
#include <stdint.h>

#include "rshmem/pattern.cuh"

#define RSHMEM_UTILITY_MAX_THREADS 1024

namespace {

__device__ __forceinline__ uint64_t global_thread_index() {
  return blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
}

__device__ __forceinline__ uint64_t global_thread_count() {
  return gridDim.x * static_cast<uint64_t>(blockDim.x);
}

// Copies `bytes` bytes one byte per thread step; used for heads, tails and for pointer
// pairs whose alignments differ so that no wider access is aligned on both sides.
__device__ __forceinline__ void copy_bytes(unsigned char *__restrict__ dst,
                                           const unsigned char *__restrict__ src, uint64_t bytes,
                                           uint64_t first, uint64_t stride) {
  for (uint64_t i = first; i < bytes; i += stride) dst[i] = src[i];
}

// Copies with accesses of type V (uint4 = 16 B, uint2 = 8 B, unsigned = 4 B). Requires
// dst ≡ src (mod sizeof(V)): bytes before the first V-aligned address of dst (the head)
// and after the last whole V (the tail) go byte by byte. The body loop keeps four
// independent loads in flight per thread before storing, which is what a streaming copy
// needs to cover HBM latency with a modest grid.
template <typename V>
__device__ __forceinline__ void copy_vectorised(unsigned char *__restrict__ dst,
                                                const unsigned char *__restrict__ src,
                                                uint64_t bytes, uint64_t first,
                                                uint64_t stride) {
  constexpr uint64_t kSize = sizeof(V);
  uint64_t head = (kSize - (reinterpret_cast<uintptr_t>(dst) & (kSize - 1))) & (kSize - 1);
  if (head > bytes) head = bytes;
  const uint64_t count = (bytes - head) / kSize;
  const uint64_t tail = bytes - head - count * kSize;

  copy_bytes(dst, src, head, first, stride);

  V *__restrict__ vdst = reinterpret_cast<V *>(dst + head);
  const V *__restrict__ vsrc = reinterpret_cast<const V *>(src + head);
  uint64_t i = first;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const V a = vsrc[i];
    const V b = vsrc[i + stride];
    const V c = vsrc[i + 2 * stride];
    const V d = vsrc[i + 3 * stride];
    vdst[i] = a;
    vdst[i + stride] = b;
    vdst[i + 2 * stride] = c;
    vdst[i + 3 * stride] = d;
  }
  for (; i < count; i += stride) vdst[i] = vsrc[i];

  const uint64_t done = head + count * kSize;
  copy_bytes(dst + done, src + done, tail, first, stride);
}

}  // namespace

extern "C" {

// dst[i] = rshmem_pattern_u64(seed, i) for i in [0, count). dst must be 8-byte aligned.
__global__ void __launch_bounds__(RSHMEM_UTILITY_MAX_THREADS)
    rshmem_fill_u64(uint64_t *__restrict__ dst, uint64_t count, uint64_t seed) {
  const uint64_t stride = global_thread_count();
  for (uint64_t i = global_thread_index(); i < count; i += stride)
    dst[i] = rshmem_pattern_u64(seed, i);
}

// Lowers *first_mismatch to the smallest i in [0, count) with
// src[i] != rshmem_pattern_u64(seed, i). The caller sets *first_mismatch to UINT64_MAX
// before the launch; it stays UINT64_MAX when the whole range matches. src must be
// 8-byte aligned.
__global__ void __launch_bounds__(RSHMEM_UTILITY_MAX_THREADS)
    rshmem_verify_u64(const uint64_t *__restrict__ src, uint64_t count, uint64_t seed,
                      unsigned long long *first_mismatch) {
  const uint64_t stride = global_thread_count();
  for (uint64_t i = global_thread_index(); i < count; i += stride) {
    if (src[i] != rshmem_pattern_u64(seed, i)) {
      // A thread's indices increase, so its first mismatch is its smallest: one atomic
      // per thread at most, even when the whole buffer is wrong.
      atomicMin(first_mismatch, static_cast<unsigned long long>(i));
      return;
    }
  }
}

// memcpy for device memory: copies `bytes` bytes from src to dst (the ranges must not
// overlap). Uses 16-byte accesses when dst and src are congruent mod 16 (always the case
// for cudaMalloc'd buffers at equal offsets), else 8-, 4- or 1-byte accesses.
__global__ void __launch_bounds__(RSHMEM_UTILITY_MAX_THREADS)
    rshmem_copy(void *__restrict__ dst, const void *__restrict__ src, uint64_t bytes) {
  unsigned char *d = static_cast<unsigned char *>(dst);
  const unsigned char *s = static_cast<const unsigned char *>(src);
  const uint64_t first = global_thread_index();
  const uint64_t stride = global_thread_count();
  // Uniform across the grid: every thread takes the same branch.
  const uintptr_t skew = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((skew & 15) == 0) {
    copy_vectorised<uint4>(d, s, bytes, first, stride);
  } else if ((skew & 7) == 0) {
    copy_vectorised<uint2>(d, s, bytes, first, stride);
  } else if ((skew & 3) == 0) {
    copy_vectorised<unsigned int>(d, s, bytes, first, stride);
  } else {
    copy_bytes(d, s, bytes, first, stride);
  }
}

}  // extern "C"
