//! rdma-core's mlx5dv.h as the oracle: struct sizes and offsets, constants and the byte
//! images of its inline helpers, compared with the Rust definitions. Fails (never skips)
//! when the header is missing.

mod mlx5_support;

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

use mlx5_support::{compile, hex, run_pairs, MLX5DV_H};
use rshmem::mlx5::cqe::{Cqe64, CqeOpcode, ErrCqe, Syndrome, CQE_SIZE};
use rshmem::mlx5::wqe::{
    self, opcode, AtomicSeg, CtrlSeg, DataSeg, FenceMode, InlineHdr, RaddrSeg, CTRL_CQ_UPDATE,
    CTRL_SOLICITED, INLINE_SEG, WQEBB,
};
use rshmem::mlx5::{Be32, WireStruct};

fn oracle() -> BTreeMap<String, String> {
    assert!(
        std::path::Path::new(MLX5DV_H).exists(),
        "{MLX5DV_H} is missing: the mlx5 oracle tests need rdma-core's headers; \
         install them with `apt-get install libibverbs-dev`"
    );
    let bin = compile("cc", "oracle.c", &[]);
    run_pairs(&bin).into_iter().collect()
}

#[test]
fn layouts_match_rdma_core() {
    let o = oracle();
    let mut rust: Vec<(&str, usize)> = vec![
        ("sizeof.mlx5_wqe_ctrl_seg", size_of::<CtrlSeg>()),
        (
            "mlx5_wqe_ctrl_seg.opmod_idx_opcode",
            offset_of!(CtrlSeg, opmod_idx_opcode),
        ),
        ("mlx5_wqe_ctrl_seg.qpn_ds", offset_of!(CtrlSeg, qpn_ds)),
        (
            "mlx5_wqe_ctrl_seg.signature",
            offset_of!(CtrlSeg, signature),
        ),
        (
            "mlx5_wqe_ctrl_seg.dci_stream_channel_id",
            offset_of!(CtrlSeg, dci_stream_channel_id),
        ),
        ("mlx5_wqe_ctrl_seg.fm_ce_se", offset_of!(CtrlSeg, fm_ce_se)),
        ("mlx5_wqe_ctrl_seg.imm", offset_of!(CtrlSeg, imm)),
        ("sizeof.mlx5_wqe_raddr_seg", size_of::<RaddrSeg>()),
        ("mlx5_wqe_raddr_seg.raddr", offset_of!(RaddrSeg, raddr)),
        ("mlx5_wqe_raddr_seg.rkey", offset_of!(RaddrSeg, rkey)),
        (
            "mlx5_wqe_raddr_seg.reserved",
            offset_of!(RaddrSeg, reserved),
        ),
        ("sizeof.mlx5_wqe_data_seg", size_of::<DataSeg>()),
        (
            "mlx5_wqe_data_seg.byte_count",
            offset_of!(DataSeg, byte_count),
        ),
        ("mlx5_wqe_data_seg.lkey", offset_of!(DataSeg, lkey)),
        ("mlx5_wqe_data_seg.addr", offset_of!(DataSeg, addr)),
        ("sizeof.mlx5_wqe_atomic_seg", size_of::<AtomicSeg>()),
        (
            "mlx5_wqe_atomic_seg.swap_add",
            offset_of!(AtomicSeg, swap_add),
        ),
        (
            "mlx5_wqe_atomic_seg.compare",
            offset_of!(AtomicSeg, compare),
        ),
        ("sizeof.mlx5_wqe_inl_data_seg", size_of::<InlineHdr>()),
        (
            "mlx5_wqe_inl_data_seg.byte_count",
            offset_of!(InlineHdr, byte_count),
        ),
        ("sizeof.mlx5_cqe64", size_of::<Cqe64>()),
        ("mlx5_cqe64.srqn_uidx", offset_of!(Cqe64, srqn_uidx)),
        (
            "mlx5_cqe64.imm_inval_pkey",
            offset_of!(Cqe64, imm_inval_pkey),
        ),
        ("mlx5_cqe64.app", offset_of!(Cqe64, app)),
        ("mlx5_cqe64.app_op", offset_of!(Cqe64, app_op)),
        ("mlx5_cqe64.app_info", offset_of!(Cqe64, app_info)),
        ("mlx5_cqe64.byte_cnt", offset_of!(Cqe64, byte_cnt)),
        ("mlx5_cqe64.timestamp", offset_of!(Cqe64, timestamp)),
        ("mlx5_cqe64.sop_drop_qpn", offset_of!(Cqe64, sop_drop_qpn)),
        ("mlx5_cqe64.wqe_counter", offset_of!(Cqe64, wqe_counter)),
        ("mlx5_cqe64.signature", offset_of!(Cqe64, signature)),
        ("mlx5_cqe64.op_own", offset_of!(Cqe64, op_own)),
        ("sizeof.mlx5_err_cqe", size_of::<ErrCqe>()),
        ("mlx5_err_cqe.srqn", offset_of!(ErrCqe, srqn)),
        (
            "mlx5_err_cqe.vendor_err_synd",
            offset_of!(ErrCqe, vendor_err_synd),
        ),
        ("mlx5_err_cqe.syndrome", offset_of!(ErrCqe, syndrome)),
        (
            "mlx5_err_cqe.s_wqe_opcode_qpn",
            offset_of!(ErrCqe, s_wqe_opcode_qpn),
        ),
        ("mlx5_err_cqe.wqe_counter", offset_of!(ErrCqe, wqe_counter)),
        ("mlx5_err_cqe.signature", offset_of!(ErrCqe, signature)),
        ("mlx5_err_cqe.op_own", offset_of!(ErrCqe, op_own)),
    ];
    rust.push(("MLX5_SEND_WQE_BB", WQEBB));
    rust.push(("MLX5_SEND_WQE_SHIFT", WQEBB.trailing_zeros() as usize));
    rust.push(("MLX5_INLINE_SEG", INLINE_SEG as usize));
    rust.push(("MLX5_WQE_CTRL_CQ_UPDATE", CTRL_CQ_UPDATE as usize));
    rust.push(("MLX5_WQE_CTRL_SOLICITED", CTRL_SOLICITED as usize));
    // The trap: rdma-core's FENCE is our SmallAndFence (0x80), not Fence (0x40).
    rust.push((
        "MLX5_WQE_CTRL_FENCE",
        FenceMode::SmallAndFence.bits() as usize,
    ));
    rust.push((
        "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",
        FenceMode::InitiatorSmall.bits() as usize,
    ));
    assert_eq!(FenceMode::Fence.bits(), 0x40);
    assert_eq!(CQE_SIZE, 64);
    for (k, v) in rust {
        assert_eq!(
            o.get(k).map(String::as_str),
            Some(v.to_string().as_str()),
            "{k}"
        );
    }
}

