//! The device API's test kernels (device-kernels/src/rshmem_device_tests.cu, unchanged)
//! run on the CPU: the same source, built as host C++ with g++ against a small CUDA
//! emulation (host/tests/device-emu/: every block of every PE a process, so blocks and PEs
//! run concurrently and wait on each other as on a GPU; a block's threads as fibers; the
//! PTX primitives of rshmem/device/ptx.cuh replaced by host atomics — the only part of the
//! API that is not the real code). Every manifest case runs at 2, 3 and 5 PEs and must
//! count exactly its manifest's checks with no failure; every trap case must trap with the
//! record and printed line the GPU runner's judge (`gpu::traps::judge`) expects; every
//! bench kernel (rshmem_device_bench.cu) must complete with the record its header defines.
//!
//! This checks the kernels' and the device API's logic (copy splitting at thread, warp and
//! block scope, peer translation, signals, waits, barriers, atomics, error paths), not GPU
//! memory ordering, warp divergence or speed: that is `scripts/gpu-check`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use rshmem::gpu::manifest::{Manifest, TestCase, TrapCase, TrapEnv};
use rshmem::gpu::state::DeviceError;
use rshmem::gpu::traps::{self, ChildOutput, Record, TrapReport};

/// Blocks of a collective case (the GPU runner sizes its co-resident grid; 3 is not a
/// power of two and makes the grid barrier count).
const COLLECTIVE_GRID: u32 = 3;
/// Device-side wait bound of the positive cases (RSHMEM_TIMEOUT_MS of a GPU run).
const TIMEOUT_MS: u64 = 10_000;

/// The emulator built with the test kernels.
fn emulator() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("rshmem_device_tests"))
}

/// The emulator built with the bench kernels.
fn bench_emulator() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("rshmem_device_bench"))
}

