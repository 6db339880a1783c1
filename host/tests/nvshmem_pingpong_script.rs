//! scripts/nvshmem-pingpong (the gpu-check step `nvshmem-pingpong`) on a machine without a
//! GPU: stand-ins for `.gpu/rshmem` and `.gpu/nvshmem/nvshmem_pingpong` print fixed JSON,
//! so the script's own logic is checked with exact values: the ratios and the summary
//! line, the n/a outcomes (limited MPG, NVSHMEM refusing, no host library), rshmem's
//! failure, the MPS attempt and its fallback, and the step's row and note in gpu-check's
//! table. The real program (bench/nvshmem/pingpong.cu) needs a GPU; its build is
//! scripts/build-nvshmem-bench.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// rshmem's side: `bench p` median 1.2 / p99 1.5 us, `bench signal` 1.8 / 2.5 us; any
/// other command prints a line and succeeds (the other gpu-check steps). FAKE_RSHMEM_FAIL=1
/// makes `bench` fail.
const FAKE_RSHMEM: &str = r#"#!/bin/bash
if [ "$1" = doctor ] && [ "${FAKE_HANG_DOCTOR:-0}" = 1 ]; then
  echo "doctor: partial output before hanging"
  echo $$ > "$FAKE_PIDFILE"
  exec sleep 31
fi
if [ "$1" = bench ]; then
  [ "${FAKE_RSHMEM_FAIL:-0}" = 1 ] && { echo "rshmem bench $2 --device gpu: CUDA_ERROR_FAKE" >&2; exit 1; }
  case "$2" in p) m=1.2; q=1.5 ;; signal) m=1.8; q=2.5 ;; *) m=3.0; q=3.0 ;; esac
  echo "{\"bench\":\"$2\",\"scope\":\"thread\",\"pes\":2,\"device\":\"gpu\",\"transport\":\"p2p\",\"gpu\":\"Fake GPU\",\"latency_kind\":\"half_round_trip\",\"latency_kernel\":\"k\",\"bandwidth_kernel\":null,\"rows\":[{\"size\":8,\"latency_us_median\":$m,\"latency_us_p99\":$q,\"latency_us_mean\":$m,\"bandwidth_gbps\":null,\"iters\":1000,\"bw_iters\":0,\"launches\":20}]}"
  exit 0
fi
echo "{\"fake\":\"$1\"}"
"#;

/// NVSHMEM's side: FAKE_NV=full|limited|refuse|partial; records its arguments and MPS
/// environment in $FAKE_LOG; fails to reach CUDA while an MPS pipe directory is set
/// (as a client of an MPS server that does not work).
const FAKE_NV: &str = r#"#!/bin/bash
echo "nv args=$* mps=${CUDA_MPS_PIPE_DIRECTORY:-none} pct=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none} ld=${LD_LIBRARY_PATH:-}" >>"$FAKE_LOG"
if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && [ "${FAKE_MPS_WORKS:-0}" != 1 ]; then
  echo "nvshmem_pingpong: PE 0: CUDA error: cudaSetDevice(o.device): cudaErrorMpsConnectionFailed: MPS client failed to connect" >&2
  exit 1
fi
mode=${FAKE_NV:-full}
# hang: a run that ignores its --timeout-s (the step's own limit must stop it).
if [ "$mode" = hang ]; then echo $$ > "$FAKE_PIDFILE"; exec sleep 61; fi
[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && mode=full
if [ "$mode" = refuse ]; then
  echo "/dvs/p4/src/host/init/init.cu:1014: non-zero status: 7 cuMemImportFromShareableHandle failed" >&2
  echo "nvshmem_pingpong: PE 1: NVSHMEM refused two PEs on one GPU: nvshmem init (unique-id bootstrap, 2 PEs on GPU 0) returned 7; NVSHMEM's own messages are above" >&2
  echo "nvshmem_pingpong: PE 1 exited with 4" >&2
  exit 4
fi
mpg=full; [ "$mode" = limited ] && mpg=limited
for op in p signal; do
  case $op in p) m=1.0; q=1.25 ;; signal) m=2.0; q=2.0 ;; esac
  extra=',"complete":true'
  if [ "$mode" = partial ] && [ $op = p ]; then
    extra=',"complete":false,"error":"deadline (20 s) passed in launch 3 of 20 (measured) after 20.000 s: 37 of 1016 round trips done"'
  fi
  [ "$mode" = partial ] && [ $op = signal ] && break
  echo "{\"bench\":\"$op\",\"scope\":\"thread\",\"pes\":2,\"device\":\"gpu\",\"transport\":\"p2p\",\"gpu\":\"Fake GPU\",\"latency_kind\":\"half_round_trip\",\"latency_kernel\":\"nvshmem_pingpong_${op}_thread\",\"bandwidth_kernel\":null,\"rows\":[{\"size\":8,\"latency_us_median\":$m,\"latency_us_p99\":$q,\"latency_us_mean\":$m,\"bandwidth_gbps\":null,\"iters\":1000,\"bw_iters\":0,\"launches\":20}],\"impl\":\"nvshmem\",\"nvshmem_version\":\"3.4.5\",\"nvshmem_built_with\":\"3.4.5\",\"mpg\":\"$mpg\"$extra}"
