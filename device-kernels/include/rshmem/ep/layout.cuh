// rshmem/ep/layout.cuh — the EP low-latency buffer layout, for the GPU kernels.
//
// Owns: ep_layout_t and ep_layout_init(), which compute exactly the offsets of the Rust
// `rshmem::ep::Layout` (host/src/ep/layout.rs: same formulas, same order of regions,
// same 64-byte alignment, same overflow refusal), plus the per-word/per-row accessors of
// that type; the config checks of `Config::validate` (host/src/ep/mod.rs) as error codes;
// and the size of the GPU-only control block (ep_ll_ctl_t, not symmetric).
// Must not: include CUDA headers; it compiles as plain host C++ (the parity test
// host/tests/ep_cuda_parity.rs compiles host/tests/ep-cuda/layout_parity.cpp with g++
// and compares every field with `Layout` for a set of configs).
//
// One symmetric allocation holds two buffer sets; LL call number `seq` uses set `seq % 2`.
// Per set, each region 64-byte aligned (see layout.rs for the table):
//   dispatch_count u64 [L][R]   tag << 32 | count   per (local expert, source PE)
//   combine_flag   u64 [R]      tag << 32 | rows    per expert-owning PE
//   credit         u64 [R]      tag                 "PE p finished receiving this set's call"
//   dispatch_send  N messages
//   dispatch_recv  [R][N * min(K, L)] messages, packed per source by local expert
//   combine_send   bf16 [L][R*N][H]  (the zero-copy combine buffer)
//   combine_recv   bf16 [N][K][H]    one row per (token, top-k slot)
// A message: 16-byte header (token i32, top-k slot i32, 8 zero bytes), then H bf16, or H
// e4m3 bytes + H/128 f32 scales; rounded up to 16 bytes.
#pragma once

#include <stdint.h>

#include "rshmem/qualifiers.cuh"

#define EP_REGION_ALIGN 64ull
#define EP_HEADER_BYTES 16ull
#define EP_FP8_GROUP 128ull
#define EP_MAX_TOPK 11ull
#define EP_MAX_TOKENS_PER_RANK (1ull << 20)

// Signal-word encoding (host/src/ep/mod.rs: POISON, COUNT_MASK, Fault::encode).
#define EP_TAG_SHIFT 32
#define EP_POISON (1ull << 31)
#define EP_COUNT_MASK 0xffffffull
// GPU shrink mode only: the low word of a signal word that a receiver gave up waiting for
// and settled as "nothing came" (ep_comm::settle_tag); never sent by a PE.
#define EP_SHRUNK (1ull << 30)
#define EP_FAULT_TOO_MANY_TOKENS 1ull
#define EP_FAULT_BAD_EXPERT 2ull
#define EP_FAULT_SHAPE 3ull
#define EP_FAULT_HANDLE 4ull
#define EP_FAULT_EXPERT_OVERFLOW 5ull
// 6: combine topk_idx differs from the dispatch's (checked on CPU PEs only: the GPU path has no
// host synchronisation to compare them).
// 7 (GPU only): the handle's dispatch received a corrupt message header on this PE
// (EP_LL_STATUS_DISPATCH_HEADER), so the rows it would return are not that routing's.
#define EP_FAULT_DISPATCH_HEADER 7ull

// ep_layout_init results (0 = ok); the same conditions as Config::validate / Layout::new.
#define EP_LAYOUT_OK 0
#define EP_LAYOUT_BAD_TOKENS 1   // N not in 1..=2^20
#define EP_LAYOUT_BAD_HIDDEN 2   // H == 0, or FP8 and H not a positive multiple of 128
#define EP_LAYOUT_BAD_TOPK 3     // K not in 1..=11
#define EP_LAYOUT_BAD_EXPERTS 4  // R == 0, E == 0 or E % R != 0
#define EP_LAYOUT_OVERFLOW 5     // the buffers overflow 64-bit sizes

