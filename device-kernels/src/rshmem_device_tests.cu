// rshmem_device_tests.cu — GPU self-test kernels of the device API (ptx/rshmem_device_tests.ptx).
//
// Owns: one `extern "C" __global__ void rshmem_test_<name>(rshmem_harness_args_t a)` per
// case, and the negative cases `rshmem_trap_<name>` that must trap. Each case's launch
// geometry, parameters and exact per-PE check count are in rshmem_device_tests.json (the
// manifest the Rust runner reads); the comment above each kernel says what it checks and
// how the count follows. Harness contract: rshmem/internal/harness.cuh.
// Must not: depend on the PE count for its check count (each PE checks what its left
// neighbour sent), or on anything but the device API and the harness.
//
// Conventions: me = rshmem_my_pe(), right = (me + 1) % n, left = (me + n - 1) % n. Every
// payload is origin-encoded: word i of PE p's data is rshmem_pattern_u64(a.seed + p, i)
// (byte k = byte k % 8 of word k / 8). The scratch range is zeroed by the host before the
// launch. Completion is signalled by the device API itself (signals, waits, barriers), so
// a broken primitive shows up as a failure or as a bounded-wait trap, never as a hang.
#include <stdint.h>

#include "rshmem/internal/harness.cuh"
#include "rshmem/pattern.cuh"
#include "rshmem/rshmem.cuh"

// Internal helpers live in a named namespace, not an anonymous one: nvcc names the
// function-local __shared__ variables of anonymous-namespace functions with a hash of
// the source path, which would make ptx/ differ between checkouts.
namespace rshmem_device_tests_detail {}
using namespace rshmem_device_tests_detail;

namespace rshmem_device_tests_detail {

// Per-thread check counting; flush() adds the count to the result once per thread.
struct Checker {
  rshmem_test_result_t *r;
  unsigned long long n;

  __device__ explicit Checker(const rshmem_harness_args_t &a)
      : r(reinterpret_cast<rshmem_test_result_t *>(a.result)), n(0) {}

  __device__ void eq(uint64_t index, uint64_t expected, uint64_t observed) {
    ++n;
    if (expected != observed) {
      if (atomicCAS(&r->failures, 0ull, 1ull) == 0ull) {
        r->first_index = index;
        r->expected = expected;
        r->observed = observed;
      } else {
        atomicAdd(&r->failures, 1ull);
      }
    }
  }

  __device__ void flush() {
    if (n) atomicAdd(&r->checks, n);
    n = 0;
  }
};

__device__ __forceinline__ unsigned char *scratch(const rshmem_harness_args_t &a) {
  return reinterpret_cast<unsigned char *>(rshmemi_device_state.heap_base + a.scratch);
}

__device__ __forceinline__ int right_pe() { return (rshmem_my_pe() + 1) % rshmem_n_pes(); }
__device__ __forceinline__ int left_pe() {
  return (rshmem_my_pe() + rshmem_n_pes() - 1) % rshmem_n_pes();
}

__device__ __forceinline__ uint64_t pat(const rshmem_harness_args_t &a, int pe, uint64_t i) {
  return rshmem_pattern_u64(a.seed + static_cast<uint64_t>(pe), i);
}

// Byte k of PE pe's pattern stream.
__device__ __forceinline__ unsigned char pat_byte(const rshmem_harness_args_t &a, int pe, uint64_t k) {
  return static_cast<unsigned char>(pat(a, pe, k / 8) >> (8 * (k % 8)));
}

__device__ __forceinline__ uint32_t gthread() { return blockIdx.x * blockDim.x + threadIdx.x; }

}  // namespace

// ---- put, thread scope -------------------------------------------------------------------
// grid 4 x block 128, param0 = W words per thread. Thread g puts its W pattern words to
// the right neighbour with rshmem_uint64_put (put_nbi in the _nbi case), quiets, and each
// block then adds 1 to the right's counter (signal_op ADD). Each block waits for the
// counter to reach gridDim.x and every thread checks its W words from the left.
// checks/PE = 512 * W.
template <bool Nbi>
__device__ __forceinline__ void put_thread_body(const rshmem_harness_args_t &a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *ctr = reinterpret_cast<uint64_t *>(s);
  const uint64_t w = a.param0;
  const uint64_t nthreads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t *src = reinterpret_cast<uint64_t *>(s + 4096);
  uint64_t *dst = src + nthreads * w;
  const uint64_t g = gthread();
  for (uint64_t i = 0; i < w; ++i) src[g * w + i] = pat(a, rshmem_my_pe(), g * w + i);
  if (Nbi)
    rshmem_uint64_put_nbi(dst + g * w, src + g * w, w, right_pe());
  else
    rshmem_uint64_put(dst + g * w, src + g * w, w, right_pe());
  rshmem_quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    rshmem_signal_op(ctr, 1, RSHMEM_SIGNAL_ADD, right_pe());
    rshmem_signal_wait_until(ctr, RSHMEM_CMP_EQ, gridDim.x);
  }
  __syncthreads();
  for (uint64_t i = 0; i < w; ++i) c.eq(g * w + i, pat(a, left_pe(), g * w + i), dst[g * w + i]);
  c.flush();
}

extern "C" {
__global__ void __launch_bounds__(128, 1) rshmem_test_put_thread(rshmem_harness_args_t a) {
  put_thread_body<false>(a);
}
__global__ void __launch_bounds__(128, 1) rshmem_test_put_nbi_thread(rshmem_harness_args_t a) {
  put_thread_body<true>(a);
}

}  // extern "C"

// ---- putmem / getmem at every scope, unaligned -------------------------------------------
// 48 cases; case c copies kLens[c % 12] bytes from source offset c % 16 to destination
// offset (7c + 3) % 16 inside its own 8 KiB slot, so all 16 x 16 misalignment classes of
// the byte / 4 / 8 / 16-byte paths and lengths 0..4097 occur. A "unit" (a thread, a warp,
// a block) handles cases unit, unit + units, ...; odd cases use the _nbi form.
//  put: the unit fills its source slot, puts it to the right neighbour, quiets, and its
//   leader adds 1 to the right's counter per case; receivers wait for 48 and check their
//   slots (from the left).
//  get: the unit fills its source slot, quiets and signals the right neighbour (ADD 1 per
//   case); the right waits for 48 and gets the slot from its left neighbour.
// Checks per case: every copied byte plus one guard byte before and one after the
// destination range (must still be 0). checks/PE = 4 * (sum of kLens) + 2 * 48 = 21620.
namespace rshmem_device_tests_detail {

constexpr int kCases = 48;
constexpr uint64_t kSlot = 8192;
__device__ __constant__ uint32_t kLens[12] = {0, 1, 3, 8, 15, 16, 17, 31, 64, 129, 1000, 4097};

// Warps per block: a block whose size is not a multiple of 32 ends with a partial warp,
// which is a unit too (the _warp_partial cases).
__device__ __forceinline__ uint32_t block_warps() { return (blockDim.x + 31) / 32; }
template <int S>
__device__ __forceinline__ uint32_t unit_index() {
  return S == RSHMEMI_THREAD ? gthread()
                             : S == RSHMEMI_WARP ? blockIdx.x * block_warps() + threadIdx.x / 32 : blockIdx.x;
}
template <int S>
__device__ __forceinline__ uint32_t unit_count() {
  return S == RSHMEMI_THREAD ? gridDim.x * blockDim.x
                             : S == RSHMEMI_WARP ? gridDim.x * block_warps() : gridDim.x;
}

template <int S, bool Get>
__device__ __forceinline__ void mem_body(const rshmem_harness_args_t &a) {
  Checker ck(a);
  unsigned char *s = scratch(a);
  uint64_t *ctr = reinterpret_cast<uint64_t *>(s);
  unsigned char *src = s + 4096;
  unsigned char *dst = src + kCases * kSlot + 4096;  // 4 KiB gap: guard bytes of case 0
  const uint32_t rank = rshmemi_scope_rank<S>();
  const uint32_t size = rshmemi_scope_size<S>();
  const int me = rshmem_my_pe(), right = right_pe(), left = left_pe();

  // Fill this unit's source slots (byte k of the slot area = byte k of my pattern stream).
  for (uint32_t cs = unit_index<S>(); cs < kCases; cs += unit_count<S>()) {
    uint64_t *words = reinterpret_cast<uint64_t *>(src + cs * kSlot);
    for (uint64_t i = rank; i < kSlot / 8; i += size) words[i] = pat(a, me, cs * kSlot / 8 + i);
  }
  rshmemi_scope_sync<S>();

  if (!Get) {
    for (uint32_t cs = unit_index<S>(); cs < kCases; cs += unit_count<S>()) {
      const uint64_t len = kLens[cs % 12], so = cs % 16, dof = (7 * cs + 3) % 16;
      unsigned char *d = dst + cs * kSlot + dof;
      const unsigned char *sp = src + cs * kSlot + so;
      if (S == RSHMEMI_THREAD) {
        if (cs & 1) rshmem_putmem_nbi(d, sp, len, right); else rshmem_putmem(d, sp, len, right);
      } else if (S == RSHMEMI_WARP) {
        if (cs & 1) rshmem_putmem_nbi_warp(d, sp, len, right); else rshmem_putmem_warp(d, sp, len, right);
      } else {
        if (cs & 1) rshmem_putmem_nbi_block(d, sp, len, right); else rshmem_putmem_block(d, sp, len, right);
      }
      rshmem_quiet();
      rshmemi_scope_sync<S>();
      if (rank == 0) rshmem_signal_op(ctr, 1, RSHMEM_SIGNAL_ADD, right);
    }
  } else {
    for (uint32_t cs = unit_index<S>(); cs < kCases; cs += unit_count<S>()) {
      rshmem_quiet();
      rshmemi_scope_sync<S>();
      if (rank == 0) rshmem_signal_op(ctr, 1, RSHMEM_SIGNAL_ADD, right);
    }
  }
  if (rank == 0) rshmem_signal_wait_until(ctr, RSHMEM_CMP_EQ, kCases);
  rshmemi_scope_sync<S>();

  for (uint32_t cs = unit_index<S>(); cs < kCases; cs += unit_count<S>()) {
    const uint64_t len = kLens[cs % 12], so = cs % 16, dof = (7 * cs + 3) % 16;
    unsigned char *d = dst + cs * kSlot + dof;
    if (Get) {
      const unsigned char *sp = src + cs * kSlot + so;
      if (S == RSHMEMI_THREAD) {
        if (cs & 1) rshmem_getmem_nbi(d, sp, len, left); else rshmem_getmem(d, sp, len, left);
      } else if (S == RSHMEMI_WARP) {
        if (cs & 1) rshmem_getmem_nbi_warp(d, sp, len, left); else rshmem_getmem_warp(d, sp, len, left);
      } else {
        if (cs & 1) rshmem_getmem_nbi_block(d, sp, len, left); else rshmem_getmem_block(d, sp, len, left);
      }
    }
    for (uint64_t k = rank; k < len; k += size)
      ck.eq(cs * kSlot + k, pat_byte(a, left, cs * kSlot + so + k), d[k]);
    if (rank == 0) {
      ck.eq(cs * kSlot + 0xffff0000ull, 0, d[-1]);
      ck.eq(cs * kSlot + 0xffff0001ull, 0, d[len]);
    }
    rshmemi_scope_sync<S>();
  }
  ck.flush();
}

}  // namespace