/// g++ of device-kernels/src/`module`.cu with the emulation and its driver.
fn build(module: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let emu = root.join("tests/device-emu");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "device-emulator-{module}-{}.bin",
        std::process::id()
    ));
    let r = Command::new("g++")
        .args([
            "-O1",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unknown-pragmas", // #pragma unroll
            "-rdynamic",            // kernels found by name (dlsym)
            "-D__CUDACC__",
            "-include",
        ])
        .arg(emu.join("emu/cuda_emu.h"))
        .arg("-I")
        .arg(emu.join("emu"))
        .arg("-I")
        .arg(root.join("../device-kernels/include"))
        .args(["-x", "c++"])
        .arg(root.join(format!("../device-kernels/src/{module}.cu")))
        .args(["-x", "c++"])
        .arg(emu.join("device_emulator.cpp"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run g++ (install g++): {e}"));
    assert!(
        r.status.success(),
        "g++ of the device emulator failed:\n{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// The pattern seed a kernel is launched with.
fn seed(kernel: &str) -> u64 {
    0x5eed_0000 + kernel.len() as u64
}

/// One emulated launch, as the emulator printed it.
#[derive(Debug, Default)]
struct Launch {
    stdout: String,
    stderr: String,
    /// Per PE: the values of the trap manifest's symbols.
    env: Vec<TrapEnv>,
    /// (pe, block, "exited:N" | "signal:N ...").
    exits: Vec<(usize, u32, String)>,
    /// Per PE: checks, failures, first_index, expected, observed.
    results: Vec<[u64; 5]>,
    /// Per PE: the first five words of the record (a bench kernel's start_ns, end_ns,
    /// iters, bytes, checksum).
    records: Vec<[u64; 5]>,
    errors: Vec<DeviceError>,
}

/// `key=value` fields of one output line.
fn fields(line: &str) -> std::collections::HashMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .collect()
}

fn num<T: std::str::FromStr>(f: &std::collections::HashMap<&str, &str>, k: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    f[k].parse()
        .unwrap_or_else(|e| panic!("field {k}={} is not a number: {e:?}", f[k]))
}

#[allow(clippy::too_many_arguments)]
fn launch(
    bin: &Path,
    kernel: &str,
    grid: u32,
    block: u32,
    pes: usize,
    params: [u64; 3],
    scratch_bytes: u64,
    timeout_ms: u64,
    bind: bool,
    fault: Option<&str>,
) -> Launch {
    let mut cmd = Command::new(bin);
    cmd.arg(kernel)
        .arg(grid.to_string())
        .arg(block.to_string())
        .arg(pes.to_string());
    for p in params {
        cmd.arg(p.to_string());
    }
    // Seeds: any value; the kernels derive every payload from it and the PE.
    cmd.arg(format!("{:#x}", seed(kernel)))
        .arg(scratch_bytes.to_string())
        .arg(timeout_ms.to_string())
        .arg(if bind { "1" } else { "0" });
    match fault {
        Some(f) => cmd.env("RSHMEM_EMU_FAULT", f),
        None => cmd.env_remove("RSHMEM_EMU_FAULT"),
    };
    let o = cmd.output().expect("run the device emulator");
    let mut l = Launch {
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        ..Launch::default()
    };
    assert!(
        o.status.success(),
        "device emulator {kernel} failed ({}): {}{}",
        o.status,
        l.stdout,
        l.stderr
    );
    for line in l.stdout.lines() {
        let f = fields(line);
        if line.starts_with("env ") {
            l.env.push(TrapEnv {
                my_pe: num(&f, "pe"),
                n_pes: num(&f, "n_pes"),
                heap_base: num(&f, "heap_base"),
                heap_size: num(&f, "heap_size"),
                scratch: num(&f, "scratch"),
                result: num(&f, "result"),
            });
        } else if line.starts_with("exit ") {
            let status = line.split_once("status=").unwrap().1.to_string();
            l.exits.push((num(&f, "pe"), num(&f, "block"), status));
        } else if line.starts_with("result ") {
            l.results.push([
                num(&f, "checks"),
                num(&f, "failures"),
                num(&f, "first_index"),
                num(&f, "expected"),
                num(&f, "observed"),
            ]);
        } else if line.starts_with("record ") {
            l.records.push([
                num(&f, "w0"),
                num(&f, "w1"),
                num(&f, "w2"),
                num(&f, "w3"),
                num(&f, "w4"),
            ]);
        } else if line.starts_with("error ") {
            l.errors.push(DeviceError {
                code: num(&f, "code"),
                pe: num(&f, "target"),
                addr: num(&f, "addr"),
                expected: num(&f, "expected"),
                observed: num(&f, "observed"),
                cmp: num(&f, "cmp"),
                block: num(&f, "block"),
                thread: num(&f, "thread"),
                reserved: [0; 5],
            });
        }
    }
    assert_eq!(l.env.len(), pes, "{}", l.stdout);
    assert_eq!(l.results.len(), pes, "{}", l.stdout);
    assert_eq!(l.errors.len(), pes, "{}", l.stdout);
    l
}

fn run_case(t: &TestCase, pes: usize, fault: Option<&str>) -> Launch {
    let grid = if t.collective || t.grid == 0 {
        COLLECTIVE_GRID
    } else {
        t.grid
    };
    launch(
        emulator(),
        &t.name,
        grid,
        t.block,
        pes,
        t.params3(),
        t.scratch_bytes,
        TIMEOUT_MS,
        true,
        fault,
    )
}

/// Everything wrong with one launch of a positive case, as sentences.
fn problems(t: &TestCase, pes: usize, l: &Launch) -> Vec<String> {
    let mut bad = Vec::new();
    for (pe, block, status) in &l.exits {
        if status != "exited:0" {
            bad.push(format!(
                "{} at {pes} PEs: PE {pe} block {block} ended {status}",
                t.name
            ));
        }
    }
    for (pe, r) in l.results.iter().enumerate() {
        if r[0] != t.checks_per_pe || r[1] != 0 {
            bad.push(format!(
                "{} at {pes} PEs: PE {pe} made {} checks (manifest: {}), {} failed; first at \
                 index {:#x}: expected {:#x}, observed {:#x}",
                t.name, r[0], t.checks_per_pe, r[1], r[2], r[3], r[4]
            ));
        }
    }
    for (pe, e) in l.errors.iter().enumerate() {
        if e.code != 0 {
            bad.push(format!(
                "{} at {pes} PEs: PE {pe} wrote device error {e:?}",
                t.name
            ));
        }
    }
    if !bad.is_empty() {
        let printed: Vec<&str> = l
            .stdout
            .lines()
            .filter(|s| s.starts_with("rshmem:"))
            .take(3)
            .collect();
        if !printed.is_empty() {
            bad.push(format!("  it printed: {printed:?}"));
        }
    }
    bad
}

#[test]
fn every_test_kernel_passes_on_emulated_pes() {
    let m = Manifest::load(None).expect("embedded manifest");
    assert!(m.tests.len() >= 22, "{} cases", m.tests.len());
    let mut bad = Vec::new();
    for pes in [2usize, 3, 5] {
        for t in &m.tests {
            if pes < t.min_pes {
                continue;
            }
            bad.extend(problems(t, pes, &run_case(t, pes, None)));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn a_wrong_peer_table_fails_the_checks() {
    // The emulation is not vacuous: with peers mapped at the wrong heaps, the data each PE
    // receives comes from the wrong origin, and the kernels say so.
    let m = Manifest::load(None).unwrap();
    for name in ["rshmem_test_put_thread", "rshmem_test_getmem_block"] {
        let t = m.tests.iter().find(|t| t.name == name).unwrap();
        let l = run_case(t, 3, Some("misroute"));
        let failures: u64 = l.results.iter().map(|r| r[1]).sum();
        let trapped = l.exits.iter().any(|(_, _, s)| s != "exited:0");
        assert!(
            failures > 0 || trapped,
            "{name} passed with a wrong peer table:\n{}",
            l.stdout
        );
    }
}

/// What the GPU trap runner's child reports, from an emulated launch: a block whose
/// process died by SIGABRT (`__trap`) is a launch failure, and the host layer's error is
/// the `Error::DeviceFault` GpuPe::sync builds from the record.
fn trap_report(t: &TrapCase, l: &Launch) -> TrapReport {
    let trapped = l.exits.iter().any(|(_, _, s)| s.starts_with("signal:6"));
    let e = l.errors[0];
    let launch_error = trapped.then(|| {
        if e.code != 0 {
            rshmem::Error::DeviceFault {
                pe: 0,
                kernel: t.kernel().to_string(),
                code: e.code,
                what: e.what(),
                target_pe: e.pe,
                addr: e.addr,
                wait: e.wait_text(),
                block: e.block,
                thread: e.thread,
            }
            .to_string()
        } else {
            "CUDA cuStreamQuery failed: CUDA_ERROR_LAUNCH_FAILED (emulated)".to_string()
        }
    });
    TrapReport {
        name: t.name.clone(),
        kernel: t.kernel().to_string(),
        env: l.env[0],
        cuda_status: if trapped {
            "CUDA_ERROR_LAUNCH_FAILED (emulated: the block's process died by SIGABRT)".into()
        } else {
            "CUDA_SUCCESS".into()
        },
        launch_error,
        record: Record::from(e),
    }
}

#[test]
fn every_trap_kernel_traps_as_the_manifest_says() {
    let m = Manifest::load(None).expect("embedded manifest");
    assert!(m.traps.len() >= 7, "{} traps", m.traps.len());
    let mut bad = Vec::new();
    for t in &m.traps {
        let pes = t.min_pes.max(1);
        let l = launch(
            emulator(),
            t.kernel(),
            t.grid,
            t.block,
            pes,
            t.params3(),
            t.scratch_bytes,
            t.timeout_ms.unwrap_or(TIMEOUT_MS),
            t.bind,
            None,
        );
        let report = trap_report(t, &l);
        let out = ChildOutput {
            code: None,
            timed_out: false,
            limit: std::time::Duration::from_secs(30),
            stdout: format!(
                "{}\n{}{}\n",
                l.stdout,
                traps::REPORT_PREFIX,
                serde_json::to_string(&report).unwrap()
            ),
            stderr: l.stderr.clone(),
        };
        if let Err(why) = traps::judge(t, &out) {
            bad.push(format!("{}: {}", t.name, why.join("; ")));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn every_bench_kernel_completes_with_its_record_on_emulated_pes() {
    // Every `rshmem bench --device gpu` kernel, 4 KiB messages, 20 timed iterations, PE 0
    // and its peer (the next PE of 2; the last of 3, with a bystander that returns at
    // once): the launch completes, and PE 0's record holds the iterations, the bytes and
    // the checksum its header (rshmem_device_bench.cu) defines.
    const SIZE: u64 = 4096;
    const ITERS: u64 = 20;
    const WARMUP: u64 = 16; // kWarmup
    let m = Manifest::load(None).expect("embedded manifest");
    assert!(m.benches.len() >= 22, "{} benches", m.benches.len());
    let mut bad = Vec::new();
    for (pes, peer) in [(2usize, 1u64), (3, 2)] {
        for b in &m.benches {
            let l = launch(
                bench_emulator(),
                &b.name,
                b.grid,
                b.block,
                pes,
                [SIZE, ITERS, peer],
                4096 + 2 * SIZE,
                TIMEOUT_MS,
                true,
                None,
            );
            let what = format!("{} at {pes} PEs (peer {peer})", b.name);
            for (pe, block, status) in &l.exits {
                if status != "exited:0" {
                    bad.push(format!("{what}: PE {pe} block {block} ended {status}"));
                }
            }
            let [start, end, iters, bytes, checksum] = l.records[0];
            let lat = b.kind == "latency";
            let want_bytes = if lat && (b.op == "p" || b.op == "atomic") {
                8 * ITERS
            } else {
                SIZE * ITERS
            };
            let peer_word = |i: u64| rshmem::gpu::pattern_u64(seed(&b.name) + peer, i);
            let want_sum = match b.op.as_str() {
                "p" if lat => Some(WARMUP + ITERS),
                "atomic" if lat => Some(WARMUP + ITERS - 1),
                "put" | "signal" | "get" if lat => Some(peer_word(0) ^ peer_word(SIZE / 8 - 1)),
                _ => None,
            };
            if iters != ITERS || bytes != want_bytes || start == 0 || end < start {
                bad.push(format!(
                    "{what}: record start {start} end {end} iters {iters} (want {ITERS}) \
                     bytes {bytes} (want {want_bytes})"
                ));
            }
            if let Some(w) = want_sum {
                if checksum != w {
                    bad.push(format!("{what}: checksum {checksum:#x}, want {w:#x}"));
                }
            }
            for (pe, e) in l.errors.iter().enumerate() {
                if e.code != 0 {
                    bad.push(format!("{what}: PE {pe} wrote device error {e:?}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
