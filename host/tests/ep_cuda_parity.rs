//! The GPU EP kernels' headers, compiled as host C++ with g++, against the CPU oracle:
//! `device-kernels/include/rshmem/ep/layout.cuh` must compute exactly `ep::Layout`'s
//! offsets, and `rshmem/ep/fp8.cuh` exactly `ep::fp8`'s casts and scales and the combine
//! arithmetic (`acc += w * v`, `bf16::from_f32`) bit for bit. The C++ programs are in
//! host/tests/ep-cuda/; this test writes their requests and compares every answer.
//!
//! The kernels themselves (device-kernels/src/ep_ll.cu, unchanged) are built for the host
//! with a small CUDA emulation (host/tests/ep-cuda/emu/: each block's 512 GPU threads as
//! fibers, warps as barriers, blocks one after another, every PE's send kernel before any
//! receive kernel) and their outputs compared with the CPU oracle's on the same inputs
//! (`kernels_emulated_*`). With `--concurrent` (`kernels_emulated_concurrently_*`) every
//! PE and every block is a process and they all run at once, so receive kernels really
//! wait for their peers' sends and sends for the credits of the call two before (with
//! the waits removed, those tests fail; the sequential ones do not). This checks the
//! kernels' logic and their waits, not GPU memory ordering or speed: that is
//! scripts/gpu-check's `ep` step.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use rshmem::ep::{bf16, check, fp8, Buffer, Config, Layout, RecvX};

