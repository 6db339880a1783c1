/* Prints rdma-core's own mlx5 facts (from /usr/include/infiniband/mlx5dv.h) as
 * "key value" lines: struct sizes and offsetof, constants, and byte images produced by its
 * inline helpers. host/tests/mlx5_oracle.rs compares each line with the Rust definitions. */
#include <infiniband/mlx5dv.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define P(name, v) printf("%s %llu\n", name, (unsigned long long)(v))
#define OFF(s, f) P(#s "." #f, offsetof(struct s, f))
#define SZ(s) P("sizeof." #s, sizeof(struct s))

static void hex(const char *name, const void *p, size_t n) {
    const unsigned char *b = p;
    printf("%s ", name);
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    printf("\n");
}

int main(void) {
    SZ(mlx5_wqe_ctrl_seg);
    OFF(mlx5_wqe_ctrl_seg, opmod_idx_opcode);
    OFF(mlx5_wqe_ctrl_seg, qpn_ds);
    OFF(mlx5_wqe_ctrl_seg, signature);
    OFF(mlx5_wqe_ctrl_seg, dci_stream_channel_id);
    OFF(mlx5_wqe_ctrl_seg, fm_ce_se);
    OFF(mlx5_wqe_ctrl_seg, imm);
    SZ(mlx5_wqe_raddr_seg);
    OFF(mlx5_wqe_raddr_seg, raddr);
    OFF(mlx5_wqe_raddr_seg, rkey);
    OFF(mlx5_wqe_raddr_seg, reserved);
    SZ(mlx5_wqe_data_seg);
    OFF(mlx5_wqe_data_seg, byte_count);
    OFF(mlx5_wqe_data_seg, lkey);
    OFF(mlx5_wqe_data_seg, addr);
    SZ(mlx5_wqe_atomic_seg);
    OFF(mlx5_wqe_atomic_seg, swap_add);
    OFF(mlx5_wqe_atomic_seg, compare);
    SZ(mlx5_wqe_inl_data_seg);
    OFF(mlx5_wqe_inl_data_seg, byte_count);
    SZ(mlx5_cqe64);
    OFF(mlx5_cqe64, srqn_uidx);
    OFF(mlx5_cqe64, imm_inval_pkey);
    OFF(mlx5_cqe64, app);
    OFF(mlx5_cqe64, app_op);
    OFF(mlx5_cqe64, app_info);
    OFF(mlx5_cqe64, byte_cnt);
    OFF(mlx5_cqe64, timestamp);
    OFF(mlx5_cqe64, sop_drop_qpn);
    OFF(mlx5_cqe64, wqe_counter);
    OFF(mlx5_cqe64, signature);
    OFF(mlx5_cqe64, op_own);
    SZ(mlx5_err_cqe);
    OFF(mlx5_err_cqe, srqn);
    OFF(mlx5_err_cqe, vendor_err_synd);
    OFF(mlx5_err_cqe, syndrome);
    OFF(mlx5_err_cqe, s_wqe_opcode_qpn);
    OFF(mlx5_err_cqe, wqe_counter);
    OFF(mlx5_err_cqe, signature);
    OFF(mlx5_err_cqe, op_own);

    P("MLX5_OPCODE_NOP", MLX5_OPCODE_NOP);
    P("MLX5_OPCODE_SEND_INVAL", MLX5_OPCODE_SEND_INVAL);
    P("MLX5_OPCODE_RDMA_WRITE", MLX5_OPCODE_RDMA_WRITE);
    P("MLX5_OPCODE_RDMA_WRITE_IMM", MLX5_OPCODE_RDMA_WRITE_IMM);
    P("MLX5_OPCODE_SEND", MLX5_OPCODE_SEND);
    P("MLX5_OPCODE_SEND_IMM", MLX5_OPCODE_SEND_IMM);
    P("MLX5_OPCODE_TSO", MLX5_OPCODE_TSO);
    P("MLX5_OPCODE_RDMA_READ", MLX5_OPCODE_RDMA_READ);
    P("MLX5_OPCODE_ATOMIC_CS", MLX5_OPCODE_ATOMIC_CS);
    P("MLX5_OPCODE_ATOMIC_FA", MLX5_OPCODE_ATOMIC_FA);
    P("MLX5_OPCODE_ATOMIC_MASKED_CS", MLX5_OPCODE_ATOMIC_MASKED_CS);
    P("MLX5_OPCODE_ATOMIC_MASKED_FA", MLX5_OPCODE_ATOMIC_MASKED_FA);
    P("MLX5_OPCODE_FMR", MLX5_OPCODE_FMR);
    P("MLX5_OPCODE_LOCAL_INVAL", MLX5_OPCODE_LOCAL_INVAL);
    P("MLX5_OPCODE_CONFIG_CMD", MLX5_OPCODE_CONFIG_CMD);
    P("MLX5_OPCODE_SET_PSV", MLX5_OPCODE_SET_PSV);
    P("MLX5_OPCODE_UMR", MLX5_OPCODE_UMR);
    P("MLX5_OPCODE_TAG_MATCHING", MLX5_OPCODE_TAG_MATCHING);
    P("MLX5_OPCODE_FLOW_TBL_ACCESS", MLX5_OPCODE_FLOW_TBL_ACCESS);
    P("MLX5_OPCODE_MMO", MLX5_OPCODE_MMO);

    P("MLX5_CQE_REQ", MLX5_CQE_REQ);
    P("MLX5_CQE_RESP_WR_IMM", MLX5_CQE_RESP_WR_IMM);
    P("MLX5_CQE_RESP_SEND", MLX5_CQE_RESP_SEND);
    P("MLX5_CQE_RESP_SEND_IMM", MLX5_CQE_RESP_SEND_IMM);
    P("MLX5_CQE_RESP_SEND_INV", MLX5_CQE_RESP_SEND_INV);
    P("MLX5_CQE_REQ_ERR", MLX5_CQE_REQ_ERR);
    P("MLX5_CQE_RESP_ERR", MLX5_CQE_RESP_ERR);
    P("MLX5_CQE_INVALID", MLX5_CQE_INVALID);
    P("MLX5_CQE_OWNER_MASK", MLX5_CQE_OWNER_MASK);

    P("MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR", MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    P("MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR", MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    P("MLX5_CQE_SYNDROME_LOCAL_PROT_ERR", MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
    P("MLX5_CQE_SYNDROME_WR_FLUSH_ERR", MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    P("MLX5_CQE_SYNDROME_MW_BIND_ERR", MLX5_CQE_SYNDROME_MW_BIND_ERR);
    P("MLX5_CQE_SYNDROME_BAD_RESP_ERR", MLX5_CQE_SYNDROME_BAD_RESP_ERR);
    P("MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR", MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR);
    P("MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR", MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
    P("MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR", MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    P("MLX5_CQE_SYNDROME_REMOTE_OP_ERR", MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
    P("MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR", MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
    P("MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR", MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
    P("MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR", MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR);

    P("MLX5_WQE_CTRL_CQ_UPDATE", MLX5_WQE_CTRL_CQ_UPDATE);
    P("MLX5_WQE_CTRL_SOLICITED", MLX5_WQE_CTRL_SOLICITED);
    P("MLX5_WQE_CTRL_FENCE", MLX5_WQE_CTRL_FENCE);
    P("MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE", MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE);
    P("MLX5_SEND_WQE_BB", MLX5_SEND_WQE_BB);
    P("MLX5_SEND_WQE_SHIFT", MLX5_SEND_WQE_SHIFT);
    P("MLX5_INLINE_SEG", MLX5_INLINE_SEG);

    /* Byte images from rdma-core's inline helpers. */
    struct mlx5_wqe_ctrl_seg ctrl;
    memset(&ctrl, 0xcc, sizeof ctrl);
    /* MLX5.md oracle image (dci_stream_channel_id is not touched by the helper). */
    ctrl.dci_stream_channel_id = 0;
    mlx5dv_set_ctrl_seg(&ctrl, 0x1234, 0x08, 0x08, 0xabcdef, 0x08, 3, 0, 0);
    hex("img.ctrl_md", &ctrl, sizeof ctrl);
    ctrl.dci_stream_channel_id = 0;
    mlx5dv_set_ctrl_seg(&ctrl, 0xffff, MLX5_OPCODE_RDMA_WRITE_IMM, 0, 0x42,
                        MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED | MLX5_WQE_CTRL_FENCE,
                        3, 0x5a, htobe32(0xcafef00d));
    hex("img.ctrl_imm", &ctrl, sizeof ctrl);

    struct mlx5_wqe_data_seg data;
    mlx5dv_set_data_seg(&data, 0x100, 0x11223344, 0x0102030405060708ull);
    hex("img.data_md", &data, sizeof data);
    mlx5dv_set_data_seg(&data, 8, 0x55aa55aa, 0x00007f0012345678ull);
    hex("img.data_atomic", &data, sizeof data);

    /* rdma-core has no remote-address helper; fill the struct the way qp.c does. */
    struct mlx5_wqe_raddr_seg raddr;
    memset(&raddr, 0, sizeof raddr);
    raddr.raddr = htobe64(0x1122334455667788ull);
    raddr.rkey = htobe32(0xdeadbeef);
    hex("img.raddr", &raddr, sizeof raddr);

    struct mlx5_wqe_atomic_seg atomic;
    atomic.swap_add = htobe64(0x5555666677778888ull);
    atomic.compare = htobe64(0x1111222233334444ull);
    hex("img.atomic", &atomic, sizeof atomic);

    /* CQE accessors. */
    struct mlx5_cqe64 cqe;
    memset(&cqe, 0, sizeof cqe);
    cqe.op_own = 0xd0;
    mlx5dv_set_cqe_owner(&cqe, 1);
    P("cqe.owner", mlx5dv_get_cqe_owner(&cqe));
    P("cqe.opcode", mlx5dv_get_cqe_opcode(&cqe));
    P("cqe.op_own", cqe.op_own);
    return 0;
}
