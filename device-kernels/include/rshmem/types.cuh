// rshmem/types.cuh — plain types of the device API, shared with host C++.
//
// Owns: the enums the wait/test and signal families take, and the team handle type. The numeric values are a
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

// Device team handles (rshmem/device/team.cuh): a team's slot, the same on every member.
// WORLD and SHARED (the PEs of this node, OpenSHMEM's SHMEM_TEAM_SHARED) always exist on
// the device; other teams once the host created them with GpuPe::team_split_strided.
typedef int rshmem_team_t;
#define RSHMEM_TEAM_INVALID (-1)
#define RSHMEM_TEAM_WORLD 0
#define RSHMEM_TEAM_SHARED 1

#ifdef __cplusplus
}  // extern "C"

// Passed by value across the host/device boundary as a 32-bit integer.
static_assert(sizeof(rshmem_cmp_t) == 4, "rshmem_cmp_t must be 32-bit");
static_assert(sizeof(rshmem_signal_op_t) == 4, "rshmem_signal_op_t must be 32-bit");
#endif
