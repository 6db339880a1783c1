//! `rshmem selftest --device gpu --traps` / `--trap NAME`: the negative device cases of the
//! manifest (`traps`, [`super::manifest::TrapCase`]): kernels that must trap on a
//! device-side check (invalid PE, address outside the heap, unbound module, wait timeout,
//! invalid comparison).
//!
//! A trap destroys the CUDA context of the whole process, so every case runs in a child
//! process of this executable (`selftest --device gpu --trap-child NAME`, hidden), with the
//! case's `timeout_ms` as its RSHMEM_TIMEOUT_MS. The child launches the kernel on PE 0,
//! waits for it (bounded), reads the device error record (host-pinned memory mapped into
//! the device: it is ordinary host memory of the process and stays readable after the
//! context is lost), synchronises the stream once more (which flushes the kernel's
//! `printf` buffer and returns the context's sticky status) and prints one
//! [`REPORT_PREFIX`] line of JSON ([`TrapReport`]). The parent ([`run_traps`]) waits for
//! each child with a deadline (killing it past that) and [`judge`]s its output: the launch
//! failed with a trap status, the record names the expected code, PE, address and
//! operands, and the kernel's printed line says the same. A child that could not run
//! (no GPU, no driver) prints no report: the parent reports that child's error, never a
//! pass.

use super::driver::{driver, result_name};
use super::harness::HarnessArgs;
use super::manifest::{Manifest, TrapCase, TrapEnv};
use super::pe::{run_gpu_threads, DevBuf};
use super::runner::Sources;
use super::state;
use crate::config::Settings;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};
use std::ffi::c_void;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The child's report line starts with this; the rest is [`TrapReport`] as JSON.
pub const REPORT_PREFIX: &str = "rshmem-trap-report ";

/// Context statuses that mean "the kernel trapped": `__trap()` surfaces as an unspecified
/// launch failure or, on some GPU/driver combinations, as an illegal instruction.
pub const TRAP_STATUSES: &[&str] = &["CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION"];

/// How long a child may run on top of its case's `timeout_ms`: process start, CUDA
/// initialisation, loading (JIT-compiling) the module, the kernel, teardown.
pub const CHILD_GRACE: Duration = Duration::from_secs(30);

/// `rshmem_device_error_t` as the child read it back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub code: u32,
    pub pe: i32,
    pub addr: u64,
    pub expected: u64,
    pub observed: u64,
    pub cmp: u32,
    pub block: u32,
    pub thread: u32,
}

impl From<state::DeviceError> for Record {
    fn from(e: state::DeviceError) -> Record {
        Record {
            code: e.code,
            pe: e.pe,
            addr: e.addr,
            expected: e.expected,
            observed: e.observed,
            cmp: e.cmp,
            block: e.block,
            thread: e.thread,
        }
    }
}

/// What the child saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrapReport {
    pub name: String,
    pub kernel: String,
    /// The run's values of the manifest's expression symbols.
    pub env: TrapEnv,
    /// The error the host layer returned while waiting for the kernel; None: it completed.
    pub launch_error: Option<String>,
    /// The context's status after the wait (cuStreamSynchronize): "CUDA_SUCCESS" or
    /// `driver::result_name`'s "NAME (code): text".
    pub cuda_status: String,
    pub record: Record,
}

/// A finished (or killed) child process.
#[derive(Debug, Clone, Default)]
pub struct ChildOutput {
    /// The exit code; None when a signal ended it.
    pub code: Option<i32>,
    /// Killed by the parent at its deadline.
    pub timed_out: bool,
    pub limit: Duration,
    pub stdout: String,
    pub stderr: String,
}

impl ChildOutput {
    fn last_lines(&self, n: usize) -> String {
        let all: Vec<&str> = self
            .stdout
            .lines()
            .chain(self.stderr.lines())
            .filter(|l| !l.trim().is_empty())
            .collect();
        all[all.len().saturating_sub(n)..].join(" | ")
    }
}

/// The report line of a child's stdout (the last one), parsed.
pub fn parse_report(stdout: &str) -> Option<std::result::Result<TrapReport, String>> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(REPORT_PREFIX))
        .map(|j| serde_json::from_str(j).map_err(|e| format!("malformed trap report {j:?}: {e}")))
}

