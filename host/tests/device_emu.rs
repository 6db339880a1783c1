//! The device API's test kernels (device-kernels/src/rshmem_device_tests.cu, unchanged)
//! run on the CPU: the same source, built as host C++ with g++ against a small CUDA
//! emulation (host/tests/device-emu/: every block of every PE a process, so blocks and PEs
//! run concurrently and wait on each other as on a GPU; a block's threads as fibers; the
//! PTX primitives of rshmem/device/ptx.cuh replaced by host atomics — the only part of the
//! API that is not the real code). Every manifest case runs at 2, 3, 5 and 8 PEs and must
//! count exactly its manifest's checks with no failure; every trap case must trap with the
//! record and printed line the GPU runner's judge (`gpu::traps::judge`) expects; every
//! bench kernel (rshmem_device_bench.cu) must complete with the record its header defines.
//!
//! The test kernels also run with every peer over IBGDA queues that a soft HCA engine in
//! this process executes (what `selftest --device gpu --transport proxy` does on a GPU).
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

/// Which kernels an emulator build links, and how its driver calls them.
#[derive(Clone, Copy)]
enum Kernels {
    /// rshmem_device_tests.cu: harness arguments, result records.
    Tests,
    /// rshmem_device_bench.cu: harness arguments, bench records.
    Bench,
    /// rshmem_ibgda_producer.cu, the IBGDA rate kernels: their own arguments.
    Producer,
    /// examples/gpu_ring/ring.cu, the user example.
    Ring,
}

impl Kernels {
    /// The source, relative to the crate.
    fn source(self) -> &'static str {
        match self {
            Kernels::Tests => "../device-kernels/src/rshmem_device_tests.cu",
            Kernels::Bench => "../device-kernels/src/rshmem_device_bench.cu",
            Kernels::Producer => "../device-kernels/src/rshmem_ibgda_producer.cu",
            Kernels::Ring => "../examples/gpu_ring/ring.cu",
        }
    }
    /// The driver's mode (device_emulator.cpp).
    fn mode(self) -> &'static str {
        match self {
            Kernels::Tests | Kernels::Bench => "-DRSHMEM_EMU_HARNESS",
            Kernels::Producer => "-DRSHMEM_EMU_PRODUCER",
            Kernels::Ring => "-DRSHMEM_EMU_RING",
        }
    }
}

/// The emulator built with `k` (once per test binary).
fn emulator(k: Kernels) -> &'static Path {
    static BINS: [OnceLock<PathBuf>; 4] = [const { OnceLock::new() }; 4];
    BINS[k as usize].get_or_init(|| build(k))
}