typedef struct ep_region {
  uint64_t offset;
  uint64_t bytes;
} ep_region_t;

typedef struct ep_layout {
  uint64_t num_pes;            // R
  uint64_t num_local_experts;  // L = E / R
  uint64_t num_max_tokens;     // N
  uint64_t hidden;             // H
  uint64_t num_topk;           // K
  uint64_t use_fp8;            // 0 / 1
  uint64_t msg_bytes;          // bytes of one dispatch message
  uint64_t slots_per_src;      // N * min(K, L)
  ep_region_t dispatch_count;
  ep_region_t combine_flag;
  ep_region_t credit;
  ep_region_t dispatch_send;
  ep_region_t dispatch_recv;
  ep_region_t combine_send;
  ep_region_t combine_recv;
  uint64_t set_bytes;    // one buffer set
  uint64_t total_bytes;  // the whole allocation (two sets)
} ep_layout_t;

// a * b, or false on u64 overflow.
RSHMEM_HOST_DEVICE bool ep_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

RSHMEM_HOST_DEVICE uint64_t ep_round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

// Places a region of `bytes` at *at and advances *at to the next 64-byte boundary.
RSHMEM_HOST_DEVICE bool ep_place(uint64_t *at, uint64_t bytes, ep_region_t *r) {
  r->offset = *at;
  r->bytes = bytes;
  if (bytes > UINT64_MAX - *at - EP_REGION_ALIGN) return false;
  *at = ep_round_up(*at + bytes, EP_REGION_ALIGN);
  return true;
}

// Config::validate followed by Layout::new. Returns EP_LAYOUT_*; *lay is complete only
// on EP_LAYOUT_OK.
RSHMEM_HOST_DEVICE int ep_layout_init(ep_layout_t *lay, uint64_t num_max_tokens, uint64_t hidden,
                                      uint64_t num_experts, uint64_t num_topk, bool use_fp8,
                                      uint64_t num_pes) {
  const uint64_t n = num_max_tokens, h = hidden, k = num_topk, r = num_pes;
  if (n == 0 || n > EP_MAX_TOKENS_PER_RANK) return EP_LAYOUT_BAD_TOKENS;
  if (h == 0) return EP_LAYOUT_BAD_HIDDEN;
  if (use_fp8 && (h < EP_FP8_GROUP || h % EP_FP8_GROUP != 0)) return EP_LAYOUT_BAD_HIDDEN;
  if (k == 0 || k > EP_MAX_TOPK) return EP_LAYOUT_BAD_TOPK;
  if (r == 0 || num_experts == 0 || num_experts % r != 0) return EP_LAYOUT_BAD_EXPERTS;
  const uint64_t l = num_experts / r;
  if (h > UINT64_MAX / 4) return EP_LAYOUT_OVERFLOW;
  const uint64_t payload = use_fp8 ? h + h / EP_FP8_GROUP * 4 : h * 2;
  lay->num_pes = r;
  lay->num_local_experts = l;
  lay->num_max_tokens = n;
  lay->hidden = h;
  lay->num_topk = k;
  lay->use_fp8 = use_fp8 ? 1 : 0;
  lay->msg_bytes = ep_round_up(EP_HEADER_BYTES + payload, 16);
  lay->slots_per_src = n * (k < l ? k : l);
  // Region sizes first (each checked for overflow), then their places in order.
  uint64_t x = 0, y = 0, sz[7] = {0, 0, 0, 0, 0, 0, 0};
  bool ok = ep_mul_ok(l * r, 8, &sz[0]) && ep_mul_ok(r, 8, &sz[1]) && ep_mul_ok(r, 8, &sz[2]) &&
            ep_mul_ok(n, lay->msg_bytes, &sz[3]) && ep_mul_ok(r, lay->slots_per_src, &x) &&
            ep_mul_ok(x, lay->msg_bytes, &sz[4]) && ep_mul_ok(l, r, &x) && ep_mul_ok(x, n, &y) &&
            ep_mul_ok(y, h * 2, &sz[5]) && ep_mul_ok(n, k, &x) && ep_mul_ok(x, h * 2, &sz[6]);
  uint64_t at = 0;
  ok = ok && ep_place(&at, sz[0], &lay->dispatch_count);
  ok = ok && ep_place(&at, sz[1], &lay->combine_flag);
  ok = ok && ep_place(&at, sz[2], &lay->credit);
  ok = ok && ep_place(&at, sz[3], &lay->dispatch_send);
  ok = ok && ep_place(&at, sz[4], &lay->dispatch_recv);
  ok = ok && ep_place(&at, sz[5], &lay->combine_send);
  ok = ok && ep_place(&at, sz[6], &lay->combine_recv);
  if (!ok) return EP_LAYOUT_OVERFLOW;
  lay->set_bytes = at;
  if (!ep_mul_ok(at, 2, &lay->total_bytes)) return EP_LAYOUT_OVERFLOW;
  return EP_LAYOUT_OK;
}

