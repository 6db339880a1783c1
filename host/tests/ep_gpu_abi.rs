//! The C++ compiler as the oracle for the EP kernels' launch ABI: every size, offset and
//! constant of `rshmem/ep/ll.cuh` (and the layout constants of `rshmem/ep/layout.cuh`)
//! that the Rust launcher mirrors (host/src/gpu/ep.rs), compared one by one. Also: the
//! packed argument bytes put each value at the offset the compiler gives its field, and
//! the launcher's buffer offsets are `ep::Layout`'s (which ep_cuda_parity.rs checks
//! against layout.cuh). Fails (never skips) without g++.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use rshmem::ep::{Config, Layout};
use rshmem::gpu::ep::{self as gep, ArgBase, IdxType, OutPtrs};

fn oracle() -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Unique per call: the tests of this binary compile concurrently.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ep-ll-abi-{}-{n}.bin", std::process::id()));
    let r = Command::new("g++")
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(dir.join("../device-kernels/include"))
        .arg(dir.join("tests/gpu-oracle/ep_ll_abi.cpp"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run g++ (install g++): {e}"));
    assert!(
        r.status.success(),
        "g++ failed:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let r = Command::new(&out).output().expect("run the EP ABI oracle");
    assert!(r.status.success());
    String::from_utf8(r.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("key value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn ll_structs_match_the_compiler() {
    let o = oracle();
    let rows = gep::layout_table();
    for (k, v) in &rows {
        assert_eq!(
            o.get(*k).map(String::as_str),
            Some(v.to_string().as_str()),
            "{k}"
        );
    }
    // Every field the compiler knows is mirrored.
    let layout_keys = o.keys().filter(|k| k.contains('.')).count();
    assert_eq!(layout_keys, rows.len());
    assert_eq!(rows.len(), 40);
}

#[test]
fn ll_constants_match_the_headers() {
    let o = oracle();
    let consts = gep::constant_table();
    for (k, v) in &consts {
        assert_eq!(
            o.get(*k).map(String::as_str),
            Some(v.to_string().as_str()),
            "{k}"
        );
    }
    let const_keys = o.keys().filter(|k| !k.contains('.')).count();
    assert_eq!(
        const_keys,
        consts.len(),
        "every printed constant is mirrored"
    );
}

#[test]
fn packed_arguments_land_at_the_compilers_offsets() {
    let o = oracle();
    let off = |f: &str| -> usize { o[&format!("ep_ll_args_t.{f}")].parse().unwrap() };
    let base = ArgBase {
        buf: 0x4000_0040,
        ctl: 0x7f00_0000_1000,
        mask: 0x7f00_0000_2000,
        num_max_tokens: 128,
        num_experts: 288,
        num_topk: 8,
        fp8: true,
        round_scale: false,
        shrink: None,
    };
    let out = OutPtrs {
        recv_x: 0x1000,
        recv_scales: 0x2000,
        recv_count: 0x3000,
        src_info: 0x4000,
        recv_topk_slot: 0x5000,
        layout_range: 0x6000,
        combined: 0x7000,
    };
    let a = base.dispatch(1, &out, 0xa000, 0xb000, IdxType::I32, 77, 0);
    let b = gep::args_bytes(&a);
    assert_eq!(b.len(), o["sizeof.ep_ll_args_t"].parse::<usize>().unwrap());
    let u = |f: &str| u64::from_le_bytes(b[off(f)..off(f) + 8].try_into().unwrap());
    let w = |f: &str| u32::from_le_bytes(b[off(f)..off(f) + 4].try_into().unwrap());
    assert_eq!(u("buf"), 0x4000_0040);
    assert_eq!(u("ctl"), 0x7f00_0000_1000);
    assert_eq!(u("mask"), 0x7f00_0000_2000);
    assert_eq!(u("x"), 0xa000);
    assert_eq!(u("topk_idx"), 0xb000);
    assert_eq!(u("out"), 0x1000);
    assert_eq!(u("recv_scales"), 0x2000);
    assert_eq!(u("recv_count"), 0x3000);
    assert_eq!(u("src_info"), 0x4000);
    assert_eq!(u("recv_topk_slot"), 0x5000);
    assert_eq!(u("layout_range"), 0x6000);
    assert_eq!(w("num_tokens"), 77);
    assert_eq!(w("num_max_tokens"), 128);
    assert_eq!(w("num_experts"), 288);
    assert_eq!(w("num_topk"), 8);
    assert_eq!(w("set"), 1);
    let flags: u32 =
        o["EP_LL_IDX_I32"].parse::<u32>().unwrap() | o["EP_LL_FP8_BUFFER"].parse::<u32>().unwrap();
    assert_eq!(w("flags"), flags);
    assert_eq!(w("fault"), 0);
}

#[test]
fn launcher_sizes_come_from_the_one_layout() {
    // The GPU buffer is exactly Layout's size, and its zero-copy region is Layout's
    // combine_send of the set (the kernels compute the same with layout.cuh).
    let cfg = Config::deepep_default();
    let l = gep::check_config(&cfg, 8).unwrap();
    assert_eq!(l, Layout::new(&cfg, 8).unwrap());
    assert_eq!(l.total_bytes, Layout::size_hint(&cfg, 8).unwrap());
    assert_eq!(
        l.combine_send_row(1, 0, 0),
        l.set_bytes + l.combine_send.offset
    );
}
