//! Property tests of the WQE builders and parser: every valid WQE parses back to what was
//! built (also after a trip through a ring with wrap-around), and arbitrary bytes never
//! panic the parser — every rejection names LOCAL_LENGTH or LOCAL_QP_OP.

use proptest::prelude::*;
use rshmem::mlx5::cqe::Syndrome;
use rshmem::mlx5::ring::{copy_from_ring, copy_into_ring, read_wqe};
use rshmem::mlx5::wqe::{
    build_wqe, opcode, parse_wqe, parse_wqe_with, DataSeg, FenceMode, Payload, RaddrSeg, Sge8,
    WqeCtrl, WqeOp, DEFAULT_MAX_INLINE, WQEBB,
};

#[derive(Debug, Clone)]
enum Owned {
    Nop,
    Dump(DataSeg),
    Write(RaddrSeg, Vec<DataSeg>),
    WriteInline(RaddrSeg, Vec<u8>),
    WriteImm(RaddrSeg, Vec<DataSeg>, u32),
    SendInline(Vec<u8>),
    Read(RaddrSeg, Vec<DataSeg>),
    Cs(RaddrSeg, u64, u64, Sge8),
    Fa(RaddrSeg, u64, Sge8),
    Mcs32(RaddrSeg, [u32; 4], Sge8),
    Mfa32(RaddrSeg, u32, u32, Sge8),
    Mcs64(RaddrSeg, [u64; 4], Sge8),
    Mfa64(RaddrSeg, u64, u64, Sge8),
}

impl Owned {
    fn op(&self) -> WqeOp<'_> {
        match self {
            Owned::Nop => WqeOp::Nop,
            Owned::Dump(local) => WqeOp::Dump { local: *local },
            Owned::Write(remote, s) => WqeOp::RdmaWrite {
                remote: *remote,
                payload: Payload::Sge(s),
            },
            Owned::WriteInline(remote, d) => WqeOp::RdmaWrite {
                remote: *remote,
                payload: Payload::Inline(d),
            },
            Owned::WriteImm(remote, s, imm) => WqeOp::RdmaWriteImm {
                remote: *remote,
                payload: Payload::Sge(s),
                imm: *imm,
            },
            Owned::SendInline(d) => WqeOp::Send {
                payload: Payload::Inline(d),
            },
            Owned::Read(remote, s) => WqeOp::RdmaRead {
                remote: *remote,
                local: s,
            },
            Owned::Cs(remote, compare, swap, result) => WqeOp::AtomicCs {
                remote: *remote,
                compare: *compare,
                swap: *swap,
                result: *result,
            },
            Owned::Fa(remote, add, result) => WqeOp::AtomicFa {
                remote: *remote,
                add: *add,
                result: *result,
            },
            Owned::Mcs32(remote, v, result) => WqeOp::MaskedCs32 {
                remote: *remote,
                swap: v[0],
                compare: v[1],
                swap_mask: v[2],
                compare_mask: v[3],
                result: *result,
            },
            Owned::Mfa32(remote, add, fb, result) => WqeOp::MaskedFa32 {
                remote: *remote,
                add: *add,
                field_boundary: *fb,
                result: *result,
            },
            Owned::Mcs64(remote, v, result) => WqeOp::MaskedCs64 {
                remote: *remote,
                swap: v[0],
                compare: v[1],
                swap_mask: v[2],
                compare_mask: v[3],
                result: *result,
            },
            Owned::Mfa64(remote, add, fb, result) => WqeOp::MaskedFa64 {
                remote: *remote,
                add: *add,
                field_boundary: *fb,
                result: *result,
            },
        }
    }
}

fn raddr() -> impl Strategy<Value = RaddrSeg> {
    (any::<u64>(), any::<u32>()).prop_map(|(a, k)| RaddrSeg::new(a, k))
}
fn sge() -> impl Strategy<Value = DataSeg> {
    // byte_count < 2^31: bit 31 would mark an inline segment.
    (0u32..0x8000_0000, any::<u32>(), any::<u64>()).prop_map(|(n, k, a)| DataSeg::new(n, k, a))
}
fn sge8() -> impl Strategy<Value = Sge8> {
    (any::<u64>(), any::<u32>()).prop_map(|(addr, lkey)| Sge8 { addr, lkey })
}
fn inline_data() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..=DEFAULT_MAX_INLINE as usize)
}

fn owned() -> impl Strategy<Value = Owned> {
    let sges = || proptest::collection::vec(sge(), 0..=8);
    prop_oneof![
        Just(Owned::Nop),
        sge().prop_map(Owned::Dump),
        (raddr(), sges()).prop_map(|(r, s)| Owned::Write(r, s)),
        (raddr(), inline_data()).prop_map(|(r, d)| Owned::WriteInline(r, d)),
        (raddr(), sges(), any::<u32>()).prop_map(|(r, s, i)| Owned::WriteImm(r, s, i)),
        inline_data().prop_map(Owned::SendInline),
        (raddr(), sges()).prop_map(|(r, s)| Owned::Read(r, s)),
        (raddr(), any::<u64>(), any::<u64>(), sge8())
            .prop_map(|(r, c, s, g)| Owned::Cs(r, c, s, g)),
        (raddr(), any::<u64>(), sge8()).prop_map(|(r, a, g)| Owned::Fa(r, a, g)),
        (raddr(), any::<[u32; 4]>(), sge8()).prop_map(|(r, v, g)| Owned::Mcs32(r, v, g)),
        (raddr(), any::<u32>(), any::<u32>(), sge8())
            .prop_map(|(r, a, b, g)| Owned::Mfa32(r, a, b, g)),
        (raddr(), any::<[u64; 4]>(), sge8()).prop_map(|(r, v, g)| Owned::Mcs64(r, v, g)),
        (raddr(), any::<u64>(), any::<u64>(), sge8())
            .prop_map(|(r, a, b, g)| Owned::Mfa64(r, a, b, g)),
    ]
}