// Byte offsets inside the allocation (Layout's accessors, same names).
RSHMEM_HOST_DEVICE uint64_t ep_set_base(const ep_layout_t *l, uint64_t set) {
  return set * l->set_bytes;
}
RSHMEM_HOST_DEVICE uint64_t ep_dispatch_count_word(const ep_layout_t *l, uint64_t set, uint64_t le,
                                                   uint64_t src) {
  return ep_set_base(l, set) + l->dispatch_count.offset + (le * l->num_pes + src) * 8;
}
RSHMEM_HOST_DEVICE uint64_t ep_combine_flag_word(const ep_layout_t *l, uint64_t set, uint64_t src) {
  return ep_set_base(l, set) + l->combine_flag.offset + src * 8;
}
RSHMEM_HOST_DEVICE uint64_t ep_credit_word(const ep_layout_t *l, uint64_t set, uint64_t pe) {
  return ep_set_base(l, set) + l->credit.offset + pe * 8;
}
RSHMEM_HOST_DEVICE uint64_t ep_dispatch_send_msg(const ep_layout_t *l, uint64_t set, uint64_t t) {
  return ep_set_base(l, set) + l->dispatch_send.offset + t * l->msg_bytes;
}
RSHMEM_HOST_DEVICE uint64_t ep_dispatch_recv_msg(const ep_layout_t *l, uint64_t set, uint64_t src,
                                                 uint64_t slot) {
  return ep_set_base(l, set) + l->dispatch_recv.offset + (src * l->slots_per_src + slot) * l->msg_bytes;
}
RSHMEM_HOST_DEVICE uint64_t ep_combine_send_row(const ep_layout_t *l, uint64_t set, uint64_t le,
                                                uint64_t row) {
  const uint64_t rows = l->num_pes * l->num_max_tokens;
  return ep_set_base(l, set) + l->combine_send.offset + (le * rows + row) * l->hidden * 2;
}
RSHMEM_HOST_DEVICE uint64_t ep_combine_recv_row(const ep_layout_t *l, uint64_t set, uint64_t t,
                                                uint64_t k) {
  return ep_set_base(l, set) + l->combine_recv.offset + (t * l->num_topk + k) * l->hidden * 2;
}
RSHMEM_HOST_DEVICE uint64_t ep_payload_offset(const ep_layout_t *) { return EP_HEADER_BYTES; }
RSHMEM_HOST_DEVICE uint64_t ep_scales_offset(const ep_layout_t *l) {
  return EP_HEADER_BYTES + l->hidden;
}
RSHMEM_HOST_DEVICE uint64_t ep_payload_bytes(const ep_layout_t *l) {
  return l->use_fp8 ? l->hidden + l->hidden / EP_FP8_GROUP * 4 : l->hidden * 2;
}
