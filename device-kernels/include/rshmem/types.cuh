// rshmem/types.cuh — plain types of the device API, shared with host C++.
//
// Owns: the enums the wait/test and signal families take. The numeric values are a
// contract with the Rust host API (host/src/types.rs: `Cmp`, `SignalOp`, in the same
// order) — the host passes them to kernels by value.
// Must not: include CUDA headers or declare device functions; this header compiles as
// plain host C++ (scripts/check-device-code checks that with g++).
//
// Note: the values are rshmem's own, not NVSHMEM's (NVSHMEM numbers CMP_LE=3, CMP_LT=4,
// CMP_GE=5 and SIGNAL_SET=9, SIGNAL_ADD=10); do not pass NVSHMEM constants here.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Comparison operators of the wait/test family: `value <op> target`.
typedef enum rshmem_cmp {
  RSHMEM_CMP_EQ = 0,
  RSHMEM_CMP_NE = 1,
  RSHMEM_CMP_GT = 2,
  RSHMEM_CMP_GE = 3,
  RSHMEM_CMP_LT = 4,
  RSHMEM_CMP_LE = 5,
} rshmem_cmp_t;

// Signal update operators: SET stores the value, ADD adds it atomically.
typedef enum rshmem_signal_op {
  RSHMEM_SIGNAL_SET = 0,
  RSHMEM_SIGNAL_ADD = 1,
} rshmem_signal_op_t;

#ifdef __cplusplus
}  // extern "C"

// Passed by value across the host/device boundary as a 32-bit integer.
static_assert(sizeof(rshmem_cmp_t) == 4, "rshmem_cmp_t must be 32-bit");
static_assert(sizeof(rshmem_signal_op_t) == 4, "rshmem_signal_op_t must be 32-bit");
#endif
