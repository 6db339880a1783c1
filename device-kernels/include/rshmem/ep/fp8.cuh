// rshmem/ep/fp8.cuh — the numerics of EP dispatch/combine, bit-identical to the CPU oracle.
//
// Owns: the e4m3 cast (OCP e4m3fn, round to nearest even, saturating to ±448, NaN → 0x7f),
// the per-128-channel scale (amax floored at 1e-4, scale = 448/amax, scale_inv =
// amax * (1/448) as DeepEP computes them, `round_scale` rounds scale_inv up to a power of
// two), the f32 → bf16 rounding of combine (round to
// nearest even, NaN keeps its high bits with the quiet bit set: the `half` crate's
// `bf16::from_f32`), and the combine step `acc + w * v` without FMA. Every function is
// RSHMEM_HOST_DEVICE and uses no libm, so host C++ and the GPU run the same instructions'
// worth of IEEE arithmetic: only single-rounded *, / and comparisons.
// Must not: include CUDA headers (host/tests/ep-cuda/fp8_parity.cpp compiles it with g++
// and host/tests/ep_cuda_parity.rs compares it with host/src/ep/fp8.rs over every bf16
// input, edge and random f32 values and random rows).
//
// Why no hardware cvt: sm_89+ has cvt.rn.satfinite.e4m3x2.f32, but its NaN encoding and
// sign of NaN are not what the oracle writes, and the software cast is a handful of
// integer operations per value on data that is memory-bound anyway.
//
// Why the power-of-two ceiling is computed from the bits: the oracle uses
// `(amax * (1/448)).log2().ceil().exp2()` (glibc log2f). For every value this can take in
// dispatch (amax is the magnitude of a bf16 value, or the 1e-4 floor) the bit formula
// gives the same result (checked exhaustively by the parity test); for arbitrary f32
// inputs just above a power of two, log2f rounds to the integer and the two differ, which
// quantize_row never produces.
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"

#if !RSHMEM_DEVICE_COMPILE
#if !defined(__CUDACC_RTC__)  // NVRTC declares memcpy itself and has no string.h
#include <string.h>
#endif
#endif

#define EP_E4M3_MAX 448.0f
// 1/448 rounded to f32 (DeepEP's kFP8AmaxInv; host/src/ep/fp8.rs E4M3_MAX_INV).
#define EP_E4M3_MAX_INV (1.0f / 448.0f)
#define EP_AMAX_FLOOR 1e-4f

RSHMEM_HOST_DEVICE uint32_t ep_f32_bits(float x) {
#if RSHMEM_DEVICE_COMPILE
  return __float_as_uint(x);
#else
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
#endif
}

RSHMEM_HOST_DEVICE float ep_bits_f32(uint32_t b) {
#if RSHMEM_DEVICE_COMPILE
  return __uint_as_float(b);
#else
  float x;
  memcpy(&x, &b, 4);
  return x;
#endif
}

