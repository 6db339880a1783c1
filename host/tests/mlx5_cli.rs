//! `rshmem mlx5 decode`: exact JSON for the MLX5.md oracle images and builder outputs,
//! readable listings, and exit status 2 with a clear message for malformed input.

use std::process::{Command, Output};

use rshmem::mlx5::cqe::{Cqe64, CqeInfo, CqeOpcode, Syndrome};
use rshmem::mlx5::wqe::{self, DataSeg, FenceMode, RaddrSeg, Sge8, WqeCtrl};
use rshmem::mlx5::WireStruct;

fn rshmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rshmem"))
        .args(args)
        .output()
        .expect("run rshmem")
}

fn ok(args: &[&str]) -> String {
    let o = rshmem(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let o = rshmem(args);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{args:?}: stdout {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(o.stdout.is_empty());
    String::from_utf8(o.stderr).unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The MLX5.md ctrl image (ds = 3) followed by the MLX5.md data image after a zero raddr,
/// padded to one WQEBB: spaced, colon-separated and split over arguments.
#[test]
fn oracle_images_decode_to_exact_json() {
    let out = ok(&[
        "mlx5",
        "decode",
        "--json",
        "08 12 34 08 ab cd ef 03 00 00 00 08 00 00 00 00",
        "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00",
        "00000100 11223344 01020304 05060708",
        "0x00000000000000000000000000000000",
    ]);
    assert_eq!(
        out,
        "{\"segments\": [\
         {\"type\": \"ctrl\", \"opcode\": 8, \"opmod\": 8, \"wqe_index\": 4660, \"qpn\": 11259375, \"ds\": 3, \"fm_ce_se\": 8, \"imm\": 0}, \
         {\"type\": \"raddr\", \"raddr\": 0, \"rkey\": 0}, \
         {\"type\": \"data\", \"byte_count\": 256, \"lkey\": 287454020, \"addr\": 72623859790382856}]}\n"
    );
    let text = ok(&[
        "mlx5",
        "decode",
        "08123408abcdef030000000800000000",
        &"00".repeat(16),
        "00000100112233440102030405060708",
        &"00".repeat(16),
    ]);
    assert_eq!(
        text,
        "WQE: 3 ds, 1 WQEBB(s)\n\
         ctrl         opcode 0x08 RDMA_WRITE  opmod 0x08  wqe_index 0x1234  qpn 0xabcdef  ds 3  fm_ce_se 0x08 (fence None, CQ update)  imm 0x00000000\n\
         raddr        raddr 0x0000000000000000  rkey 0x00000000\n\
         data         byte_count 256  lkey 0x11223344  addr 0x0102030405060708\n"
    );
}

fn c() -> WqeCtrl {
    WqeCtrl {
        wqe_index: 0xffff,
        qpn: 0x42,
        fence: FenceMode::Fence,
        cq_update: true,
        solicited: false,
    }
}

#[test]
fn builder_outputs_decode_to_exact_json() {
    let r = RaddrSeg::new(0x1000, 0x77);
    let s = Sge8 {
        addr: 0x2000,
        lkey: 0x66,
    };
    let mut b = [0u8; 128];

    let n = wqe::rdma_write_inline(&mut b, &c(), r, &[0xde, 0xad, 0xbe, 0xef, 0x01])
        .unwrap()
        .bytes();
    assert_eq!(
        ok(&["mlx5", "decode", "--wqe", "--json", &hex(&b[..n])]),
        "{\"segments\": [{\"type\": \"ctrl\", \"opcode\": 8, \"opmod\": 0, \"wqe_index\": 65535, \"qpn\": 66, \"ds\": 3, \"fm_ce_se\": 72, \"imm\": 0}, \
         {\"type\": \"raddr\", \"raddr\": 4096, \"rkey\": 119}, {\"type\": \"inline\", \"len\": 5, \"data\": \"deadbeef01\"}]}\n"
    );

    let n = wqe::rdma_write_imm(&mut b, &c(), r, DataSeg::new(8, 0x66, 0x2000), 0xcafe_f00d)
        .unwrap()
        .bytes();
    assert_eq!(
        ok(&["mlx5", "decode", "--json", &hex(&b[..n])]),
        "{\"segments\": [{\"type\": \"ctrl\", \"opcode\": 9, \"opmod\": 0, \"wqe_index\": 65535, \"qpn\": 66, \"ds\": 3, \"fm_ce_se\": 72, \"imm\": 3405705229}, \
         {\"type\": \"raddr\", \"raddr\": 4096, \"rkey\": 119}, {\"type\": \"data\", \"byte_count\": 8, \"lkey\": 102, \"addr\": 8192}]}\n"
    );

    let n = wqe::atomic_cs(&mut b, &c(), r, s, 5, 6).unwrap().bytes();
    assert_eq!(
        ok(&["mlx5", "decode", "--json", &hex(&b[..n])]),
        "{\"segments\": [{\"type\": \"ctrl\", \"opcode\": 17, \"opmod\": 0, \"wqe_index\": 65535, \"qpn\": 66, \"ds\": 4, \"fm_ce_se\": 72, \"imm\": 0}, \
         {\"type\": \"raddr\", \"raddr\": 4096, \"rkey\": 119}, {\"type\": \"atomic\", \"swap_add\": 6, \"compare\": 5}, \
         {\"type\": \"data\", \"byte_count\": 8, \"lkey\": 102, \"addr\": 8192}]}\n"
    );

    let n = wqe::masked_cs64(&mut b, &c(), r, s, 1, 2, 3, 4)
        .unwrap()
        .bytes();
    assert_eq!(n, 128);
    assert_eq!(
        ok(&["mlx5", "decode", "--json", &hex(&b[..n])]),
        "{\"segments\": [{\"type\": \"ctrl\", \"opcode\": 20, \"opmod\": 9, \"wqe_index\": 65535, \"qpn\": 66, \"ds\": 5, \"fm_ce_se\": 72, \"imm\": 0}, \
         {\"type\": \"raddr\", \"raddr\": 4096, \"rkey\": 119}, {\"type\": \"masked_cs64\", \"swap\": 1, \"compare\": 2, \"swap_mask\": 3, \"compare_mask\": 4}, \
         {\"type\": \"data\", \"byte_count\": 8, \"lkey\": 102, \"addr\": 8192}]}\n"
    );

    let n = wqe::masked_fa32(&mut b, &c(), r, s, 7, 0x8000_0000)
        .unwrap()
        .bytes();
    let j = ok(&["mlx5", "decode", "--json", &hex(&b[..n])]);
    assert!(
        j.contains("{\"type\": \"masked_fa32\", \"add\": 7, \"field_boundary\": 2147483648}"),
        "{j}"
    );
    let n = wqe::nop(&mut b, &c()).unwrap().bytes();
    assert_eq!(
        ok(&["mlx5", "decode", "--json", &hex(&b[..n])]),
        "{\"segments\": [{\"type\": \"ctrl\", \"opcode\": 0, \"opmod\": 0, \"wqe_index\": 65535, \"qpn\": 66, \"ds\": 1, \"fm_ce_se\": 72, \"imm\": 0}]}\n"
    );
}

#[test]
fn cqes_decode_to_exact_json() {
    let info = CqeInfo {
        wqe_opcode: 0x08,
        qpn: 0xabcdef,
        wqe_counter: 0x1234,
        byte_cnt: 9,
        owner: 1,
    };
    let ok_cqe = Cqe64::success(CqeOpcode::Req, &info);
    assert_eq!(
        ok(&["mlx5", "decode", "--cqe", "--json", &hex(ok_cqe.as_bytes())]),
        "{\"type\": \"cqe\", \"opcode\": 0, \"owner\": 1, \"wqe_counter\": 4660, \"byte_cnt\": 9, \"qpn\": 11259375, \"syndrome\": null, \"vendor_err_synd\": null}\n"
    );
    let err = Cqe64::error(Syndrome::RemoteAccess, 0x88, &CqeInfo { owner: 0, ..info });
    assert_eq!(
        ok(&["mlx5", "decode", "--cqe", "--json", &hex(err.as_bytes())]),
        "{\"type\": \"cqe\", \"opcode\": 13, \"owner\": 0, \"wqe_counter\": 4660, \"byte_cnt\": 0, \"qpn\": 11259375, \"syndrome\": 19, \"vendor_err_synd\": 136}\n"
    );
    let text = ok(&["mlx5", "decode", "--cqe", &hex(err.as_bytes())]);
    assert!(
        text.contains("REQ_ERR") && text.contains("syndrome 0x13 REMOTE_ACCESS"),
        "{text}"
    );
}

#[test]
fn malformed_input_exits_2_with_a_reason() {
    assert!(fails(&["mlx5", "decode", "zz"]).contains("not a hex digit"));
    assert!(fails(&["mlx5", "decode", "abc"]).contains("odd number of hex digits"));
    assert!(fails(&["mlx5", "decode", "0011"]).contains("whole 64-byte WQEBBs"));
    let unknown = format!("00001007000042030000000800000000{}", "00".repeat(48));
    let e = fails(&["mlx5", "decode", "--json", &unknown]);
    assert!(
        e.contains("unknown opcode 0x07") && e.contains("LOCAL_QP_OP 0x02"),
        "{e}"
    );
    let overrun = format!(
        "0000100800004203000000080000000000000000000000000000000000000000800000ff{}",
        "00".repeat(28)
    );
    let e = fails(&["mlx5", "decode", &overrun]);
    assert!(e.contains("LOCAL_LENGTH 0x01"), "{e}");
    let mut b = [0u8; 128];
    let n = wqe::nop(&mut b, &c()).unwrap().bytes();
    assert!(fails(&["mlx5", "decode", &hex(&b[..n + 64])]).contains("spans 64 bytes but 128"));
    assert!(fails(&["mlx5", "decode", "--cqe", "00"]).contains("a CQE is 64 bytes, got 1"));
    let reserved = format!("{}70", "00".repeat(63));
    assert!(fails(&["mlx5", "decode", "--cqe", &reserved]).contains("reserved"));
    // clap usage errors are status 2 as well.
    fails(&["mlx5", "decode", "--cqe", "--wqe", "00"]);
}
