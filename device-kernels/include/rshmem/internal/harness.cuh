// rshmem/internal/harness.cuh — the ABI between the library's GPU self-test / benchmark
// kernels (device-kernels/src/rshmem_device_tests.cu, rshmem_device_bench.cu) and their
// Rust driver (host/src/gpu/selftest.rs, host/src/gpu/bench.rs).
//
// Owns: the argument block every test and bench kernel takes, the result record a test
// kernel fills, the bench timing record. Not part of the user-facing device API.
// Must not: include CUDA headers (host C++ compiles it; host/src/gpu/harness.rs mirrors it
// with size/offset asserts).
//
// Test kernel contract: `extern "C" __global__ void rshmem_test_<name>(rshmem_harness_args_t a)`
// is launched on every PE of the job at the same time (one module instance per PE, bound
// with the PE's state), with the grid/block its manifest entry names (host/src/gpu/
// manifest.rs). It may use the symmetric scratch range [a.scratch, a.scratch + a.scratch_bytes)
// (a heap offset, the same on every PE, zeroed and followed by a host barrier before the
// launch). It checks exact values itself and counts into *a.result: `checks` per value
// compared, `failures` per mismatch, and the first mismatch's index/expected/observed
// (guarded by atomicCAS on `failures` going 0 -> 1). The host sums over PEs; a case passes
// when failures == 0 and checks == the manifest's expected count times the PE count (a
// kernel that checks nothing cannot pass).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rshmem_harness_args {
  uint64_t scratch;        // heap offset of the symmetric scratch range
  uint64_t scratch_bytes;  // its size
  uint64_t result;         // device pointer to rshmem_test_result_t (tests) or rshmem_bench_record_t (benches)
  uint64_t param0;         // case-specific (size in bytes, iteration count, ...)
  uint64_t param1;
  uint64_t param2;
  uint64_t seed;           // pattern seed; tests encode the origin PE as rshmem_pattern_u64(seed + pe, i)
  uint64_t team;           // test cases with a manifest "team": this PE's device team handle
                           // (rshmem_team_t, sign-extended); else 0 (RSHMEM_TEAM_WORLD)
} rshmem_harness_args_t;   // 64 bytes, passed by value

typedef struct rshmem_test_result {
  unsigned long long checks;     // values compared (atomicAdd)
  unsigned long long failures;   // mismatches (atomicAdd)
  unsigned long long first_index;
  unsigned long long expected;
  unsigned long long observed;
  unsigned long long reserved[3];
} rshmem_test_result_t;          // 64 bytes

typedef struct rshmem_bench_record {
  unsigned long long start_ns;   // %globaltimer at the first timed iteration (thread 0, block 0)
  unsigned long long end_ns;     // %globaltimer after the last
  unsigned long long iters;      // timed iterations
  unsigned long long bytes;      // payload bytes moved by this PE in the timed part
  unsigned long long checksum;   // a value derived from received data, so the work is observable
  unsigned long long reserved[3];
} rshmem_bench_record_t;         // 64 bytes

#ifdef __cplusplus
}  // extern "C"

static_assert(sizeof(rshmem_harness_args_t) == 64, "harness args layout");
static_assert(sizeof(rshmem_test_result_t) == 64, "test result layout");
static_assert(sizeof(rshmem_bench_record_t) == 64, "bench record layout");
#endif