#[path = "device-emu/build.rs"]
mod emu_build;
#[allow(dead_code)] // device_emu.rs uses other parts
mod emu_ibgda;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles host/tests/ep-cuda/`src` with g++ (no FMA contraction, as the kernels use
/// explicit __fmul_rn/__fadd_rn) and returns the binary.
fn compile(src: &str) -> PathBuf {
    // Unique per call: the tests of this binary compile concurrently.
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ep-cuda-{src}-{}-{n}.bin", std::process::id()));
    let r = Command::new("g++")
        .args([
            "-O1",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-ffp-contract=off",
            "-I",
        ])
        .arg(manifest_dir().join("../device-kernels/include"))
        .arg(manifest_dir().join("tests/ep-cuda").join(src))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run g++ (install g++): {e}"));
    assert!(
        r.status.success(),
        "g++ {src} failed:\n{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// Runs `bin` with `input` on stdin (through a file: no pipe deadlock) and returns its
/// stdout lines.
fn run(bin: &Path, input: &str) -> Vec<String> {
    run_args(bin, &[], &[], input)
}

fn run_args(bin: &Path, args: &[&str], env: &[(&str, String)], input: &str) -> Vec<String> {
    // Unique per call: concurrent tests run the same binary.
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = bin.with_extension(format!("{}.in", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, input).unwrap();
    let r = Command::new(bin)
        .args(args)
        .env_remove("RSHMEM_EMU_SHM")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::from(std::fs::File::open(&path).unwrap()))
        .output()
        .expect("run parity program");
    assert!(
        r.status.success(),
        "{} exited with {}: {}",
        bin.display(),
        r.status,
        String::from_utf8_lossy(&r.stderr)
    );
    let _ = std::fs::remove_file(&path);
    String::from_utf8(r.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// rshmem_pattern_u64 (SplitMix64), for reproducible random inputs.
fn splitmix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add((i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ------------------------------------------------------------------------- layout

fn layout_line(l: &Layout) -> String {
    let mut s = format!(
        "rc=0 R={} L={} N={} H={} K={} fp8={} msg={} slots={}",
        l.num_pes,
        l.num_local_experts,
        l.num_max_tokens,
        l.hidden,
        l.num_topk,
        l.use_fp8 as u8,
        l.msg_bytes,
        l.slots_per_src
    );
    for (name, r) in [
        ("dispatch_count", l.dispatch_count),
        ("combine_flag", l.combine_flag),
        ("credit", l.credit),
        ("dispatch_send", l.dispatch_send),
        ("dispatch_recv", l.dispatch_recv),
        ("combine_send", l.combine_send),
        ("combine_recv", l.combine_recv),
    ] {
        write!(s, " {name}={}+{}", r.offset, r.bytes).unwrap();
    }
    write!(s, " set={} total={}", l.set_bytes, l.total_bytes).unwrap();
    let (r, lx, n, k) = (l.num_pes, l.num_local_experts, l.num_max_tokens, l.num_topk);
    for set in 0..2 {
        write!(
            s,
            " count={},{} flag={} credit={} send={} recv={},{} csend={},{} crecv={},{}",
            l.dispatch_count_word(set, lx - 1, r - 1),
            l.dispatch_count_word(set, 0, r / 2),
            l.combine_flag_word(set, r - 1),
            l.credit_word(set, r - 1),
            l.dispatch_send_msg(set, n - 1),
            l.dispatch_recv_msg(set, r - 1, l.slots_per_src - 1),
            l.dispatch_recv_msg(set, r / 2, 1),
            l.combine_send_row(set, lx - 1, r * n - 1),
            l.combine_send_row(set, lx / 2, 3),
            l.combine_recv_row(set, n - 1, k - 1),
            l.combine_recv_row(set, n / 2, 0),
        )
        .unwrap();
    }
    write!(
        s,
        " payload={} scales={} payload_bytes={}",
        l.payload_offset(),
        l.scales_offset(),
        l.payload_bytes()
    )
    .unwrap();
    s
}

/// The C++ return code Rust's result corresponds to (EP_LAYOUT_* in layout.cuh).
fn rust_rc(r: &rshmem::error::Result<Layout>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => {
            let m = e.to_string();
            if m.contains("overflow") {
                5
            } else if m.contains("num_max_dispatch_tokens_per_rank") {
                1
            } else if m.contains("hidden") {
                2
            } else if m.contains("num_topk") {
                3
            } else if m.contains("num_experts") {
                4
            } else {
                panic!("unexpected Layout error: {m}")
            }
        }
    }
}

#[test]
fn layout_cuh_matches_rust_layout() {
    // (N, H, E, K, fp8, R): the GPU hidden sizes, the default shape, odd PE counts,
    // K > L, tiny shapes, and every invalid case of Config::validate.
    let mut cfgs: Vec<(usize, usize, usize, usize, bool, usize)> = Vec::new();
    for &h in &[2048, 2560, 4096, 5120, 7168, 8192] {
        for &fp in &[true, false] {
            for &(n, e, k, r) in &[
                (128, 288, 8, 8),
                (128, 288, 8, 4),
                (256, 256, 8, 8),
                (1, 3, 11, 3),
                (77, 30, 11, 5),
                (128, 32, 1, 1),
            ] {
                cfgs.push((n, h, e, k, fp, r));
            }
        }
    }
    cfgs.extend([
        (128, 128, 8, 2, true, 2),
        (3, 1, 7, 11, false, 7),
        (1 << 20, 7168, 2, 11, true, 2),
        (1 << 20, 1 << 40, 1 << 20, 11, false, 1), // overflows
        (0, 7168, 8, 8, true, 8),                  // N = 0
        ((1 << 20) + 1, 7168, 8, 8, true, 8),      // N too large
        (128, 0, 8, 8, false, 8),                  // H = 0
        (128, 100, 8, 8, true, 8),                 // FP8 with H % 128 != 0
        (128, 7168, 8, 0, true, 8),                // K = 0
        (128, 7168, 8, 12, true, 8),               // K > 11
        (128, 7168, 9, 8, true, 8),                // E % R != 0
        (128, 7168, 0, 8, true, 8),                // E = 0
        (128, 7168, 8, 8, true, 0),                // R = 0
    ]);
    let input: String = cfgs
        .iter()
        .map(|&(n, h, e, k, fp, r)| format!("{n} {h} {e} {k} {} {r}\n", fp as u8))
        .collect();
    let got = run(&compile("layout_parity.cpp"), &input);
    assert_eq!(got.len(), cfgs.len(), "one answer per config");
    let mut ok_count = 0;
    for (&(n, h, e, k, fp, r), line) in cfgs.iter().zip(&got) {
        let cfg = Config {
            num_max_dispatch_tokens_per_rank: n,
            hidden: h,
            num_experts: e,
            num_topk: k,
            use_fp8: fp,
            round_scale: false,
        };
        let res = Layout::new(&cfg, r);
        let want = match &res {
            Ok(l) => {
                ok_count += 1;
                layout_line(l)
            }
            Err(_) => format!("rc={}", rust_rc(&res)),
        };
        assert_eq!(line, &want, "config {cfg:?} on {r} PEs");
    }
    assert_eq!(
        ok_count,
        6 * 2 * 6 + 3,
        "valid configs compared field by field"
    );
}

// ------------------------------------------------------------------------- numerics

/// Checks each request's C++ answer against the Rust one; reports the first mismatches.
fn compare(what: &str, requests: &[String], want: &[String]) {
    compare_with(what, requests, want, |g| g.to_string())
}

/// `compare`, after mapping every C++ answer through `canon` (the Rust answers are
/// already canonical).
fn compare_with(what: &str, requests: &[String], want: &[String], canon: impl Fn(&str) -> String) {
    let bin = compile("fp8_parity.cpp");
    let got: Vec<String> = run(&bin, &requests.concat())
        .iter()
        .map(|g| canon(g))
        .collect();
    assert_eq!(got.len(), want.len(), "{what}: one answer per request");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .zip(requests)
        .filter(|((g, w), _)| g != w)
        .take(5)
        .map(|((g, w), r)| format!("request {:?}: C++ {g}, Rust {w}", r.trim_end()))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} differ, first: {bad:#?}",
        got.iter().zip(want).filter(|(g, w)| g != w).count(),
        want.len()
    );
}

/// f32 inputs for the cast: every bf16 value times DeepEP-like scales, the edges (zeros,
/// f32 subnormals, e4m3 subnormal ties, midpoints between adjacent e4m3 values and one
/// ulp either side, the saturation boundary, infinities, NaNs) and random bit patterns.
fn cast_inputs() -> Vec<u32> {
    let mut v = Vec::new();
    for &s in &[1.0f32, 448.0 / 3.0, 0.0625, 3.5, 1e-3, 1e4] {
        for bits in 0..=u16::MAX {
            v.push((bf16::from_bits(bits).to_f32() * s).to_bits());
        }
    }
    v.extend([
        0,
        0x8000_0000,
        1,
        0x007f_ffff,
        0x8000_0001,
        448f32.to_bits(),
        464f32.to_bits(),
        (464f32).to_bits() - 1,
        (464f32).to_bits() + 1,
        480f32.to_bits(),
        1e30f32.to_bits(),
        f32::INFINITY.to_bits(),
        f32::NEG_INFINITY.to_bits(),
        0x7fc0_0000,
        0xffc0_0000,
        0x7f80_0001,
        0xff80_0001,
        (1.0f32 / 64.0).to_bits(),
        (1.0f32 / 64.0).to_bits() - 1,
    ]);
    for k in 0..40u32 {
        let x = k as f32 * 2f32.powi(-10); // e4m3 subnormal grid and its midpoints
        v.push(x.to_bits());
        v.push((-x).to_bits());
    }
    for code in 0u8..0x7e {
        let (a, b) = (fp8::e4m3_to_f32(code), fp8::e4m3_to_f32(code + 1));
        let mid = (a + b) / 2.0; // exact: both have few mantissa bits
        for m in [mid.to_bits() - 1, mid.to_bits(), mid.to_bits() + 1] {
            v.push(m);
            v.push(m | 0x8000_0000);
        }
    }
    for i in 0..200_000 {
        v.push(splitmix(0xe4, i) as u32);
    }
    v
}

#[test]
fn fp8_cuh_cast_matches_rust() {
    let inputs = cast_inputs();
    let requests: Vec<String> = inputs.iter().map(|b| format!("c {b:x}\n")).collect();
    let want: Vec<String> = inputs
        .iter()
        .map(|&b| format!("{:02x}", fp8::f32_to_e4m3(f32::from_bits(b))))
        .collect();
    assert!(inputs.len() > 6 * 65536 + 200_000);
    compare("e4m3 cast", &requests, &want);
}

#[test]
fn fp8_cuh_group_scale_matches_rust() {
    let mut req = Vec::new();
    // Every amax quantize_row can produce (the magnitude of a bf16, incl. inf and NaN)
    // with both rounding modes.
    for bits in 0..=0x7fffu16 {
        let a = bf16::from_bits(bits).to_f32().to_bits();
        req.push((a, false));
        req.push((a, true));
    }
    // Arbitrary f32 amax without round_scale (with it, the header's exact power-of-two
    // ceiling and Rust's log2f differ just above powers of two; quantize_row never gets
    // such an amax — see fp8.cuh).
    for i in 0..50_000 {
        req.push(((splitmix(0x5c, i) as u32) & 0x7fff_ffff, false));
    }
    let requests: Vec<String> = req
        .iter()
        .map(|&(b, r)| format!("s {b:x} {}\n", r as u8))
        .collect();
    let want: Vec<String> = req
        .iter()
        .map(|&(b, r)| {
            let (s, i) = fp8::group_scale(f32::from_bits(b), r);
            format!("{:08x} {:08x}", s.to_bits(), i.to_bits())
        })
        .collect();
    compare("group scale", &requests, &want);
}

/// An f32 answer: its bits, or "nan" for any NaN.
fn f32_answer(bits: u32) -> String {
    if f32::from_bits(bits).is_nan() {
        "nan".into()
    } else {
        format!("{bits:08x}")
    }
}

#[test]
fn fp8_cuh_bf16_rounding_and_combine_step_match_rust() {
    let mut requests = Vec::new();
    let mut want = Vec::new();
    let mut bf = vec![
        0u32,
        0x8000_0000,
        0x3f80_8000, // tie, even: stays
        0x3f81_8000, // tie, odd: rounds up
        0x3f80_8001,
        0x3f80_7fff,
        0x7f7f_ffff, // rounds to inf
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001, // signalling NaN: quiet bit set
        0xffa0_0000,
        1,
    ];
    bf.extend((0..100_000).map(|i| splitmix(0xbf, i) as u32));
    for &b in &bf {
        requests.push(format!("b {b:x}\n"));
        want.push(format!(
            "{:04x}",
            bf16::from_f32(f32::from_bits(b)).to_bits()
        ));
    }
    // Combine terms: realistic (bf16 outputs, weights in [0, 1), partial sums) and raw bits.
    for i in 0..100_000u64 {
        let r = splitmix(0xc0, i);
        let (acc, w, v) = if i % 2 == 0 {
            let v = bf16::from_bits((r >> 16) as u16 & 0x7fff | ((r as u16) & 0x8000)).to_f32();
            let w = (r >> 40) as u32 as f32 / (1u64 << 24) as f32;
            let acc = f32::from_bits(splitmix(0xc1, i) as u32 & 0x43ff_ffff);
            (acc, w, v)
        } else {
            (
                f32::from_bits(r as u32),
                f32::from_bits((r >> 32) as u32),
                f32::from_bits(splitmix(0xc2, i) as u32),
            )
        };
        requests.push(format!(
            "m {:x} {:x} {:x}\n",
            acc.to_bits(),
            w.to_bits(),
            v.to_bits()
        ));
        let mut a = acc;
        a += w * v; // the oracle's statement (host/src/ep/mod.rs CombineHook::recv)
        want.push(f32_answer(a.to_bits()));
    }
    // NaN results are compared as "NaN": which operand's payload a NaN result carries is
    // not fixed (x86 takes the first operand's, the compiler may commute; the GPU always
    // returns the canonical 0x7fffffff), so bit identity holds for every non-NaN result
    // and NaN-ness for the rest. (Valid EP inputs produce no NaN: EP.md's checks.)
    compare_with("bf16 rounding / combine step", &requests, &want, |g| {
        if g.len() == 8 {
            f32_answer(u32::from_str_radix(g, 16).unwrap())
        } else {
            g.to_string()
        }
    });
}

#[test]
fn fp8_cuh_quantize_row_matches_rust() {
    let mut requests = Vec::new();
    let mut want = Vec::new();
    let mut rows: Vec<Vec<u16>> = Vec::new();
    // Random rows of several magnitudes (exponent windows), raw random bits (NaN, inf),
    // an all-zero row, a row with one inf, one with NaNs, subnormal-only groups.
    for i in 0..48u64 {
        let h = [128usize, 256, 2048, 7168][(i % 4) as usize];
        let row = (0..h as u64)
            .map(|j| {
                let r = splitmix(0x900 + i, j) as u16;
                match i % 3 {
                    0 => r,
                    1 => (r & 0x807f) | ((0x3c + (i as u16 % 8) * 4) << 7), // |x| in a window
                    _ => r & 0x80ff,                                        // subnormals
                }
            })
            .collect();
        rows.push(row);
    }
    rows.push(vec![0; 256]);
    let mut r = vec![0x3f80u16; 256];
    r[5] = 0x7f80; // inf
    r[200] = 0x7fc1; // NaN
    rows.push(r);
    let mut r = vec![0xbf80u16; 128];
    r[7] = 0xffc0; // NaN only: ignored by amax
    rows.push(r);
    for row in &rows {
        for round in [false, true] {
            let mut s = format!("q {} {:x}", round as u8, row.len());
            for v in row {
                write!(s, " {v:x}").unwrap();
            }
            s.push('\n');
            requests.push(s);
            let x: Vec<bf16> = row.iter().map(|&b| bf16::from_bits(b)).collect();
            let mut q = vec![0u8; x.len()];
            let mut scales = vec![0f32; x.len() / 128];
            fp8::quantize_row(&x, round, &mut q, &mut scales);
            let mut w: String = q.iter().map(|b| format!("{b:02x}")).collect();
            for sc in &scales {
                write!(w, " {:08x}", sc.to_bits()).unwrap();
            }
            want.push(w);
        }
    }
    compare("quantize_row", &requests, &want);
}

// ------------------------------------------------------------------------- kernels

/// The GPU kernels (device-kernels/src/ep_ll.cu, unchanged) built for the host with the
/// CUDA emulation in host/tests/ep-cuda/emu/ (blocks one at a time, GPU threads as OS
/// threads, warps as 32-thread barriers), once per test binary.
fn emulator() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("ep-ll-emulator-{}.bin", std::process::id()));
        emu_build::gxx_emulated(
            "ll_emulator.cpp",
            &["-ffp-contract=off"],
            &[manifest_dir().join("tests/ep-cuda/ll_emulator.cpp")],
            &out,
        );
        out
    })
}

fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}
const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// A received row: src_info, recv_topk_slot, FNV-1a of its bytes.
type Row = (i32, i32, u64);

