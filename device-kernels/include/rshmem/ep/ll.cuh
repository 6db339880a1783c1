// rshmem/ep/ll.cuh — the launch ABI of the low-latency EP kernels (device-kernels/src/
// ep_ll.cu → ptx/ep_ll.ptx) for the Rust launcher (host/src/gpu/, to be written).
//
// Owns: the argument block every EP kernel takes by value (ep_ll_args_t), the per-buffer
// control block in this PE's device memory (ep_ll_ctl_t), the status record of a call
// (ep_ll_status_t), and the launch constants. The kernel list and semantics are in the
// header comment of ep_ll.cu and in docs/ep.md ("GPU kernels").
// Must not: include CUDA headers (host C++ compiles it; the Rust mirror must pin the
// sizes and offsets asserted below).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Every EP kernel is launched with this many threads per block (1-D), any 1-D grid >= 1.
#define EP_LL_THREADS 512
// Limits of this implementation (checked by the kernels: trap with a message).
#define EP_LL_MAX_PES 1024            // R
#define EP_LL_MAX_LOCAL_EXPERTS 1024  // L = E / R

// ep_ll_args_t.flags bits.
#define EP_LL_IDX_I32 0x1u      // topk_idx is int32 (else int64)
#define EP_LL_ROUND_SCALE 0x2u  // FP8 scales rounded up to powers of two
#define EP_LL_FP8_BUFFER 0x4u   // the buffer's Config has use_fp8 (its layout's message size):
                                // required by the _fp8 dispatch kernels, refused by the
                                // _bf16 ones, and what the combine kernels lay out with
// Bits 24..29: combine only, the handle's dispatch call mod 64 (the CPU's handle mark):
// carried in the combine flags, and a peer whose mark differs combined another dispatch.
#define EP_LL_MARK_SHIFT 24
#define EP_LL_MARK_BITS 0x3fu
#define EP_LL_SHRINK 0x8u       // shrink mode (DeepEP's enable_shrink): a wait that times out
                                // masks its PE (mask[pe] = EP_LL_MASK_SHRUNK(tag)) and the
                                // call goes on without it, instead of trapping
#define EP_LL_CREDITS_ONLY 0x10u  // combine_send: wait for this set's credits (call seq - 2)
                                  // and return: the host's stream-ordered guard in
                                  // get_next_low_latency_combine_buffer, so the caller's
                                  // writes into the zero-copy rows wait for the NIC's reads
                                  // of the call two before (IBGDA WRITEs from those rows)

// The mask entry a kernel in shrink mode writes for a PE it gave up on during the call of
// tag `tag` (the host writes 1). Kernels of that call treat the PE through its settled
// signal words; later calls skip it like any masked PE.
#define EP_LL_MASK_SHRUNK(tag) ((int32_t)(0x40000000u | ((uint32_t)(tag) & 0x3fffffffu)))

// Argument block, passed by value (128 bytes). Pointers are device addresses in this
// PE's context; "heap offset" is an offset into the symmetric heap (same on every PE).
typedef struct ep_ll_args {
  uint64_t buf;             // heap offset of the EP allocation (Layout::total_bytes, 64-aligned)
  uint64_t ctl;             // ep_ll_ctl_t * (this PE's, zeroed once when the buffer is created)
  uint64_t mask;            // int32_t [R]: nonzero = PE masked (DeepEP's mask buffer);
                            //   written by the kernels in shrink mode
  uint64_t x;               // dispatch_send: bf16 [T, H] tokens; combine_send: bf16
                            //   [L, R*N, H] expert outputs (for zero-copy: the address of
                            //   this set's combine_send region, heap_base + buf + offset)
  uint64_t topk_idx;        // [T, K] int64 (or int32 with EP_LL_IDX_I32); -1 = unused slot
  uint64_t topk_weights;    // combine_recv: const float [T, K]
  uint64_t out;             // dispatch_recv: recv_x (bf16 [L, R*N, H] or e4m3 bytes
                            //   [L, R*N, H]); combine_recv: combined_x bf16 [T, H]
  uint64_t recv_scales;     // dispatch_recv with FP8: float [L, R*N, H/128]; else 0
  uint64_t recv_count;      // int32 [L]: dispatch_recv writes
  uint64_t src_info;        // int32 [L, R*N]: dispatch_recv writes, combine_send reads
  uint64_t recv_topk_slot;  // int32 [L, R*N]: top-k slot of each row on its source PE
                            //   (the handle's row_k); dispatch_recv writes, combine_send reads
  uint64_t layout_range;    // int64 [L, R]: begin << 32 | count; dispatch_recv writes,
                            //   combine_send reads
  uint32_t num_tokens;      // T of this PE's dispatch (combine: the handle's T)
  uint32_t num_max_tokens;  // N
  uint32_t num_experts;     // E (R = the world size, state.n_pes)
  uint32_t num_topk;        // K (1..=11)
  uint32_t set;             // buffer set: the host's LL call number % 2
  uint32_t flags;           // EP_LL_* bits
  uint32_t fault;           // 0, or a host-detected input fault (EP_POISON | code << 24 |
                            //   value, as host/src/ep/mod.rs Fault::encode): the send
                            //   phase poisons the call instead of sending data
  uint32_t shrink_timeout_ms;  // EP_LL_SHRINK: how long a wait lasts before it gives up on
                               //   its PE (0 = the device state's timeout)
} ep_ll_args_t;

