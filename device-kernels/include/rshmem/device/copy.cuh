// rshmem/device/copy.cuh — the cooperative copy loop behind every put/get, for device and
// host C++.
//
// Owns: rshmemi_copy(dst, src, bytes, first, stride): participant `first` of `stride`
// participants copies its share of [src, src + bytes) to dst. A thread-scope put is one
// participant (0, 1), a warp-scope put has the lanes (lane, 32), a block-scope put the
// threads (threadIdx, blockDim). Pure loads and stores, no fences or intrinsics, so host
// C++ runs it unchanged: device-kernels/tests/host_logic_test.cpp emulates warps and blocks
// by calling it for every (first, stride) pair and checks all alignments.
// Must not: order or fence anything (the callers do), or assume dst/src alignment.
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"

#if defined(__CUDACC__)
typedef uint4 rshmemi_v16_t;  // 16-byte vector loads/stores (ld/st.v4.u32)
typedef uint2 rshmemi_v8_t;
#else
struct alignas(16) rshmemi_v16_t {
  uint64_t lo, hi;
};
struct alignas(8) rshmemi_v8_t {
  uint32_t x, y;
};
#endif

// How a copy splits: `width`-byte accesses for the body (16, 8, 4 or 1), `head` bytes
// before the first width-aligned destination address, `count` whole accesses, then `tail`
// bytes. Width is the largest power of two (up to 16) with dst ≡ src (mod width), so both
// sides of every body access are aligned.
struct rshmemi_copy_plan_t {
  uint64_t width, head, count, tail;
};

RSHMEM_HOST_DEVICE rshmemi_copy_plan_t rshmemi_copy_plan(uint64_t dst, uint64_t src,
                                                         uint64_t bytes) {
  const uint64_t skew = dst ^ src;
  rshmemi_copy_plan_t p;
  p.width = (skew & 15) == 0 ? 16 : (skew & 7) == 0 ? 8 : (skew & 3) == 0 ? 4 : 1;
  if (p.width == 1) {
    p.head = 0;
    p.count = bytes;
    p.tail = 0;
    return p;
  }
  uint64_t head = (p.width - (dst & (p.width - 1))) & (p.width - 1);
  if (head > bytes) head = bytes;
  p.head = head;
  p.count = (bytes - head) / p.width;
  p.tail = bytes - head - p.count * p.width;
  return p;
}

// Source loads. Cg = true (gets: the source is a peer's memory) loads with ld.global.cg,
// cached in L2 only: L1 is not coherent, and a get that re-reads remote data must not be
// served a stale L1 line (nor a latency benchmark measure L1 hits). Puts read local
// memory and use plain loads. Host C++: plain loads either way.
template <bool Cg, typename V>
RSHMEM_HOST_DEVICE V rshmemi_copy_load(const V *p) {
#if RSHMEM_DEVICE_COMPILE
  if (Cg) return __ldcg(p);
#endif
  return *p;
}

template <bool Cg, typename V>
RSHMEM_HOST_DEVICE void rshmemi_copy_body(unsigned char *dst, const unsigned char *src,
                                          uint64_t count, uint64_t first, uint64_t stride) {
  V *vdst = reinterpret_cast<V *>(dst);
  const V *vsrc = reinterpret_cast<const V *>(src);
  uint64_t i = first;
  // Four independent loads in flight per participant before the stores: a single thread
  // copying a large message (thread-scope put) otherwise waits one full latency per word.
  for (; i + 3 * stride < count; i += 4 * stride) {
    const V a = rshmemi_copy_load<Cg>(vsrc + i);
    const V b = rshmemi_copy_load<Cg>(vsrc + i + stride);
    const V c = rshmemi_copy_load<Cg>(vsrc + i + 2 * stride);
    const V d = rshmemi_copy_load<Cg>(vsrc + i + 3 * stride);
    vdst[i] = a;
    vdst[i + stride] = b;
    vdst[i + 2 * stride] = c;
    vdst[i + 3 * stride] = d;
  }
  for (; i < count; i += stride) vdst[i] = rshmemi_copy_load<Cg>(vsrc + i);
}

template <bool Cg>
RSHMEM_HOST_DEVICE void rshmemi_copy_bytes(unsigned char *dst, const unsigned char *src,
                                           uint64_t bytes, uint64_t first, uint64_t stride) {
  for (uint64_t i = first; i < bytes; i += stride) dst[i] = rshmemi_copy_load<Cg>(src + i);
}

// Participant `first` of `stride` copies its share. The ranges must not overlap. Every
// participant must pass the same dst, src and bytes (the split is computed from them).
// Cg: see rshmemi_copy_load (true for gets).
template <bool Cg = false>
RSHMEM_HOST_DEVICE void rshmemi_copy(void *dst_, const void *src_, uint64_t bytes,
                                     uint64_t first, uint64_t stride) {
  unsigned char *dst = static_cast<unsigned char *>(dst_);
  const unsigned char *src = static_cast<const unsigned char *>(src_);
  const rshmemi_copy_plan_t p = rshmemi_copy_plan(reinterpret_cast<uintptr_t>(dst),
                                                  reinterpret_cast<uintptr_t>(src), bytes);
  rshmemi_copy_bytes<Cg>(dst, src, p.head, first, stride);
  unsigned char *bd = dst + p.head;
  const unsigned char *bs = src + p.head;
  switch (p.width) {
    case 16: rshmemi_copy_body<Cg, rshmemi_v16_t>(bd, bs, p.count, first, stride); break;
    case 8: rshmemi_copy_body<Cg, rshmemi_v8_t>(bd, bs, p.count, first, stride); break;
    case 4: rshmemi_copy_body<Cg, uint32_t>(bd, bs, p.count, first, stride); break;
    default: rshmemi_copy_bytes<Cg>(bd, bs, p.count, first, stride); return;
  }
  const uint64_t done = p.head + p.count * p.width;
  rshmemi_copy_bytes<Cg>(dst + done, src + done, p.tail, first, stride);
}