extern "C" {
__global__ void __launch_bounds__(64, 1) rshmem_test_putmem_thread(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_THREAD, false>(a);
}
__global__ void __launch_bounds__(256, 1) rshmem_test_putmem_warp(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_WARP, false>(a);
}
__global__ void __launch_bounds__(256, 1) rshmem_test_putmem_block(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_BLOCK, false>(a);
}
__global__ void __launch_bounds__(64, 1) rshmem_test_getmem_thread(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_THREAD, true>(a);
}
__global__ void __launch_bounds__(256, 1) rshmem_test_getmem_warp(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_WARP, true>(a);
}
// Blocks of 48 threads: a full warp and a partial warp of 16 lanes, each a unit.
__global__ void __launch_bounds__(48, 1) rshmem_test_putmem_warp_partial(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_WARP, false>(a);
}
__global__ void __launch_bounds__(48, 1) rshmem_test_getmem_warp_partial(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_WARP, true>(a);
}
__global__ void __launch_bounds__(256, 1) rshmem_test_getmem_block(rshmem_harness_args_t a) {
  mem_body<RSHMEMI_BLOCK, true>(a);
}
}  // extern "C"

// ---- typed put / p / g / get, every RMA type ---------------------------------------------
// grid 1 x block 1. For each of the 23 types (index t) in a 64-byte slot: 3 elements with
// rshmem_<T>_put and a 4th with rshmem_<T>_p to the right neighbour; quiet; signal ADD.
// After the left's signal: the 4 received elements, 4 rshmem_<T>_g and a 4-element
// rshmem_<T>_get of the left's source slot are compared bit-exactly. Element i of type t
// is T(pattern(seed + pe, 8t + i)) (floats from a 16-bit integer, so exact).
// checks/PE = 23 * 12 = 276.
namespace rshmem_device_tests_detail {

template <typename T>
__device__ __forceinline__ T typed_value(const rshmem_harness_args_t &a, int pe, int t, int i) {
  const uint64_t v = pat(a, pe, 8 * t + i);
  if (static_cast<T>(0.5) != 0) return static_cast<T>(v & 0xffff);  // float, double
  return static_cast<T>(v);
}

template <typename T>
__device__ __forceinline__ uint64_t bits_of(T v) {
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}

}  // namespace

#define RSHMEMI_TEST_TYPED_SEND(NAME, TYPE)                                              \
  {                                                                                      \
    TYPE *src = reinterpret_cast<TYPE *>(srcs + 64 * t);                                 \
    TYPE *dst = reinterpret_cast<TYPE *>(dsts + 64 * t);                                 \
    for (int i = 0; i < 4; ++i) src[i] = typed_value<TYPE>(a, me, t, i);                 \
    rshmem_##NAME##_put(dst, src, 3, right);                                             \
    rshmem_##NAME##_p(dst + 3, src[3], right);                                           \
    ++t;                                                                                 \
  }
#define RSHMEMI_TEST_TYPED_CHECK(NAME, TYPE)                                             \
  {                                                                                      \
    TYPE *src = reinterpret_cast<TYPE *>(srcs + 64 * t);                                 \
    TYPE *dst = reinterpret_cast<TYPE *>(dsts + 64 * t);                                 \
    TYPE *got = reinterpret_cast<TYPE *>(gots + 64 * t);                                 \
    rshmem_##NAME##_get(got, src, 4, left);                                              \
    _Pragma("unroll 1") for (int i = 0; i < 4; ++i) {                                   \
      const uint64_t want = bits_of<TYPE>(typed_value<TYPE>(a, left, t, i));             \
      c.eq(100 * t + i, want, bits_of<TYPE>(dst[i]));                                    \
      c.eq(100 * t + 10 + i, want, bits_of<TYPE>(rshmem_##NAME##_g(src + i, left)));     \
      c.eq(100 * t + 20 + i, want, bits_of<TYPE>(got[i]));                               \
    }                                                                                    \
    ++t;                                                                                 \
  }

// One out-of-line send and one check per type: the 26 types inlined into one kernel needed
// more than 255 registers (it spilled once p/g gained their alignment check).
namespace rshmem_device_tests_detail {
#define RSHMEMI_TEST_TYPED_FNS(NAME, TYPE)                                                     \
  __device__ __noinline__ void typed_send_##NAME(const rshmem_harness_args_t &a, int t, int me,    \
                                                 int right) {                                  \
    unsigned char *srcs = scratch(a) + 4096, *dsts = srcs + 4096;                              \
    RSHMEMI_TEST_TYPED_SEND(NAME, TYPE)                                                        \
  }                                                                                            \
  __device__ __noinline__ void typed_check_##NAME(const rshmem_harness_args_t &a, Checker &c,      \
                                                  int t, int left) {                           \
    unsigned char *srcs = scratch(a) + 4096, *dsts = srcs + 4096, *gots = dsts + 4096;         \
    RSHMEMI_TEST_TYPED_CHECK(NAME, TYPE)                                                       \
  }
RSHMEM_RMA_TYPES(RSHMEMI_TEST_TYPED_FNS)
#undef RSHMEMI_TEST_TYPED_FNS
}  // namespace rshmem_device_tests_detail

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_types(rshmem_harness_args_t a) {
  using namespace rshmem_device_tests_detail;
  Checker c(a);
  uint64_t *ctr = reinterpret_cast<uint64_t *>(scratch(a));
  const int me = rshmem_my_pe(), right = right_pe(), left = left_pe();
  if (threadIdx.x != 0) return;
  int t = 0;
#define RSHMEMI_TEST_TYPED_CALL_SEND(NAME, TYPE) typed_send_##NAME(a, t++, me, right);
  RSHMEM_RMA_TYPES(RSHMEMI_TEST_TYPED_CALL_SEND)
#undef RSHMEMI_TEST_TYPED_CALL_SEND
  rshmem_quiet();
  rshmem_signal_op(ctr, 1, RSHMEM_SIGNAL_ADD, right);
  rshmem_signal_wait_until(ctr, RSHMEM_CMP_EQ, 1);
  t = 0;
#define RSHMEMI_TEST_TYPED_CALL_CHECK(NAME, TYPE) typed_check_##NAME(a, c, t++, left);
  RSHMEM_RMA_TYPES(RSHMEMI_TEST_TYPED_CALL_CHECK)
#undef RSHMEMI_TEST_TYPED_CALL_CHECK
  c.flush();
}

// ---- the 16-bit float RMA types (half, bfloat16) -----------------------------------------
// As rshmem_test_types for rshmem_half_* and rshmem_bfloat16_*, the values made from bits
// (element i of type t holds the low 16 bits of pattern(seed + pe, 8t + i): NaNs and
// infinities included, all moved bit-exactly). checks/PE = 2 * 12 = 24. A build whose
// compiler had no cuda_fp16.h / cuda_bf16.h makes one failing check instead.
#if defined(__CUDA_FP16_TYPES_EXIST__) && defined(__CUDA_BF16_TYPES_EXIST__)
namespace rshmem_device_tests_detail {

template <typename T>
__device__ __forceinline__ T f16_value(const rshmem_harness_args_t &a, int pe, int t, int i) {
  const uint16_t b = static_cast<uint16_t>(pat(a, pe, 8 * t + i));
  T v;
  memcpy(&v, &b, 2);
  return v;
}
template <>
__device__ __forceinline__ __half typed_value<__half>(const rshmem_harness_args_t &a, int pe, int t, int i) {
  return f16_value<__half>(a, pe, t, i);
}
template <>
__device__ __forceinline__ __nv_bfloat16 typed_value<__nv_bfloat16>(const rshmem_harness_args_t &a, int pe,
                                                                    int t, int i) {
  return f16_value<__nv_bfloat16>(a, pe, t, i);
}

}  // namespace
#endif

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_types_f16(rshmem_harness_args_t a) {
  Checker c(a);
  if (threadIdx.x != 0) return;
#if defined(__CUDA_FP16_TYPES_EXIST__) && defined(__CUDA_BF16_TYPES_EXIST__)
  unsigned char *s = scratch(a);
  uint64_t *ctr = reinterpret_cast<uint64_t *>(s);
  unsigned char *srcs = s + 4096, *dsts = srcs + 4096, *gots = dsts + 4096;
  const int me = rshmem_my_pe(), right = right_pe(), left = left_pe();
  int t = 0;
  RSHMEMI_TEST_TYPED_SEND(half, __half)
  RSHMEMI_TEST_TYPED_SEND(bfloat16, __nv_bfloat16)
  rshmem_quiet();
  rshmem_signal_op(ctr, 1, RSHMEM_SIGNAL_ADD, right);
  rshmem_signal_wait_until(ctr, RSHMEM_CMP_EQ, 1);
  t = 0;
  RSHMEMI_TEST_TYPED_CHECK(half, __half)
  RSHMEMI_TEST_TYPED_CHECK(bfloat16, __nv_bfloat16)
#else
  c.eq(0, 1, 0);  // built without cuda_fp16.h / cuda_bf16.h: no half / bfloat16 names
#endif
  c.flush();
}
#undef RSHMEMI_TEST_TYPED_SEND
#undef RSHMEMI_TEST_TYPED_CHECK