// What went wrong in the last call on a set (see ep_ll.cu "Faults"). Valid iff
// `commit` equals that call's tag (LL call number + 1).
typedef struct ep_ll_status {
  uint64_t claim;     // atomicMax'ed with the tag by the first reporter of a call
  uint64_t commit;    // = tag once the fields below are written (release)
  uint32_t kind;      // EP_LL_STATUS_*
  int32_t peer;       // the PE at fault (this PE for *_INPUT)
  uint64_t value;     // the poisoned word's low 32 bits, a count, or rows received
  uint64_t expected;  // ROWS: rows this PE's routing expects from `peer`
  uint64_t reserved;
} ep_ll_status_t;  // 48 bytes

#define EP_LL_STATUS_NONE 0u
#define EP_LL_STATUS_DISPATCH_INPUT 1u    // this PE's input: value = fault word (T > N, bad id)
#define EP_LL_STATUS_DISPATCH_PEER 2u     // peer poisoned its counts: value = its fault word
#define EP_LL_STATUS_DISPATCH_CORRUPT 3u  // peer announced more tokens than fit: value = count
#define EP_LL_STATUS_COMBINE_INPUT 4u     // this PE's combine input: value = fault word
#define EP_LL_STATUS_COMBINE_PEER 5u      // peer poisoned its combine flag: value = fault word
#define EP_LL_STATUS_COMBINE_ROWS 6u      // peer returned `value` rows, routing expects `expected`
#define EP_LL_STATUS_COMBINE_HANDLE 7u    // peer combined another dispatch: value = its mark, expected = ours
#define EP_LL_STATUS_DISPATCH_HEADER 8u   // peer's message header out of range: value = token << 32 | slot
#define EP_LL_STATUS_IS_COMBINE(kind) \
  ((kind) >= EP_LL_STATUS_COMBINE_INPUT && (kind) <= EP_LL_STATUS_COMBINE_HANDLE)

// rshmem_device_error_t.code for an EP launch whose arguments are inconsistent (invalid
// config for this kernel's H, R or L beyond the limits above, a handle row pointing
// outside [0, N) x [0, K)); `expected`/`observed` carry the offending values.
#define EP_LL_DEVICE_ERR_CONFIG 0x45500001u

// Kernel kinds (index of ep_ll_ctl_t.grid_done).
#define EP_LL_DISPATCH_SEND 0
#define EP_LL_DISPATCH_RECV 1
#define EP_LL_COMBINE_SEND 2
#define EP_LL_COMBINE_RECV 3