/// One PE's outputs of one dispatch + combine repeat.
#[derive(Debug, Default, Clone, PartialEq)]
struct PeOut {
    counts: Vec<i32>,
    /// Per (local expert, source): begin, then (src_info, recv_topk_slot, row hash) per
    /// row (the slot is -1 on the CPU side, whose handle keeps it private).
    blocks: Vec<(u64, Vec<Row>)>,
    /// FNV-1a of each combined_x row.
    comb: Vec<u64>,
    /// (kind, set_calls) per set (emulator only).
    status: Vec<(u32, u64)>,
    /// (kind, peer, value, commit) per set (emulator only).
    status_full: Vec<(u32, i64, u64, u64)>,
    /// The PE's mask entries after the repeat (emulator, shrink mode only).
    mask: Vec<i32>,
    /// The (world) PE that reported (emulator only).
    pe: usize,
}

/// How the emulated PEs reach each other.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Net {
    /// Stores through the mapped heaps.
    P2p,
    /// Every other PE through its IBGDA queue pair, executed by a soft HCA engine in this
    /// process (what GPU PEs over `--transport proxy` do).
    Ibgda,
    /// "Nodes" of two PEs (p / 2): P2P inside a node, IBGDA between nodes.
    Mixed,
}

#[derive(Clone)]
struct KCase {
    cfg: Config,
    pes: usize,
    grid: usize,
    tokens: Vec<usize>,
    experts: Option<Vec<usize>>,
    masked_pe: Option<usize>,
    repeats: usize,
    /// Emulator runs only the dispatch (inputs that poison the call).
    dispatch_only: bool,
    /// `--concurrent`: every PE and every block a process, all at once (ll_emulator.cpp).
    concurrent: bool,
    net: Net,
    /// Shrink mode: `masked_pe` is not masked by the host but dies after this many
    /// repeats, and the others' kernels (EP_LL_SHRINK) give up on it after a bound.
    shrink: Option<usize>,
    /// With `shrink`: how the repeat of the death goes (ll_emulator.cpp RSHMEM_EMU_DIES_IN:
    /// "counts", "combine", "credit", "late"; sequential emulation only), or None: the
    /// dead PE just stops.
    dies_in: Option<&'static str>,
    /// EP teams (world PEs, strided splits: every PE in one), or None: the world team.
    teams: Option<Vec<Vec<usize>>>,
    /// Slot 1 of every token repeats slot 0's expert (where slot 0 is not -1).
    repeat_ids: bool,
    /// Start as if this many calls had run on each buffer set (ll_emulator.cpp
    /// RSHMEM_EMU_FIRST_SET_CALLS), or None: from call 0.
    first_set_calls: Option<u64>,
    /// (dst, src, token, slot): after the first dispatch's sends, the header of the first
    /// message from PE src in PE dst's receive area becomes (token, slot)
    /// (ll_emulator.cpp RSHMEM_EMU_CORRUPT_HEADER; sequential emulation only).
    corrupt_header: Option<(usize, usize, i32, i32)>,
}

