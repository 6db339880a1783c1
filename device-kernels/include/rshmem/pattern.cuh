// rshmem/pattern.cuh — the test-data pattern, identical on host and device.
//
// Owns: rshmem_pattern_u64(seed, index), the value that rshmem_fill_u64 writes and
// rshmem_verify_u64 expects. Benchmarks and tests fill buffers with it instead of zeros
// (a copy of zeros over zeros proves nothing), and choose `seed` to encode the origin
// (PE, buffer, iteration) so a misplaced word is recognisable.
//
// The function is SplitMix64's output step applied to `seed + index * golden-gamma`
// (Steele, Lea, Flood 2014), so Rust reproduces it with wrapping u64 arithmetic:
//   z = seed + (index + 1) * 0x9e3779b97f4a7c15
//   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
//   z = (z ^ (z >> 27)) * 0x94d049bb133111eb
//   z ^ (z >> 31)
// With seed 0 it yields SplitMix64's reference sequence (seeded 0): 0xe220a8397b1dcdaf,
// 0x6e789e6aa1b965f4, ...; the static_asserts below pin the formula for both sides.
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"

RSHMEM_HOST_DEVICE constexpr uint64_t rshmem_pattern_u64(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static_assert(rshmem_pattern_u64(0, 0) == 0xe220a8397b1dcdafull, "SplitMix64 reference");
static_assert(rshmem_pattern_u64(0, 1) == 0x6e789e6aa1b965f4ull, "SplitMix64 reference");
static_assert(rshmem_pattern_u64(1234, 5) == 0xb0bfb29e8c72a511ull, "seeded value");