/// The substrings the kernel's printed line must contain (docs: rshmemi_fail in
/// rshmem/device/core.cuh prints `rshmem: PE <me>: <what>: <why>` and then either
/// ` (target PE <pe>, addr 0x<addr>, bytes <len>)` or, for wait timeouts,
/// `: *0x<addr> cmp <cmp> expected <v> (0x<v>), last observed <o> (0x<o>)`).
pub fn expected_message(t: &TrapCase, env: &TrapEnv) -> Vec<String> {
    let x = &t.expect;
    // An unbound module has no PE: the line says PE -1.
    let me = if t.bind { env.my_pe as i128 } else { -1 };
    let mut v = vec![format!("rshmem: PE {me}: ")];
    let val = |s: &Option<super::manifest::Sym>| s.as_ref().map(|s| s.eval(env));
    let (pe, addr, exp, obs) = (val(&x.pe), val(&x.addr), val(&x.expected), val(&x.observed));
    if t.expect_code == state::ERR_WAIT_TIMEOUT {
        if let (Some(a), Some(c), Some(e), Some(o)) = (addr, x.cmp, exp, obs) {
            v.push(format!(
                "*{:#x} cmp {c} expected {} ({:#x}), last observed {} ({:#x})",
                a as u64, e as u64, e as u64, o as u64, o as u64
            ));
        }
    } else if let (Some(p), Some(a), Some(e)) = (pe, addr, exp) {
        v.push(format!(
            "(target PE {p}, addr {:#x}, bytes {})",
            a as u64, e as u64
        ));
    }
    v.extend(x.message.iter().cloned());
    v
}

/// Judges one child's output against its case: Ok(what it showed) or Err(every mismatch).
pub fn judge(t: &TrapCase, out: &ChildOutput) -> std::result::Result<String, Vec<String>> {
    if out.timed_out {
        return Err(vec![format!(
            "the child did not finish within {} s and was killed; its last output: {}",
            out.limit.as_secs(),
            out.last_lines(3)
        )]);
    }
    let r = match parse_report(&out.stdout) {
        None => {
            return Err(vec![format!(
                "the child ran no trap (exit {}): {}",
                out.code.map_or("by signal".to_string(), |c| c.to_string()),
                out.last_lines(3)
            )])
        }
        Some(Err(e)) => return Err(vec![e]),
        Some(Ok(r)) => r,
    };
    let mut bad = Vec::new();
    if r.name != t.name || r.kernel != t.kernel() {
        bad.push(format!(
            "the report is for {} ({}), not {} ({})",
            r.name,
            r.kernel,
            t.name,
            t.kernel()
        ));
    }
    match &r.launch_error {
        None => bad.push(format!(
            "the kernel completed without trapping (status {})",
            r.cuda_status
        )),
        Some(_) if !TRAP_STATUSES.iter().any(|s| r.cuda_status.starts_with(s)) => {
            bad.push(format!(
                "CUDA reported {}, not a trap ({})",
                r.cuda_status,
                TRAP_STATUSES.join(" or ")
            ))
        }
        Some(_) => {}
    }
    let env = &r.env;
    let x = &t.expect;
    let rec = &r.record;
    if x.record {
        let mut field = |name: &str, want: Option<i128>, got: i128, hex: bool| {
            if let Some(w) = want {
                if w != got {
                    bad.push(if hex {
                        format!("record.{name} is {got:#x}, expected {w:#x}")
                    } else {
                        format!("record.{name} is {got}, expected {w}")
                    });
                }
            }
        };
        let ev = |s: &Option<super::manifest::Sym>| s.as_ref().map(|s| s.eval(env));
        field("code", Some(t.expect_code as i128), rec.code as i128, false);
        field("pe", ev(&x.pe), rec.pe as i128, false);
        field("addr", ev(&x.addr), rec.addr as i128, true);
        field("expected", ev(&x.expected), rec.expected as i128, false);
        field("observed", ev(&x.observed), rec.observed as i128, false);
        field("cmp", x.cmp.map(|c| c as i128), rec.cmp as i128, false);
        // The host layer's error must carry the record.
        if let Some(e) = &r.launch_error {
            let mut want = vec![
                format!("device error {}", t.expect_code),
                format!("target PE {}", rec.pe),
                format!("address {:#x}", rec.addr),
            ];
            if t.expect_code == state::ERR_WAIT_TIMEOUT {
                want.push(format!("last seen {}", rec.observed));
            }
            for w in want {
                if !e.contains(&w) {
                    bad.push(format!("the host error does not say {w:?}: {e}"));
                }
            }
        }
    } else if rec.code != state::ERR_NONE {
        bad.push(format!(
            "record.code is {}, expected none (this case cannot write the record)",
            rec.code
        ));
    }
    // The printed line: one line with every expected piece.
    let want = expected_message(t, env);
    let text = format!("{}\n{}", out.stdout, out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains(&want[0]) && want.iter().all(|w| l.contains(w.as_str())));
    let line = match line {
        Some(l) => l.trim().to_string(),
        None => {
            let near = text
                .lines()
                .find(|l| l.contains("rshmem: PE "))
                .map_or("no line starting \"rshmem: PE\"".to_string(), |l| {
                    format!("the nearest is {:?}", l.trim())
                });
            bad.push(format!("no printed line contains all of {want:?} ({near})"));
            String::new()
        }
    };
    if !bad.is_empty() {
        return Err(bad);
    }
    Ok(format!(
        "{}; record code {} PE {} addr {:#x} expected {} observed {} cmp {}; printed {:?}",
        r.cuda_status.split(':').next().unwrap_or(""),
        rec.code,
        rec.pe,
        rec.addr,
        rec.expected,
        rec.observed,
        rec.cmp,
        line
    ))
}