impl KCase {
    /// PE `p`'s EP team (world PEs in team order) and its rank in it.
    fn team_of(&self, p: usize) -> (Vec<usize>, usize) {
        match &self.teams {
            None => ((0..self.pes).collect(), p),
            Some(ts) => {
                let t = ts
                    .iter()
                    .find(|t| t.contains(&p))
                    .expect("every PE in a team");
                (t.clone(), t.iter().position(|&q| q == p).unwrap())
            }
        }
    }
}

fn routing(c: &KCase) -> Vec<check::Routing> {
    (0..c.pes)
        .map(|p| {
            let mut r = check::random_routing(11, p, c.tokens[p], &c.cfg, c.experts.as_deref(), 3);
            if c.repeat_ids {
                for row in r.topk_idx.chunks_mut(c.cfg.num_topk) {
                    if row[0] >= 0 {
                        row[1] = row[0];
                    }
                }
            }
            r
        })
        .collect()
}

fn expert_scale(e: usize) -> f32 {
    1.0 + (e % 4) as f32 * 0.25
}

/// Runs the emulated kernels: per repeat, per unmasked PE.
fn run_emulated(c: &KCase, routes: &[check::Routing]) -> Vec<Vec<PeOut>> {
    let cfg = &c.cfg;
    let mut input = format!(
        "{} {} {} {} {} {} {} {} {} {} {}\n",
        c.pes,
        cfg.num_max_dispatch_tokens_per_rank,
        cfg.hidden,
        cfg.num_experts,
        cfg.num_topk,
        cfg.use_fp8 as u8,
        cfg.round_scale as u8,
        c.grid,
        c.repeats,
        c.masked_pe.map(|p| p as i64).unwrap_or(-1),
        c.dispatch_only as u8
    );
    for r in routes {
        writeln!(input, "{}", r.num_tokens).unwrap();
        for v in &r.topk_idx {
            write!(input, "{v} ").unwrap();
        }
        input.push('\n');
        for w in &r.topk_weights {
            write!(input, "{:x} ", w.to_bits()).unwrap();
        }
        input.push('\n');
    }
    // Over IBGDA: heaps, queues and states in a memfd that a soft HCA engine serves.
    let shared = (c.net != Net::P2p).then(|| {
        let heap = (64 << 10)
            + (0..c.pes)
                .map(|p| Layout::new(cfg, c.team_of(p).0.len()).unwrap().total_bytes)
                .max()
                .unwrap_or(0);
        let p2p = |p: usize, q: usize| c.net == Net::Mixed && p / 2 == q / 2;
        emu_ibgda::Shared::with(
            c.pes,
            false,
            20_000,
            rshmem::gpu::ibgda::WQE_CNT,
            heap.next_multiple_of(4096),
            &p2p,
        )
    });
    let mut env = shared.as_ref().map(|s| s.shm.env()).unwrap_or_default();
    if let Some(after) = c.shrink {
        env.push(("RSHMEM_EMU_SHRINK", "1".into()));
        env.push(("RSHMEM_EMU_DEAD_AFTER", after.to_string()));
        // Blocks one after another wait only for the dead PE (every live send ran before
        // any receive), so a short bound is safe; with every block a process a live PE
        // may be descheduled on a loaded machine, so those get the 5 s the other
        // concurrent tests trap after.
        let bound = if c.concurrent {
            5000
        } else {
            SHRINK_TIMEOUT_MS
        };
        env.push(("RSHMEM_EMU_TIMEOUT_MS", bound.to_string()));
        if let Some(how) = c.dies_in {
            env.push(("RSHMEM_EMU_DIES_IN", how.into()));
        }
    }
    if let Some(k) = c.first_set_calls {
        env.push(("RSHMEM_EMU_FIRST_SET_CALLS", k.to_string()));
    }
    if let Some((dst, src, t, k)) = c.corrupt_header {
        env.push(("RSHMEM_EMU_CORRUPT_HEADER", format!("{dst} {src} {t} {k}")));
    }
    if let Some(ts) = &c.teams {
        let spec: Vec<String> = ts
            .iter()
            .map(|t| {
                t.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        env.push(("RSHMEM_EMU_TEAMS", spec.join("/")));
    }
    let lines = run_args(
        emulator(),
        if c.concurrent { &["--concurrent"] } else { &[] },
        &env,
        &input,
    );
    // Every queue between two live PEs that do not share a mapping carried work (at least
    // the credits), and no other queue did: the calls really went through the soft HCA
    // (whose execution the outputs check).
    if let Some(sh) = &shared {
        let live = |p: usize| c.masked_pe != Some(p);
        for p in (0..c.pes).filter(|&p| live(p)) {
            // Only members of one EP team talk to each other.
            let team = c.team_of(p).0;
            for q in (0..c.pes).filter(|&q| live(q) && q != p && team.contains(&q)) {
                let queued = c.net == Net::Ibgda || p / 2 != q / 2;
                let posted = sh.published(p, q);
                assert_eq!(
                    posted > 0,
                    queued,
                    "{:?}: PE {p} published {posted} WQEBBs on its queue to PE {q}",
                    c.net
                );
            }
        }
    }
    let mut out: Vec<Vec<PeOut>> = vec![Vec::new(); c.repeats];
    let mut cur: Option<(usize, PeOut)> = None;
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[0] {
            "rep" => {
                if let Some((rep, o)) = cur.take() {
                    out[rep].push(o);
                }
                cur = Some((
                    f[1].parse().unwrap(),
                    PeOut {
                        pe: f[3].parse().unwrap(),
                        ..PeOut::default()
                    },
                ));
            }
            "count" => {
                cur.as_mut().unwrap().1.counts = f[1..].iter().map(|v| v.parse().unwrap()).collect()
            }
            "block" => cur
                .as_mut()
                .unwrap()
                .1
                .blocks
                .push((f[3].parse().unwrap(), Vec::new())),
            "row" => cur.as_mut().unwrap().1.blocks.last_mut().unwrap().1.push((
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                u64::from_str_radix(f[3], 16).unwrap(),
            )),
            "comb" => cur
                .as_mut()
                .unwrap()
                .1
                .comb
                .push(u64::from_str_radix(f[1], 16).unwrap()),
            "status" => {
                let o = &mut cur.as_mut().unwrap().1;
                o.status
                    .push((f[2].parse().unwrap(), f[6].parse().unwrap()));
                o.status_full.push((
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                    f[4].parse().unwrap(),
                    f[5].parse().unwrap(),
                ));
            }
            "mask" => {
                cur.as_mut().unwrap().1.mask = f[1..].iter().map(|v| v.parse().unwrap()).collect()
            }
            _ => panic!("emulator printed {line:?}"),
        }
    }
    if let Some((rep, o)) = cur.take() {
        out[rep].push(o);
    }
    for rep in &out {
        for o in rep {
            let n = c.team_of(o.pe).0.len();
            let l = cfg.num_experts / n;
            assert_eq!(o.blocks.len(), if c.dispatch_only { 0 } else { l * n });
        }
    }
    out
}

/// Runs the CPU oracle (rshmem::ep on threads) on the same inputs.
fn run_cpu(c: &KCase, routes: &[check::Routing]) -> Vec<Vec<PeOut>> {
    let cfg = c.cfg;
    let mut s = rshmem::Settings::from_lookup(|_| None).expect("default settings");
    // The largest team's need (every team's buffer comes from one world allocation).
    let need = (0..c.pes)
        .map(|p| Layout::size_hint(&cfg, c.team_of(p).0.len()).unwrap())
        .max()
        .unwrap_or(0);
    s.symmetric_size = (need + (2 << 20)).next_multiple_of(1 << 20);
    s.timeout = std::time::Duration::from_secs(20);
    let res = rshmem::run_threads(c.pes, s, |pe| -> rshmem::Result<Vec<PeOut>> {
        // The EP teams, as strided splits of the world (every PE takes part in each).
        let team = match &c.teams {
            None => pe.world().clone(),
            Some(ts) => {
                let mut mine = None;
                for t in ts {
                    let stride = if t.len() > 1 { t[1] - t[0] } else { 1 };
                    assert!(
                        t.windows(2).all(|w| w[1] - w[0] == stride),
                        "team {t:?} is not strided"
                    );
                    let got = pe.team_split_strided(pe.world(), t[0], stride, t.len())?;
                    mine = mine.or(got);
                }
                mine.expect("every PE is in a team")
            }
        };
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, cfg)?;
        if c.masked_pe == Some(pe.my_pe()) {
            return Ok(Vec::new());
        }
        if let Some(m) = c.masked_pe {
            let (members, _) = c.team_of(pe.my_pe());
            if let Some(r) = members.iter().position(|&q| q == m) {
                buf.update_mask(r, true)?;
            }
        }
        let r = &routes[pe.my_pe()];
        let x = check::origin_x(me, r.num_tokens, cfg.hidden);
        let (h, n) = (cfg.hidden, team.n_pes());
        let l = cfg.num_experts / n;
        let rows = n * cfg.num_max_dispatch_tokens_per_rank;
        let mut reps = Vec::new();
        for _ in 0..c.repeats {
            let d = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
            let mut eo = vec![bf16::ZERO; l * rows * h];
            check::expert_forward(&cfg, n, me, &d, &expert_scale, &mut eo);
            let y = buf
                .low_latency_combine(&eo, &r.topk_idx, &r.topk_weights, &d.handle, false, false)?
                .wait()?;
            let mut o = PeOut {
                counts: d.recv_count.clone(),
                ..PeOut::default()
            };
            for le in 0..l {
                for src in 0..n {
                    let lr = d.layout_range[le * n + src];
                    let (begin, count) = ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
                    let rows_out = (begin..begin + count)
                        .map(|j| {
                            let row = le * rows + j;
                            let hash = match &d.recv_x {
                                RecvX::Fp8 { data, scales } => {
                                    let g = h / 128;
                                    let sb: Vec<u8> = scales[row * g..(row + 1) * g]
                                        .iter()
                                        .flat_map(|v| v.to_le_bytes())
                                        .collect();
                                    fnv(&sb, fnv(&data[row * h..(row + 1) * h], FNV0))
                                }
                                RecvX::Bf16(v) => {
                                    let b: Vec<u8> = v[row * h..(row + 1) * h]
                                        .iter()
                                        .flat_map(|x| x.to_bits().to_le_bytes())
                                        .collect();
                                    fnv(&b, FNV0)
                                }
                            };
                            (d.src_info[row], -1, hash)
                        })
                        .collect();
                    o.blocks.push((begin as u64, rows_out));
                }
            }
            o.comb = y
                .chunks(h.max(1))
                .take(r.num_tokens)
                .map(|row| {
                    let b: Vec<u8> = row.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
                    fnv(&b, FNV0)
                })
                .collect();
            reps.push(o);
        }
        if c.masked_pe.is_none() {
            // (Collective: with a PE that stopped calling, leave the memory to the job end.)
            buf.destroy()?;
        }
        Ok(reps)
    })
    .expect("threads start");
    let per_pe: Vec<Vec<PeOut>> = res
        .into_iter()
        .enumerate()
        .map(|(p, r)| r.unwrap_or_else(|e| panic!("CPU oracle, PE {p}: {e}")))
        .collect();
    (0..c.repeats)
        .map(|rep| {
            per_pe
                .iter()
                .enumerate()
                .filter(|(p, _)| c.masked_pe != Some(*p))
                .map(|(_, v)| v[rep].clone())
                .collect()
        })
        .collect()
}

