//! The CUDA C++ header `device-kernels/include/rshmem/mlx5.cuh`, compiled as host C++ with
//! g++, must encode exactly the bytes the Rust builders encode. The case list mirrors
//! host/tests/mlx5-oracle/parity.cpp.

mod mlx5_support;

use std::collections::BTreeMap;

use mlx5_support::{compile, hex, run_pairs};
use rshmem::mlx5::cqe::{sw_owns, wqe_completed};
use rshmem::mlx5::doorbell::{cq_consumer_index, doorbell_bytes, doorbell_word, send_counter};
use rshmem::mlx5::wqe::{
    self, build_wqe, parse_wqe, DataSeg, FenceMode, RaddrSeg, Sge8, WqeCtrl, WqeOp,
};

fn ctrl(wqe_index: u16, qpn: u32, fence: FenceMode, cq_update: bool, solicited: bool) -> WqeCtrl {
    WqeCtrl {
        wqe_index,
        qpn,
        fence,
        cq_update,
        solicited,
    }
}

fn rust_cases() -> Vec<(&'static str, Vec<u8>)> {
    let c1 = ctrl(0x1234, 0xabcdef, FenceMode::None, true, false);
    let c2 = ctrl(0xffff, 0x42, FenceMode::Fence, true, false);
    let c3 = ctrl(0x0001, 0x000123, FenceMode::StrongOrdering, false, true);
    let c4 = ctrl(0x8000, 0xffffff, FenceMode::SmallAndFence, true, true);
    let c5 = ctrl(0x00ff, 0x7, FenceMode::InitiatorSmall, true, false);
    let r = RaddrSeg::new(0x1122_3344_5566_7788, 0xdead_beef);
    let l = DataSeg::new(0x100, 0x1122_3344, 0x0102_0304_0506_0708);
    let s = Sge8 {
        addr: 0x7f00_1234_5678,
        lkey: 0x55aa_55aa,
    };
    let payload: Vec<u8> = (0..200u32).map(|i| (i * 7 + 1) as u8).collect();

    let mut out = Vec::new();
    let mut run = |name: &'static str, f: &dyn Fn(&mut [u8]) -> wqe::WqeSize| {
        let mut b = vec![0xccu8; 1024];
        let size = f(&mut b);
        b.truncate(size.bytes());
        // Every case also parses back.
        parse_wqe(&b).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, b));
    };
    run("nop", &|b| wqe::nop(b, &c1).unwrap());
    run("dump", &|b| {
        build_wqe(
            b,
            &c5,
            &WqeOp::Dump {
                local: DataSeg::new(1, 0x99, 0x4000),
            },
        )
        .unwrap()
    });
    run("write", &|b| wqe::rdma_write(b, &c2, r, l).unwrap());
    run("write_inline_0", &|b| {
        wqe::rdma_write_inline(b, &c1, r, &payload[..0]).unwrap()
    });
    run("write_inline_4", &|b| {
        wqe::rdma_write_inline(b, &c1, r, &payload[..4]).unwrap()
    });
    run("write_inline_12", &|b| {
        wqe::rdma_write_inline(b, &c3, r, &payload[..12]).unwrap()
    });
    run("write_inline_13", &|b| {
        wqe::rdma_write_inline(b, &c3, r, &payload[..13]).unwrap()
    });
    run("write_inline_200", &|b| {
        wqe::rdma_write_inline(b, &c4, r, &payload[..200]).unwrap()
    });
    run("write_imm", &|b| {
        wqe::rdma_write_imm(b, &c3, r, l, 0xcafe_f00d).unwrap()
    });
    run("read", &|b| wqe::rdma_read(b, &c4, r, l).unwrap());
    run("atomic_cs", &|b| {
        wqe::atomic_cs(b, &c2, r, s, 0x1111_2222_3333_4444, 0x5555_6666_7777_8888).unwrap()
    });
    run("atomic_fa", &|b| wqe::atomic_fa(b, &c5, r, s, 7).unwrap());
    run("masked_cs32", &|b| {
        wqe::masked_cs32(
            b,
            &c1,
            r,
            s,
            0xa1a2_a3a4,
            0xb1b2_b3b4,
            0xc1c2_c3c4,
            0xd1d2_d3d4,
        )
        .unwrap()
    });
    run("masked_fa32", &|b| {
        wqe::masked_fa32(b, &c2, r, s, 0x10, 0x8000_8000).unwrap()
    });
    run("masked_cs64", &|b| {
        wqe::masked_cs64(
            b,
            &c4,
            r,
            s,
            0x0102_0304_0506_0708,
            0x1112_1314_1516_1718,
            0x2122_2324_2526_2728,
            0x3132_3334_3536_3738,
        )
        .unwrap()
    });
    run("masked_fa64", &|b| {
        wqe::masked_fa64(b, &c5, r, s, 0xffff_ffff_ffff_fffe, 0x8000_0000_0000_0000).unwrap()
    });
    out
}

#[test]
fn cuda_header_encodes_the_same_bytes_as_rust() {
    let bin = compile("c++", "parity.cpp", &["-std=c++17"]);
    let cpp: BTreeMap<String, String> = run_pairs(&bin).into_iter().collect();
    let cases = rust_cases();
    assert_eq!(cases.len(), 16);
    for (name, bytes) in &cases {
        assert_eq!(cpp.get(*name), Some(&hex(bytes)), "WQE {name}: C++ vs Rust");
    }
    assert_eq!(
        cpp["doorbell_bytes"],
        hex(&doorbell_bytes(0x1234, 0xabcdef))
    );
    assert_eq!(
        cpp["doorbell_word"],
        format!("{:016x}", doorbell_word(0x1234, 0xabcdef))
    );
    // `raw` of a be32 printed as a host integer: little-endian view of the wire bytes.
    assert_eq!(
        cpp["send_counter"],
        format!(
            "{:08x}",
            u32::from_le_bytes(send_counter(0x12345).to_bytes())
        )
    );
    assert_eq!(
        cpp["cq_ci"],
        format!(
            "{:08x}",
            u32::from_le_bytes(cq_consumer_index(0x1234_5678).to_bytes())
        )
    );
    let owns = [
        sw_owns(0x00, 3, 8),
        sw_owns(0x01, 11, 8),
        sw_owns(0xf0, 0, 8),
        sw_owns(0x00, 11, 8),
    ];
    assert_eq!(
        cpp["sw_owns"],
        owns.iter()
            .map(|&b| if b { '1' } else { '0' })
            .collect::<String>()
    );
    let done = [
        wqe_completed(2, 0xfffe),
        wqe_completed(0xfffe, 2),
        wqe_completed(5, 5),
    ];
    assert_eq!(
        cpp["wqe_completed"],
        done.iter()
            .map(|&b| if b { '1' } else { '0' })
            .collect::<String>()
    );
}

#[test]
fn header_compiles_as_pedantic_cxx14() {
    // Users include the device API from their own code bases: keep it warning-free under
    // -Wextra -pedantic at nvcc's default dialect (C++17 since CUDA 11; C++14 here for margin).
    compile("c++", "parity.cpp", &["-std=c++14", "-Wextra", "-pedantic"]);
}
