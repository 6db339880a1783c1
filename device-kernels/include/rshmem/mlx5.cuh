// rshmem/mlx5.cuh — mlx5 send-queue WQE encoders, CQE and doorbell words, for device and
// host code.
//
// The CUDA C++ twin of the Rust module `rshmem::mlx5` (host/src/mlx5/): same segment
// layouts, same builder names (snake_case, namespace rshmem::mlx5), same bytes — checked by
// host/tests/mlx5_cpp_parity.rs, which compiles this header with plain g++. Facts:
// shared/design/MLX5.md. All multi-byte wire fields are big-endian; byte swapping is
// portable shift code (compilers turn it into bswap / prmt).
//
// Builders write one complete WQE at `wqe` (contiguous: the caller handles ring wrap for
// multi-WQEBB WQEs), zero the rest of its last WQEBB, and return its ds (16-B units incl.
// the control segment; the producer index advances by wqebbs(ds)). They do not fence or
// ring doorbells: the send-queue code orders WQE stores → dbrec → doorbell.
#pragma once

#include <stddef.h>
#include <stdint.h>
#if !defined(__CUDACC_RTC__)  // NVRTC declares memcpy itself and has no string.h
#include <string.h>
#endif

#ifdef __CUDACC__
#define RSHMEM_MLX5_FN __host__ __device__ __forceinline__
#else
#define RSHMEM_MLX5_FN inline
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "rshmem/mlx5.cuh assumes a little-endian host and device"
#endif