/// The emulated kernels' outputs equal the CPU oracle's: counts, each (expert, source)
/// block's rows in order (src_info and bytes of recv_x + scales), every combined row bit
/// for bit; the kernels' blocks are in source order and their recv_topk_slot is the slot
/// the routing gives; no fault recorded; each set's call counter advanced.
fn check_kernels(c: KCase) {
    let routes = routing(&c);
    let emu = run_emulated(&c, &routes);
    let cpu = run_cpu(&c, &routes);
    let pes: Vec<usize> = (0..c.pes).filter(|&p| c.masked_pe != Some(p)).collect();
    let mut rows_checked = 0;
    for rep in 0..c.repeats {
        rows_checked += compare_repeat(&c, &routes, rep, &emu[rep], &cpu[rep], &pes);
    }
    assert!(rows_checked > 0, "the case received nothing");
}

/// One repeat: the emulated PEs `pes` (their outputs `emu`) against the oracle's (`cpu`,
/// same order); returns the rows compared.
#[allow(clippy::needless_range_loop)] // indices name PEs and experts in the messages
fn compare_repeat(
    c: &KCase,
    routes: &[check::Routing],
    rep: usize,
    emu: &[PeOut],
    cpu: &[PeOut],
    pes: &[usize],
) -> usize {
    let k = c.cfg.num_topk;
    let mut rows_checked = 0;
    assert_eq!(emu.len(), pes.len(), "repeat {rep}: PEs that reported");
    assert_eq!(cpu.len(), pes.len(), "repeat {rep}: oracle PEs");
    for ((e, o), &pe) in emu.iter().zip(cpu).zip(pes) {
        // Sources and experts are numbered in the PE's team.
        let (members, me) = c.team_of(pe);
        let (n, l) = (members.len(), c.cfg.num_experts / members.len());
        let at = format!("{}, repeat {rep}, PE {pe} (rank {me} of {n})", c.cfg);
        assert_eq!(e.counts, o.counts, "{at}: recv_count");
        for le in 0..l {
            let mut begin = 0;
            for s in 0..n {
                let (eb, er) = &e.blocks[le * n + s];
                let (_, or) = &o.blocks[le * n + s];
                assert_eq!(
                    er.len(),
                    or.len(),
                    "{at}: count of block (expert {le}, source {s})"
                );
                if !er.is_empty() {
                    assert_eq!(*eb, begin, "{at}: blocks in source order");
                }
                begin += er.len() as u64;
                for (i, (g, w)) in er.iter().zip(or).enumerate() {
                    assert_eq!((g.0, g.2), (w.0, w.2), "{at}: block ({le}, {s}) row {i}");
                    let t = g.0 as usize;
                    let slots = &routes[members[s]].topk_idx[t * k..(t + 1) * k];
                    // The slot names this expert; a token that names it twice has a row
                    // per slot, in slot order.
                    assert_eq!(
                        slots.get(g.1 as usize),
                        Some(&((me * l + le) as i64)),
                        "{at}: recv_topk_slot of ({le}, {s}) row {i}"
                    );
                    if i > 0 && er[i - 1].0 == g.0 {
                        assert!(
                            er[i - 1].1 < g.1,
                            "{at}: rows of token {t} in block ({le}, {s}) in slot order"
                        );
                    }
                    rows_checked += 1;
                }
            }
        }
        assert_eq!(e.comb, o.comb, "{at}: combined_x rows");
        let first = c.first_set_calls.unwrap_or(0);
        let calls = (first + rep as u64 + 1, first + rep as u64 + 1);
        assert_eq!(
            e.status,
            vec![(0, calls.0), (0, calls.1)],
            "{at}: status / set_calls"
        );
    }
    rows_checked
}