/// Runs `cmd` to completion with its output captured, killing it after `limit`. The child
/// leads its own process group, and the whole group is killed; a child still alive
/// [`KILL_WAIT`] after SIGKILL (asleep in a GPU driver) is an error naming its pid, and
/// output still open [`PIPE_WAIT`] after it ended (held by a process it left behind) is
/// taken as far as it came, so nothing here waits without a bound. The child dies with
/// this process (its own group keeps it out of the signals sent to ours).
pub fn run_child(mut cmd: Command, limit: Duration) -> Result<ChildOutput> {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Its own process group keeps it out of the signals meant for this process's group
    // (gpu-check's step limit, a Ctrl-C): it dies with this process instead (with the
    // thread that forked it, which waits for it below).
    crate::launcher::die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("starting {:?}", cmd.get_program()), e))?;
    // Readers on threads: a child that fills one pipe must not block on it while we wait.
    // Each appends what it reads as it comes, and says when its pipe closed; what came
    // is taken when it closed or PIPE_WAIT after the child ended, whichever is first.
    let reader = |mut pipe: Box<dyn Read + Send>| {
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let sink = got.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => sink
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
        (got, rx)
    };
    let ro = reader(Box::new(child.stdout.take().expect("piped")));
    let re = reader(Box::new(child.stderr.take().expect("piped")));
    let pid = child.id();
    let deadline = Instant::now() + limit;
    let mut killed: Option<Instant> = None;
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .map_err(|e| Error::io("waiting for a trap child", e))?
        {
            break s;
        }
        match killed {
            None if Instant::now() >= deadline => {
                // SAFETY: kill(2) on the child's own process group (it called setpgid(0)
                // before exec, so the group id is its pid, and the group lives while the
                // child is unreaped).
                unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
                killed = Some(Instant::now());
            }
            Some(t) if t.elapsed() >= KILL_WAIT => {
                return Err(Error::Timeout {
                    pe: 0,
                    what: format!(
                        "trap child pid {pid} to end after SIGKILL (it ran past its {} s \
                         limit; a process asleep in the GPU driver ignores SIGKILL until it \
                         wakes)",
                        limit.as_secs_f64()
                    ),
                    waited_ms: KILL_WAIT.as_millis() as u64,
                });
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // One PIPE_WAIT for both pipes, from the child's end.
    let closed_by = Instant::now() + PIPE_WAIT;
    let take = |(got, closed): (
        std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
        std::sync::mpsc::Receiver<()>,
    )| {
        let _ = closed.recv_timeout(closed_by.saturating_duration_since(Instant::now()));
        let v = got.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&v).into_owned()
    };
    let (stdout, stderr) = (take(ro), take(re));
    Ok(ChildOutput {
        code: status.code(),
        timed_out: killed.is_some(),
        limit,
        stdout,
        stderr,
    })
}

/// How long [`run_child`] waits for a killed child to end.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long [`run_child`] waits for a child's output to close once it ended.
pub const PIPE_WAIT: Duration = Duration::from_secs(2);

/// Arguments of the parent.
#[derive(Debug, Clone)]
pub struct TrapsOpts {
    /// Cases by full or short name; empty: every trap case of the manifest.
    pub names: Vec<String>,
    pub sources: Sources,
}

/// `rshmem selftest --device gpu --traps | --trap NAME`: the process exit code.
pub fn traps_cli(o: &TrapsOpts) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rshmem selftest --device gpu --traps: cannot find this executable: {e}");
            return 1;
        }
    };
    let child = |t: &TrapCase| {
        let mut c = Command::new(&exe);
        c.args(child_args(&t.name, o.sources.manifest.as_deref()));
        c
    };
    match run_traps(o, child) {
        Ok((_, 0)) => 0,
        Ok(_) => 1,
        Err(e) => {
            eprintln!("rshmem selftest --device gpu --traps: {e}");
            1
        }
    }
}

