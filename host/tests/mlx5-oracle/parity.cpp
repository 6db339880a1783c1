// Encodes a fixed set of WQEs with device-kernels/include/rshmem/mlx5.cuh (as host C++)
// and prints "name hex" per WQE. host/tests/mlx5_cpp_parity.rs builds the same WQEs with
// the Rust builders and requires identical bytes. Keep the two case lists in step.
#include <stdio.h>

#include "rshmem/mlx5.cuh"

using namespace rshmem::mlx5;

static void emit(const char *name, const uint8_t *wqe, uint8_t ds) {
    printf("%s ", name);
    if (ds == 0) {
        printf("error\n");
        return;
    }
    for (uint32_t i = 0; i < wqebbs(ds) * WQEBB; ++i) printf("%02x", wqe[i]);
    printf("\n");
}

int main() {
    alignas(64) uint8_t b[MAX_WQEBBS * WQEBB];
    uint8_t payload[200];
    for (int i = 0; i < 200; ++i) payload[i] = (uint8_t)(i * 7 + 1);

    const wqe_ctrl c1 = {0x1234, 0xabcdef, fence_mode::none, true, false};
    const wqe_ctrl c2 = {0xffff, 0x42, fence_mode::fence, true, false};
    const wqe_ctrl c3 = {0x0001, 0x000123, fence_mode::strong_ordering, false, true};
    const wqe_ctrl c4 = {0x8000, 0xffffff, fence_mode::small_and_fence, true, true};
    const wqe_ctrl c5 = {0x00ff, 0x7, fence_mode::initiator_small, true, false};
    const raddr_seg r = make_raddr_seg(0x1122334455667788ull, 0xdeadbeef);
    const data_seg l = make_data_seg(0x100, 0x11223344, 0x0102030405060708ull);
    const sge8 s = {0x00007f0012345678ull, 0x55aa55aa};

    memset(b, 0xcc, sizeof b); emit("nop", b, nop(b, c1));
    memset(b, 0xcc, sizeof b); emit("dump", b, dump(b, c5, make_data_seg(1, 0x99, 0x4000)));
    memset(b, 0xcc, sizeof b); emit("write", b, rdma_write(b, c2, r, l));
    memset(b, 0xcc, sizeof b); emit("write_inline_0", b, rdma_write_inline(b, c1, r, payload, 0));
    memset(b, 0xcc, sizeof b); emit("write_inline_4", b, rdma_write_inline(b, c1, r, payload, 4));
    memset(b, 0xcc, sizeof b); emit("write_inline_12", b, rdma_write_inline(b, c3, r, payload, 12));
    memset(b, 0xcc, sizeof b); emit("write_inline_13", b, rdma_write_inline(b, c3, r, payload, 13));
    memset(b, 0xcc, sizeof b); emit("write_inline_200", b, rdma_write_inline(b, c4, r, payload, 200));
    memset(b, 0xcc, sizeof b); emit("write_imm", b, rdma_write_imm(b, c3, r, l, 0xcafef00d));
    memset(b, 0xcc, sizeof b); emit("read", b, rdma_read(b, c4, r, l));
    memset(b, 0xcc, sizeof b);
    emit("atomic_cs", b, atomic_cs(b, c2, r, s, 0x1111222233334444ull, 0x5555666677778888ull));
    memset(b, 0xcc, sizeof b); emit("atomic_fa", b, atomic_fa(b, c5, r, s, 7));
    memset(b, 0xcc, sizeof b);
    emit("masked_cs32", b, masked_cs32(b, c1, r, s, 0xa1a2a3a4, 0xb1b2b3b4, 0xc1c2c3c4, 0xd1d2d3d4));
    memset(b, 0xcc, sizeof b); emit("masked_fa32", b, masked_fa32(b, c2, r, s, 0x10, 0x80008000));
    memset(b, 0xcc, sizeof b);
    emit("masked_cs64", b,
         masked_cs64(b, c4, r, s, 0x0102030405060708ull, 0x1112131415161718ull,
                     0x2122232425262728ull, 0x3132333435363738ull));
    memset(b, 0xcc, sizeof b);
    emit("masked_fa64", b, masked_fa64(b, c5, r, s, 0xfffffffffffffffeull, 0x8000000000000000ull));

    // Doorbell and CQ words.
    uint64_t db = doorbell_word(0x1234, 0xabcdef);
    uint8_t dbb[8];
    memcpy(dbb, &db, 8);
    printf("doorbell_bytes ");
    for (int i = 0; i < 8; ++i) printf("%02x", dbb[i]);
    printf("\n");
    printf("doorbell_word %016llx\n", (unsigned long long)db);
    printf("send_counter %08x\n", send_counter(0x12345).raw);
    printf("cq_ci %08x\n", cq_consumer_index(0x12345678).raw);
    printf("sw_owns %d%d%d%d\n", sw_owns(0x00, 3, 8), sw_owns(0x01, 11, 8), sw_owns(0xf0, 0, 8),
           sw_owns(0x00, 11, 8));
    printf("wqe_completed %d%d%d\n", wqe_completed(2, 0xfffe), wqe_completed(0xfffe, 2),
           wqe_completed(5, 5));
    return 0;
}