// Multiply and add that are never contracted into an FMA (nvcc contracts a*b+c by
// default; the oracle rounds the product and the sum separately).
RSHMEM_HOST_DEVICE float ep_mul_rn(float a, float b) {
#if RSHMEM_DEVICE_COMPILE
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

RSHMEM_HOST_DEVICE float ep_add_rn(float a, float b) {
#if RSHMEM_DEVICE_COMPILE
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// |x| by clearing the sign bit (fabsf without libm; NaN stays NaN).
RSHMEM_HOST_DEVICE float ep_fabs(float x) { return ep_bits_f32(ep_f32_bits(x) & 0x7fffffffu); }

// f32::max for a non-negative running maximum: NaN in `v` is ignored (as Rust's max and
// CUDA's fmaxf do), so the result does not depend on the order of a reduction.
RSHMEM_HOST_DEVICE float ep_amax_step(float m, float v) {
  const float a = ep_fabs(v);
  return a > m ? a : m;
}

// Rounds x to the nearest e4m3 code, ties to even, saturating to ±448; NaN → 0x7f.
// host/src/ep/fp8.rs `f32_to_e4m3`, step by step.
RSHMEM_HOST_DEVICE uint8_t ep_f32_to_e4m3(float x) {
  const uint32_t bits = ep_f32_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7f;  // NaN
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const float a = ep_bits_f32(bits & 0x7fffffffu);
  if (a >= EP_E4M3_MAX) return sign | 0x7e;
  if (a < 1.0f / 64.0f) {
    // Subnormal range: multiples of 2^-9; a * 512 is exact and lies in [0, 8).
    const float v = a * 512.0f;
    uint32_t m = static_cast<uint32_t>(v);  // truncation = floor for v >= 0
    const float frac = v - static_cast<float>(m);  // exact
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m += 1;  // 8 is the smallest normal
    return sign | static_cast<uint8_t>(m);
  }
  const uint32_t abits = bits & 0x7fffffffu;
  const int32_t exp = static_cast<int32_t>((abits >> 23) & 0xff) - 127;  // -6..=8
  const uint32_t man = abits & 0x7fffffu;
  uint32_t code = (static_cast<uint32_t>(exp + 7) << 3) | (man >> 20);
  const uint32_t rem = man & 0xfffffu;
  const uint32_t half = 0x80000u;
  if (rem > half || (rem == half && (code & 1u))) code += 1;  // a carry into the exponent is right
  return sign | static_cast<uint8_t>(code < 0x7eu ? code : 0x7eu);
}

// The value of an e4m3 code (NaN for 0x7f / 0xff). Tests only; the kernels never decode.
RSHMEM_HOST_DEVICE float ep_e4m3_to_f32(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return ep_bits_f32(0x7fc00000u);
  const uint32_t e = (b >> 3) & 0xf, m = b & 7;
  float mag;
  if (e == 0) {
    mag = static_cast<float>(m) * (1.0f / 512.0f);
  } else {
    mag = (1.0f + static_cast<float>(m) / 8.0f) * ep_bits_f32((e - 7 + 127) << 23);
  }
  return (b & 0x80) ? -mag : mag;
}

// Scale of one 128-channel group: q = e4m3(x * *scale), x ≈ q * *scale_inv.
// host/src/ep/fp8.rs `group_scale`.
RSHMEM_HOST_DEVICE void ep_group_scale(float amax, bool round_scale, float *scale,
                                       float *scale_inv) {
  // f32::max(amax, floor): a NaN amax gives the floor.
  amax = amax > EP_AMAX_FLOOR ? amax : EP_AMAX_FLOOR;
  if (round_scale) {
    const float q = amax * EP_E4M3_MAX_INV;
    const uint32_t b = ep_f32_bits(q);
    if ((b & 0x7f800000u) == 0x7f800000u) {  // amax = inf: log2/ceil/exp2 give inf
      *scale_inv = q;
      *scale = 1.0f / q;  // 0
      return;
    }
    // ceil(log2(q)) for a normal q (q >= 1e-4 / 448 > 2^-126): exponent, +1 unless the
    // mantissa is zero.
    const int32_t e = static_cast<int32_t>((b >> 23) & 0xff) - 127 + ((b & 0x7fffffu) != 0);
    *scale_inv = ep_bits_f32(static_cast<uint32_t>(e + 127) << 23);
    *scale = ep_bits_f32(static_cast<uint32_t>(127 - e) << 23);  // 1 / scale_inv, exact
  } else {
    *scale = EP_E4M3_MAX / amax;
    *scale_inv = amax * EP_E4M3_MAX_INV;  // DeepEP's amax * kFP8AmaxInv, bit for bit
  }
}

// The bf16 value (bits) of an f32, round to nearest even; `half::bf16::from_f32`.
RSHMEM_HOST_DEVICE uint16_t ep_f32_to_bf16(float v) {
  const uint32_t x = ep_f32_bits(v);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint32_t round_bit = 0x8000u;
  if ((x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0)
    return static_cast<uint16_t>((x >> 16) + 1);
  return static_cast<uint16_t>(x >> 16);
}

RSHMEM_HOST_DEVICE float ep_bf16_to_f32(uint16_t b) {
  return ep_bits_f32(static_cast<uint32_t>(b) << 16);
}

// One combine term: acc + w * v, product and sum rounded separately (the oracle's
// `*a += w * v` in Rust, which never contracts).
RSHMEM_HOST_DEVICE float ep_combine_step(float acc, float w, float v) {
  return ep_add_rn(acc, ep_mul_rn(w, v));
}