// ---- put_signal at every scope, SET and ADD ----------------------------------------------
// Units as in the putmem cases; U = number of units (thread: 2 x 64 = 128; warp:
// 2 x 128 / 32 = 8; block: 8). param0 = W words per chunk. Unit u sends two chunks of W
// words to the right neighbour: chunk A with rshmem_uint64_put_signal* and ADD 1 on the
// shared counter, chunk B with rshmem_putmem_signal* and SET of its own word to
// (pattern(seed + me, 1<<40 | u) | 1). Odd units use the _nbi forms. The receiving unit u
// waits for its SET word (signal_wait_until EQ the left's value, checked), checks chunk
// B, waits for the counter to reach U, checks chunk A, and checks signal_fetch == U.
// checks/PE = U * (2W + 2).
namespace rshmem_device_tests_detail {

template <int S>
__device__ __forceinline__ void put_signal_body(const rshmem_harness_args_t &a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *counter = reinterpret_cast<uint64_t *>(s);
  uint64_t *setw = reinterpret_cast<uint64_t *>(s + 64);  // [U], U <= 480
  const uint64_t w = a.param0;
  const uint32_t u = unit_index<S>(), nu = unit_count<S>();
  const uint32_t rank = rshmemi_scope_rank<S>(), size = rshmemi_scope_size<S>();
  uint64_t *src = reinterpret_cast<uint64_t *>(s + 4096);
  uint64_t *dst = src + 2 * w * nu;
  const int me = rshmem_my_pe(), right = right_pe(), left = left_pe();
  uint64_t *sa = src + 2 * w * u, *sb = sa + w, *da = dst + 2 * w * u, *db = da + w;
  for (uint64_t i = rank; i < 2 * w; i += size) sa[i] = pat(a, me, 2 * w * u + i);
  rshmemi_scope_sync<S>();
  const uint64_t mine = pat(a, me, (1ull << 40) | u) | 1;
  const bool nbi = u & 1;
  if (S == RSHMEMI_THREAD) {
    if (nbi) {
      rshmem_uint64_put_signal_nbi(da, sa, w, counter, 1, RSHMEM_SIGNAL_ADD, right);
      rshmem_putmem_signal_nbi(db, sb, w * 8, setw + u, mine, RSHMEM_SIGNAL_SET, right);
    } else {
      rshmem_uint64_put_signal(da, sa, w, counter, 1, RSHMEM_SIGNAL_ADD, right);
      rshmem_putmem_signal(db, sb, w * 8, setw + u, mine, RSHMEM_SIGNAL_SET, right);
    }
  } else if (S == RSHMEMI_WARP) {
    if (nbi) {
      rshmem_uint64_put_signal_nbi_warp(da, sa, w, counter, 1, RSHMEM_SIGNAL_ADD, right);
      rshmem_putmem_signal_nbi_warp(db, sb, w * 8, setw + u, mine, RSHMEM_SIGNAL_SET, right);
    } else {
      rshmem_uint64_put_signal_warp(da, sa, w, counter, 1, RSHMEM_SIGNAL_ADD, right);
      rshmem_putmem_signal_warp(db, sb, w * 8, setw + u, mine, RSHMEM_SIGNAL_SET, right);
    }
  } else {
    if (nbi) {
      rshmem_uint64_put_signal_nbi_block(da, sa, w, counter, 1, RSHMEM_SIGNAL_ADD, right);
      rshmem_putmem_signal_nbi_block(db, sb, w * 8, setw + u, mine, RSHMEM_SIGNAL_SET, right);
    } else {
      rshmem_uint64_put_signal_block(da, sa, w, counter, 1, RSHMEM_SIGNAL_ADD, right);
      rshmem_putmem_signal_block(db, sb, w * 8, setw + u, mine, RSHMEM_SIGNAL_SET, right);
    }
  }
  const uint64_t theirs = pat(a, left, (1ull << 40) | u) | 1;
  if (rank == 0) c.eq(u, theirs, rshmem_signal_wait_until(setw + u, RSHMEM_CMP_EQ, theirs));
  rshmemi_scope_sync<S>();
  for (uint64_t i = rank; i < w; i += size) c.eq(2 * w * u + w + i, pat(a, left, 2 * w * u + w + i), db[i]);
  if (rank == 0) rshmem_signal_wait_until(counter, RSHMEM_CMP_EQ, nu);
  rshmemi_scope_sync<S>();
  for (uint64_t i = rank; i < w; i += size) c.eq(2 * w * u + i, pat(a, left, 2 * w * u + i), da[i]);
  if (rank == 0) c.eq(0xfffff000ull + u, nu, rshmem_signal_fetch(counter));
  c.flush();
}

}  // namespace

extern "C" {
__global__ void __launch_bounds__(64, 1) rshmem_test_put_signal_thread(rshmem_harness_args_t a) {
  put_signal_body<RSHMEMI_THREAD>(a);
}
__global__ void __launch_bounds__(128, 1) rshmem_test_put_signal_warp(rshmem_harness_args_t a) {
  put_signal_body<RSHMEMI_WARP>(a);
}
__global__ void __launch_bounds__(256, 1) rshmem_test_put_signal_block(rshmem_harness_args_t a) {
  put_signal_body<RSHMEMI_BLOCK>(a);
}
}  // extern "C"