done
"#;

/// A stand-in MPS control program: `-d` starts "the daemon" (logged), stdin commands are
/// logged; get_server_list fails (no daemon was running before), quit succeeds.
const FAKE_MPS: &str = r#"#!/bin/bash
if [ "${1:-}" = -d ]; then echo "mps -d pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >>"$FAKE_LOG"; exit 0; fi
read -r cmd
echo "mps $cmd pipe=${CUDA_MPS_PIPE_DIRECTORY:-none}" >>"$FAKE_LOG"
[ "$cmd" = quit ]
"#;

fn write_exe(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A scratch repository with the scripts and a stand-in bundle (`nvshmem`: whether the
/// NVSHMEM program is in it), and a stand-in NVSHMEM library folder.
fn repo(tag: &str, nvshmem: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nvshmem-pp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    for s in ["gpu-check", "nvshmem-pingpong"] {
        std::fs::copy(scripts.join(s), root.join("scripts").join(s)).unwrap();
    }
    write_exe(&root.join(".gpu/rshmem"), FAKE_RSHMEM);
    std::fs::create_dir_all(root.join(".gpu/ptx")).unwrap();
    if nvshmem {
        write_exe(&root.join(".gpu/nvshmem/nvshmem_pingpong"), FAKE_NV);
        std::fs::write(root.join(".gpu/nvshmem/NVSHMEM_VERSION"), "3.4.5\n").unwrap();
    }
    std::fs::create_dir_all(root.join("nvlib")).unwrap();
    std::fs::write(root.join("nvlib/libnvshmem_host.so.3"), "").unwrap();
    write_exe(&root.join("fakebin/nvidia-cuda-mps-control"), FAKE_MPS);
    // As build-gpu-bundle ends (gpu-check refuses a bundle without them): what the bundle
    // was built from.
    std::fs::write(root.join(".gpu/BUILD-INFO"), "commit test\n").unwrap();
    let sums = Command::new("sha256sum")
        .args(["scripts/gpu-check", "scripts/nvshmem-pingpong"])
        .current_dir(&root)
        .output()
        .expect("sha256sum");
    assert!(sums.status.success());
    std::fs::write(root.join(".gpu/SOURCES.sha256"), &sums.stdout).unwrap();
    root
}

fn run_script(root: &Path, envs: &[(&str, &str)], mps_on_path: bool) -> (Output, String) {
    let log = root.join("fake.log");
    let _ = std::fs::remove_file(&log);
    let mut c = Command::new("bash");
    c.current_dir(root)
        .arg("scripts/nvshmem-pingpong")
        .args(["--iters", "1000", "--reps", "20", "--budget-s", "50"])
        .env("RSHMEM_NVSHMEM_LIB_DIR", root.join("nvlib"))
        .env("FAKE_LOG", &log)
        .env_remove("CUDA_MPS_PIPE_DIRECTORY")
        .env_remove("LD_LIBRARY_PATH");
    let path = std::env::var("PATH").unwrap_or_default();
    if mps_on_path {
        c.env("PATH", format!("{}:{path}", root.join("fakebin").display()));
    } else {
        // No MPS control program on PATH (a machine without one).
        c.env("RSHMEM_NVSHMEM_MPS", "0");
    }
    for (k, v) in envs {
        c.env(k, v);
    }
    let o = c.output().expect("run scripts/nvshmem-pingpong");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    (o, log)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn comparable_run_prints_both_sides_and_the_ratios() {
    let root = repo("full", true);
    let (o, log) = run_script(&root, &[("FAKE_NV", "full")], false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    // ratio = rshmem / NVSHMEM: p 1.2/1.0, 1.5/1.25; signal 1.8/2.0, 2.5/2.0.
    assert!(
        t.contains(
            "p             1.200       1.500        1.000        1.250     1.200     1.200\n"
        ),
        "{t}"
    );
    assert!(
        t.contains(
            "signal        1.800       2.500        2.000        2.000     0.900     1.250\n"
        ),
        "{t}"
    );
    assert!(
        t.contains(
            "SUMMARY: nvshmem-pingpong: p med 1.200/1.000 us = 1.20x, p99 1.500/1.250 us = 1.20x; \
             signal med 1.800/2.000 us = 0.90x, p99 2.500/2.000 us = 1.25x (NVSHMEM 3.4.5, mpg full, no MPS)\n"
        ),
        "{t}"
    );
    // Both rshmem runs used the same iterations and launches as NVSHMEM's.
    assert!(t.contains("rshmem bench p --device gpu --scope thread --pes 2 --min-size 8 --max-size 8 --iters 1000 --reps 20"), "{t}");
    assert!(t.contains("rshmem bench signal --device gpu --scope thread --pes 2 --min-size 8 --max-size 8 --iters 1000 --reps 20"), "{t}");
    let nvlib = root.join("nvlib");
    assert_eq!(
        log,
        format!(
            "nv args=--op both --scope thread --iters 1000 --reps 20 --timeout-s 25 mps=none pct=none ld={}\n",
            nvlib.display()
        ),
        "the program runs once, with the wheel's library folder on LD_LIBRARY_PATH"
    );
    assert!(!t.contains("n/a"), "{t}");
}

#[test]
fn limited_mpg_is_not_a_comparison() {
    let root = repo("limited", true);
    let (o, _) = run_script(&root, &[("FAKE_NV", "limited")], false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains(
            "p             1.200       1.500        1.000        1.250         -         -\n"
        ),
        "numbers are shown, ratios are not: {t}"
    );
    assert!(
        t.contains(
            "nvshmem-pingpong: n/a: NVSHMEM ran the two PEs in limited MPG mode (no MPS): the PE \
             processes' kernels are time-sliced on the GPU, so its numbers measure context \
             switches, not NVSHMEM; no ratio\n"
        ),
        "{t}"
    );
}

#[test]
fn refusal_is_reported_with_nvshmem_s_message() {
    let root = repo("refuse", true);
    let (o, _) = run_script(&root, &[("FAKE_NV", "refuse")], false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains(
            "SUMMARY: nvshmem-pingpong: NVSHMEM n/a: NVSHMEM refused two PEs on one GPU: nvshmem \
             init (unique-id bootstrap, 2 PEs on GPU 0) returned 7; NVSHMEM's own messages are \
             above | NVSHMEM said: /dvs/p4/src/host/init/init.cu:1014: non-zero status: 7 \
             cuMemImportFromShareableHandle failed\n"
        ),
        "{t}"
    );
}

#[test]
fn a_partial_run_names_what_did_not_complete() {
    let root = repo("partial", true);
    let (o, _) = run_script(&root, &[("FAKE_NV", "partial")], false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains("NVSHMEM p did not complete: deadline (20 s) passed in launch 3 of 20 (measured) after 20.000 s: 37 of 1016 round trips done\n"), "{t}");
    assert!(
        t.contains("nvshmem-pingpong: n/a: the NVSHMEM run did not complete for p, signal (deadline (20 s) passed in launch 3 of 20 (measured) after 20.000 s: 37 of 1016 round trips done)\n"),
        "{t}"
    );
}

#[test]
fn rshmem_failing_is_a_failure_even_when_nvshmem_ran() {
    let root = repo("rsfail", true);
    let (o, _) = run_script(
        &root,
        &[("FAKE_NV", "full"), ("FAKE_RSHMEM_FAIL", "1")],
        false,
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("rshmem bench p --device gpu: CUDA_ERROR_FAKE"),
        "{t}"
    );
    assert!(
        t.contains("SUMMARY: nvshmem-pingpong: FAIL: rshmem's side failed (log above)\n"),
        "{t}"
    );
}

#[test]
fn no_host_library_or_no_program_is_n_a() {
    let root = repo("nolib", true);
    let (o, log) = run_script(
        &root,
        &[("RSHMEM_NVSHMEM_LIB_DIR", "/nonexistent/nvshmem/lib")],
        false,
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains("nvshmem-pingpong: n/a: RSHMEM_NVSHMEM_LIB_DIR=/nonexistent/nvshmem/lib has no libnvshmem_host.so.3\n"),
        "{t}"
    );
    assert_eq!(log, "", "the program did not run");

    let root = repo("noprog", false);
    let (o, _) = run_script(&root, &[], false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains("nvshmem-pingpong: n/a: .gpu/nvshmem/nvshmem_pingpong is not in the bundle"),
        "{t}"
    );
}

#[test]
fn mps_is_tried_in_a_private_daemon_then_stopped_and_the_run_falls_back() {
    let root = repo("mps", true);
    let (o, log) = run_script(&root, &[("FAKE_NV", "limited")], true);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 5, "{log}");
    assert!(
        lines[0].starts_with("mps get_server_list pipe=none"),
        "{log}"
    );
    // A private daemon in /tmp/rshmem-mps.*, its pipe and log folders inside.
    let dir = lines[1]
        .strip_prefix("mps -d pipe=")
        .and_then(|r| r.split_once("/pipe log="))
        .map(|(d, _)| d.to_string())
        .unwrap_or_else(|| panic!("{log}"));
    assert!(dir.starts_with("/tmp/rshmem-mps."), "{log}");
    assert_eq!(lines[1], format!("mps -d pipe={dir}/pipe log={dir}/log"));
    // First attempt as MPS clients at 50 % each, a short deadline (half the time left).
    assert!(
        lines[2]
            .starts_with("nv args=--op both --scope thread --iters 1000 --reps 20 --timeout-s "),
        "{log}"
    );
    assert!(
        lines[2].contains(&format!(" mps={dir}/pipe pct=50 ")),
        "{log}"
    );
    // The daemon is stopped, then the run without MPS.
    assert_eq!(lines[3], format!("mps quit pipe={dir}/pipe"));
    assert!(lines[4].contains(" mps=none pct=none "), "{log}");
    assert!(
        t.contains("the NVSHMEM run under MPS did not complete: once more without MPS"),
        "{t}"
    );
    assert!(
        t.contains("limited MPG mode (no MPS, after the MPS attempt failed)"),
        "{t}"
    );
    assert!(
        !Path::new(&dir).exists(),
        "the daemon's folder is removed: {dir}"
    );

    // A working MPS: one run, full MPG, comparable, the daemon stopped at the end.
    let (o, log) = run_script(
        &root,
        &[("FAKE_NV", "limited"), ("FAKE_MPS_WORKS", "1")],
        true,
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 4, "{log}");
    assert!(
        lines[3].starts_with("mps quit pipe=/tmp/rshmem-mps."),
        "{log}"
    );
    assert!(
        t.contains("(NVSHMEM 3.4.5, mpg full, MPS (a private daemon, /tmp/rshmem-mps."),
        "{t}"
    );
}

/// Builds the stand-in driver (FAKE_CUDA_C) as `root/fakelib/libcuda.so.1`; returns the
/// folder.
fn fake_libcuda(root: &Path) -> PathBuf {
    let lib = root.join("fakelib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("fake.c"), FAKE_CUDA_C).unwrap();
    let b = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(lib.join("libcuda.so.1"))
        .arg(lib.join("fake.c"))
        .output()
        .expect("cc");
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    lib
}

const FAKE_CUDA_C: &str = r#"
int cuInit(unsigned int f) { return 0; }
"#;

#[test]
fn gpu_check_runs_the_step_and_puts_its_finding_under_the_table() {
    let root = repo("gpucheck", true);
    let lib = fake_libcuda(&root);
    let o = Command::new("bash")
        .arg(root.join("scripts/gpu-check"))
        .arg(root.join("out"))
        .env("RSHMEM_GPU_LOGS", root.join("logs"))
        .env("LD_LIBRARY_PATH", &lib)
        .env("RSHMEM_NVSHMEM_LIB_DIR", root.join("nvlib"))
        .env("RSHMEM_NVSHMEM_MPS", "0")
        .env("FAKE_NV", "full")
        .env("FAKE_LOG", root.join("fake.log"))
        .output()
        .expect("run gpu-check");
    let t = text(&o);
    let summary = std::fs::read_to_string(root.join("out/summary.txt")).unwrap();
    assert!(t.ends_with(&summary), "{t}");
    let row = summary
        .lines()
        .find(|l| l.starts_with("nvshmem-pingpong "))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(row.contains(" ok "), "{summary}");
    assert!(
        summary.contains(
            "\nnvshmem-pingpong: p med 1.200/1.000 us = 1.20x, p99 1.500/1.250 us = 1.20x; signal \
             med 1.800/2.000 us = 0.90x, p99 2.500/2.000 us = 1.25x (NVSHMEM 3.4.5, mpg full, no MPS)\n"
        ),
        "{summary}"
    );
    let log = std::fs::read_to_string(root.join("logs/nvshmem-pingpong.log")).unwrap();
    assert!(log.starts_with("== nvshmem-pingpong (bash scripts/nvshmem-pingpong --iters 1000 --reps 20), limit 60s\n"), "{log}");
    // Its budget comes from the step's limit, 15 s inside it.
    assert!(log.contains("(limit 15s)"), "{log}");

    // NVSHMEM refusing: the row is n/a, not a failure, and the reason is under the table.
    let o = Command::new("bash")
        .arg(root.join("scripts/gpu-check"))
        .arg(root.join("out2"))
        .env("LD_LIBRARY_PATH", &lib)
        .env("RSHMEM_NVSHMEM_LIB_DIR", root.join("nvlib"))
        .env("RSHMEM_NVSHMEM_MPS", "0")
        .env("FAKE_NV", "refuse")
        .env("FAKE_LOG", root.join("fake.log"))
        .output()
        .expect("run gpu-check");
    let t = text(&o);
    let summary = std::fs::read_to_string(root.join("out2/summary.txt")).unwrap();
    let row = summary
        .lines()
        .find(|l| l.starts_with("nvshmem-pingpong "))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(row.contains("n/a (NVSHMEM: see below)"), "{summary}");
    assert!(
        summary.contains("\nnvshmem-pingpong: NVSHMEM n/a: NVSHMEM refused two PEs on one GPU: "),
        "{summary}"
    );
}

/// The step's limit passes while NVSHMEM's run hangs: gpu-check's `timeout` sends TERM to
/// the script's process group, which the run's own `timeout` left. The script stops the
/// run and its private MPS daemon and exits at once (bash ran its TERM trap only after the
/// run's own limit, gpu-check's kill came first, and the daemon was left running).
#[test]
fn the_steps_limit_stops_the_run_and_the_mps_daemon() {
    let root = repo("limit", true);
    let log = root.join("fake.log");
    let path = std::env::var("PATH").unwrap_or_default();
    let t0 = std::time::Instant::now();
    let o = Command::new("timeout")
        .current_dir(&root)
        .args(["-k", "5", "6", "bash", "scripts/nvshmem-pingpong"])
        .args(["--iters", "1000", "--reps", "20", "--budget-s", "50"])
        .env("RSHMEM_NVSHMEM_LIB_DIR", root.join("nvlib"))
        .env("FAKE_LOG", &log)
        .env("FAKE_NV", "hang")
        .env("FAKE_PIDFILE", root.join("hang.pid"))
        .env("FAKE_MPS_WORKS", "1")
        .env("PATH", format!("{}:{path}", root.join("fakebin").display()))
        .env_remove("CUDA_MPS_PIPE_DIRECTORY")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run scripts/nvshmem-pingpong under timeout");
    let took = t0.elapsed();
    let t = text(&o);
    // TERM at 6 s: the script's own exit (143 -> timeout's 124), not the kill 5 s later.
    assert_eq!(o.status.code(), Some(124), "{t}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}\n{t}");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("mps -d ") && log.contains("mps quit "),
        "{log}"
    );
    // The hung run was stopped with the script.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = std::fs::read_to_string(root.join("hang.pid")).expect("the run started");
    let alive = Command::new("kill")
        .args(["-0", pid.trim()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        !alive.success(),
        "the hung run (pid {}) is still running",
        pid.trim()
    );
}

/// gpu-check cut off inside a step (its caller's limit): the step's log so far is in
/// OUT/running-step.log (logs.tgz is written between steps, so it held only the step's
/// header line), and the summary names the step that was running.
#[test]
fn gpu_check_cut_off_inside_a_step_leaves_its_log_so_far() {
    let root = repo("cutoff", false);
    let lib = fake_libcuda(&root);
    let o = Command::new("timeout")
        .args(["-k", "2", "5", "bash"])
        .arg(root.join("scripts/gpu-check"))
        .arg(root.join("out"))
        .env("RSHMEM_GPU_LOGS", root.join("logs"))
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAKE_HANG_DOCTOR", "1")
        .env("FAKE_PIDFILE", root.join("hang.pid"))
        .env("GPU_CHECK_SNAPSHOT_S", "1")
        .output()
        .expect("run gpu-check");
    // The hung doctor (its own process group, out of timeout's reach) is this test's own.
    if let Ok(pid) = std::fs::read_to_string(root.join("hang.pid")) {
        let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    }
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    let summary = std::fs::read_to_string(root.join("out/summary.txt")).unwrap();
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("doctor ") && l.contains("running (cut off here?)")),
        "{summary}"
    );
    let running = std::fs::read_to_string(root.join("out/running-step.log")).unwrap();
    assert!(
        running.starts_with("== doctor (")
            && running.contains("doctor: partial output before hanging"),
        "{running}"
    );
}