/// g++ of `k`'s kernels with the emulation and its driver.
fn build(k: Kernels) -> PathBuf {
    let root = emu_build::crate_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "device-emulator-{}-{}.bin",
        k as usize,
        std::process::id()
    ));
    emu_build::gxx_emulated(
        "the device emulator",
        &["-rdynamic", k.mode()], // -rdynamic: kernels found by name (dlsym)
        &[
            root.join(k.source()),
            root.join("tests/device-emu/device_emulator.cpp"),
        ],
        &out,
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
    env: &[(&str, String)],
    shm: Option<&Shm>,
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
    // Only what this launch says: none of the driver's variables from outside.
    for v in [
        "RSHMEM_EMU_FAULT",
        "RSHMEM_EMU_PRODUCER_ARGS",
        "RSHMEM_EMU_SHM",
        "RSHMEM_EMU_SHM_AT",
        "RSHMEM_EMU_SHM_LEN",
        "RSHMEM_EMU_STATES",
        "RSHMEM_EMU_RESULTS",
        "RSHMEM_EMU_TEAM",
    ] {
        cmd.env_remove(v);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(m) = shm {
        cmd.envs(m.env());
    }
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

/// The driver's RSHMEM_EMU_TEAM for a case with a manifest `team` (the teams the GPU
/// runner creates for it).
fn team_env(t: &TestCase) -> Vec<(&'static str, String)> {
    t.team
        .iter()
        .map(|m| ("RSHMEM_EMU_TEAM", m.clone()))
        .collect()
}

/// `fault`: RSHMEM_EMU_FAULT for the driver (a deliberately wrong setup).
fn run_case(t: &TestCase, pes: usize, fault: Option<&str>) -> Launch {
    let mut env = team_env(t);
    env.extend(fault.map(|f| ("RSHMEM_EMU_FAULT", f.to_string())));
    let grid = if t.collective || t.grid == 0 {
        COLLECTIVE_GRID
    } else {
        t.grid
    };
    launch(
        emulator(Kernels::Tests),
        &t.name,
        grid,
        t.block,
        pes,
        t.params3(),
        t.scratch_bytes,
        TIMEOUT_MS,
        true,
        &env,
        None,
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
    for pes in [2usize, 3, 5, 8] {
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
            e.fault(0, t.kernel()).to_string()
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
            emulator(Kernels::Tests),
            t.kernel(),
            t.grid,
            t.block,
            pes,
            t.params3(),
            t.scratch_bytes,
            t.timeout_ms.unwrap_or(TIMEOUT_MS),
            t.bind,
            &[],
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
    let m = Manifest::load(None).expect("embedded manifest");
    assert!(m.benches.len() >= 22, "{} benches", m.benches.len());
    let mut bad = Vec::new();
    // With 2 PEs the parameters `rshmem bench --device gpu` passes (runner.rs).
    let runners = rshmem::gpu::runner::bench_kernel_params(SIZE as usize, ITERS);
    for (pes, params) in [(2usize, runners), (3, [SIZE, ITERS, 2])] {
        let peer = params[2];
        for b in &m.benches {
            let l = launch(
                emulator(Kernels::Bench),
                &b.name,
                b.grid,
                b.block,
                pes,
                params,
                4096 + 2 * SIZE,
                TIMEOUT_MS,
                true,
                &[],
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
            // What `rshmem bench --device gpu` requires of the record (runner.rs).
            let (want_bytes, want_sum) =
                rshmem::gpu::runner::bench_expected(&b.op, lat, SIZE, ITERS, seed(&b.name), peer);
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

// ---- the device API over IBGDA, against the soft HCA -------------------------------------

#[path = "device-emu/build.rs"]
mod emu_build;
#[allow(dead_code)] // the EP parity test uses other parts
mod emu_ibgda;
use emu_ibgda::{Mapping, PollingLocal, Shared, Shm};
use rshmem::gpu::ibgda::{descriptor, descriptor_bytes, CQE_CNT, WQE_CNT};
use rshmem::gpu::state::DeviceState;
use rshmem::softhca::{
    Access, CqMode, LocalBackend, LocalPeer, MrTable, QpConfig, QueueLayout, SoftHca,
};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn every_test_kernel_passes_over_ibgda_against_the_soft_hca() {
    let m = Manifest::load(None).expect("embedded manifest");
    let mut bad = Vec::new();
    // The production ring (1024 WQEBBs) at 2 and 3 PEs, and rings of 32, 8 and 16 WQEBBs
    // (at 3, 2 and 5 PEs), where hundreds of producer threads per queue wait for free
    // slots and the ring wraps constantly (put_signal's two-WQEBB and the inline puts'
    // five-WQEBB reservations across the end of the ring too).
    for (pes, ring) in [(2usize, WQE_CNT), (3, WQE_CNT), (3, 32), (2, 8), (5, 16)] {
        let sh = Shared::new(pes, false, TIMEOUT_MS, ring);
        for t in &m.tests {
            if pes < t.min_pes || rshmem::gpu::runner::P2P_KERNEL_CASES.contains(&t.name.as_str()) {
                continue;
            }
            sh.reset(t.scratch_bytes as usize);
            let grid = if t.collective || t.grid == 0 {
                COLLECTIVE_GRID
            } else {
                t.grid
            };
            let l = launch(
                emulator(Kernels::Tests),
                &t.name,
                grid,
                t.block,
                pes,
                t.params3(),
                t.scratch_bytes,
                TIMEOUT_MS,
                true,
                &team_env(t),
                Some(&sh.shm),
            );
            bad.extend(
                problems(t, pes, &l)
                    .into_iter()
                    .map(|b| format!("ibgda: {b}")),
            );
        }
        // Every queue carried work: the kernels really went through the soft HCA (the
        // loopback queues carry each PE's own atomics and signals).
        for p in 0..pes {
            for q in 0..pes {
                if sh.completed(p, q) == 0 {
                    bad.push(format!(
                        "ibgda at {pes} PEs: PE {p}'s queue to PE {q} completed nothing"
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn a_bad_rkey_over_ibgda_traps_with_the_queue_error() {
    // The IBGDA error path end to end: the engine completes the WRITE to a peer with
    // REMOTE_ACCESS, the device side (queue.cuh fail) writes the record (ERR_QUEUE, the
    // syndrome in cmp bits 15:8, WQE opcode in 23:16), prints the line and traps.
    let m = Manifest::load(None).unwrap();
    let t = m
        .tests
        .iter()
        .find(|t| t.name == "rshmem_test_put_thread")
        .unwrap();
    let sh = Shared::new(2, true, 2000, WQE_CNT);
    sh.reset(t.scratch_bytes as usize);
    let l = launch(
        emulator(Kernels::Tests),
        &t.name,
        t.grid,
        t.block,
        2,
        t.params3(),
        t.scratch_bytes,
        2000,
        true,
        &[],
        Some(&sh.shm),
    );
    assert!(
        l.exits.iter().any(|(_, _, s)| s.starts_with("signal:6")),
        "nothing trapped: {}",
        l.stdout
    );
    for (pe, e) in l.errors.iter().enumerate() {
        assert_eq!(
            e.code,
            rshmem::gpu::state::ERR_QUEUE,
            "PE {pe}: {e:?}\n{}",
            l.stdout
        );
        assert_eq!(e.pe, 1 - pe as i32, "PE {pe}: {e:?}");
        assert_eq!((e.cmp >> 8) & 0xff, 0x13, "PE {pe}: syndrome of {e:?}");
        assert_eq!(
            (e.cmp >> 16) & 0xff,
            0x08,
            "PE {pe}: WQE opcode of {e:?} (RDMA WRITE)"
        );
    }
    assert!(
        l.stdout.lines().any(|s| s.starts_with("rshmem: PE ")
            && s.contains("error completion (syndrome 0x13, WQE opcode 0x08")),
        "{}",
        l.stdout
    );
}

/// One IBGDA queue pair in a memfd for the rate kernels (rshmem_ibgda_producer.cu): the
/// emulated GPU threads post, this test's engine executes. Offsets into the memfd.
struct ProducerJob {
    shm: Shm,
    desc: usize,
    src: usize,
    dst: usize,
    results: usize,
    out: usize,
    err: usize,
    times: usize,
    lkey: u32,
    rkey: u32,
    _qp: rshmem::softhca::QpHandle<PollingLocal>,
    _hca: SoftHca<PollingLocal>,
}

impl ProducerJob {
    fn new(dst_bytes: usize, src_bytes: usize, out_bytes: usize) -> ProducerJob {
        let page = 4096usize;
        let mut len = 0usize;
        let mut take = |bytes: usize| {
            let at = len.next_multiple_of(page);
            len = at + bytes.max(1);
            at
        };
        let ql = QueueLayout::new(WQE_CNT, CQE_CNT).unwrap();
        let queue = take(ql.size);
        let desc = take(320);
        let src = take(src_bytes);
        let dst = take(dst_bytes);
        let results = take(out_bytes);
        let out = take(out_bytes);
        let err = take(64);
        let times = take(4096);
        let states = take(128);
        let records = take(64);
        let len = len.next_multiple_of(page);
        let map = Mapping::new(len);
        let host = map.host;
        let r = host as u64;
        let dev = emu_ibgda::EMU_DEVICE_BASE;
        let at = |off: usize| map.at(off);
        // Local buffers (source, result slots) by device address; the remote region by
        // host address, in the peer's table.
        let pd = Arc::new(MrTable::new());
        let remote = Arc::new(MrTable::new());
        // SAFETY: the ranges are inside the mapping, which outlives both tables.
        let (lkey, rkey) = unsafe {
            (
                pd.register(at(0), dev, len as u64, Access::ALL),
                remote.register(at(dst), r + dst as u64, dst_bytes as u64, Access::ALL),
            )
        };
        let hca = SoftHca::start(PollingLocal(LocalBackend), "emu-producer").expect("engine");
        let mem = map.queue(queue, WQE_CNT);
        let qp = hca.attach(QpConfig::new(
            mem.clone(),
            pd.clone(),
            LocalPeer::new(remote.clone()),
            CqMode::Normal,
        ));
        let d = descriptor(
            &mem,
            dev.wrapping_sub(r),
            qp.qpn(),
            Duration::from_millis(TIMEOUT_MS),
        )
        .unwrap();
        let bytes = descriptor_bytes(&[d]);
        map.write(desc, &bytes);
        // The driver's (unbound) state: only its error pointer and heap size are read.
        let st = DeviceState {
            heap_base: dev,
            heap_size: len as u64,
            error: dev + err as u64,
            ..Default::default()
        };
        // SAFETY: DeviceState is repr(C), 128 bytes of plain integers; inside the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping((&st as *const DeviceState).cast::<u8>(), at(states), 128)
        };
        ProducerJob {
            shm: Shm {
                map,
                dev,
                states,
                results: records,
            },
            desc,
            src,
            dst,
            results,
            out,
            err,
            times,
            lkey,
            rkey,
            _qp: qp,
            _hca: hca,
        }
    }

    fn host(&self, off: usize) -> *mut u8 {
        self.shm.map.at(off)
    }
    fn d(&self, off: usize) -> u64 {
        self.shm.d(off)
    }
    fn word(&self, off: usize) -> u64 {
        // SAFETY: inside the mapping, 8-byte aligned by the callers; no kernel runs now.
        unsafe { self.host(off).cast::<u64>().read() }
    }

    /// Runs `kernel` with `args` (the kernel's own, in order) on one PE; returns the
    /// launch.
    fn run(&self, kernel: &str, grid: u32, block: u32, args: &[u64]) -> Launch {
        let args: Vec<String> = args.iter().map(|a| format!("{a:#x}")).collect();
        launch(
            emulator(Kernels::Producer),
            kernel,
            grid,
            block,
            1,
            [0; 3],
            0,
            TIMEOUT_MS,
            false,
            &[("RSHMEM_EMU_PRODUCER_ARGS", args.join(","))],
            Some(&self.shm),
        )
    }
}

#[test]
fn the_ibgda_rate_kernels_post_exactly_their_wqes_on_emulated_gpu_threads() {
    // rshmem_ibgda_post_writes (what `bench ibgda-rate` launches), per thread and
    // warp-batched (post_write_warp: one reservation per warp, __shfl_sync of the index,
    // per-lane fences, __syncwarp, the leader publishes), into a 1024-WQEBB ring that the
    // 5120 WQEs wrap five times; then rshmem_ibgda_fetch_add, 1280 blocking fetch-adds of
    // one word. The engine executes every WQE: exact memory, exact fetched values.
    const GRID: u32 = 2;
    const BLOCK: u32 = 64;
    const BYTES: usize = 64;
    const ITERS: u64 = 40;
    let threads = (GRID * BLOCK) as usize;
    for warp_batch in [0u64, 1] {
        let job = ProducerJob::new(threads * BYTES, BYTES, 8 * threads * ITERS as usize);
        let pattern: Vec<u8> = (0..BYTES)
            .map(|i| (i * 13 + 7 + warp_batch as usize) as u8)
            .collect();
        // SAFETY: inside the mapping; no kernel runs yet.
        unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), job.host(job.src), BYTES) };
        let l = job.run(
            "rshmem_ibgda_post_writes",
            GRID,
            BLOCK,
            &[
                job.d(job.desc),
                job.shm.map.host as u64 + job.dst as u64, // raddr: the engine's address
                job.rkey as u64,
                job.d(job.src),
                job.lkey as u64,
                BYTES as u64,
                ITERS,
                warp_batch,
                job.d(job.err),
                job.d(job.times),
            ],
        );
        let what = format!("post_writes (warp_batch {warp_batch})");
        for (_, b, s) in &l.exits {
            assert_eq!(s, "exited:0", "{what}: block {b}: {}", l.stdout);
        }
        assert_eq!(job.word(job.err), 0, "{what}: error record {}", l.stdout);
        for t in 0..threads {
            // SAFETY: inside the mapping; the kernel finished.
            let got = unsafe { std::slice::from_raw_parts(job.host(job.dst + t * BYTES), BYTES) };
            assert_eq!(got, &pattern[..], "{what}: thread {t}'s destination");
        }
        // SAFETY: the descriptor written in new(); its counters are atomics.
        let d = unsafe {
            &*job
                .host(job.desc)
                .cast::<rshmem::softhca::ibgda_table::IbgdaQp>()
        };
        assert_eq!(
            d.completed(),
            threads as u64 * ITERS,
            "{what}: WQEs completed"
        );
        assert_eq!(
            d.reserved(),
            threads as u64 * ITERS,
            "{what}: WQEBBs reserved"
        );
        for b in 0..GRID as usize {
            let (t0, t1) = (
                job.word(job.times + 16 * b),
                job.word(job.times + 16 * b + 8),
            );
            assert!(t0 > 0 && t1 >= t0, "{what}: block {b} times {t0} {t1}");
        }
    }

    const FA_BLOCK: u32 = 32;
    const FA_ITERS: u64 = 20;
    let fa_threads = (GRID * FA_BLOCK) as u64;
    let job = ProducerJob::new(4096, 8, 8 * (fa_threads * FA_ITERS) as usize);
    let l = job.run(
        "rshmem_ibgda_fetch_add",
        GRID,
        FA_BLOCK,
        &[
            job.d(job.desc),
            job.shm.map.host as u64 + job.dst as u64,
            job.rkey as u64,
            job.d(job.results),
            job.lkey as u64,
            FA_ITERS,
            job.d(job.err),
            job.d(job.out),
        ],
    );
    for (_, b, s) in &l.exits {
        assert_eq!(s, "exited:0", "fetch_add: block {b}: {}", l.stdout);
    }
    assert_eq!(job.word(job.err), 0, "fetch_add: error record {}", l.stdout);
    let n = fa_threads * FA_ITERS;
    let mut olds: Vec<u64> = (0..n as usize).map(|i| job.word(job.out + 8 * i)).collect();
    olds.sort_unstable();
    assert_eq!(
        olds,
        (0..n).collect::<Vec<_>>(),
        "fetched values are not 0..{n} once each"
    );
    // The remote word holds the sum (the engine stores in the CPU's byte order).
    assert_eq!(job.word(job.dst), n, "the counter");
}

#[test]
fn the_gpu_ring_example_kernel_passes_over_p2p_and_ibgda() {
    // examples/gpu_ring/ring.cu, the user example: one block of 256 threads per PE, 4096
    // words, 5 rounds of put_signal_block + signal_wait_until + barrier_all_block; every
    // thread counts the words it checked (the kernel's `checked`) and the wrong ones.
    const WORDS: u64 = 4096;
    const ROUNDS: u64 = 5;
    for pes in [2usize, 3, 4] {
        let scratch = 2 * WORDS * 8 + 64;
        let sh = Shared::new(pes, false, TIMEOUT_MS, WQE_CNT);
        sh.reset(scratch as usize);
        for (how, shared) in [("p2p", None), ("ibgda", Some(&sh))] {
            let l = launch(
                emulator(Kernels::Ring),
                "ring_exchange",
                1,
                256,
                pes,
                [WORDS, ROUNDS, 0],
                scratch,
                TIMEOUT_MS,
                true,
                &[],
                shared.map(|s: &Shared| &s.shm),
            );
            for (pe, b, s) in &l.exits {
                assert_eq!(
                    s, "exited:0",
                    "{how}, {pes} PEs: PE {pe} block {b}: {}",
                    l.stdout
                );
            }
            for (pe, r) in l.results.iter().enumerate() {
                assert_eq!(
                    (r[0], r[1]),
                    (WORDS * ROUNDS, 0),
                    "{how}, {pes} PEs: PE {pe} checked / wrong words"
                );
            }
        }
    }
}