#[test]
fn constants_match_rdma_core() {
    let o = oracle();
    let get = |k: &str| -> u64 {
        o.get(k)
            .unwrap_or_else(|| panic!("oracle lacks {k}"))
            .parse()
            .unwrap()
    };
    // Every MLX5_OPCODE_* rdma-core defines has our value and name.
    let mut n = 0;
    for (k, _) in o.iter().filter(|(k, _)| k.starts_with("MLX5_OPCODE_")) {
        let name = &k["MLX5_OPCODE_".len()..];
        let v = get(k) as u8;
        assert_eq!(opcode::name(v), Some(name), "{k} = {v:#x}");
        n += 1;
    }
    assert_eq!(n, 20);
    for op in [
        CqeOpcode::Req,
        CqeOpcode::RespWrImm,
        CqeOpcode::RespSend,
        CqeOpcode::RespSendImm,
        CqeOpcode::RespSendInv,
        CqeOpcode::ReqErr,
        CqeOpcode::RespErr,
        CqeOpcode::Invalid,
    ] {
        assert_eq!(get(&format!("MLX5_CQE_{}", op.name())), op as u64, "{op:?}");
    }
    assert_eq!(get("MLX5_CQE_OWNER_MASK"), 1);
    for s in Syndrome::ALL {
        assert_eq!(
            get(&format!("MLX5_CQE_SYNDROME_{}_ERR", s.name())),
            s as u64,
            "{s:?}"
        );
    }
    assert_eq!(
        o.keys()
            .filter(|k| k.starts_with("MLX5_CQE_SYNDROME_"))
            .count(),
        Syndrome::ALL.len()
    );
    // mlx5dv_get_cqe_opcode / owner on op_own 0xd0 with owner set.
    assert_eq!(get("cqe.op_own"), 0xd1);
    let mut c = Cqe64 {
        op_own: 0xd1,
        ..Default::default()
    };
    assert_eq!(
        (c.owner() as u64, c.opcode() as u64),
        (get("cqe.owner"), get("cqe.opcode"))
    );
    c.op_own = 0;
    assert_eq!(c.opcode(), 0);
}

#[test]
fn helper_byte_images_match_rdma_core() {
    let o = oracle();
    let img = |k: &str| {
        o.get(k)
            .unwrap_or_else(|| panic!("oracle lacks {k}"))
            .clone()
    };
    // The two images given in MLX5.md, from rdma-core and from Rust.
    assert_eq!(img("img.ctrl_md"), "08123408abcdef030000000800000000");
    assert_eq!(img("img.data_md"), "00000100112233440102030405060708");
    let ctrl = CtrlSeg::new(0x1234, 0x08, 0x08, 0xabcdef, 0x08, 3, 0, Be32::new(0));
    assert_eq!(hex(ctrl.as_bytes()), img("img.ctrl_md"));
    let data = DataSeg::new(0x100, 0x1122_3344, 0x0102_0304_0506_0708);
    assert_eq!(hex(data.as_bytes()), img("img.data_md"));
    // imm passed big-endian, signature, all three flag bits.
    let ctrl = CtrlSeg::new(
        0xffff,
        opcode::RDMA_WRITE_IMM,
        0,
        0x42,
        CTRL_CQ_UPDATE | CTRL_SOLICITED | FenceMode::SmallAndFence.bits(),
        3,
        0x5a,
        Be32::new(0xcafe_f00d),
    );
    assert_eq!(hex(ctrl.as_bytes()), img("img.ctrl_imm"));
    assert_eq!(
        hex(DataSeg::new(8, 0x55aa_55aa, 0x7f00_1234_5678).as_bytes()),
        img("img.data_atomic")
    );
    assert_eq!(
        hex(RaddrSeg::new(0x1122_3344_5566_7788, 0xdead_beef).as_bytes()),
        img("img.raddr")
    );
    let a = AtomicSeg {
        swap_add: 0x5555_6666_7777_8888u64.into(),
        compare: 0x1111_2222_3333_4444u64.into(),
    };
    assert_eq!(hex(a.as_bytes()), img("img.atomic"));
    // A whole builder WQE contains those images segment by segment.
    let mut b = [0u8; 64];
    let c = wqe::WqeCtrl {
        wqe_index: 0x1234,
        qpn: 0xabcdef,
        cq_update: true,
        ..Default::default()
    };
    wqe::rdma_write(
        &mut b,
        &c,
        RaddrSeg::new(0x1122_3344_5566_7788, 0xdead_beef),
        data,
    )
    .unwrap();
    assert_eq!(hex(&b[16..32]), img("img.raddr"));
    assert_eq!(hex(&b[32..48]), img("img.data_md"));
}