/// GPU shrink mode (EP_LL_SHRINK, ep_ll.cu "Shrink mode"): PE `dead` runs `after` repeats
/// and stops (a PE that died; 0 = from the start; `c.dies_in` says how the repeat of the
/// death goes). The others' kernels wait for it at most the bound, then mask it themselves
/// and go on: before the death every PE's outputs equal the oracle's with nobody masked,
/// from the repeat of the death on the survivors' equal the oracle's with `dead` masked by
/// the host (what the dead PE had not sent is absent, its experts are left out of the
/// sums) — except that a PE that dies after the dispatch (`"combine"`) still delivered
/// its dispatch — and each survivor's mask names exactly `dead`, with the mark of the
/// call that gave up on it.
fn check_shrink(mut c: KCase, dead: usize, after: usize) {
    c.masked_pe = Some(dead);
    c.shrink = Some(after);
    let routes = routing(&c);
    let emu = run_emulated(&c, &routes);
    let all = run_cpu(
        &KCase {
            masked_pe: None,
            shrink: None,
            ..c.clone()
        },
        &routes,
    );
    let masked = run_cpu(&c, &routes);
    let everyone: Vec<usize> = (0..c.pes).collect();
    let survivors: Vec<usize> = (0..c.pes).filter(|&p| p != dead).collect();
    let after_dispatch = c.dies_in == Some("combine");
    let mut rows_checked = 0;
    for rep in 0..c.repeats {
        let (pes, want): (&Vec<usize>, Vec<PeOut>) = if rep < after {
            (&everyone, all[rep].clone())
        } else if rep == after && after_dispatch {
            // The dispatch had everyone; the combine leaves the dead PE's experts out.
            let w = survivors
                .iter()
                .zip(&masked[rep])
                .map(|(&me, m)| PeOut {
                    comb: m.comb.clone(),
                    ..all[rep][me].clone()
                })
                .collect();
            (&survivors, w)
        } else {
            (&survivors, masked[rep].clone())
        };
        rows_checked += compare_repeat(&c, &routes, rep, &emu[rep], &want, pes);
        // The call that gave up on it: the death's dispatch (LL call 2 * after, tag
        // 2 * after + 1), or its combine (tag 2 * after + 2): EP_LL_MASK_SHRUNK(tag), as
        // the launcher's mirror computes it.
        let tag = 2 * after as u64 + if after_dispatch { 2 } else { 1 };
        for (o, &me) in emu[rep].iter().zip(pes) {
            let want: Vec<i32> = (0..c.pes)
                .map(|q| {
                    if q == dead && rep >= after {
                        rshmem::gpu::ep::mask_shrunk(tag)
                    } else {
                        0
                    }
                })
                .collect();
            assert_eq!(o.mask, want, "repeat {rep}, PE {me}: mask");
        }
    }
    assert!(rows_checked > 0, "the case received nothing");
}

#[allow(clippy::too_many_arguments)]
fn kcase(
    pes: usize,
    n: usize,
    h: usize,
    e: usize,
    k: usize,
    fp8: bool,
    grid: usize,
    tokens: &[usize],
) -> KCase {
    KCase {
        cfg: Config {
            num_max_dispatch_tokens_per_rank: n,
            hidden: h,
            num_experts: e,
            num_topk: k,
            use_fp8: fp8,
            round_scale: false,
        },
        pes,
        grid,
        tokens: tokens.to_vec(),
        experts: None,
        masked_pe: None,
        repeats: 2,
        dispatch_only: false,
        concurrent: false,
        net: Net::P2p,
        shrink: None,
        dies_in: None,
        teams: None,
        repeat_ids: false,
        first_set_calls: None,
        corrupt_header: None,
    }
}

#[test]
fn kernels_emulated_two_pes_bf16_h2048() {
    check_kernels(kcase(2, 4, 2048, 8, 4, false, 2, &[4, 3]));
}

#[test]
fn kernels_emulated_three_pes_fp8_h7168_grid_below_pes_and_zero_tokens() {
    check_kernels(kcase(3, 3, 7168, 9, 3, true, 1, &[3, 3, 0]));
}

#[test]
fn kernels_emulated_four_pes_fp8_round_scale_h2560_parts_and_idle_experts() {
    let mut c = kcase(4, 4, 2560, 16, 8, true, 9, &[4, 4, 2, 1]);
    c.cfg.round_scale = true;
    c.experts = Some(vec![0, 1, 2, 3, 4, 5, 12]);
    check_kernels(c);
}

/// Signal words carry the call's tag in 32 bits: the kernels go on across the point
/// where it wraps (LL call 2^32 - 1 is the last before it; cut to 32 bits, the tag stopped
/// every wait from matching there), in both emulation modes.
#[test]
fn kernels_emulated_across_the_tag_wrap() {
    for concurrent in [false, true] {
        let mut c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 3, 2]);
        c.repeats = 4; // LL calls 2^32 - 4 ..= 2^32 + 3
        c.first_set_calls = Some((1 << 31) - 2);
        c.concurrent = concurrent;
        check_kernels(c);
    }
}

#[test]
fn kernels_emulated_one_pe_fp8_h4096() {
    check_kernels(kcase(1, 5, 4096, 4, 2, true, 3, &[5]));
}

#[test]
fn kernels_emulated_masked_pe_bf16_h5120() {
    let mut c = kcase(3, 4, 5120, 6, 3, false, 6, &[4, 4, 4]);
    c.masked_pe = Some(2);
    check_kernels(c);
}

#[test]
fn kernels_emulated_two_pes_fp8_h8192_k11_many_chunks() {
    check_kernels(kcase(2, 16, 8192, 22, 11, true, 4, &[16, 13]));
}

/// A PE whose input is invalid poisons the call: it records its own fault, every other PE
/// records that PE's fault word (the CPU's `EpPeerFailed` reason), and every PE's receive
/// kernel still completes (the set's call counter advances: nobody hangs).
fn check_poisoned(
    mut c: KCase,
    bad_pe: usize,
    want_word: u64,
    corrupt: impl Fn(&mut check::Routing),
) {
    c.dispatch_only = true;
    c.repeats = 1;
    let mut routes = routing(&c);
    corrupt(&mut routes[bad_pe]);
    let emu = run_emulated(&c, &routes);
    assert_eq!(emu[0].len(), c.pes);
    for (me, o) in emu[0].iter().enumerate() {
        let (kind, peer) = if me == bad_pe {
            (1, me as i64)
        } else {
            (2, bad_pe as i64)
        };
        // Tag of call 0 = 1; set 1 untouched; set 0's counter advanced once.
        assert_eq!(
            o.status_full,
            vec![(kind, peer, want_word, 1), (0, 0, 0, 0)],
            "PE {me}: status (kind, peer, value, commit) per set"
        );
        assert_eq!(o.status, vec![(kind, 1), (0, 0)], "PE {me}: set_calls");
    }
}