namespace rshmem {
namespace mlx5 {

constexpr uint32_t WQEBB = 64;
constexpr uint32_t DS_BYTES = 16;
constexpr uint32_t MAX_WQEBBS = 16;
constexpr uint32_t MAX_DS = 64;
constexpr uint32_t INLINE_SEG = 0x80000000u;
constexpr uint8_t CTRL_SOLICITED = 0x02;
constexpr uint8_t CTRL_CQ_UPDATE = 0x08;
constexpr uint8_t OPMOD_MASKED_4B = 0x08;
constexpr uint8_t OPMOD_MASKED_8B = 0x09;
constexpr uint32_t BF_OFFSET = 0x800;
constexpr uint32_t CQE_SIZE = 64;
constexpr uint8_t OP_OWN_INIT = 0xF0;

namespace opcode {
constexpr uint8_t NOP = 0x00;
constexpr uint8_t RDMA_WRITE = 0x08;
constexpr uint8_t RDMA_WRITE_IMM = 0x09;
constexpr uint8_t SEND = 0x0a;
constexpr uint8_t SEND_IMM = 0x0b;
constexpr uint8_t RDMA_READ = 0x10;
constexpr uint8_t ATOMIC_CS = 0x11;
constexpr uint8_t ATOMIC_FA = 0x12;
constexpr uint8_t ATOMIC_MASKED_CS = 0x14;
constexpr uint8_t ATOMIC_MASKED_FA = 0x15;
constexpr uint8_t DUMP = 0x23;
constexpr uint8_t UMR = 0x25;
}  // namespace opcode

// Fence mode, bits 7:5 of fm_ce_se. rdma-core's MLX5_WQE_CTRL_FENCE (0x80) is
// SMALL_AND_FENCE; the kernel's MLX5_FENCE_MODE_FENCE (0x40) is FENCE.
enum class fence_mode : uint8_t {
    none = 0,
    initiator_small = 1,
    fence = 2,
    strong_ordering = 3,
    small_and_fence = 4,
};

RSHMEM_MLX5_FN uint16_t bswap16(uint16_t v) { return (uint16_t)((v >> 8) | (v << 8)); }
RSHMEM_MLX5_FN uint32_t bswap32(uint32_t v) {
    return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}
RSHMEM_MLX5_FN uint64_t bswap64(uint64_t v) {
    return ((uint64_t)bswap32((uint32_t)v) << 32) | bswap32((uint32_t)(v >> 32));
}

// Big-endian wire integers: `raw` holds the wire bytes in memory order.
struct be16 { uint16_t raw; };
struct be32 { uint32_t raw; };
struct be64 { uint64_t raw; };
RSHMEM_MLX5_FN be16 to_be16(uint16_t v) { return be16{bswap16(v)}; }
RSHMEM_MLX5_FN be32 to_be32(uint32_t v) { return be32{bswap32(v)}; }
RSHMEM_MLX5_FN be64 to_be64(uint64_t v) { return be64{bswap64(v)}; }
RSHMEM_MLX5_FN uint16_t from_be(be16 v) { return bswap16(v.raw); }
RSHMEM_MLX5_FN uint32_t from_be(be32 v) { return bswap32(v.raw); }
RSHMEM_MLX5_FN uint64_t from_be(be64 v) { return bswap64(v.raw); }

// struct mlx5_wqe_ctrl_seg (16 B).
struct ctrl_seg {
    be32 opmod_idx_opcode;  // 31:24 opmod, 23:8 WQE index, 7:0 opcode
    be32 qpn_ds;            // 31:8 QP number, 7:0 ds
    uint8_t signature;
    uint8_t dci_stream_channel_id[2];
    uint8_t fm_ce_se;
    be32 imm;  // stored as given (big-endian)
};
struct raddr_seg { be64 raddr; be32 rkey; be32 reserved; };      // mlx5_wqe_raddr_seg
struct data_seg { be32 byte_count; be32 lkey; be64 addr; };      // mlx5_wqe_data_seg
struct inline_hdr { be32 byte_count; };                           // BE32(len | INLINE_SEG)
struct atomic_seg { be64 swap_add; be64 compare; };              // mlx5_wqe_atomic_seg
struct masked_cs32_seg { be32 swap; be32 compare; be32 swap_mask; be32 compare_mask; };
struct masked_fa32_seg { be32 add; be32 field_boundary; be64 reserved; };
struct masked_fa64_seg { be64 add; be64 field_boundary; };
struct masked_cs64_seg { be64 swap; be64 compare; be64 swap_mask; be64 compare_mask; };  // 2 ds

static_assert(sizeof(ctrl_seg) == 16, "ctrl_seg");
#if !defined(__CUDACC_RTC__)  // NVRTC has no offsetof; nvcc and g++ check these
static_assert(offsetof(ctrl_seg, fm_ce_se) == 11, "ctrl_seg.fm_ce_se");
static_assert(offsetof(ctrl_seg, imm) == 12, "ctrl_seg.imm");
#endif
static_assert(sizeof(raddr_seg) == 16 && sizeof(data_seg) == 16, "raddr/data");
static_assert(sizeof(atomic_seg) == 16 && sizeof(masked_cs32_seg) == 16, "atomic");
static_assert(sizeof(masked_fa32_seg) == 16 && sizeof(masked_fa64_seg) == 16, "masked fa");
static_assert(sizeof(masked_cs64_seg) == 32, "masked cs64");

// Same arguments, same order as rdma-core's mlx5dv_set_ctrl_seg (opcode before opmod).
RSHMEM_MLX5_FN ctrl_seg make_ctrl_seg(uint16_t pi, uint8_t op, uint8_t opmod, uint32_t qpn,
                                      uint8_t fm_ce_se, uint8_t ds, uint8_t signature,
                                      be32 imm) {
    ctrl_seg c;
    c.opmod_idx_opcode = to_be32(((uint32_t)opmod << 24) | ((uint32_t)pi << 8) | op);
    c.qpn_ds = to_be32(((qpn & 0xffffffu) << 8) | ds);
    c.signature = signature;
    c.dci_stream_channel_id[0] = 0;
    c.dci_stream_channel_id[1] = 0;
    c.fm_ce_se = fm_ce_se;
    c.imm = imm;
    return c;
}
RSHMEM_MLX5_FN raddr_seg make_raddr_seg(uint64_t raddr, uint32_t rkey) {
    return raddr_seg{to_be64(raddr), to_be32(rkey), be32{0}};
}
// Same argument order as mlx5dv_set_data_seg(seg, length, lkey, address).
RSHMEM_MLX5_FN data_seg make_data_seg(uint32_t byte_count, uint32_t lkey, uint64_t addr) {
    return data_seg{to_be32(byte_count), to_be32(lkey), to_be64(addr)};
}

// What a builder needs for the control segment besides opcode and ds.
struct wqe_ctrl {
    uint16_t wqe_index;  // 16-bit, wraps at 0xffff
    uint32_t qpn;        // 24 bits
    fence_mode fence;
    bool cq_update;
    bool solicited;
};
RSHMEM_MLX5_FN uint8_t fm_ce_se(const wqe_ctrl &c) {
    return (uint8_t)(((uint8_t)c.fence << 5) | (c.cq_update ? CTRL_CQ_UPDATE : 0) |
                     (c.solicited ? CTRL_SOLICITED : 0));
}

// Where an atomic's fetched old value lands (byte count = operand size).
struct sge8 { uint64_t addr; uint32_t lkey; };

RSHMEM_MLX5_FN uint32_t wqebbs(uint32_t ds) { return (ds + 3) / 4; }
RSHMEM_MLX5_FN uint32_t inline_ds(uint32_t len) { return (len + 4 + DS_BYTES - 1) / DS_BYTES; }
// Byte offset of WQE index i's slot in a ring of wqe_cnt WQEBBs (a power of two).
RSHMEM_MLX5_FN size_t slot_offset(uint32_t i, uint32_t wqe_cnt) {
    return (size_t)(i & (wqe_cnt - 1)) << 6;
}

namespace detail {
template <typename T>
RSHMEM_MLX5_FN uint8_t *put(uint8_t *p, const T &seg) {
    memcpy(p, &seg, sizeof(T));
    return p + sizeof(T);
}
// Zeroes from `end` to the end of the WQE's last WQEBB; returns ds.
RSHMEM_MLX5_FN uint8_t finish(uint8_t *wqe, uint8_t *end, uint32_t ds) {
    uint8_t *stop = wqe + wqebbs(ds) * WQEBB;
    for (uint8_t *p = end; p < stop; ++p) *p = 0;
    return (uint8_t)ds;
}
RSHMEM_MLX5_FN uint8_t *put_ctrl(uint8_t *wqe, const wqe_ctrl &c, uint8_t op, uint8_t opmod,
                                 uint32_t ds, uint32_t imm) {
    return put(wqe, make_ctrl_seg(c.wqe_index, op, opmod, c.qpn, fm_ce_se(c), (uint8_t)ds, 0,
                                  to_be32(imm)));
}
RSHMEM_MLX5_FN uint8_t *put_inline(uint8_t *p, const void *data, uint32_t len) {
    p = put(p, inline_hdr{to_be32(len | INLINE_SEG)});
    const uint8_t *d = (const uint8_t *)data;
    for (uint32_t i = 0; i < len; ++i) p[i] = d[i];
    uint32_t padded = inline_ds(len) * DS_BYTES - 4;
    for (uint32_t i = len; i < padded; ++i) p[i] = 0;
    return p + padded;
}
}  // namespace detail

// NOP: ctrl only (ds = 1).
RSHMEM_MLX5_FN uint8_t nop(uint8_t *wqe, const wqe_ctrl &c) {
    return detail::finish(wqe, detail::put_ctrl(wqe, c, opcode::NOP, 0, 1, 0), 1);
}
// NVSHMEM's DUMP flush: ctrl + one data segment (ds = 2).
RSHMEM_MLX5_FN uint8_t dump(uint8_t *wqe, const wqe_ctrl &c, data_seg local) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::DUMP, 0, 2, 0);
    return detail::finish(wqe, detail::put(p, local), 2);
}
// RDMA write of one local buffer (ds = 3).
RSHMEM_MLX5_FN uint8_t rdma_write(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                  data_seg local) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::RDMA_WRITE, 0, 3, 0);
    p = detail::put(p, remote);
    return detail::finish(wqe, detail::put(p, local), 3);
}
// RDMA write with the payload inline (ds = 2 + inline_ds(len); 3 for len <= 12).
// Returns 0 if the WQE would exceed 16 WQEBBs.
RSHMEM_MLX5_FN uint8_t rdma_write_inline(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                         const void *data, uint32_t len) {
    uint32_t ds = 2 + inline_ds(len);
    if (ds > MAX_DS) return 0;
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::RDMA_WRITE, 0, ds, 0);
    p = detail::put(p, remote);
    return detail::finish(wqe, detail::put_inline(p, data, len), ds);
}
// RDMA write with immediate (host-order imm, sent as BE32) of one local buffer (ds = 3).
RSHMEM_MLX5_FN uint8_t rdma_write_imm(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                      data_seg local, uint32_t imm) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::RDMA_WRITE_IMM, 0, 3, imm);
    p = detail::put(p, remote);
    return detail::finish(wqe, detail::put(p, local), 3);
}
// RDMA read into one local buffer (ds = 3).
RSHMEM_MLX5_FN uint8_t rdma_read(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                 data_seg local) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::RDMA_READ, 0, 3, 0);
    p = detail::put(p, remote);
    return detail::finish(wqe, detail::put(p, local), 3);
}
// 8-byte compare-and-swap (ds = 4); the old value lands at `result`.
RSHMEM_MLX5_FN uint8_t atomic_cs(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                 sge8 result, uint64_t compare, uint64_t swap) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::ATOMIC_CS, 0, 4, 0);
    p = detail::put(p, remote);
    p = detail::put(p, atomic_seg{to_be64(swap), to_be64(compare)});
    return detail::finish(wqe, detail::put(p, make_data_seg(8, result.lkey, result.addr)), 4);
}
// 8-byte fetch-add (ds = 4).
RSHMEM_MLX5_FN uint8_t atomic_fa(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                 sge8 result, uint64_t add) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::ATOMIC_FA, 0, 4, 0);
    p = detail::put(p, remote);
    p = detail::put(p, atomic_seg{to_be64(add), be64{0}});
    return detail::finish(wqe, detail::put(p, make_data_seg(8, result.lkey, result.addr)), 4);
}
// 4-byte masked compare-and-swap (opmod 0x08, ds = 4).
RSHMEM_MLX5_FN uint8_t masked_cs32(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                   sge8 result, uint32_t swap, uint32_t compare,
                                   uint32_t swap_mask, uint32_t compare_mask) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::ATOMIC_MASKED_CS, OPMOD_MASKED_4B, 4, 0);
    p = detail::put(p, remote);
    p = detail::put(p, masked_cs32_seg{to_be32(swap), to_be32(compare), to_be32(swap_mask),
                                       to_be32(compare_mask)});
    return detail::finish(wqe, detail::put(p, make_data_seg(4, result.lkey, result.addr)), 4);
}
// 4-byte masked fetch-add (opmod 0x08, ds = 4).
RSHMEM_MLX5_FN uint8_t masked_fa32(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                   sge8 result, uint32_t add, uint32_t field_boundary) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::ATOMIC_MASKED_FA, OPMOD_MASKED_4B, 4, 0);
    p = detail::put(p, remote);
    p = detail::put(p, masked_fa32_seg{to_be32(add), to_be32(field_boundary), be64{0}});
    return detail::finish(wqe, detail::put(p, make_data_seg(4, result.lkey, result.addr)), 4);
}
// 8-byte masked compare-and-swap (opmod 0x09, ds = 5: two WQEBBs).
RSHMEM_MLX5_FN uint8_t masked_cs64(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                   sge8 result, uint64_t swap, uint64_t compare,
                                   uint64_t swap_mask, uint64_t compare_mask) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::ATOMIC_MASKED_CS, OPMOD_MASKED_8B, 5, 0);
    p = detail::put(p, remote);
    p = detail::put(p, masked_cs64_seg{to_be64(swap), to_be64(compare), to_be64(swap_mask),
                                       to_be64(compare_mask)});
    return detail::finish(wqe, detail::put(p, make_data_seg(8, result.lkey, result.addr)), 5);
}
// 8-byte masked fetch-add (opmod 0x09, ds = 4).
RSHMEM_MLX5_FN uint8_t masked_fa64(uint8_t *wqe, const wqe_ctrl &c, raddr_seg remote,
                                   sge8 result, uint64_t add, uint64_t field_boundary) {
    uint8_t *p = detail::put_ctrl(wqe, c, opcode::ATOMIC_MASKED_FA, OPMOD_MASKED_8B, 4, 0);
    p = detail::put(p, remote);
    p = detail::put(p, masked_fa64_seg{to_be64(add), to_be64(field_boundary)});
    return detail::finish(wqe, detail::put(p, make_data_seg(8, result.lkey, result.addr)), 4);
}