/// Runs every selected case in a child from `child(case)` (plus the case's
/// RSHMEM_TIMEOUT_MS) and prints one verdict line per case; Ok((passed, failed)).
pub fn run_traps(o: &TrapsOpts, child: impl Fn(&TrapCase) -> Command) -> Result<(usize, usize)> {
    let m = Manifest::load(o.sources.manifest.as_deref())?;
    if m.traps.is_empty() {
        return Err(Error::InvalidArgument(
            "the GPU kernel manifest lists no trap cases".into(),
        ));
    }
    let cases = m.select_traps(&o.names)?;
    println!(
        "gpu traps: {} case(s), each in a child process (a trap destroys the CUDA context)",
        cases.len()
    );
    let (mut passed, mut failed) = (0, 0);
    for t in &cases {
        let mut cmd = child(t);
        let mut limit = CHILD_GRACE;
        if let Some(ms) = t.timeout_ms {
            cmd.env("RSHMEM_TIMEOUT_MS", ms.to_string());
            limit += Duration::from_millis(ms);
        }
        // Named before it runs: a step cut off by its own limit still says which case
        // was running.
        println!(
            "gpu trap {}: running (limit {:.0} s)",
            t.name,
            limit.as_secs_f64()
        );
        let _ = std::io::stdout().flush();
        let t0 = Instant::now();
        let out = run_child(cmd, limit)?;
        for l in out.stdout.lines().chain(out.stderr.lines()) {
            if !l.starts_with(REPORT_PREFIX) {
                println!("  | {l}");
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        match judge(t, &out) {
            Ok(what) => {
                passed += 1;
                println!("gpu trap {}: ok ({secs:.1} s): {what}", t.name);
            }
            Err(why) => {
                failed += 1;
                println!(
                    "gpu trap {}: FAIL ({secs:.1} s): {}",
                    t.name,
                    why.join("; ")
                );
            }
        }
        let _ = std::io::stdout().flush();
    }
    println!(
        "gpu traps: {passed} passed, {failed} failed, of {} case(s)",
        cases.len()
    );
    Ok((passed, failed))
}

/// The hidden child: runs one trap case on PE 0 and prints its [`TrapReport`] line.
/// Exit 0 when the report was printed (the parent judges it), 1 otherwise.
pub fn trap_child_cli(name: &str, sources: &Sources) -> i32 {
    match trap_child(name, sources) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rshmem selftest --device gpu --trap-child {name}: {e}");
            1
        }
    }
}

fn trap_child(name: &str, sources: &Sources) -> Result<()> {
    let m = Manifest::load(sources.manifest.as_deref())?;
    let t = m.select_traps(&[name.to_string()])?[0].clone();
    driver()?;
    let mut settings = Settings::from_env()?;
    let need = crate::heap::RESERVED_BYTES
        + (t.scratch_bytes as usize).next_multiple_of(1 << 20)
        + (1 << 20);
    settings.symmetric_size = settings.symmetric_size.max(need);
    let reported = AtomicBool::new(false);
    let ptx_dir: Option<PathBuf> = sources.ptx_dir.clone();
    let res = run_gpu_threads(t.min_pes, settings, |g| {
        let scratch = g.malloc(t.scratch_bytes as usize)?;
        g.memset(scratch.offset(), 0, t.scratch_bytes as usize)?;
        g.pe().barrier_all()?;
        if g.my_pe() != 0 {
            return Ok(());
        }
        let module = if t.bind {
            g.load_library_module(&t.module, ptx_dir.as_deref())?
        } else {
            let src = super::module::ptx_source(&t.module, ptx_dir.as_deref())?;
            super::module::Module::load_library(
                g.ctx(),
                &t.module,
                &src,
                ptx_dir.as_deref(),
                g.device().cc,
            )?
        };
        let result = DevBuf::new(g.ctx(), 64, "the test result record")?;
        result.write(&[0u8; 64])?;
        let env = TrapEnv {
            my_pe: g.my_pe() as i64,
            n_pes: g.n_pes() as i64,
            heap_base: g.heap_base(),
            heap_size: g.heap_size() as u64,
            scratch: g.heap_base() + scratch.offset() as u64,
            result: result.ptr(),
        };
        let p = t.params3();
        let mut args = HarnessArgs {
            scratch: scratch.offset() as u64,
            scratch_bytes: t.scratch_bytes,
            result: result.ptr(),
            param0: p[0],
            param1: p[1],
            param2: p[2],
            seed: 0x7a_0000,
            team: 0,
        };
        let mut params = [(&mut args as *mut HarnessArgs).cast::<c_void>()];
        // SAFETY: harness kernels take one rshmem_harness_args_t by value (harness.cuh),
        // which HarnessArgs mirrors; its pointers are this PE's scratch and result record.
        // launch_raw, not launch_harness: the UNBOUND case launches an unbound module on
        // purpose. The kernel's faulty access is what the case tests; the device checks
        // trap before it happens.
        unsafe { g.launch_raw(&module, t.kernel(), t.grid, t.block, 0, &mut params, false)? };
        let launch_error = g.sync(t.kernel()).err().map(|e| e.to_string());
        // g.sync made the context current on this thread; entering it again after a trap
        // may itself report the context's error, which is no reason to lose the report.
        let _ = g.enter();
        // SAFETY: this PE's stream in the current context. After a trap it returns the
        // context's sticky error at once; it also flushes the device printf buffer.
        let rc = unsafe { sys::cuStreamSynchronize(g.stream()) };
        let cuda_status = if rc == sys::CUresult::CUDA_SUCCESS {
            "CUDA_SUCCESS".to_string()
        } else {
            result_name(rc)
        };
        // SAFETY: flushes every C stdio stream (the driver writes device printf output
        // through C stdio, which is block-buffered on a pipe).
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let report = TrapReport {
            name: t.name.clone(),
            kernel: t.kernel().to_string(),
            env,
            launch_error,
            cuda_status,
            record: g.device_error().into(),
        };
        let line = serde_json::to_string(&report)
            .map_err(|e| Error::InvalidArgument(format!("encoding the trap report: {e}")))?;
        let mut so = std::io::stdout().lock();
        let _ = writeln!(so, "{REPORT_PREFIX}{line}");
        let _ = so.flush();
        // Relaxed: the flag is read after run_gpu_threads has joined this thread, and the
        // join orders this store before that load.
        reported.store(true, Ordering::Relaxed);
        Ok(())
    });
    // After a trap the context is lost: tearing the PEs down reports errors that are
    // expected here; they are printed, not fatal, once the report is out.
    let outcome = match res {
        Ok(v) => v.into_iter().find_map(|r| r.err()),
        Err(e) => Some(e),
    };
    if reported.load(Ordering::Relaxed) {
        // joined: see the store
        if let Some(e) = outcome {
            eprintln!("rshmem trap child: after the trap (expected): {e}");
        }
        return Ok(());
    }
    Err(outcome.unwrap_or_else(|| Error::Verification("the trap case printed no report".into())))
}