#[test]
fn kernels_emulated_bad_expert_id_poisons_every_pe() {
    let c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 2, 3]);
    // topk_idx[1][2] = E on PE 1: fault code 2 with the flat index 1 * K + 2 = 5.
    check_poisoned(c, 1, (1 << 31) | (2 << 24) | 5, |r| r.topk_idx[5] = 6);
}

/// Repeated ids within N rows per expert are sent, counted and combined once per slot,
/// as on the CPU.
#[test]
fn kernels_emulated_repeated_expert_ids_match_the_oracle() {
    let mut c = kcase(3, 8, 2048, 6, 3, true, 2, &[4, 3, 4]);
    c.repeat_ids = true;
    check_kernels(c);
}

#[test]
fn kernels_emulated_expert_named_more_than_n_times_poisons_every_pe() {
    let c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 2, 3]);
    // Every id of PE 2's 3 tokens is expert 4: the fifth entry naming it (N = 4), index
    // 4, is fault code 5 with that index.
    check_poisoned(c, 2, (1 << 31) | (5 << 24) | 4, |r| r.topk_idx.fill(4));
}

/// An expert named more than N times where another expert is named often too (repeats
/// within tokens but no overflow for it): the first entry past N of the expert that
/// overflows, found after the per-expert count.
#[test]
fn kernels_emulated_overflow_among_repeats_names_the_first_entry_past_n() {
    let c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 2, 4]);
    // PE 2, K = 3: tokens [1 1 5] [2 2 5] [3 3 -1] [5 5 5]. Experts 1, 2, 3 are named
    // twice (<= N = 4); expert 5 at flat indices 2, 5, 9, 10, 11: the fifth, 11, is the
    // first entry past N = 4.
    check_poisoned(c, 2, (1 << 31) | (5 << 24) | 11, |r| {
        r.topk_idx = vec![1, 1, 5, 2, 2, 5, 3, 3, -1, 5, 5, 5];
    });
    // E = 2400: the count takes three passes of 1024 experts. Expert 7 (first pass) is
    // named 3 times, expert 1500 (second) N = 4 times, expert 2100 (third) five times:
    // the fifth at index 11.
    let c = kcase(3, 4, 2048, 2400, 3, true, 2, &[4, 2, 4]);
    check_poisoned(c, 2, (1 << 31) | (5 << 24) | 11, |r| {
        r.topk_idx = vec![
            7, 7, 7, 1500, 1500, 1500, 1500, 2100, 2100, 2100, 2100, 2100,
        ];
    });
}

/// A message header outside [0, N) x [0, K) (a corrupt message) fails the dispatch on its
/// receiver with the CPU's words (the launcher's status_error), every other PE's dispatch
/// succeeds, and the receive writes stay in bounds: the row is filed at (0, 0). A combine
/// of that handle is poisoned there (EP_FAULT_DISPATCH_HEADER), so every PE's combine
/// fails instead of one returning a row to the wrong place; before 2026-12-07 the GPU
/// trapped in that combine. The routing (seed 11) has PE 1 send PE 0 at least one token.
#[test]
fn kernels_emulated_corrupt_header_fails_the_dispatch_on_its_receiver() {
    let poison7 = (1u64 << 31) | (7 << 24);
    for (t, k) in [(4, 0), (0, 3), (-1, 1), (2, -7)] {
        let mut c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 2, 3]);
        // The first pair runs 34 round trips: the combines of repeats 1 to 33 (the
        // header is corrupt in repeat 0 only) sum exactly. Before 2026-12-07 the
        // dispatch's record stayed, matched by the call mod 64, and repeat 32's combine
        // (call 65, its dispatch call 64) was poisoned on every PE.
        c.repeats = if (t, k) == (4, 0) { 34 } else { 1 };
        c.corrupt_header = Some((0, 1, t, k));
        let routes = routing(&c);
        let emu = run_emulated(&c, &routes);
        assert_eq!(emu[0].len(), 3);
        for rep in 2..c.repeats {
            for (me, o) in emu[rep].iter().enumerate() {
                assert_eq!(
                    o.comb, emu[1][me].comb,
                    "repeat {rep} PE {me}: combined rows"
                );
                // Nothing recorded by this repeat's calls (2 rep and 2 rep + 1: tags
                // 2 rep + 1 and 2 rep + 2); the records shown are repeat 0's.
                assert!(
                    o.status_full.iter().all(|s| s.3 <= 2),
                    "repeat {rep} PE {me}: {:?}",
                    o.status_full
                );
            }
        }
        for (me, o) in emu[0].iter().enumerate() {
            // Set 0: the dispatch's record (tag 1); set 1: the combine's (tag 2).
            let want = if me == 0 {
                vec![
                    (8, 1, (u64::from(t as u32) << 32) | u64::from(k as u32), 1),
                    (4, 0, poison7, 2),
                ]
            } else {
                vec![(0, 0, 0, 0), (5, 0, poison7, 2)]
            };
            assert_eq!(o.status_full, want, "({t}, {k}) PE {me}: status per set");
            assert_eq!(o.status.iter().map(|s| s.1).collect::<Vec<_>>(), [1, 1]);
        }
        // PE 0's first message from PE 1 is the first row of its first non-empty block
        // from PE 1 (blocks in (local expert, source) order, 3 sources).
        let first = emu[0][0]
            .blocks
            .iter()
            .skip(1)
            .step_by(3)
            .find(|b| !b.1.is_empty())
            .expect("PE 1 sent PE 0 a token");
        assert_eq!((first.1[0].0, first.1[0].1), (0, 0), "({t}, {k})");
    }
}

#[test]
fn kernels_emulated_too_many_tokens_poisons_every_pe() {
    let c = kcase(2, 3, 4096, 4, 2, false, 3, &[3, 5]);
    // PE 1 passes T = 5 > N = 3: fault code 1 with the value 5.
    check_poisoned(c, 1, (1 << 31) | (1 << 24) | 5, |_| {});
}

/// The same comparisons with PEs and blocks running at once (`--concurrent`): a receive
/// kernel can start before its peers' send kernels, blocks of one launch interleave, and
/// with three repeats (six calls) every send after the second waits for real credits
/// from the receivers of the call two before on its buffer set.
#[test]
fn kernels_emulated_concurrently_match_the_oracle() {
    let mut cases = vec![
        kcase(2, 4, 2048, 8, 4, false, 2, &[4, 3]),
        kcase(3, 3, 7168, 9, 3, true, 1, &[3, 3, 0]),
        kcase(2, 16, 8192, 22, 11, true, 4, &[16, 13]),
    ];
    let mut c = kcase(4, 4, 2560, 16, 8, true, 9, &[4, 4, 2, 1]);
    c.cfg.round_scale = true;
    c.experts = Some(vec![0, 1, 2, 3, 4, 5, 12]);
    cases.push(c);
    let mut c = kcase(3, 4, 5120, 6, 3, false, 6, &[4, 4, 4]);
    c.masked_pe = Some(2);
    cases.push(c);
    for mut c in cases {
        c.concurrent = true;
        c.repeats = 3;
        check_kernels(c);
    }
}