// ---- doorbells -------------------------------------------------------------------------
// QP doorbell record [1] (send counter): BE32(pi & 0xffff).
RSHMEM_MLX5_FN be32 send_counter(uint32_t pi) { return to_be32(pi & 0xffffu); }
// CQ doorbell record [0]: BE32(ci & 0xffffff).
RSHMEM_MLX5_FN be32 cq_consumer_index(uint32_t ci) { return to_be32(ci & 0xffffffu); }
// The 8 bytes for the doorbell register {BE32(pi << 8), BE32(qpn << 8)}, as the uint64_t
// whose little-endian store writes them.
RSHMEM_MLX5_FN uint64_t doorbell_word(uint16_t pi, uint32_t qpn) {
    return (uint64_t)bswap32((uint32_t)pi << 8) | ((uint64_t)bswap32((qpn & 0xffffffu) << 8) << 32);
}

// ---- CQEs ------------------------------------------------------------------------------
// Byte offsets in a 64-B CQE (struct mlx5_cqe64 / mlx5_err_cqe).
constexpr uint32_t CQE_BYTE_CNT = 44, CQE_VENDOR_ERR_SYND = 54, CQE_SYNDROME = 55,
                   CQE_SOP_DROP_QPN = 56, CQE_WQE_COUNTER = 60, CQE_SIGNATURE = 62,
                   CQE_OP_OWN = 63;
constexpr uint8_t CQE_REQ = 0, CQE_REQ_ERR = 13, CQE_RESP_ERR = 14, CQE_INVALID = 15;
// CQE at unmasked index n of a ring of cqe_cnt (power of two) belongs to software.
RSHMEM_MLX5_FN bool sw_owns(uint8_t op_own, uint32_t n, uint32_t cqe_cnt) {
    return (op_own >> 4) != CQE_INVALID && (op_own & 1) == ((n & cqe_cnt) != 0 ? 1 : 0);
}
// Collapsed CQ: WQE idx is complete once wqe_counter has reached it (16-bit wrap).
RSHMEM_MLX5_FN bool wqe_completed(uint16_t wqe_counter, uint16_t idx) {
    return (int16_t)(uint16_t)(wqe_counter - idx) >= 0;
}

}  // namespace mlx5
}  // namespace rshmem
