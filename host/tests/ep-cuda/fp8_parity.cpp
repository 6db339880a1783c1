// Host C++ side of host/tests/ep_cuda_parity.rs: answers one request per input line with
// the functions of rshmem/ep/fp8.cuh (the GPU kernels' numerics), for the Rust test to
// compare with host/src/ep/fp8.rs and half::bf16 bit for bit. Requests (hex operands):
//   c BITS            e4m3 code of the f32 with these bits               -> "xx"
//   s BITS ROUND      ep_group_scale(amax, round)                        -> "scale inv" (f32 bits)
//   b BITS            ep_f32_to_bf16                                      -> "xxxx"
//   m ACC W V         ep_combine_step(acc, w, v)                          -> f32 bits
//   q ROUND N X...    quantise a row of N bf16 (N multiple of 128), the kernel's way:
//                     per group amax (ep_amax_step), scale, e4m3(x * scale)
//                                                                         -> "codes scales"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "rshmem/ep/fp8.cuh"

static float f(uint32_t b) { return ep_bits_f32(b); }

int main() {
  char op[4];
  while (scanf("%3s", op) == 1) {
    if (!strcmp(op, "c")) {
      unsigned x;
      if (scanf("%x", &x) != 1) return 2;
      printf("%02x\n", ep_f32_to_e4m3(f(x)));
    } else if (!strcmp(op, "s")) {
      unsigned x, r;
      if (scanf("%x %x", &x, &r) != 2) return 2;
      float scale, inv;
      ep_group_scale(f(x), r != 0, &scale, &inv);
      printf("%08x %08x\n", ep_f32_bits(scale), ep_f32_bits(inv));
    } else if (!strcmp(op, "b")) {
      unsigned x;
      if (scanf("%x", &x) != 1) return 2;
      printf("%04x\n", ep_f32_to_bf16(f(x)));
    } else if (!strcmp(op, "m")) {
      unsigned a, w, v;
      if (scanf("%x %x %x", &a, &w, &v) != 3) return 2;
      printf("%08x\n", ep_f32_bits(ep_combine_step(f(a), f(w), f(v))));
    } else if (!strcmp(op, "q")) {
      unsigned r, n;
      if (scanf("%x %x", &r, &n) != 2 || n % 128 != 0) return 2;
      std::vector<uint16_t> x(n);
      for (unsigned i = 0; i < n; ++i) {
        unsigned v;
        if (scanf("%x", &v) != 1) return 2;
        x[i] = static_cast<uint16_t>(v);
      }
      std::vector<float> scales;
      for (unsigned g = 0; g < n / 128; ++g) {
        float amax = 0.0f;
        for (unsigned i = 0; i < 128; ++i) amax = ep_amax_step(amax, ep_bf16_to_f32(x[g * 128 + i]));
        float scale, inv;
        ep_group_scale(amax, r != 0, &scale, &inv);
        scales.push_back(inv);
        for (unsigned i = 0; i < 128; ++i)
          printf("%02x", ep_f32_to_e4m3(ep_mul_rn(ep_bf16_to_f32(x[g * 128 + i]), scale)));
      }
      for (float s : scales) printf(" %08x", ep_f32_bits(s));
      printf("\n");
    } else {
      return 3;
    }
  }
  return 0;
}