fn ctrl() -> impl Strategy<Value = WqeCtrl> {
    (
        any::<u16>(),
        0u32..=0xff_ffff,
        0u8..5,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(i, q, f, ce, se)| {
            let fence = [
                FenceMode::None,
                FenceMode::InitiatorSmall,
                FenceMode::Fence,
                FenceMode::StrongOrdering,
                FenceMode::SmallAndFence,
            ][f as usize];
            WqeCtrl {
                wqe_index: i,
                qpn: q,
                fence,
                cq_update: ce,
                solicited: se,
            }
        })
}

const KNOWN: [u8; 11] = [
    opcode::NOP,
    opcode::DUMP,
    opcode::RDMA_WRITE,
    opcode::RDMA_WRITE_IMM,
    opcode::SEND,
    opcode::SEND_IMM,
    opcode::RDMA_READ,
    opcode::ATOMIC_CS,
    opcode::ATOMIC_FA,
    opcode::ATOMIC_MASKED_CS,
    opcode::ATOMIC_MASKED_FA,
];

fn check_rejection_or_rebuild(bytes: &[u8]) {
    match parse_wqe(bytes) {
        Err(e) => {
            assert!(
                matches!(e.syndrome(), Syndrome::LocalLength | Syndrome::LocalQpOp),
                "{e:?}"
            );
            assert!(!e.to_string().is_empty());
        }
        Ok(p) => {
            // Whatever parses, the builders re-encode to something that parses the same.
            let c = p.ctrl;
            let mut buf = vec![0u8; 1024];
            let ctrl = WqeCtrl {
                wqe_index: c.wqe_index(),
                qpn: c.qpn(),
                ..Default::default()
            };
            let size = build_wqe(&mut buf, &ctrl, &p.op).expect("rebuild");
            if p.op != WqeOp::Nop {
                assert_eq!(size, p.size);
            }
            assert_eq!(parse_wqe(&buf).expect("reparse").op, p.op);
        }
    }
}

proptest! {
    #[test]
    fn built_wqes_parse_back(c in ctrl(), o in owned()) {
        let op = o.op();
        let mut buf = vec![0xa5u8; 16 * WQEBB];
        let size = build_wqe(&mut buf, &c, &op).expect("build");
        prop_assert!(size.wqebbs() as usize <= 16);
        prop_assert!(buf[size.ds as usize * 16..size.bytes()].iter().all(|&b| b == 0));
        let p = parse_wqe(&buf[..size.bytes()]).expect("parse");
        prop_assert_eq!(p.op, op);
        prop_assert_eq!(p.size, size);
        prop_assert_eq!(p.ctrl.opcode(), op.opcode());
        prop_assert_eq!(p.ctrl.opmod(), op.opmod());
        prop_assert_eq!(p.ctrl.wqe_index(), c.wqe_index);
        prop_assert_eq!(p.ctrl.qpn(), c.qpn);
        prop_assert_eq!(p.ctrl.fm_ce_se, c.fm_ce_se());
        prop_assert_eq!(p.ctrl.fence(), Some(c.fence));
        prop_assert_eq!(p.ctrl.imm.get(), op.imm());
    }

    #[test]
    fn wqes_survive_a_wrapping_ring(c in ctrl(), o in owned(), log_cnt in 4u32..7, index in any::<u32>()) {
        let op = o.op();
        let wqe_cnt = 1usize << log_cnt;
        let mut w = vec![0u8; 16 * WQEBB];
        let size = build_wqe(&mut w, &c, &op).expect("build");
        let mut ring = vec![0u8; wqe_cnt * WQEBB];
        copy_into_ring(&mut ring, wqe_cnt, index, &w[..size.bytes()]).expect("into ring");
        let back = read_wqe(&ring, wqe_cnt, index).expect("read");
        let mut raw = vec![0u8; size.bytes()];
        copy_from_ring(&ring, wqe_cnt, index, &mut raw).expect("out of ring");
        prop_assert_eq!(&raw, &w[..size.bytes()]);
        prop_assert_eq!(parse_wqe(&back).expect("parse").op, op);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
        check_rejection_or_rebuild(&bytes);
    }

    #[test]
    fn random_segments_behind_a_plausible_ctrl_never_panic(
        op in proptest::sample::select(KNOWN.to_vec()),
        opmod in prop_oneof![Just(0u8), Just(8), Just(9), any::<u8>()],
        ds in prop_oneof![1u8..=6, any::<u8>()],
        inline_first in any::<bool>(),
        inline_len in prop_oneof![0u32..64, any::<u32>()],
        tail in proptest::collection::vec(any::<u8>(), 0..400),
        max_inline in prop_oneof![Just(DEFAULT_MAX_INLINE), 0u32..512],
    ) {
        let mut b = vec![0u8; 16];
        b[0..4].copy_from_slice(&(((opmod as u32) << 24) | 0x0100 | op as u32).to_be_bytes());
        b[4..8].copy_from_slice(&((0x42 << 8) | ds as u32).to_be_bytes());
        if inline_first {
            b.extend_from_slice(&[0; 16]); // raddr for writes, ignored otherwise
            b.extend_from_slice(&(inline_len | 0x8000_0000).to_be_bytes());
        }
        b.extend_from_slice(&tail);
        check_rejection_or_rebuild(&b);
        if let Err(e) = parse_wqe_with(&b, max_inline) {
            prop_assert!(matches!(e.syndrome(), Syndrome::LocalLength | Syndrome::LocalQpOp));
        }
    }
}