// ---- wait_until / test with every comparison and type ------------------------------------
// grid 1 x block 32; threads 0..23 each own one (type, cmp) pair: type = k / 6 of
// {int32, uint32, int64, uint64}, cmp = k % 6 (EQ NE GT GE LT LE). Thread k initialises its
// own word (rshmem_<T>_p to itself: 0, or 1000 for LT/LE), announces "ready" to its left
// neighbour (signal SET), waits for its right neighbour's "ready", then p's v = 5 + k into
// the right's word. It then waits on its own word with (cmp, target) chosen so the
// initial value does not satisfy it and v does (EQ v, NE 0, GT v-1, GE v, LT v+1, LE v),
// and checks: the returned value == v, test(cmp, target) == 1, test(EQ, v + 1) == 0.
// checks/PE = 24 * 3 = 72.
namespace rshmem_device_tests_detail {

template <typename T>
__device__ __forceinline__ void wait_case(const rshmem_harness_args_t &a, Checker &c, int k, int cmp) {
  unsigned char *s = scratch(a);
  T *word = reinterpret_cast<T *>(s + 4096 + 8 * k);
  uint64_t *ready = reinterpret_cast<uint64_t *>(s + 8192 + 8 * k);
  const T v = static_cast<T>(5 + k);
  const T init = (cmp == RSHMEM_CMP_LT || cmp == RSHMEM_CMP_LE) ? static_cast<T>(1000) : static_cast<T>(0);
  T target = v;
  if (cmp == RSHMEM_CMP_NE) target = 0;
  if (cmp == RSHMEM_CMP_GT) target = static_cast<T>(v - 1);
  if (cmp == RSHMEM_CMP_LT) target = static_cast<T>(v + 1);
  rshmem_p<T>(word, init, rshmem_my_pe());
  rshmem_signal_op(ready, 1, RSHMEM_SIGNAL_SET, left_pe());
  rshmem_signal_wait_until(ready, RSHMEM_CMP_EQ, 1);
  rshmem_p<T>(word, v, right_pe());
  const T got = rshmem_wait_until<T>(word, cmp, target);
  c.eq(100 * k, static_cast<uint64_t>(v), static_cast<uint64_t>(got));
  c.eq(100 * k + 1, 1, static_cast<uint64_t>(rshmem_test<T>(word, cmp, target)));
  c.eq(100 * k + 2, 0, static_cast<uint64_t>(rshmem_test<T>(word, RSHMEM_CMP_EQ, static_cast<T>(v + 1))));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_wait_until(rshmem_harness_args_t a) {
  Checker c(a);
  const int k = threadIdx.x;
  if (k < 24) {
    const int cmp = k % 6;
    switch (k / 6) {
      case 0: wait_case<int32_t>(a, c, k, cmp); break;
      case 1: wait_case<uint32_t>(a, c, k, cmp); break;
      case 2: wait_case<int64_t>(a, c, k, cmp); break;
      default: wait_case<uint64_t>(a, c, k, cmp); break;
    }
  }
  c.flush();
}

// The typed wrappers of the wait family, one per AMO type, on one word each: thread 0
// sets the right's word with rshmem_<T>_atomic_set and waits on its own with
// rshmem_<T>_wait_until(EQ) then rshmem_<T>_test(EQ). grid 1 x block 32.
// checks/PE = 12 * 2 = 24.
#define RSHMEMI_TEST_TYPED_WAIT(NAME, TYPE)                                           \
  {                                                                                   \
    TYPE *word = reinterpret_cast<TYPE *>(s + 4096 + 8 * t);                          \
    const TYPE v = static_cast<TYPE>(pat(a, right, t) | 1);                           \
    rshmem_##NAME##_atomic_set(word, v, right);                                       \
    const TYPE want = static_cast<TYPE>(pat(a, me, t) | 1);                           \
    c.eq(10 * t, static_cast<uint64_t>(want),                                         \
         static_cast<uint64_t>(rshmem_##NAME##_wait_until(word, RSHMEM_CMP_EQ, want))); \
    c.eq(10 * t + 1, 1, static_cast<uint64_t>(rshmem_##NAME##_test(word, RSHMEM_CMP_EQ, want))); \
    ++t;                                                                              \
  }

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_wait_typed(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  const int me = rshmem_my_pe(), right = right_pe();
  if (threadIdx.x == 0) {
    int t = 0;
    RSHMEM_AMO_TYPES(RSHMEMI_TEST_TYPED_WAIT)
  }
  c.flush();
}

// ---- wait_until / test on arrays (all, any, some, and their _vector forms) -------------
// grid 1 x block 32, thread 0. Each PE writes 8 uint64 words of its right neighbour's
// array (scratch + 4096, zero at launch) in three stages and checks its own array as the
// left neighbour fills it; status {0,1,0,0,1,0,0,0} excludes elements 1 and 4. Between
// stages the reader acknowledges to its writer (signal ADD on the writer's ack word), so
// every check sees exactly the stage it names.
//   before:  all zero: test_{all,any,some} on the set and on empty sets (nelems 0, every
//            element excluded: test_all 1, _any SIZE_MAX, _some 0, wait_until_all returns)
//   stage 1: [5] = 7                 -> wait_until_any, _all on {5}, _some, test_any
//   stage 2: [1] = [2] = 9           -> _any skips the excluded [1], then sees it unmasked;
//                                       _some / test_some with and without status
//   stage 3: [i] = 10 + i, i in {0,3,4,6,7} -> the _vector forms with per-element operands
// checks/PE = 9 + 4 + 10 + 12 = 35.
extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_wait_set(rshmem_harness_args_t a) {
  if (threadIdx.x != 0) return;
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *ack = reinterpret_cast<uint64_t *>(s);
  uint64_t *ready = reinterpret_cast<uint64_t *>(s + 64);
  uint64_t *iv = reinterpret_cast<uint64_t *>(s + 4096);
  const int right = right_pe(), left = left_pe();
  const uint64_t none = ~static_cast<size_t>(0);
  const int st[8] = {0, 1, 0, 0, 1, 0, 0, 0};
  const int all_out[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  size_t idx[8];
  size_t n;

  c.eq(0, 1, rshmem_uint64_test_all(iv, 8, st, RSHMEM_CMP_EQ, 0));
  c.eq(1, 0, rshmem_uint64_test_all(iv, 8, nullptr, RSHMEM_CMP_NE, 0));
  c.eq(2, none, rshmem_uint64_test_any(iv, 8, st, RSHMEM_CMP_NE, 0));
  c.eq(3, 0, rshmem_uint64_test_some(iv, 8, idx, st, RSHMEM_CMP_NE, 0));
  c.eq(4, 1, rshmem_uint64_test_all(iv, 0, nullptr, RSHMEM_CMP_NE, 0));
  c.eq(5, 1, rshmem_uint64_test_all(iv, 8, all_out, RSHMEM_CMP_NE, 0));
  c.eq(6, none, rshmem_uint64_test_any(iv, 8, all_out, RSHMEM_CMP_EQ, 0));
  rshmem_uint64_wait_until_all(iv, 8, all_out, RSHMEM_CMP_NE, 0);
  c.eq(7, none, rshmem_uint64_wait_until_any(iv, 8, all_out, RSHMEM_CMP_NE, 0));
  c.eq(8, 0, rshmem_uint64_wait_until_some(iv, 0, idx, nullptr, RSHMEM_CMP_NE, 0));
  rshmem_signal_op(ready, 1, RSHMEM_SIGNAL_SET, left);
  rshmem_signal_wait_until(ready, RSHMEM_CMP_EQ, 1);

  // Stage 1.
  rshmem_uint64_p(iv + 5, 7, right);
  c.eq(10, 5, rshmem_uint64_wait_until_any(iv, 8, st, RSHMEM_CMP_NE, 0));
  const int only5[8] = {1, 1, 1, 1, 1, 0, 1, 1};
  rshmem_uint64_wait_until_all(iv, 8, only5, RSHMEM_CMP_EQ, 7);
  n = rshmem_uint64_wait_until_some(iv, 8, idx, st, RSHMEM_CMP_NE, 0);
  c.eq(11, 1, n);
  c.eq(12, 5, idx[0]);
  c.eq(13, 5, rshmem_uint64_test_any(iv, 8, nullptr, RSHMEM_CMP_EQ, 7));
  rshmem_signal_op(ack, 1, RSHMEM_SIGNAL_ADD, left);
  rshmem_signal_wait_until(ack, RSHMEM_CMP_EQ, 1);

  // Stage 2 (the two puts may land in either order: wait for both before the unmasked checks).
  rshmem_uint64_p(iv + 1, 9, right);
  rshmem_uint64_p(iv + 2, 9, right);
  c.eq(20, 2, rshmem_uint64_wait_until_any(iv, 8, st, RSHMEM_CMP_EQ, 9));
  const int only12[8] = {1, 0, 0, 1, 1, 1, 1, 1};
  rshmem_uint64_wait_until_all(iv, 8, only12, RSHMEM_CMP_EQ, 9);
  c.eq(21, 1, rshmem_uint64_wait_until_any(iv, 8, nullptr, RSHMEM_CMP_EQ, 9));
  n = rshmem_uint64_wait_until_some(iv, 8, idx, st, RSHMEM_CMP_NE, 0);
  c.eq(22, 2, n);
  c.eq(23, 2, idx[0]);
  c.eq(24, 5, idx[1]);
  n = rshmem_uint64_test_some(iv, 8, idx, nullptr, RSHMEM_CMP_NE, 0);
  c.eq(25, 3, n);
  c.eq(26, 1, idx[0]);
  c.eq(27, 2, idx[1]);
  c.eq(28, 5, idx[2]);
  c.eq(29, 0, rshmem_uint64_test_all(iv, 8, st, RSHMEM_CMP_NE, 0));
  rshmem_signal_op(ack, 1, RSHMEM_SIGNAL_ADD, left);
  rshmem_signal_wait_until(ack, RSHMEM_CMP_EQ, 2);

  // Stage 3: iv = {10, 9, 9, 13, 14, 7, 16, 17}.
  const uint64_t fill[5] = {0, 3, 4, 6, 7};
  for (int k = 0; k < 5; ++k) rshmem_uint64_p(iv + fill[k], 10 + fill[k], right);
  rshmem_uint64_wait_until_all(iv, 8, nullptr, RSHMEM_CMP_NE, 0);
  const uint64_t exact[8] = {10, 9, 9, 13, 14, 7, 16, 17};
  const uint64_t gt[8] = {10, 9, 9, 13, 14, 7, 15, 17};  // only [6] is greater
  const uint64_t le[8] = {9, 8, 8, 13, 14, 6, 15, 16};   // only [3] and [4] are <=
  rshmem_uint64_wait_until_all_vector(iv, 8, nullptr, RSHMEM_CMP_EQ, exact);
  c.eq(30, 1, rshmem_uint64_test_all_vector(iv, 8, nullptr, RSHMEM_CMP_EQ, exact));
  c.eq(31, 1, rshmem_uint64_test_all(iv, 8, st, RSHMEM_CMP_GE, 7));
  c.eq(32, 0, rshmem_uint64_test_all(iv, 8, nullptr, RSHMEM_CMP_GT, 7));
  c.eq(33, 6, rshmem_uint64_test_any_vector(iv, 8, nullptr, RSHMEM_CMP_GT, gt));
  c.eq(34, 6, rshmem_uint64_wait_until_any_vector(iv, 8, nullptr, RSHMEM_CMP_GT, gt));
  n = rshmem_uint64_test_some_vector(iv, 8, idx, st, RSHMEM_CMP_LE, le);
  c.eq(35, 1, n);
  c.eq(36, 3, idx[0]);
  n = rshmem_uint64_wait_until_some_vector(iv, 8, idx, nullptr, RSHMEM_CMP_LE, le);
  c.eq(37, 2, n);
  c.eq(38, 3, idx[0]);
  c.eq(39, 4, idx[1]);
  c.eq(40, none, rshmem_uint64_test_any_vector(iv, 8, st, RSHMEM_CMP_LT, exact));
  c.eq(41, 1, rshmem_uint64_test_all_vector(iv, 8, all_out, RSHMEM_CMP_LT, exact));
  c.flush();
}

// The typed wrappers of the array wait/test family, one per AMO type, on 4 words of this
// PE's own heap (no peer involved): thread 0 stores {1, 2, 3, 4} (plain stores: the same
// thread reads them back) and status {0, 0, 1, 0} excludes [2]. Every wait is already
// satisfied, so this checks results, not waiting. grid 1 x block 32.
// checks/PE = 12 * 12 = 144.
#define RSHMEMI_TEST_TYPED_WAIT_SET(NAME, TYPE)                                            \
  {                                                                                        \
    TYPE *iv = reinterpret_cast<TYPE *>(s + 4096 + 64 * t);                                \
    for (int j = 0; j < 4; ++j) iv[j] = static_cast<TYPE>(j + 1);                          \
    const TYPE v[4] = {1, 2, 3, 4};                                                        \
    const TYPE w[4] = {5, 5, 5, 4};                                                        \
    const uint64_t b = 20 * t;                                                             \
    c.eq(b, 1, rshmem_##NAME##_test_all(iv, 4, nullptr, RSHMEM_CMP_GE, 1));                \
    c.eq(b + 1, 3, rshmem_##NAME##_test_any(iv, 4, st, RSHMEM_CMP_GT, 2));                 \
    n = rshmem_##NAME##_test_some(iv, 4, idx, st, RSHMEM_CMP_LE, 2);                        \
    c.eq(b + 2, 2, n);                                                                     \
    c.eq(b + 3, 1, idx[1]);                                                                \
    rshmem_##NAME##_wait_until_all(iv, 4, st, RSHMEM_CMP_NE, 0);                           \
    c.eq(b + 4, 0, rshmem_##NAME##_wait_until_any(iv, 4, nullptr, RSHMEM_CMP_EQ, 1));      \
    n = rshmem_##NAME##_wait_until_some(iv, 4, idx, nullptr, RSHMEM_CMP_GE, 3);            \
    c.eq(b + 5, 2, n);                                                                     \
    c.eq(b + 6, 3, idx[1]);                                                                \
    rshmem_##NAME##_wait_until_all_vector(iv, 4, nullptr, RSHMEM_CMP_EQ, v);               \
    c.eq(b + 7, 1, rshmem_##NAME##_test_all_vector(iv, 4, nullptr, RSHMEM_CMP_EQ, v));     \
    c.eq(b + 8, 3, rshmem_##NAME##_wait_until_any_vector(iv, 4, st, RSHMEM_CMP_GE, w));    \
    c.eq(b + 9, 3, rshmem_##NAME##_wait_until_some_vector(iv, 4, idx, nullptr, RSHMEM_CMP_NE, w)); \
    c.eq(b + 10, none, rshmem_##NAME##_test_any_vector(iv, 4, nullptr, RSHMEM_CMP_GT, v));  \
    c.eq(b + 11, 3, rshmem_##NAME##_test_some_vector(iv, 4, idx, st, RSHMEM_CMP_EQ, v));    \
    ++t;                                                                                   \
  }

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_wait_set_typed(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  const uint64_t none = ~static_cast<size_t>(0);
  const int st[4] = {0, 0, 1, 0};
  size_t idx[4];
  size_t n;
  if (threadIdx.x == 0) {
    int t = 0;
    RSHMEM_AMO_TYPES(RSHMEMI_TEST_TYPED_WAIT_SET)
  }
  c.flush();
}
#undef RSHMEMI_TEST_TYPED_WAIT_SET
#undef RSHMEMI_TEST_TYPED_WAIT

// ---- atomics -----------------------------------------------------------------------------
// grid 2 x block 128 (256 threads). Part A, concurrency: every thread of every PE does 4
// rshmem_uint64_atomic_fetch_add(ctr64, 1) and 4 rshmem_int_atomic_add(ctr32, 1) on every
// PE (itself included); each thread checks that all its fetched values were < the total
// (1 check per thread); after quiet, each block's thread 0 announces itself to every PE
// (signal ADD), waits for n_pes * gridDim.x announcements and checks ctr64 == ctr32 ==
// n_pes * 256 * 4 (2 checks per block). Part B, every operation with exact values: thread 0
// of block 0 runs set, fetch, swap, compare_swap (failing, then succeeding), fetch_add/add,
// fetch_inc/inc, fetch_and/and, fetch_or/or, fetch_xor/xor on a word of its right
// neighbour, per type int32/uint32/int64/uint64, checking every returned value and the
// word after each pair (17 checks per type). checks/PE = 256 + 2 * 2 + 4 * 17 = 328.
namespace rshmem_device_tests_detail {

template <typename T>
__device__ __forceinline__ void amo_sequence(const rshmem_harness_args_t &a, Checker &c, T *w, int t) {
  typedef rshmemi_word_t<T> U;
  const int pe = right_pe();
  const uint64_t base = 1000 * static_cast<uint64_t>(t);
  const T va = static_cast<T>(pat(a, rshmem_my_pe(), base + 0));
  const T vb = static_cast<T>(pat(a, rshmem_my_pe(), base + 1));
  const T vc = static_cast<T>(pat(a, rshmem_my_pe(), base + 2));
  const T vd = static_cast<T>(pat(a, rshmem_my_pe(), base + 3));
  const T m1 = static_cast<T>(pat(a, rshmem_my_pe(), base + 4));
  const T m2 = static_cast<T>(pat(a, rshmem_my_pe(), base + 5));
#define EQ(i, want, got) c.eq(base + (i), static_cast<uint64_t>(static_cast<U>(want)), static_cast<uint64_t>(static_cast<U>(got)))
  rshmem_atomic_set<T>(w, va, pe);
  EQ(1, va, rshmem_atomic_fetch<T>(w, pe));
  EQ(2, va, rshmem_atomic_swap<T>(w, vb, pe));
  EQ(3, vb, rshmem_atomic_fetch<T>(w, pe));
  const T not_b = static_cast<T>(~static_cast<U>(vb));
  EQ(4, vb, rshmem_atomic_compare_swap<T>(w, not_b, vc, pe));  // fails
  EQ(5, vb, rshmem_atomic_fetch<T>(w, pe));
  EQ(6, vb, rshmem_atomic_compare_swap<T>(w, vb, vc, pe));  // succeeds
  EQ(7, vc, rshmem_atomic_fetch<T>(w, pe));
  U x = static_cast<U>(vc);
  EQ(8, x, rshmem_atomic_fetch_add<T>(w, vd, pe));
  rshmem_atomic_add<T>(w, vd, pe);
  x = static_cast<U>(x + 2 * static_cast<U>(vd));
  EQ(9, x, rshmem_atomic_fetch<T>(w, pe));
  EQ(10, x, rshmem_atomic_fetch_inc<T>(w, pe));
  rshmem_atomic_inc<T>(w, pe);
  x = static_cast<U>(x + 2);
  EQ(11, x, rshmem_atomic_fetch<T>(w, pe));
  EQ(12, x, rshmem_atomic_fetch_and<T>(w, m1, pe));
  rshmem_atomic_and<T>(w, m2, pe);
  x = static_cast<U>(x & static_cast<U>(m1) & static_cast<U>(m2));
  EQ(13, x, rshmem_atomic_fetch<T>(w, pe));
  EQ(14, x, rshmem_atomic_fetch_or<T>(w, m1, pe));
  rshmem_atomic_or<T>(w, vd, pe);
  x = static_cast<U>(x | static_cast<U>(m1) | static_cast<U>(vd));
  EQ(15, x, rshmem_atomic_fetch<T>(w, pe));
  EQ(16, x, rshmem_atomic_fetch_xor<T>(w, m2, pe));
  rshmem_atomic_xor<T>(w, va, pe);
  x = static_cast<U>(x ^ static_cast<U>(m2) ^ static_cast<U>(va));
  EQ(17, x, rshmem_atomic_fetch<T>(w, pe));
#undef EQ
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128, 1) rshmem_test_atomics(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *ctr64 = reinterpret_cast<uint64_t *>(s);
  int *ctr32 = reinterpret_cast<int *>(s + 64);
  uint64_t *done = reinterpret_cast<uint64_t *>(s + 128);
  const int n = rshmem_n_pes();
  const uint64_t total = static_cast<uint64_t>(n) * gridDim.x * blockDim.x * 4;
  bool ok = true;
  for (int k = 0; k < 4; ++k) {
    for (int p = 0; p < n; ++p) {
      const uint64_t old = rshmem_uint64_atomic_fetch_add(ctr64, 1, p);
      ok = ok && old < total;
      rshmem_int_atomic_add(ctr32, 1, p);
    }
  }
  c.eq(gthread(), 1, ok ? 1 : 0);
  rshmem_quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int p = 0; p < n; ++p) rshmem_signal_op(done, 1, RSHMEM_SIGNAL_ADD, p);
    rshmem_signal_wait_until(done, RSHMEM_CMP_EQ, static_cast<uint64_t>(n) * gridDim.x);
    c.eq(0xff000000ull + blockIdx.x, total, rshmem_uint64_atomic_fetch(ctr64, rshmem_my_pe()));
    c.eq(0xff100000ull + blockIdx.x, total, static_cast<uint64_t>(rshmem_int_atomic_fetch(ctr32, rshmem_my_pe())));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    amo_sequence<int32_t>(a, c, reinterpret_cast<int32_t *>(s + 1024), 1);
    amo_sequence<uint32_t>(a, c, reinterpret_cast<uint32_t *>(s + 1088), 2);
    amo_sequence<int64_t>(a, c, reinterpret_cast<int64_t *>(s + 1152), 3);
    amo_sequence<uint64_t>(a, c, reinterpret_cast<uint64_t *>(s + 1216), 4);
  }
  c.flush();
}

// The typed AMO wrappers (one call of each per type): thread 0 runs, per AMO type, on a
// word of its right neighbour: set(3), fetch_add(4) == 3, add(5), fetch_inc == 12, inc,
// fetch == 14, swap(6) == 14, compare_swap(6 -> 7) == 6, fetch_and(3) == 7, and(1),
// fetch_or(8) == 1, or(16), fetch_xor(1) == 25, xor(2), fetch == 26.
// grid 1 x block 32. checks/PE = 12 * 9 = 108.
#define RSHMEMI_TEST_TYPED_AMO(NAME, TYPE)                                                       \
  {                                                                                              \
    TYPE *w = reinterpret_cast<TYPE *>(s + 4096 + 64 * t);                                       \
    rshmem_##NAME##_atomic_set(w, 3, right);                                                     \
    c.eq(100 * t + 0, 3, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch_add(w, 4, right)));  \
    rshmem_##NAME##_atomic_add(w, 5, right);                                                     \
    c.eq(100 * t + 1, 12, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch_inc(w, right)));    \
    rshmem_##NAME##_atomic_inc(w, right);                                                        \
    c.eq(100 * t + 2, 14, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch(w, right)));        \
    c.eq(100 * t + 3, 14, static_cast<uint64_t>(rshmem_##NAME##_atomic_swap(w, 6, right)));      \
    c.eq(100 * t + 4, 6, static_cast<uint64_t>(rshmem_##NAME##_atomic_compare_swap(w, 6, 7, right))); \
    c.eq(100 * t + 5, 7, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch_and(w, 3, right)));  \
    rshmem_##NAME##_atomic_and(w, 1, right);                                                     \
    c.eq(100 * t + 6, 1, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch_or(w, 8, right)));   \
    rshmem_##NAME##_atomic_or(w, 16, right);                                                     \
    c.eq(100 * t + 7, 25, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch_xor(w, 1, right))); \
    rshmem_##NAME##_atomic_xor(w, 2, right);                                                     \
    c.eq(100 * t + 8, 26, static_cast<uint64_t>(rshmem_##NAME##_atomic_fetch(w, right)));        \
    ++t;                                                                                         \
  }

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_atomics_typed(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  const int right = right_pe();
  if (threadIdx.x == 0) {
    int t = 0;
    RSHMEM_AMO_TYPES(RSHMEMI_TEST_TYPED_AMO)
  }
  c.flush();
}
#undef RSHMEMI_TEST_TYPED_AMO

// The extended AMO types: rshmem_float_ / rshmem_double_atomic_{set,fetch,swap} on the right
// neighbour's word (only this PE touches it), with ordinary values and a NaN with a
// payload, compared bit-exactly. grid 1 x block 32, thread 0. checks/PE = 2 * 5 = 10.
#define RSHMEMI_TEST_FLOAT_AMO(TYPE, A, B, NAN_BITS)                                        \
  {                                                                                         \
    TYPE *w = reinterpret_cast<TYPE *>(s + 4096 + 64 * t);                                  \
    rshmem_##TYPE##_atomic_set(w, A, right);                                                \
    c.eq(10 * t, bits_of<TYPE>(A), bits_of<TYPE>(rshmem_##TYPE##_atomic_fetch(w, right)));  \
    c.eq(10 * t + 1, bits_of<TYPE>(A), bits_of<TYPE>(rshmem_##TYPE##_atomic_swap(w, B, right))); \
    c.eq(10 * t + 2, bits_of<TYPE>(B), bits_of<TYPE>(rshmem_##TYPE##_atomic_fetch(w, right))); \
    TYPE nan;                                                                               \
    const rshmemi_word_t<TYPE> nb = NAN_BITS;                                               \
    memcpy(&nan, &nb, sizeof(TYPE));                                                        \
    c.eq(10 * t + 3, bits_of<TYPE>(B), bits_of<TYPE>(rshmem_atomic_swap<TYPE>(w, nan, right))); \
    c.eq(10 * t + 4, static_cast<uint64_t>(nb), bits_of<TYPE>(rshmem_atomic_fetch<TYPE>(w, right))); \
    ++t;                                                                                    \
  }

extern "C" __global__ void __launch_bounds__(32, 1) rshmem_test_atomics_float(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  const int right = right_pe();
  if (threadIdx.x == 0) {
    int t = 0;
    RSHMEMI_TEST_FLOAT_AMO(float, 1.5f, -2.25f, 0x7fc00123u)
    RSHMEMI_TEST_FLOAT_AMO(double, 1.5, -0.0, 0x7ff8000000000abcull)
  }
  c.flush();
}
#undef RSHMEMI_TEST_FLOAT_AMO

// ---- fence ordering ----------------------------------------------------------------------
// grid 1 x block 64, param0 = N rounds. Thread 0 (sender) for i = 1..N: puts chunk i (8
// pattern words) to the right neighbour, rshmem_fence(), rshmem_uint64_p(flag, i). Thread
// 32 (receiver, another warp, concurrently) for i = 1..N: waits flag >= i and checks chunk
// i from the left: whenever the flag says i, chunks 1..i must be visible.
// checks/PE = 8 * N.
extern "C" __global__ void __launch_bounds__(64, 1) rshmem_test_fence(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *flag = reinterpret_cast<uint64_t *>(s);
  uint64_t *src = reinterpret_cast<uint64_t *>(s + 4096);
  const uint64_t n = a.param0;
  uint64_t *dst = src + 8 * (n + 1);
  if (threadIdx.x == 0) {
    const int right = right_pe();
    for (uint64_t i = 1; i <= n; ++i) {
      for (int j = 0; j < 8; ++j) src[8 * i + j] = pat(a, rshmem_my_pe(), 8 * i + j);
      rshmem_uint64_put(dst + 8 * i, src + 8 * i, 8, right);
      rshmem_fence();
      rshmem_uint64_p(flag, i, right);
    }
  } else if (threadIdx.x == 32) {
    const int left = left_pe();
    for (uint64_t i = 1; i <= n; ++i) {
      rshmem_uint64_wait_until(flag, RSHMEM_CMP_GE, i);
      for (int j = 0; j < 8; ++j) c.eq(8 * i + j, pat(a, left, 8 * i + j), dst[8 * i + j]);
    }
  }
  c.flush();
}

// ---- barriers ----------------------------------------------------------------------------
// barrier_all (collective launch, runner-sized co-resident grid, block 256), param0 = R
// rounds. Round r: global threads g < 256 p their word pattern(seed + me, 256r + g) into
// the right's buffer r % 2; every block's thread 0 adds 1 to the right's counter r % 2;
// then rshmem_barrier_all(); thread g < 256 checks the word from the left, and thread 0 of
// block 0 checks counter r % 2 == (r / 2 + 1) * gridDim.x (every PE runs the same grid).
// Double buffering, of the words and of the counters: a PE cannot write buffer or
// counter r % 2 again (round r + 2) before the next barrier, which the reader reaches only
// after checking. (One counter is a race: blocks of the left PE that left barrier r
// first add round r + 1's increments while this PE still reads round r's count; the
// device emulation, host/tests/device_emu.rs, caught it.) checks/PE = R * 257.
extern "C" __global__ void __launch_bounds__(256, 1) rshmem_test_barrier_all(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *counters = reinterpret_cast<uint64_t *>(s);  // two, on separate lines
  uint64_t *buf = reinterpret_cast<uint64_t *>(s + 4096);
  const uint32_t g = gthread();
  const int right = right_pe(), left = left_pe();
  for (uint64_t r = 0; r < a.param0; ++r) {
    uint64_t *b = buf + 256 * (r % 2);
    uint64_t *counter = counters + 8 * (r % 2);
    if (g < 256) rshmem_uint64_p(b + g, pat(a, rshmem_my_pe(), 256 * r + g), right);
    if (threadIdx.x == 0) rshmem_uint64_atomic_add(counter, 1, right);
    rshmem_barrier_all();
    if (g < 256) c.eq(256 * r + g, pat(a, left, 256 * r + g), b[g]);
    if (g == 0)
      c.eq(0xfff00000ull + r, (r / 2 + 1) * gridDim.x, rshmem_uint64_atomic_fetch(counter, rshmem_my_pe()));
  }
  c.flush();
}

// sync_all (collective, block 256), param0 = R rounds. Round r: thread g < 256 stores
// pattern(seed + me, 256r + g) into its OWN buffer r % 2 (a local store), rshmem_sync_all(),
// then reads the left neighbour's word with rshmem_uint64_g and checks it (sync_all makes
// local stores visible to all PEs). checks/PE = R * 256.
extern "C" __global__ void __launch_bounds__(256, 1) rshmem_test_sync_all(rshmem_harness_args_t a) {
  Checker c(a);
  uint64_t *buf = reinterpret_cast<uint64_t *>(scratch(a) + 4096);
  const uint32_t g = gthread();
  const int left = left_pe();
  for (uint64_t r = 0; r < a.param0; ++r) {
    uint64_t *b = buf + 256 * (r % 2);
    if (g < 256) b[g] = pat(a, rshmem_my_pe(), 256 * r + g);
    rshmem_sync_all();
    if (g < 256) c.eq(256 * r + g, pat(a, left, 256 * r + g), rshmem_uint64_g(b + g, left));
  }
  c.flush();
}

// barrier_all_block (grid 1 x block 128, not collective), param0 = R rounds: as
// barrier_all with all 128 threads writing/checking and no counter. checks/PE = R * 128.
extern "C" __global__ void __launch_bounds__(128, 1) rshmem_test_barrier_all_block(rshmem_harness_args_t a) {
  Checker c(a);
  uint64_t *buf = reinterpret_cast<uint64_t *>(scratch(a) + 4096);
  const uint32_t g = threadIdx.x;
  const int right = right_pe(), left = left_pe();
  for (uint64_t r = 0; r < a.param0; ++r) {
    uint64_t *b = buf + 128 * (r % 2);
    rshmem_uint64_p(b + g, pat(a, rshmem_my_pe(), 128 * r + g), right);
    rshmem_barrier_all_block();
    c.eq(128 * r + g, pat(a, left, 128 * r + g), b[g]);
  }
  c.flush();
}

// sync_all_block (grid 1 x block 128), param0 = R rounds: as sync_all with 128 threads.
// checks/PE = R * 128.
extern "C" __global__ void __launch_bounds__(128, 1) rshmem_test_sync_all_block(rshmem_harness_args_t a) {
  Checker c(a);
  uint64_t *buf = reinterpret_cast<uint64_t *>(scratch(a) + 4096);
  const uint32_t g = threadIdx.x;
  const int left = left_pe();
  for (uint64_t r = 0; r < a.param0; ++r) {
    uint64_t *b = buf + 128 * (r % 2);
    b[g] = pat(a, rshmem_my_pe(), 128 * r + g);
    rshmem_sync_all_block();
    c.eq(128 * r + g, pat(a, left, 128 * r + g), rshmem_uint64_g(b + g, left));
  }
  c.flush();
}

// barrier_all_warp / sync_all_warp (grid 1 x block 64, not collective), param0 = R rounds:
// as the _block cases with one warp per PE, the block's second warp (lanes 32..63; the
// first warp returns at once), each lane one word. checks/PE = R * 32. The _partial
// kernels run in blocks of 48: the second warp is a partial warp of 16 lanes, which
// announces to and waits for every PE all the same. checks/PE = R * 16.
namespace rshmem_device_tests_detail {
template <bool Barrier>
__device__ __forceinline__ void all_warp_body(const rshmem_harness_args_t &a) {
  if (threadIdx.x < 32) return;
  Checker c(a);
  uint64_t *buf = reinterpret_cast<uint64_t *>(scratch(a) + 4096);
  const uint32_t g = threadIdx.x - 32, lanes = blockDim.x - 32;
  const int right = right_pe(), left = left_pe();
  for (uint64_t r = 0; r < a.param0; ++r) {
    uint64_t *b = buf + 32 * (r % 2);
    if (Barrier) {
      rshmem_uint64_p(b + g, pat(a, rshmem_my_pe(), lanes * r + g), right);
      rshmem_barrier_all_warp();
      c.eq(lanes * r + g, pat(a, left, lanes * r + g), b[g]);
    } else {
      b[g] = pat(a, rshmem_my_pe(), lanes * r + g);
      rshmem_sync_all_warp();
      c.eq(lanes * r + g, pat(a, left, lanes * r + g), rshmem_uint64_g(b + g, left));
    }
  }
  c.flush();
}
}  // namespace rshmem_device_tests_detail

extern "C" __global__ void __launch_bounds__(64, 1) rshmem_test_barrier_all_warp(rshmem_harness_args_t a) {
  rshmem_device_tests_detail::all_warp_body<true>(a);
}

extern "C" __global__ void __launch_bounds__(64, 1) rshmem_test_sync_all_warp(rshmem_harness_args_t a) {
  rshmem_device_tests_detail::all_warp_body<false>(a);
}

extern "C" __global__ void __launch_bounds__(48, 1) rshmem_test_barrier_all_warp_partial(rshmem_harness_args_t a) {
  rshmem_device_tests_detail::all_warp_body<true>(a);
}

extern "C" __global__ void __launch_bounds__(48, 1) rshmem_test_sync_all_warp_partial(rshmem_harness_args_t a) {
  rshmem_device_tests_detail::all_warp_body<false>(a);
}

// ---- collectives (block scope, world team) -----------------------------------------------
// grid 1 x block 64, every thread calls each collective; thread 0 fills the sources first
// and checks afterwards (a fixed set of elements, so the count does not depend on the PE
// count): fcollect of 5 words (the blocks of the left, right and own PE: 15), broadcast of
// 7 words from PE n - 1 (7), alltoall of 3 words (left, right, own: 9), a wrapping u64
// sum (4), an int64 max (4), a uint32 xor in place (dest == source: 4), a double sum whose
// result depends on the order (PE 0 adds 1e16, the others 1.0: in PE order each 1.0 is
// rounded away; 1), then a u64 sum in place over 150 elements (three chunks of the 64
// threads: 150) right after the others on a new buffer. Values are pattern words of each
// PE. checks/PE = 44 + 150 = 194.
// The collectives of rshmem_test_collectives_block on team T, as PE mt of its ts members
// (member k is world PE start + stride * k); check indices start at `base`. 194 checks.
__device__ void check_collectives(Checker &c, const rshmem_harness_args_t &a, rshmem_team_t T, int mt, int ts,
                                  int start, int stride, uint64_t base) {
  unsigned char *s = scratch(a);
  uint64_t *src = reinterpret_cast<uint64_t *>(s + 4096);       // 64 words
  uint64_t *fc = reinterpret_cast<uint64_t *>(s + 8192);        // 5 * ts words
  uint64_t *bc = reinterpret_cast<uint64_t *>(s + 65536);       // 7 words
  uint64_t *a2a_src = reinterpret_cast<uint64_t *>(s + 69632);  // 3 * ts words
  uint64_t *a2a = reinterpret_cast<uint64_t *>(s + 131072);     // 3 * ts words
  uint64_t *sum = reinterpret_cast<uint64_t *>(s + 196608);     // 4 words
  int64_t *mx = reinterpret_cast<int64_t *>(s + 196672);        // 4 words
  uint32_t *xr = reinterpret_cast<uint32_t *>(s + 196736);      // 4 words, in place
  double *ds = reinterpret_cast<double *>(s + 196800);          // 2 doubles: source, dest
  uint64_t *big = reinterpret_cast<uint64_t *>(s + 262144);     // 150 words, in place
  auto world = [start, stride](int k) { return start + stride * k; };
  const int me = world(mt), lt = (mt + ts - 1) % ts, rt = (mt + 1) % ts;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 64; ++i) src[i] = pat(a, me, i);
    for (int i = 0; i < 3 * ts; ++i) a2a_src[i] = pat(a, me, 100 + i);
    for (int i = 0; i < 4; ++i) xr[i] = static_cast<uint32_t>(pat(a, me, 200 + i));
    ds[0] = mt == 0 ? 1e16 : 1.0;
    for (int i = 0; i < 150; ++i) big[i] = pat(a, me, 300 + i);
  }
  rshmem_uint64_fcollect_block(T, fc, src, 5);
  rshmem_uint64_broadcast_block(T, bc, src + 8, 7, ts - 1);
  rshmem_uint64_alltoall_block(T, a2a, a2a_src, 3);
  rshmem_uint64_sum_reduce_block(T, sum, src + 16, 4);
  rshmem_int64_max_reduce_block(T, mx, reinterpret_cast<const int64_t *>(src + 24), 4);
  rshmem_uint32_xor_reduce_block(T, xr, xr, 4);
  rshmem_double_sum_reduce_block(T, ds + 1, ds, 1);
  rshmem_uint64_sum_reduce_block(T, big, big, 150);
  if (threadIdx.x == 0) {
    const int who[3] = {lt, rt, mt};
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 5; ++i) c.eq(base + 10 * k + i, pat(a, world(who[k]), i), fc[5 * who[k] + i]);
    for (int i = 0; i < 7; ++i) c.eq(base + 100 + i, pat(a, world(ts - 1), 8 + i), bc[i]);
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 3; ++i)
        c.eq(base + 200 + 10 * k + i, pat(a, world(who[k]), 100 + 3 * mt + i), a2a[3 * who[k] + i]);
    for (int i = 0; i < 4; ++i) {
      uint64_t sw = 0;
      int64_t mw = static_cast<int64_t>(pat(a, world(0), 24 + i));
      uint32_t xw = 0;
      for (int k = 0; k < ts; ++k) {
        sw += pat(a, world(k), 16 + i);
        const int64_t m = static_cast<int64_t>(pat(a, world(k), 24 + i));
        mw = m > mw ? m : mw;
        xw ^= static_cast<uint32_t>(pat(a, world(k), 200 + i));
      }
      c.eq(base + 300 + i, sw, sum[i]);
      c.eq(base + 310 + i, static_cast<uint64_t>(mw), static_cast<uint64_t>(mx[i]));
      c.eq(base + 320 + i, xw, xr[i]);
    }
    double want = 1e16;
    for (int k = 1; k < ts; ++k) want = want + 1.0;
    c.eq(base + 400, bits_of<double>(want), bits_of<double>(ds[1]));
    for (int i = 0; i < 150; ++i) {
      uint64_t w = 0;
      for (int k = 0; k < ts; ++k) w += pat(a, world(k), 300 + i);
      c.eq(base + 500 + i, w, big[i]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(64, 1) rshmem_test_collectives_block(rshmem_harness_args_t a) {
  Checker c(a);
  check_collectives(c, a, RSHMEM_TEAM_WORLD, rshmem_my_pe(), rshmem_n_pes(), 0, 1, 0);
  c.flush();
}

// ---- teams -------------------------------------------------------------------------------
// grid 1 x block 64, manifest "team": "parity": the runner makes the even and the odd PEs
// device teams and passes each PE its own (a.team). T = that team, par = my_pe % 2, mt =
// my number in T, ts = its size, members world(k) = par + 2k; lt/rt = the left/right
// member. Checks:
//  - queries (thread 0, 16): my_pe/n_pes of T, WORLD and SHARED; translate T -> WORLD,
//    WORLD -> T (a member, and the right world neighbour, -1 when of the other parity),
//    T -> SHARED; -1 for RSHMEM_TEAM_INVALID, an empty slot (63), slot 64, a PE number
//    past the team's end;
//  - team barrier_block, 3 rounds (192): every thread p's a pattern word to rt's buffer of
//    the round, barrier_block(T), checks lt's word;
//  - team sync_block (64): every thread stores its word locally, team_sync_block(T), reads
//    lt's word with rshmem_g;
//  - team barrier_warp (32): warp 0 p's to rt, barrier_warp(T), checks lt's word;
//  - thread scope (4): thread 0 alone: p to rt + barrier(T), twice; p to the right world
//    neighbour + barrier(WORLD); a local store + team_sync(T) read back from lt with g;
//  - collectives on T (194): as rshmem_test_collectives_block, numbered in T (fcollect 5
//    words, broadcast 7 from member ts - 1, alltoall 3, u64 sum, int64 max, u32 xor in
//    place, an order-sensitive double sum, a 150-element u64 sum in place).
// checks/PE = 16 + 192 + 64 + 32 + 4 + 194 = 502.
extern "C" __global__ void __launch_bounds__(64, 1) rshmem_test_team_block(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  const rshmem_team_t T = static_cast<rshmem_team_t>(static_cast<int64_t>(a.team));
  const int me = rshmem_my_pe(), n = rshmem_n_pes(), par = me % 2;
  const int mt = rshmem_team_my_pe(T), ts = rshmem_team_n_pes(T);
  const int lt = (mt + ts - 1) % ts, rt = (mt + 1) % ts;
  auto world = [par](int k) { return par + 2 * k; };
  const uint32_t tid = threadIdx.x;
  // RSHMEM_TEAM_SHARED is this PE's node. The runner describes it (param0 = 1 + its size,
  // param1 = this PE's index in it, param2 = 1 + the index in it of world PE `par`, 0 when
  // that PE is on another node); param0 = 0: every PE is on one node.
  const bool one_node = a.param0 == 0;
  const uint64_t shared_n = one_node ? static_cast<uint64_t>(n) : a.param0 - 1;
  const uint64_t shared_me = one_node ? static_cast<uint64_t>(me) : a.param1;
  const uint64_t shared_par = one_node ? static_cast<uint64_t>(par) : a.param2 - 1;
  if (tid == 0) {
    c.eq(0, static_cast<uint64_t>(me / 2), static_cast<uint64_t>(mt));
    c.eq(1, static_cast<uint64_t>((n - par + 1) / 2), static_cast<uint64_t>(ts));
    c.eq(2, static_cast<uint64_t>(me), static_cast<uint64_t>(rshmem_team_my_pe(RSHMEM_TEAM_WORLD)));
    c.eq(3, static_cast<uint64_t>(n), static_cast<uint64_t>(rshmem_team_n_pes(RSHMEM_TEAM_WORLD)));
    c.eq(4, shared_me, static_cast<uint64_t>(rshmem_team_my_pe(RSHMEM_TEAM_SHARED)));
    c.eq(5, shared_n, static_cast<uint64_t>(rshmem_team_n_pes(RSHMEM_TEAM_SHARED)));
    c.eq(6, static_cast<uint64_t>(me), static_cast<uint64_t>(rshmem_team_translate_pe(T, mt, RSHMEM_TEAM_WORLD)));
    c.eq(7, static_cast<uint64_t>(mt), static_cast<uint64_t>(rshmem_team_translate_pe(RSHMEM_TEAM_WORLD, me, T)));
    const int nb = (me + 1) % n;
    const int want_nb = nb % 2 == par ? nb / 2 : -1;
    c.eq(8, static_cast<uint64_t>(want_nb), static_cast<uint64_t>(rshmem_team_translate_pe(RSHMEM_TEAM_WORLD, nb, T)));
    const uint64_t none = static_cast<uint64_t>(-1);
    c.eq(9, none, static_cast<uint64_t>(rshmem_team_my_pe(RSHMEM_TEAM_INVALID)));
    c.eq(10, none, static_cast<uint64_t>(rshmem_team_n_pes(RSHMEM_TEAM_INVALID)));
    c.eq(11, none, static_cast<uint64_t>(rshmem_team_my_pe(63)));
    c.eq(12, none, static_cast<uint64_t>(rshmem_team_my_pe(64)));
    c.eq(13, none, static_cast<uint64_t>(rshmem_team_translate_pe(RSHMEM_TEAM_INVALID, 0, RSHMEM_TEAM_WORLD)));
    c.eq(14, none, static_cast<uint64_t>(rshmem_team_translate_pe(T, ts, RSHMEM_TEAM_WORLD)));
    c.eq(15, shared_par, static_cast<uint64_t>(rshmem_team_translate_pe(T, 0, RSHMEM_TEAM_SHARED)));
  }
  // Team barriers at block and warp scope.
  uint64_t *rounds = reinterpret_cast<uint64_t *>(s);        // 3 x 64 words
  uint64_t *loc = reinterpret_cast<uint64_t *>(s + 2048);    // 64 words
  uint64_t *wbuf = reinterpret_cast<uint64_t *>(s + 3072);   // 32 words
  for (int r = 0; r < 3; ++r) {
    rshmem_uint64_p(rounds + 64 * r + tid, pat(a, me, 1000 * r + tid), world(rt));
    rshmem_barrier_block(T);
    c.eq(1000 * r + tid, pat(a, world(lt), 1000 * r + tid), rounds[64 * r + tid]);
  }
  loc[tid] = pat(a, me, 5000 + tid);
  rshmem_team_sync_block(T);
  c.eq(5000 + tid, pat(a, world(lt), 5000 + tid), rshmem_uint64_g(loc + tid, world(lt)));
  if (tid < 32) {
    rshmem_uint64_p(wbuf + tid, pat(a, me, 6000 + tid), world(rt));
    rshmem_barrier_warp(T);
    c.eq(6000 + tid, pat(a, world(lt), 6000 + tid), wbuf[tid]);
  }
  __syncthreads();
  // Thread scope: thread 0 alone, on T (two barrier rounds and a sync) and on WORLD.
  uint64_t *tbuf = reinterpret_cast<uint64_t *>(s + 3584);  // 3 words
  uint64_t *tloc = reinterpret_cast<uint64_t *>(s + 3840);  // 1 word
  if (tid == 0) {
    for (int r = 0; r < 2; ++r) {
      rshmem_uint64_p(tbuf + r, pat(a, me, 6100 + r), world(rt));
      rshmem_barrier(T);
      c.eq(6100 + r, pat(a, world(lt), 6100 + r), tbuf[r]);
    }
    const int wl = (me + n - 1) % n;
    rshmem_uint64_p(tbuf + 2, pat(a, me, 6102), (me + 1) % n);
    rshmem_barrier(RSHMEM_TEAM_WORLD);
    c.eq(6102, pat(a, wl, 6102), tbuf[2]);
    *tloc = pat(a, me, 6103);
    rshmem_team_sync(T);
    c.eq(6103, pat(a, world(lt), 6103), rshmem_uint64_g(tloc, world(lt)));
  }
  __syncthreads();
  // Collectives on T.
  check_collectives(c, a, T, mt, ts, par, 2, 7000);
  c.flush();
}

// ---- rshmem_ptr --------------------------------------------------------------------------
// grid 1 x block 64. Every thread stores word i of its pattern into its own buffer; after
// quiet, thread 0 signals the right neighbour and waits for the left's signal. Checks:
// thread i loads word i through rshmem_ptr(buf, left) (64); thread 0 checks that ptr is
// non-null, ptr(buf, me) == buf, and nullptr for PE n_pes, PE -1, the heap end and a
// non-heap address (the result record), and 0 <= my_pe < n_pes (7). checks/PE = 71.
extern "C" __global__ void __launch_bounds__(64, 1) rshmem_test_ptr(rshmem_harness_args_t a) {
  Checker c(a);
  unsigned char *s = scratch(a);
  uint64_t *flag = reinterpret_cast<uint64_t *>(s);
  uint64_t *buf = reinterpret_cast<uint64_t *>(s + 4096);
  const int me = rshmem_my_pe(), n = rshmem_n_pes(), left = left_pe();
  buf[threadIdx.x] = pat(a, me, threadIdx.x);
  rshmem_quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    rshmem_signal_op(flag, 1, RSHMEM_SIGNAL_SET, right_pe());
    rshmem_signal_wait_until(flag, RSHMEM_CMP_EQ, 1);
  }
  __syncthreads();
  const volatile uint64_t *q = static_cast<const volatile uint64_t *>(rshmem_ptr(buf, left));
  if (threadIdx.x == 0) {
    c.eq(1, 1, q != nullptr);
    c.eq(2, reinterpret_cast<uint64_t>(buf), reinterpret_cast<uint64_t>(rshmem_ptr(buf, me)));
    c.eq(3, 0, reinterpret_cast<uint64_t>(rshmem_ptr(buf, n)));
    c.eq(4, 0, reinterpret_cast<uint64_t>(rshmem_ptr(buf, -1)));
    const void *end = reinterpret_cast<const void *>(rshmemi_device_state.heap_base + rshmemi_device_state.heap_size);
    c.eq(5, 0, reinterpret_cast<uint64_t>(rshmem_ptr(end, me)));
    c.eq(6, 0, reinterpret_cast<uint64_t>(rshmem_ptr(reinterpret_cast<const void *>(a.result), me)));
    c.eq(7, 1, me >= 0 && me < n);
  }
  if (q != nullptr) c.eq(100 + threadIdx.x, pat(a, left, threadIdx.x), q[threadIdx.x]);
  c.flush();
}

// ---- negative cases: each must trap (run one per process; a trap kills the context) -------
// With RSHMEM_DEVICE_CHECKS on (the default). The runner expects the launch to fail and
// the error record to carry expect_code (and the PE / address named in the manifest doc).

// putmem to PE n_pes: BAD_PE, record.pe = n_pes.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_bad_pe(rshmem_harness_args_t a) {
  unsigned char *s = scratch(a);
  rshmem_putmem(s, s + 64, 8, rshmem_n_pes());
}

// getmem from PE -1: BAD_PE, record.pe = -1.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_negative_pe(rshmem_harness_args_t a) {
  unsigned char *s = scratch(a);
  rshmem_getmem(s, s + 64, 8, -1);
}

// 8-byte put whose last 4 bytes are past the heap end: OUT_OF_HEAP, record.addr =
// heap_base + heap_size - 4, record.pe = my_pe.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_out_of_heap(rshmem_harness_args_t a) {
  unsigned char *end = reinterpret_cast<unsigned char *>(rshmemi_device_state.heap_base + rshmemi_device_state.heap_size);
  rshmem_putmem(end - 4, scratch(a), 8, rshmem_my_pe());
}

// Atomic on a non-heap address (the result record): OUT_OF_HEAP, record.addr = a.result.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_not_heap(rshmem_harness_args_t a) {
  rshmem_uint64_atomic_add(reinterpret_cast<uint64_t *>(a.result), 1, rshmem_my_pe());
}

// Waits for a word nobody writes: WAIT_TIMEOUT after RSHMEM_TIMEOUT_MS, record.addr = the
// scratch word, cmp = EQ, expected = 1, observed = 0.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_wait_timeout(rshmem_harness_args_t a) {
  rshmem_uint64_wait_until(reinterpret_cast<uint64_t *>(scratch(a)), RSHMEM_CMP_EQ, 1);
}

// A team barrier on a team slot that holds no team on this PE (5): BAD_ARG naming the
// handle: record.pe = my_pe, addr = 0, expected = 5.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_bad_team(rshmem_harness_args_t a) {
  (void)a;
  rshmem_team_sync_block(5);
}

// A comparison operator that is not a rshmem_cmp_t (17): BAD_ARG, record.cmp = 17.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_bad_cmp(rshmem_harness_args_t a) {
  rshmem_uint64_wait_until(reinterpret_cast<uint64_t *>(scratch(a)), 17, 1);
}

// put_signal to this PE with signal operator 7: BAD_ARG before anything is sent, record.addr
// = the signal word (scratch), record.cmp = 7; the destination word stays 0 (checked by
// nobody after a trap: the order is what the message and record show).
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_bad_sig_op(rshmem_harness_args_t a) {
  uint64_t *w = reinterpret_cast<uint64_t *>(scratch(a));
  w[2] = 42;
  rshmem_putmem_signal(w + 1, w + 2, 8, w, 1, 7, rshmem_my_pe());
}

// A 64-bit atomic add on scratch + 4, inside the heap but 4-aligned: BAD_ARG before any
// access, record.addr = scratch + 4, record.expected = 8.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_misaligned_atomic(rshmem_harness_args_t a) {
  rshmem_uint64_atomic_add(reinterpret_cast<uint64_t *>(scratch(a) + 4), 1, rshmem_my_pe());
}

// A put of 2^61 + 1 u64 elements (whose byte count wraps to 8): OUT_OF_HEAP for the
// saturated length, record.addr = scratch, record.expected = 2^64 - 1. Before 2026-12-07
// it moved 8 bytes and returned.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_put_count_wrap(rshmem_harness_args_t a) {
  uint64_t *s = reinterpret_cast<uint64_t *>(scratch(a));
  rshmem_put(s, s + 8, (1ull << 61) + 1, rshmem_my_pe());
}

// rshmem_p of a class of size 8 and alignment 4 on scratch + 4: BAD_ARG (the store is one
// 8-byte word), record.expected = 8. Before 2026-12-07 the alignment checked was 4 and
// the GPU faulted with a misaligned address, naming nothing.
struct rshmemi_test_f2 {
  float x, y;
};
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_misaligned_p_class(rshmem_harness_args_t a) {
  rshmem_p(reinterpret_cast<rshmemi_test_f2 *>(scratch(a) + 4), rshmemi_test_f2{1.0f, 2.0f}, rshmem_my_pe());
}

// signal_wait_until on scratch + 4: BAD_ARG at once (no wait), record.addr = scratch + 4,
// record.expected = 8.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_misaligned_signal_wait(rshmem_harness_args_t a) {
  rshmem_signal_wait_until(reinterpret_cast<uint64_t *>(scratch(a) + 4), RSHMEM_CMP_EQ, 1);
}

// wait_until_all on 4 scratch words, [0] and [1] set to 1 first, [3] excluded: [2] keeps
// the wait going: WAIT_TIMEOUT, record.addr = scratch + 16, expected = 1, observed = 0.
extern "C" __global__ void __launch_bounds__(1, 1) rshmem_trap_wait_all_timeout(rshmem_harness_args_t a) {
  uint64_t *iv = reinterpret_cast<uint64_t *>(scratch(a));
  iv[0] = 1;
  iv[1] = 1;
  const int status[4] = {0, 0, 0, 1};
  rshmem_uint64_wait_until_all(iv, 4, status, RSHMEM_CMP_EQ, 1);
}