/// The child command's default arguments (for tests and docs).
pub fn child_args(name: &str, manifest: Option<&Path>) -> Vec<String> {
    let mut v = vec![
        "selftest".to_string(),
        "--device".into(),
        "gpu".into(),
        "--trap-child".into(),
        name.into(),
    ];
    if let Some(m) = manifest {
        v.push("--manifest".into());
        v.push(m.display().to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest::load(None).expect("embedded manifest")
    }

    fn case(name: &str) -> TrapCase {
        manifest().select_traps(&[name.into()]).unwrap()[0].clone()
    }

    const ENV: TrapEnv = TrapEnv {
        my_pe: 0,
        n_pes: 1,
        heap_base: 0x7f00_0000_0000,
        heap_size: 64 << 20,
        scratch: 0x7f00_0001_0000,
        result: 0x7e00_0000_0200,
    };

    /// What a correct run of `t` prints, built by hand (not from expected_message).
    fn good_output(t: &TrapCase, rec: Record, line: &str) -> ChildOutput {
        let r = TrapReport {
            name: t.name.clone(),
            kernel: t.kernel().to_string(),
            env: ENV,
            launch_error: Some(if t.expect.record {
                crate::Error::DeviceFault {
                    pe: 0,
                    kernel: t.kernel().to_string(),
                    code: rec.code,
                    what: "x",
                    target_pe: rec.pe,
                    addr: rec.addr,
                    wait: state::DeviceError {
                        code: rec.code,
                        expected: rec.expected,
                        observed: rec.observed,
                        cmp: rec.cmp,
                        ..Default::default()
                    }
                    .wait_text(),
                    block: 0,
                    thread: 0,
                }
                .to_string()
            } else {
                "CUDA cuStreamQuery failed: CUDA_ERROR_LAUNCH_FAILED (719): unspecified launch failure while PE 0: waiting for rshmem_trap_bad_pe".to_string()
            }),
            cuda_status: "CUDA_ERROR_LAUNCH_FAILED (719): unspecified launch failure".into(),
            record: rec,
        };
        ChildOutput {
            code: Some(0),
            stdout: format!(
                "{line}\n{REPORT_PREFIX}{}\n",
                serde_json::to_string(&r).unwrap()
            ),
            stderr: "rshmem trap child: after the trap (expected): ...\n".into(),
            ..Default::default()
        }
    }

    fn bad_pe() -> (TrapCase, Record, String) {
        let t = case("bad_pe");
        let rec = Record {
            code: 2,
            pe: 1,
            addr: 0x7f00_0001_0000,
            expected: 8,
            ..Default::default()
        };
        let line = "rshmem: PE 0: rshmem_putmem: PE out of range (target PE 1, addr 0x7f0000010000, bytes 8) [block 0 thread 0]".to_string();
        (t, rec, line)
    }

    #[test]
    fn manifest_traps_carry_exact_expectations() {
        let m = manifest();
        let names: Vec<&str> = m.traps.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "rshmem_trap_bad_pe",
                "rshmem_trap_negative_pe",
                "rshmem_trap_out_of_heap",
                "rshmem_trap_not_heap",
                "rshmem_trap_wait_timeout",
                "rshmem_trap_bad_cmp",
                "rshmem_trap_unbound",
                "rshmem_trap_wait_all_timeout",
                "rshmem_trap_bad_team",
                "rshmem_trap_bad_sig_op",
                "rshmem_trap_misaligned_atomic",
                "rshmem_trap_misaligned_signal_wait",
                "rshmem_trap_put_count_wrap",
                "rshmem_trap_misaligned_p_class"
            ]
        );
        // The wrapped count's saturated length, and the class p's 8-byte width.
        let last = |name: &str| {
            let t = m.traps.iter().find(|t| t.name == name).expect("listed");
            let e = |s: &Option<crate::gpu::manifest::Sym>| s.as_ref().map(|s| s.eval(&ENV));
            (t.expect_code, e(&t.expect.addr), e(&t.expect.expected))
        };
        let s = ENV.scratch as i128;
        assert_eq!(
            last("rshmem_trap_put_count_wrap"),
            (3, Some(s), Some(u64::MAX as i128))
        );
        assert_eq!(
            last("rshmem_trap_misaligned_p_class"),
            (6, Some(s + 4), Some(8))
        );
        let ev = |t: &TrapCase| {
            let x = &t.expect;
            let e = |s: &Option<crate::gpu::manifest::Sym>| s.as_ref().map(|s| s.eval(&ENV));
            (
                t.expect_code,
                e(&x.pe),
                e(&x.addr),
                e(&x.expected),
                e(&x.observed),
                x.cmp,
                x.record,
            )
        };
        let s = ENV.scratch as i128;
        let end = (ENV.heap_base + ENV.heap_size) as i128;
        assert_eq!(
            ev(&m.traps[0]),
            (2, Some(1), Some(s), Some(8), Some(0), Some(0), true)
        );
        assert_eq!(
            ev(&m.traps[1]),
            (2, Some(-1), Some(s + 64), Some(8), Some(0), Some(0), true)
        );
        assert_eq!(
            ev(&m.traps[2]),
            (3, Some(0), Some(end - 4), Some(8), Some(0), Some(0), true)
        );
        assert_eq!(
            ev(&m.traps[3]),
            (
                3,
                Some(0),
                Some(ENV.result as i128),
                Some(8),
                Some(0),
                Some(0),
                true
            )
        );
        assert_eq!(
            ev(&m.traps[4]),
            (4, Some(0), Some(s), Some(1), Some(0), Some(0), true)
        );
        assert_eq!(m.traps[4].timeout_ms, Some(500));
        assert_eq!(
            ev(&m.traps[5]),
            (6, Some(0), Some(s), Some(1), Some(0), Some(17), true)
        );
        let u = &m.traps[6];
        assert_eq!((u.kernel(), u.bind), ("rshmem_trap_bad_pe", false));
        assert_eq!(ev(u), (1, Some(-1), Some(0), Some(0), None, None, false));
        assert!(m.traps[..6].iter().all(|t| t.bind && t.kernel() == t.name));
        // The array wait names the element that kept it going ([2] of 4 u64 words).
        let w = &m.traps[7];
        assert_eq!(
            ev(w),
            (4, Some(0), Some(s + 16), Some(1), Some(0), Some(0), true)
        );
        assert_eq!(w.timeout_ms, Some(500));
        assert!(w.bind && w.kernel() == w.name);
        // A team barrier on an empty team slot names the handle (5) in `expected`.
        let b = &m.traps[8];
        assert_eq!(
            ev(b),
            (6, Some(0), Some(0), Some(5), Some(0), Some(0), true)
        );
        assert!(b.bind && b.kernel() == b.name);
        // A put_signal with operator 7 names the signal word and the operator (in `cmp`).
        let g = &m.traps[9];
        assert_eq!(
            ev(g),
            (6, Some(0), Some(s), Some(8), Some(0), Some(7), true)
        );
        assert!(g.bind && g.kernel() == g.name);
        // A misaligned atomic and a misaligned signal wait name the word and its size.
        for t in &m.traps[10..12] {
            assert_eq!(
                ev(t),
                (6, Some(0), Some(s + 4), Some(8), Some(0), Some(0), true)
            );
            assert!(t.bind && t.kernel() == t.name);
        }
        assert_eq!(m.traps.len(), 14);
    }

    #[test]
    fn expected_lines_follow_the_device_printf() {
        let (t, _, _) = bad_pe();
        assert_eq!(
            expected_message(&t, &ENV),
            [
                "rshmem: PE 0: ",
                "(target PE 1, addr 0x7f0000010000, bytes 8)",
                "rshmem_putmem",
                "PE out of range"
            ]
        );
        assert_eq!(
            expected_message(&case("wait_timeout"), &ENV),
            [
                "rshmem: PE 0: ",
                "*0x7f0000010000 cmp 0 expected 1 (0x1), last observed 0 (0x0)",
                "rshmem_wait_until",
                "wait timed out"
            ]
        );
        assert_eq!(
            expected_message(&case("unbound"), &ENV),
            [
                "rshmem: PE -1: ",
                "(target PE -1, addr 0x0, bytes 0)",
                "rshmem_n_pes",
                "module not bound to a PE"
            ]
        );
    }

    #[test]
    fn a_correct_trap_passes() {
        let (t, rec, line) = bad_pe();
        let v = judge(&t, &good_output(&t, rec, &line)).unwrap();
        assert!(
            v.starts_with(
                "CUDA_ERROR_LAUNCH_FAILED (719); record code 2 PE 1 addr 0x7f0000010000 expected 8"
            ),
            "{v}"
        );
        // A wait timeout: the host error names the comparison too.
        let t = case("wait_timeout");
        let rec = Record {
            code: 4,
            pe: 0,
            addr: ENV.scratch,
            expected: 1,
            observed: 0,
            cmp: 0,
            ..Default::default()
        };
        let line = "rshmem: PE 0: rshmem_wait_until: wait timed out: *0x7f0000010000 cmp 0 expected 1 (0x1), last observed 0 (0x0) [block 0 thread 0]";
        judge(&t, &good_output(&t, rec, line)).unwrap();
        // Unbound: no record, the line says it; an illegal-instruction status is a trap too.
        let t = case("unbound");
        let line = "rshmem: PE -1: rshmem_n_pes: module not bound to a PE (magic/version mismatch; call bind_module) (target PE -1, addr 0x0, bytes 0) [block 0 thread 0]";
        let mut o = good_output(&t, Record::default(), line);
        o.stdout = o.stdout.replace(
            "CUDA_ERROR_LAUNCH_FAILED (719): unspecified launch failure\"",
            "CUDA_ERROR_ILLEGAL_INSTRUCTION (715): an illegal instruction was encountered\"",
        );
        assert!(o.stdout.contains("ILLEGAL_INSTRUCTION"));
        judge(&t, &o).unwrap();
    }

    #[test]
    fn every_mismatch_is_named() {
        let (t, rec, line) = bad_pe();
        // Wrong code, PE and address in the record (and so in the host error).
        let wrong = Record {
            code: 3,
            pe: 0,
            addr: 0x10,
            ..rec
        };
        let e = judge(&t, &good_output(&t, wrong, &line)).unwrap_err();
        assert_eq!(
            e[..3],
            [
                "record.code is 3, expected 2".to_string(),
                "record.pe is 0, expected 1".to_string(),
                "record.addr is 0x10, expected 0x7f0000010000".to_string()
            ]
        );
        assert!(
            e[3].contains("the host error does not say \"device error 2\""),
            "{e:?}"
        );
        // The printed line lacks the address.
        let e = judge(
            &t,
            &good_output(
                &t,
                rec,
                "rshmem: PE 0: rshmem_putmem: PE out of range (target PE 1, addr 0x0, bytes 8)",
            ),
        )
        .unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("no printed line contains all of"), "{e:?}");
        assert!(e[0].contains("the nearest is"), "{e:?}");
        // No line at all (printf lost).
        let e = judge(&t, &good_output(&t, rec, "")).unwrap_err();
        assert!(e[0].contains("no line starting \"rshmem: PE\""), "{e:?}");
        // The kernel completed.
        let mut o = good_output(&t, rec, &line);
        let mut r = parse_report(&o.stdout).unwrap().unwrap();
        r.launch_error = None;
        r.cuda_status = "CUDA_SUCCESS".into();
        o.stdout = format!(
            "{line}\n{REPORT_PREFIX}{}\n",
            serde_json::to_string(&r).unwrap()
        );
        let e = judge(&t, &o).unwrap_err();
        assert_eq!(
            e[0],
            "the kernel completed without trapping (status CUDA_SUCCESS)"
        );
        // A failure that is not a trap.
        r.launch_error = Some("x".into());
        r.cuda_status =
            "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered".into();
        o.stdout = format!(
            "{line}\n{REPORT_PREFIX}{}\n",
            serde_json::to_string(&r).unwrap()
        );
        let e = judge(&t, &o).unwrap_err();
        assert!(
            e[0].starts_with("CUDA reported CUDA_ERROR_ILLEGAL_ADDRESS (700)"),
            "{e:?}"
        );
        // The report of another case.
        let o = good_output(&case("negative_pe"), rec, &line);
        let e = judge(&t, &o).unwrap_err();
        assert!(
            e[0].starts_with("the report is for rshmem_trap_negative_pe"),
            "{e:?}"
        );
        // Unbound, yet a record was written.
        let u = case("unbound");
        let e = judge(&u, &good_output(&u, rec, "rshmem: PE -1: rshmem_n_pes: module not bound to a PE (target PE -1, addr 0x0, bytes 0)")).unwrap_err();
        assert_eq!(
            e,
            ["record.code is 2, expected none (this case cannot write the record)"]
        );
    }

    #[test]
    fn a_child_that_could_not_run_is_a_failure_naming_its_error() {
        let (t, _, _) = bad_pe();
        let o = ChildOutput {
            code: Some(1),
            stderr: "rshmem selftest --device gpu --trap-child rshmem_trap_bad_pe: the CUDA driver library is missing: libcuda.so.1 not found: install the NVIDIA driver\n".into(),
            ..Default::default()
        };
        let e = judge(&t, &o).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("the child ran no trap (exit 1): "),
            "{e:?}"
        );
        assert!(e[0].contains("libcuda.so.1 not found"), "{e:?}");
        let o = ChildOutput {
            timed_out: true,
            limit: Duration::from_secs(30),
            stdout: "loading\n".into(),
            ..Default::default()
        };
        assert_eq!(
            judge(&t, &o).unwrap_err(),
            ["the child did not finish within 30 s and was killed; its last output: loading"]
        );
        let o = ChildOutput {
            code: Some(0),
            stdout: format!("{REPORT_PREFIX}{{\"name\": 1}}\n"),
            ..Default::default()
        };
        assert!(judge(&t, &o).unwrap_err()[0].starts_with("malformed trap report"));
    }

    #[test]
    fn children_are_captured_and_bounded() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = run_child(c, Duration::from_secs(10)).unwrap();
        assert_eq!(
            (o.code, o.timed_out, o.stdout.as_str(), o.stderr.as_str()),
            (Some(3), false, "out\n", "err\n")
        );
        let mut c = Command::new("sh");
        c.args(["-c", "echo started; exec sleep 30"]);
        let t0 = Instant::now();
        let o = run_child(c, Duration::from_millis(300)).unwrap();
        assert!(o.timed_out && o.code.is_none(), "{o:?}");
        assert_eq!(o.stdout, "started\n");
        assert!(t0.elapsed() < Duration::from_secs(5));
        // A process the child left behind holding its output: the whole group is killed,
        // so the output closes at once (only the child was killed before, and reading its
        // output waited for the leftover's 30 s).
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 30 & echo started; exec sleep 30"]);
        let t0 = Instant::now();
        let o = run_child(c, Duration::from_millis(300)).unwrap();
        assert!(o.timed_out && o.code.is_none(), "{o:?}");
        assert_eq!(o.stdout, "started\n");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // A leftover in a session of its own (out of reach of the group kill) holding the
        // output: what came before is kept, PIPE_WAIT after the child ended (it was lost).
        let mut c = Command::new("sh");
        c.args(["-c", "setsid sleep 32 & echo $! >&2; echo started; exit 5"]);
        let t0 = Instant::now();
        let o = run_child(c, Duration::from_secs(10)).unwrap();
        if let Ok(pid) = o.stderr.trim().parse::<i32>() {
            // SAFETY: kill(2) on the leftover this case started (its pid, from its shell).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert_eq!((o.code, o.timed_out), (Some(5), false), "{o:?}");
        assert_eq!(o.stdout, "started\n");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    /// The parent with stand-in children: a shell that prints what a child would. One case
    /// passes, one child fails to run; the run fails and RSHMEM_TIMEOUT_MS reaches only the
    /// case that sets it.
    #[test]
    fn the_parent_runs_one_child_per_case() {
        let (t, rec, line) = bad_pe();
        let good = good_output(&t, rec, &line).stdout;
        let dir = std::env::temp_dir().join(format!("rshmem-traps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("good.txt");
        std::fs::write(&f, good).unwrap();
        let o = TrapsOpts {
            names: vec!["bad_pe".into(), "wait_timeout".into()],
            sources: Sources::default(),
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let d = dir.display().to_string();
        let counts = run_traps(&o, |t| {
            let mut c = Command::new("sh");
            c.env_remove("RSHMEM_TIMEOUT_MS");
            let script = if t.name == "rshmem_trap_bad_pe" {
                format!("echo \"${{RSHMEM_TIMEOUT_MS:-unset}}\" > {d}/b.txt; cat {}", f.display())
            } else {
                format!("echo \"$RSHMEM_TIMEOUT_MS\" > {d}/w.txt; echo 'libcuda.so.1 not found' >&2; exit 1")
            };
            c.args(["-c", &script]);
            seen.lock().unwrap().push(t.name.clone());
            c
        })
        .unwrap();
        assert_eq!(counts, (1, 1));
        assert_eq!(
            *seen.lock().unwrap(),
            ["rshmem_trap_bad_pe", "rshmem_trap_wait_timeout"]
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("b.txt")).unwrap(),
            "unset\n"
        );
        assert_eq!(std::fs::read_to_string(dir.join("w.txt")).unwrap(), "500\n");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            child_args("rshmem_trap_bad_pe", Some(Path::new("m.json"))),
            [
                "selftest",
                "--device",
                "gpu",
                "--trap-child",
                "rshmem_trap_bad_pe",
                "--manifest",
                "m.json"
            ]
        );
    }
}