// Per-buffer control block in this PE's device memory (not symmetric; zeroed once). It
// holds what must survive between launches without the host: the call counter of each
// set (so a CUDA graph replays with fresh tags), completion counters, the status, and
// which call's stage kernel last ran (for IBGDA destinations).
typedef struct ep_ll_ctl {
  uint64_t set_calls[2];            // LL calls completed (received) on each set
  ep_ll_status_t status[2][2];      // per set and kind ([set][0] dispatch, [set][1] combine):
                                    //   a dispatch's record outlives a combine on its set
                                    //   (before 2026-12-07 one per set: a failing combine two
                                    //   calls later overwrote a failed dispatch's record)
  uint32_t grid_done[2][4];         // blocks finished, per set and kernel kind (reset by the last)
  uint32_t dest_done[2][2][EP_LL_MAX_PES];  // [set][dispatch/combine][dest]: units finished
  uint64_t staged[2];               // tag of the call whose stage kernel last ran, per set
  // Shrink mode: per set and source, what this call's receive kernel decided about the
  // source: tag << 1 | 1 (use what it sent) or tag << 1 (leave it out); another tag =
  // undecided. The first unit or block to decide wins; every other one adopts it.
  uint64_t shrink_decided[2][EP_LL_MAX_PES];
  // The buffer's team, written by the host when it creates the buffer: team_size 0 = the
  // world team; else R = team_size, this PE is team member team_rank, and member i is
  // world PE team_pe[i] (every PE index the kernels use — mask, counters, layout — is a
  // team rank; peers are reached through team_pe).
  uint32_t team_size;
  int32_t team_rank;
  int32_t team_pe[EP_LL_MAX_PES];
  // Shrink mode: per set and destination, what this call's send kernels decided about the
  // destination's credit (call seq - 2 received): tag << 1 | 1 (it came: send) or tag << 1
  // (given up on: send nothing); another tag = undecided. The first block to finish its
  // wait decides; every other block adopts it, so no block sends to a PE that another
  // block of the same call gave up on (whose counts would then cover messages never sent).
  uint64_t credit_decided[2][EP_LL_MAX_PES];
} ep_ll_ctl_t;

#ifdef __cplusplus
}  // extern "C"

static_assert(sizeof(ep_ll_args_t) == 128, "ep_ll_args_t layout");
#if !defined(__CUDACC_RTC__)  // NVRTC has no __builtin_offsetof; nvcc and g++ check these
static_assert(__builtin_offsetof(ep_ll_args_t, num_tokens) == 96, "ep_ll_args_t layout");
static_assert(__builtin_offsetof(ep_ll_args_t, fault) == 120, "ep_ll_args_t layout");
#endif
static_assert(sizeof(ep_ll_status_t) == 48, "ep_ll_status_t layout");
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(ep_ll_ctl_t, status) == 16, "ep_ll_ctl_t layout");
static_assert(__builtin_offsetof(ep_ll_ctl_t, grid_done) == 208, "ep_ll_ctl_t layout");
static_assert(__builtin_offsetof(ep_ll_ctl_t, dest_done) == 240, "ep_ll_ctl_t layout");
#endif
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(ep_ll_ctl_t, staged) == 240 + 2 * 2 * EP_LL_MAX_PES * 4, "ep_ll_ctl_t layout");
#endif
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(ep_ll_ctl_t, shrink_decided) == 240 + 2 * 2 * EP_LL_MAX_PES * 4 + 16,
              "ep_ll_ctl_t layout");
#endif
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(ep_ll_ctl_t, team_size) ==
                  240 + 2 * 2 * EP_LL_MAX_PES * 4 + 16 + 2 * EP_LL_MAX_PES * 8,
              "ep_ll_ctl_t layout");
static_assert(__builtin_offsetof(ep_ll_ctl_t, team_pe) ==
                  240 + 2 * 2 * EP_LL_MAX_PES * 4 + 16 + 2 * EP_LL_MAX_PES * 8 + 8,
              "ep_ll_ctl_t layout");
#endif
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(ep_ll_ctl_t, credit_decided) ==
                  240 + 2 * 2 * EP_LL_MAX_PES * 4 + 16 + 2 * EP_LL_MAX_PES * 8 + 8 + EP_LL_MAX_PES * 4,
              "ep_ll_ctl_t layout");
#endif
static_assert(sizeof(ep_ll_ctl_t) == 240 + 2 * 2 * EP_LL_MAX_PES * 4 + 16 + 2 * EP_LL_MAX_PES * 8 + 8 +
                                         EP_LL_MAX_PES * 4 + 2 * EP_LL_MAX_PES * 8,
              "ep_ll_ctl_t layout");
#endif