/// GPU shrink mode with a PE that died part way through sending its counts (blocks one
/// after another, so the emulator can place the death): in repeat `after` the dead PE's
/// dispatch send runs, then its count word for local expert 0 is taken back on every
/// receiver. The receivers give up on that word only, yet must leave the PE out of the
/// whole call (its later blocks cannot be located without that count), every block of
/// the receive alike: from that repeat on the survivors' outputs are the masked oracle's.
fn check_shrink_partial(mut c: KCase, dead: usize, after: usize) {
    c.dies_in = Some("counts");
    // The case shows something only if the count taken back announced tokens, and the
    // dead PE also sent to a later local expert of some survivor (whose block the rule
    // must drop although its count came).
    let routes = routing(&c);
    let l = c.cfg.num_experts / c.pes;
    let to = |le: usize| {
        (0..c.pes)
            .filter(|&p| p != dead)
            .map(|p| {
                let e = (p * l + le) as i64;
                routes[dead].topk_idx.iter().filter(|&&x| x == e).count()
            })
            .sum::<usize>()
    };
    assert!(to(0) > 0, "the count taken back announced no token");
    assert!(
        (1..l).map(to).sum::<usize>() > 0,
        "the dead PE sent nothing to a later local expert"
    );
    check_shrink(c, dead, after);
}

/// EP groups of a split (the buffer's team in the control block, ep_ll.ctl team fields):
/// 5 PEs as {0, 2, 4} and {1, 3}, each group its own buffer, sizes and layout, at once in
/// one heap; every PE's outputs equal the CPU oracle's on the same teams, sources and
/// experts numbered in the team, the peers reached through their world PEs. Blocks one
/// after another, then every PE and block a process; over P2P, then with IBGDA queues
/// between "nodes".
#[test]
fn kernels_emulated_on_two_teams_of_a_split() {
    for concurrent in [false, true] {
        let mut c = kcase(5, 4, 2048, 12, 3, true, 3, &[4, 3, 4, 2, 4]);
        c.teams = Some(vec![vec![0, 2, 4], vec![1, 3]]);
        c.concurrent = concurrent;
        check_kernels(c.clone());
        // "Nodes" of two PEs (0-1, 2-3, 4): the teams' peers through IBGDA queues, with
        // world PEs on the queue pairs and the signals.
        c.net = Net::Mixed;
        check_kernels(c);
    }
}

/// Shrink tests (blocks one after another): how long the kernels wait for a dead PE before
/// giving up.
const SHRINK_TIMEOUT_MS: u64 = 300;

/// Shrink mode, blocks one after another: a PE dead from the first call.
#[test]
fn kernels_emulated_shrink_masks_a_pe_dead_from_the_start() {
    check_shrink(kcase(3, 4, 2048, 6, 3, false, 3, &[4, 4, 4]), 2, 0);
}

/// Shrink mode: a PE that dies after sending some of its counts.
#[test]
fn kernels_emulated_shrink_leaves_out_a_pe_that_died_while_sending_counts() {
    let mut c = kcase(3, 4, 2048, 6, 3, true, 3, &[4, 4, 4]);
    c.repeats = 3;
    check_shrink_partial(c, 1, 1);
}

/// Shrink mode: a PE that dies after the dispatch of a repeat (the combine gives up).
#[test]
fn kernels_emulated_shrink_masks_a_pe_that_dies_before_the_combine() {
    let mut c = kcase(3, 4, 2048, 6, 3, false, 3, &[4, 4, 4]);
    c.repeats = 3;
    c.dies_in = Some("combine");
    check_shrink(c, 0, 1);
}

/// Shrink mode: a PE whose credit never came (the send kernels give up, send it nothing,
/// and still complete their counters).
#[test]
fn kernels_emulated_shrink_gives_up_in_the_credit_wait() {
    let mut c = kcase(4, 4, 2560, 8, 4, true, 5, &[4, 3, 4, 2]);
    c.repeats = 3;
    c.dies_in = Some("credit");
    check_shrink(c, 3, 1);
}

/// Shrink mode: a PE later than the whole bound. Block 0 of each receiver's dispatch
/// receive gives up on its count for local expert 0; the word comes right after, so the
/// other block finds all its words. The call's one decision (block 0's: leave it out)
/// must hold in that block too: the dispatch of that repeat leaves the PE out entirely.
#[test]
fn kernels_emulated_shrink_one_decision_for_a_late_pe() {
    // 3 PEs, 6 local experts: 18 receive units, so block 1 (units 16 and 17, local
    // expert 5, sources 1 and 2) reads source 1's words after block 0 gave up on it.
    let mut c = kcase(3, 8, 2048, 18, 4, false, 2, &[8, 8, 8]);
    c.repeats = 3;
    c.dies_in = Some("late");
    let (dead, l) = (1, 6);
    let routes = routing(&c);
    let late = [0, 2]
        .iter()
        .map(|&p| {
            let e = (p * l + 5) as i64;
            routes[dead].topk_idx.iter().filter(|&&x| x == e).count()
        })
        .sum::<usize>();
    assert!(
        late > 0,
        "the late PE sent nothing to local expert 5: the case shows nothing"
    );
    check_shrink(c, dead, 1);
}

/// Shrink mode, every PE and block a process: a PE that completes two repeats and dies.
#[test]
fn kernels_emulated_concurrently_shrink_masks_a_pe_that_dies() {
    let mut c = kcase(4, 4, 2560, 8, 4, true, 4, &[4, 3, 4, 2]);
    c.concurrent = true;
    c.repeats = 4;
    check_shrink(c, 1, 2);
}

#[test]
fn kernels_emulated_concurrently_poison_every_pe() {
    let mut c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 2, 3]);
    c.concurrent = true;
    check_poisoned(c, 1, (1 << 31) | (2 << 24) | 5, |r| r.topk_idx[5] = 6);
}

/// The kernels over IBGDA queues against the soft HCA (every peer, and "nodes" of two PEs
/// with P2P inside), sequential and concurrent: the stage kernel, the WRITEs of messages
/// and rows from the heap's staging areas, the fenced signal WRITEs of counts, flags and
/// credits, and the loopback queue for each PE's own signals, against the same oracle.
#[test]
fn kernels_emulated_over_ibgda_match_the_oracle() {
    let mut masked = kcase(3, 4, 5120, 6, 3, false, 6, &[4, 4, 4]);
    masked.masked_pe = Some(2);
    let mut idle = kcase(4, 4, 2560, 16, 8, true, 9, &[4, 4, 2, 1]);
    idle.cfg.round_scale = true;
    idle.experts = Some(vec![0, 1, 2, 3, 4, 5, 12]);
    let cases = [
        (
            kcase(2, 4, 2048, 8, 4, false, 2, &[4, 3]),
            Net::Ibgda,
            false,
        ),
        (
            kcase(3, 3, 7168, 9, 3, true, 1, &[3, 3, 0]),
            Net::Ibgda,
            false,
        ),
        (idle.clone(), Net::Mixed, false),
        (masked, Net::Ibgda, true),
        (idle, Net::Ibgda, true),
        (
            kcase(3, 16, 8192, 33, 11, true, 4, &[16, 13, 9]),
            Net::Mixed,
            true,
        ),
    ];
    for (mut c, net, concurrent) in cases {
        c.net = net;
        c.concurrent = concurrent;
        c.repeats = 3;
        check_kernels(c);
    }
}

#[test]
fn kernels_emulated_over_ibgda_poison_every_pe() {
    let mut c = kcase(3, 4, 2048, 6, 3, true, 2, &[4, 2, 3]);
    c.concurrent = true;
    c.net = Net::Ibgda;
    check_poisoned(c, 1, (1 << 31) | (2 << 24) | 5, |r| r.topk_idx[5] = 6);
}
