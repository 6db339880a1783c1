// rshmem/rshmem.cuh — the rshmem device API: include this in your kernels.
//
// Owns: the public entry point of the header-only device API. Under nvcc (or NVRTC) it
// brings in the whole API (docs/device-api.md):
//   rshmem/device/core.cuh     the bound state (`rshmemi_device_state`), errors, polling
//   rshmem/device/rma.cuh      my_pe, n_pes, ptr, put/get/p/g (+_nbi, _warp, _block),
//                              put_signal, signal_op/fetch/wait_until, quiet, fence
//   rshmem/device/amo.cuh      atomics, wait_until, test
//   rshmem/device/barrier.cuh  barrier_all, sync_all (device-wide), _block and _warp forms
//   rshmem/device/team.cuh     team_my_pe/n_pes/translate_pe, team sync and barrier
//                              (_block and _warp forms)
//   rshmem/device/coll.cuh     broadcast, fcollect, alltoall, reductions on a team
//                              (_block forms)
// As plain host C++ it provides the shared types (state.cuh, types.cuh) and the pure
// helpers (device/layout.cuh, device/copy.cuh), so host code can include it too.
// Must not: contain device code itself (it lives in rshmem/device/*.cuh).
//
// Using it: compile your .cu to PTX/cubin (whole-program, one module per .cu; -rdc is not
// supported because every module defines its own `rshmemi_device_state`), load the module
// once per PE and bind it (Rust: GpuPe::bind_module) before launching anything from it.
#pragma once

#include "rshmem/device/copy.cuh"
#include "rshmem/device/layout.cuh"
#include "rshmem/qualifiers.cuh"
#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

#if defined(__CUDACC__)
#include "rshmem/device/amo.cuh"
#include "rshmem/device/barrier.cuh"
#include "rshmem/device/coll.cuh"
#include "rshmem/device/core.cuh"
#include "rshmem/device/rma.cuh"
#include "rshmem/device/team.cuh"
#endif
