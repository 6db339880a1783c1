//! scripts/gpu-check's own logic on a machine without a GPU: it refuses to run without a
//! bundle or without libcuda (clear message, exit 2), and with a stand-in libcuda that
//! only the doctor can use it runs every step, records each failure without stopping, and
//! ends with the summary table (exit 1). The bundle is this build's debug binary (the
//! gpu_ring example is left out of it, so its step must say the bundle lacks it). With
//! hostcuda (host/tests/hostcuda/, a CPU stand-in for the driver) as the driver, every GPU
//! step must get through its setup to its first kernel launch.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

/// A scratch "repository": scripts/gpu-check and, optionally, .gpu/ with the binary.
fn repo(tag: &str, bundle: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpu-check-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check");
    std::fs::copy(&src, root.join("scripts/gpu-check")).unwrap();
    if bundle {
        std::fs::create_dir_all(root.join(".gpu/ptx")).unwrap();
        std::fs::copy(BIN, root.join(".gpu/rshmem")).unwrap();
        let m = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../device-kernels/src/rshmem_device_tests.json");
        std::fs::copy(m, root.join(".gpu/rshmem_device_tests.json")).unwrap();
        // As build-gpu-bundle ends: what it was built from (here, gpu-check itself).
        std::fs::write(root.join(".gpu/BUILD-INFO"), "commit test\n").unwrap();
        let sums = Command::new("sha256sum")
            .arg("scripts/gpu-check")
            .current_dir(&root)
            .output()
            .expect("sha256sum");
        assert!(sums.status.success());
        std::fs::write(root.join(".gpu/SOURCES.sha256"), &sums.stdout).unwrap();
    }
    root
}

fn run(root: &Path, envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new("bash");
    c.arg(root.join("scripts/gpu-check")).arg(root.join("out"));
    // The step logs, kept here for the tests to read (by default a temporary folder;
    // out/logs.tgz has them either way).
    c.env("RSHMEM_GPU_LOGS", root.join("logs"));
    c.env_remove("LD_LIBRARY_PATH");
    c.env_remove("RSHMEM_CUDA_LIB");
    c.env_remove("CUDA_DEVICE_MAX_CONNECTIONS");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("run gpu-check")
}

/// The names `tar tzf` lists in out/logs.tgz, one per line.
fn logs_in_archive(root: &Path) -> String {
    let o = Command::new("tar")
        .arg("tzf")
        .arg(root.join("out/logs.tgz"))
        .output()
        .expect("tar");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn refuses_without_a_bundle() {
    let root = repo("nobundle", false);
    let o = run(&root, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(".gpu/rshmem is missing: run scripts/build-gpu-bundle"),
        "{}",
        text(&o)
    );
}

/// A bundle built from other sources than the carried ones (a .gpu/ left from an older
/// build) or one whose build did not finish is refused before any step, saying so in the
/// summary; RSHMEM_GPU_ALLOW_STALE=1 runs it anyway with the note on top (before
/// 2026-12-07 a stale bundle ran and its results read as the tree's).
#[test]
fn a_stale_or_incomplete_bundle_is_refused() {
    let root = repo("stale", true);
    let script = root.join("scripts/gpu-check");
    let mut text_of = std::fs::read_to_string(&script).unwrap();
    text_of.push_str("\n# changed after the bundle was built\n");
    std::fs::write(&script, text_of).unwrap();
    let o = run(&root, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let summary = std::fs::read_to_string(root.join("out/summary.txt")).unwrap();
    assert!(
        summary.starts_with("gpu-check: no GPU check ran: bundle STALE: 1 source file(s) differ")
            && summary.contains("scripts/gpu-check: FAILED"),
        "{summary}"
    );
    let o = run(&root, &[("RSHMEM_GPU_ALLOW_STALE", "1")]);
    assert!(
        text(&o).contains("RSHMEM_GPU_ALLOW_STALE=1: run anyway"),
        "{}",
        text(&o)
    );
    std::fs::remove_file(root.join(".gpu/SOURCES.sha256")).unwrap();
    let o = run(&root, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("the bundle is incomplete"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A bundle whose binary the machine's loader refuses (built against a newer glibc): one
/// clear message with what the bundle needs, no steps run.
#[test]
fn a_bundle_that_does_not_start_stops_the_run() {
    use std::os::unix::fs::PermissionsExt;
    let root = repo("nostart", true);
    let bin = root.join(".gpu/rshmem");
    std::fs::write(
        &bin,
        "#!/bin/sh\necho \"./rshmem: /lib/x86_64-linux-gnu/libc.so.6: version \\`GLIBC_2.34' not found\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(root.join(".gpu/BUILD-INFO"), "commit x\nneeds glibc 2.34\n").unwrap();
    let o = run(&root, &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("gpu-check: .gpu/rshmem does not start on this machine: ./rshmem: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.34' not found"),
        "{t}"
    );
    assert!(
        t.contains("gpu-check: the bundle needs glibc 2.34; this machine: ldd"),
        "{t}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("out/summary.txt")).unwrap(),
        "gpu-check: no GPU check ran (the bundle does not start here)\n"
    );
    assert!(!root.join("logs/doctor.log").exists(), "no step ran");
}

#[test]
fn refuses_without_libcuda() {
    // RSHMEM_CUDA_LIB at a file that is not there: the same on a machine with a driver.
    let root = repo("nolib", true);
    let o = run(&root, &[("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(
            "libcuda.so.1 not found at RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1: point it at"
        ),
        "{}",
        text(&o)
    );
    assert!(std::fs::read_to_string(root.join("out/summary.txt"))
        .unwrap()
        .contains("no GPU check ran"));
    // A bare name is searched for as the loader would (LD_LIBRARY_PATH, ldconfig, the
    // usual folders), not looked up in the current folder.
    let o = run(&root, &[("RSHMEM_CUDA_LIB", "libcuda-absent.so.1")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("libcuda.so.1 not found at RSHMEM_CUDA_LIB=libcuda-absent.so.1"),
        "{}",
        text(&o)
    );
}

/// The bundle's programs travel xz-compressed (the device tool carries 64 MiB with the
/// repository): gpu-check unpacks .gpu/rshmem.xz into an executable .gpu/rshmem before
/// anything runs it; here the run then gets as far as the driver check.
#[test]
fn the_bundles_programs_are_unpacked() {
    use std::os::unix::fs::PermissionsExt;
    let root = repo("xzbin", true);
    let z = Command::new("xz")
        .args(["-0", "-T2"])
        .arg(root.join(".gpu/rshmem"))
        .output()
        .expect("xz (xz-utils)");
    assert!(z.status.success(), "{}", text(&z));
    assert!(!root.join(".gpu/rshmem").exists());
    let o = run(&root, &[("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1")]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("libcuda.so.1 not found at RSHMEM_CUDA_LIB="),
        "{t}"
    );
    let mode = std::fs::metadata(root.join(".gpu/rshmem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "unpacked executable: {mode:o}");
    assert_eq!(
        std::fs::read(root.join(".gpu/rshmem")).unwrap(),
        std::fs::read(BIN).unwrap()
    );
}

#[test]
fn a_bare_driver_name_is_found_on_the_loader_path() {
    let root = repo("barename", true);
    let lib = fake_libcuda(&root);
    // The step logs in gpu-check's default place, a temporary folder (RSHMEM_GPU_LOGS
    // empty): they come back in out/logs.tgz only.
    let o = run(
        &root,
        &[
            ("RSHMEM_CUDA_LIB", "libcuda.so.1"),
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("RSHMEM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13"),
            ("RSHMEM_GPU_LOGS", ""),
        ],
    );
    let t = text(&o);
    assert!(!t.contains("not found at RSHMEM_CUDA_LIB"), "{t}");
    assert!(!root.join("logs").exists(), "{t}");
    let listed = logs_in_archive(&root);
    assert!(
        listed.lines().any(|l| l == "./doctor.log")
            && listed.lines().any(|l| l == "./selftest-3.log"),
        "{listed}"
    );
    // Past the driver check, the steps ran against the stand-in driver.
    let summary = std::fs::read_to_string(root.join("out/summary.txt")).unwrap();
    assert!(
        summary.contains("GPU: Fake GPU  driver: 13000"),
        "{summary}"
    );
    // The free space of /dev/shm (the proxy steps' heaps) is under the table.
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("/dev/shm: ") && l.contains(" MiB free of ")),
        "{summary}"
    );
    // So is the doctor's fd-export probe (the fake driver has no VMM calls: not tried).
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("heap fd export (doctor): not tried: ")),
        "{summary}"
    );
}

const FAKE_CUDA_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Appends what CUDA would read at init to $FAKE_CUDA_ENV_LOG (when set). */
int cuInit(unsigned int f) {
  const char *log = getenv("FAKE_CUDA_ENV_LOG");
  if (log) {
    FILE *o = fopen(log, "a");
    const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (o) { fprintf(o, "%s\n", v ? v : "(unset)"); fclose(o); }
  }
  return 0;
}
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int o) { *d = o; return o == 0 ? 0 : 101; }
int cuDeviceGetName(char *n, int len, int d) { snprintf(n, len, "Fake GPU"); return 0; }
int cuDeviceTotalMem_v2(size_t *b, int d) { *b = 1 << 30; return 0; }
int cuDeviceGetAttribute(int *v, int a, int d) { *v = 1; return 0; }
int cuGetErrorName(int rc, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
"#;

/// Builds the stand-in libcuda.so.1 (and the libcuda.so link cudarc tries first) into
/// `root`/fakelib and returns that folder. On LD_LIBRARY_PATH it is found before any real
/// driver of the machine, so these tests mean the same with or without one.
fn fake_libcuda(root: &Path) -> PathBuf {
    let lib = root.join("fakelib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("fake.c"), FAKE_CUDA_C).unwrap();
    let b = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(lib.join("libcuda.so.1"))
        .arg(lib.join("fake.c"))
        .output()
        .expect("cc");
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    std::os::unix::fs::symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
    lib
}

/// The rshmem binary gives CUDA 32 hardware queues unless the user chose a number: GPU
/// PEs of one process wait for each other across their streams, and CUDA's default of 8
/// would serialise the ninth stream behind another.
#[test]
fn the_binary_gives_cuda_enough_connections() {
    let root = repo("conns", false);
    let lib = fake_libcuda(&root);
    let log = root.join("env.log");
    for (set, want) in [(None, "32"), (Some("16"), "16")] {
        let _ = std::fs::remove_file(&log);
        let mut c = Command::new(BIN);
        c.args(["doctor", "--json"])
            .env("LD_LIBRARY_PATH", &lib)
            .env("FAKE_CUDA_ENV_LOG", &log)
            .env_remove("RSHMEM_CUDA_LIB")
            .env_remove("CUDA_DEVICE_MAX_CONNECTIONS");
        if let Some(v) = set {
            c.env("CUDA_DEVICE_MAX_CONNECTIONS", v);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let seen = std::fs::read_to_string(&log).expect("the stand-in cuInit ran");
        assert_eq!(
            seen.lines().collect::<Vec<_>>(),
            [want],
            "exported: {set:?}"
        );
    }
}

/// The bundle's cubins travel xz-compressed: gpu-check unpacks them with their PTX hashes
/// into a temporary folder, points RSHMEM_PTX_DIR there for every step, and removes it.
#[test]
fn the_bundles_cubins_are_unpacked_for_the_run() {
    let root = repo("cubins", true);
    let lib = fake_libcuda(&root);
    let ptx = root.join(".gpu/ptx");
    std::fs::write(ptx.join("m.sm_90.cubin"), b"not really a cubin\n").unwrap();
    let z = Command::new("xz")
        .arg(ptx.join("m.sm_90.cubin"))
        .output()
        .expect("xz (xz-utils)");
    assert!(z.status.success(), "{}", text(&z));
    std::fs::write(ptx.join("m.sm_90.cubin.fnv"), "0123456789abcdef\n").unwrap();
    // A cut-off archive: left out (its module is JIT-compiled), never half unpacked.
    let whole = std::fs::read(ptx.join("m.sm_90.cubin.xz")).unwrap();
    std::fs::write(ptx.join("t.sm_90.cubin.xz"), &whole[..whole.len() / 2]).unwrap();
    let o = run(
        &root,
        &[
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("RSHMEM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13"),
            ("RSHMEM_GPU_CHECK_BUDGET_S", "15"),
        ],
    );
    let t = text(&o);
    assert!(
        t.contains("gpu-check: modules from the bundle's cubins: m.sm_90.cubin \n"),
        "{t}"
    );
    assert!(
        t.contains(".gpu/ptx/t.sm_90.cubin.xz: its module will be JIT-compiled"),
        "{t}"
    );
    let doctor = std::fs::read_to_string(root.join("logs/doctor.log")).unwrap();
    // The doctor's JSON lists the RSHMEM_* variables it saw.
    let key = r#"{"name":"RSHMEM_PTX_DIR","value":""#;
    let dir = doctor
        .split(key)
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("the doctor saw no RSHMEM_PTX_DIR:\n{doctor}"))
        .to_string();
    assert!(dir.starts_with('/'), "{dir}");
    assert!(!dir.contains(".gpu/ptx"), "{dir}");
    assert!(
        !Path::new(&dir).exists(),
        "the unpacked cubins ({dir}) are removed at the end"
    );
}

#[test]
fn runs_every_step_and_ends_with_the_table() {
    let root = repo("fake", true);
    let lib = fake_libcuda(&root);
    let env_log = root.join("env.log");
    let o = run(
        &root,
        &[
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("RSHMEM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13"),
            ("FAKE_CUDA_ENV_LOG", env_log.to_str().unwrap()),
        ],
    );
    // Every process that started CUDA saw the script's 32 hardware queues.
    let seen = std::fs::read_to_string(&env_log).expect("a stand-in cuInit ran");
    assert!(
        !seen.is_empty() && seen.lines().all(|l| l == "32"),
        "CUDA_DEVICE_MAX_CONNECTIONS seen at cuInit: {seen}"
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    let summary = std::fs::read_to_string(root.join("out/summary.txt")).unwrap();
    assert!(t.ends_with(&summary), "the table is printed last:\n{t}");
    assert!(
        summary.contains("GPU: Fake GPU  driver: 13000"),
        "{summary}"
    );
    // The free space of /dev/shm (the proxy steps' heaps) is under the table.
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("/dev/shm: ") && l.contains(" MiB free of ")),
        "{summary}"
    );
    let rows: Vec<&str> = summary
        .lines()
        .filter(|l| {
            l.starts_with("doctor")
                || l.starts_with("selftest-")
                || l.starts_with("bench-")
                || l.starts_with("traps ")
                || l.starts_with("example-ring ")
                || l.starts_with("ep ")
                || l.starts_with("ep-check ")
                || l.starts_with("ep-proxy ")
                || l.starts_with("ibgda-")
        })
        .collect();
    // doctor, 3 selftests and selftest-procs-2, traps, example-ring, 11 op/scope benches
    // (put, get, signal at 3 scopes; p, atomic at thread), copy, ep-check and ep,
    // selftest-proxy-2, ibgda-rate, ep-proxy, 2 benches over the proxy.
    assert_eq!(rows.len(), 1 + 4 + 2 + 11 + 1 + 2 + 3 + 2, "{summary}");
    // The traps step's limit follows the manifest's trap count (14: 20 + 5 x 14 s).
    let traps_log = std::fs::read_to_string(root.join("logs/traps.log")).unwrap();
    assert!(
        traps_log
            .lines()
            .next()
            .unwrap_or("")
            .ends_with("limit 90s"),
        "{traps_log}"
    );
    // No row is left "running" once the run ended.
    assert!(!summary.contains("running (cut off here?)"), "{summary}");
    assert!(
        summary.contains("selftest-proxy-2")
            && summary.contains("ibgda-rate")
            && summary.contains("ep-proxy")
            && summary.contains("bench-proxy-p-thread")
            && summary.contains("bench-proxy-put-block"),
        "{summary}"
    );
    let row = |prefix: &str| {
        rows.iter()
            .find(|r| r.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} row: {summary}"))
    };
    assert!(row("traps ").contains("FAIL (rc 1)"), "{summary}");
    assert!(row("example-ring ").contains("FAIL (rc 3)"), "{summary}");
    assert!(
        rows[0].starts_with("doctor") && rows[0].contains(" ok "),
        "{summary}"
    );
    // Every step runs and fails against the stand-in driver, except benches whose op/scope
    // has no kernel in the manifest (p and atomic exist at thread scope only): "n/a".
    let mut failed = 0;
    for r in &rows[1..] {
        if r.contains("FAIL (rc 1)") || r.starts_with("example-ring ") {
            failed += 1;
        } else {
            assert!(
                r.starts_with("bench-") && r.contains("n/a (no kernel in manifest)"),
                "a step that fails is recorded and the run goes on: {r}"
            );
        }
    }
    assert!(failed >= 18, "{summary}");
    assert!(
        summary.contains(&format!("{failed} step(s) not ok")),
        "{summary}"
    );
    // The NVSHMEM comparison is not in this bundle: n/a (not a failure), with a note.
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("nvshmem-pingpong ") && l.contains("n/a (not in the bundle)")),
        "{summary}"
    );
    assert!(
        summary.contains("\nnvshmem-pingpong: .gpu/nvshmem/nvshmem_pingpong is not in the bundle"),
        "{summary}"
    );
    let log = std::fs::read_to_string(root.join("logs/selftest-2.log")).unwrap();
    assert!(log.contains("libcuda.so.1 lacks cuGetErrorString"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    // traps: one child per trap case of the bundle's manifest; each child stops at the
    // driver check and the parent reports that child's error as the case's failure.
    let log = std::fs::read_to_string(root.join("logs/traps.log")).unwrap();
    assert!(
        log.contains("selftest --device gpu --traps --manifest .gpu/rshmem_device_tests.json"),
        "{log}"
    );
    let fails: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("gpu trap ") && !l.contains(": running (limit "))
        .collect();
    let n_traps = rshmem::gpu::manifest::Manifest::load(None)
        .expect("embedded manifest")
        .traps
        .len();
    assert_eq!(fails.len(), n_traps, "{log}");
    for l in &fails {
        assert!(
            l.contains(": FAIL (")
                && l.contains("the child ran no trap (exit 1)")
                && l.contains("libcuda.so.1 lacks cuGetErrorString"),
            "{l}"
        );
    }
    assert!(
        log.contains(&format!(
            "gpu traps: 0 passed, {n_traps} failed, of {n_traps} case(s)"
        )),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    let log = std::fs::read_to_string(root.join("logs/example-ring.log")).unwrap();
    assert!(
        log.contains(".gpu/gpu_ring is missing: rerun scripts/build-gpu-bundle"),
        "{log}"
    );
    // The EP suite, then the bench, each its own step, each failing cleanly.
    for (step, says) in [
        (
            "ep-check",
            "rshmem bench ep --check: libcuda.so.1 could not be loaded (libcuda.so.1 lacks",
        ),
        (
            "ep",
            "rshmem bench ep: libcuda.so.1 could not be loaded (libcuda.so.1 lacks",
        ),
    ] {
        let r = rows
            .iter()
            .find(|r| r.starts_with(&format!("{step} ")))
            .unwrap();
        assert!(r.contains("FAIL (rc 1)"), "{summary}");
        let log = std::fs::read_to_string(root.join(format!("logs/{step}.log"))).unwrap();
        assert!(log.contains(says), "{log}");
        assert!(!log.contains("panicked"), "{log}");
    }
    // What comes back from the device tool (at most 8 files): the summary and every log
    // in one archive, nothing else.
    let mut back: Vec<String> = std::fs::read_dir(root.join("out"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    back.sort();
    assert_eq!(back, ["logs.tgz", "summary.txt"]);
    let listed = logs_in_archive(&root);
    for step in ["doctor", "selftest-2", "ep-check", "ep", "selftest-3"] {
        assert!(
            listed.lines().any(|l| l == format!("./{step}.log")),
            "{step}.log not in logs.tgz: {listed}"
        );
    }
    // ep-proxy: the suite over the proxy transport, refused at the driver check likewise.
    let log = std::fs::read_to_string(root.join("logs/ep-proxy.log")).unwrap();
    assert!(
        log.contains("bench ep --device gpu --check --pes 2 --transport proxy")
            && log.contains(
                "rshmem bench ep --check: libcuda.so.1 could not be loaded (libcuda.so.1 lacks"
            ),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    for step in ["selftest-proxy-2", "ibgda-rate"] {
        let log = std::fs::read_to_string(root.join(format!("logs/{step}.log"))).unwrap();
        assert!(
            log.contains("libcuda.so.1 lacks cuGetErrorString"),
            "{step}: {log}"
        );
        assert!(!log.contains("panicked"), "{step}: {log}");
    }
}

#[path = "hostcuda/build.rs"]
mod hostcuda_build;

/// A dry run of gpu-check on the CPU: with hostcuda (a CPU stand-in for the driver that
/// refuses kernel launches) every GPU step gets through all its setup — the command line,
/// GPU PE setup over p2p and over the proxy, heaps, module loading and binding, EP buffers,
/// the CPU oracle of the EP suite — to its first kernel launch, and nothing crashes or
/// panics. (The first such run found NVRTC crashing on a driver without
/// cuGetExportTable, a gap of the stand-in; the review fixes of 2026-12-05 came before it.)
#[test]
fn every_step_reaches_its_first_kernel_launch_on_hostcuda() {
    let lib = hostcuda_build::hostcuda_lib();
    let root = repo("dry", true);
    // A driver that exports no POSIX-fd handle (gVisor's nvproxy): every step but
    // selftest-procs-2 runs its GPU PEs as threads of one process and needs none;
    // selftest-procs-2 is n/a, with a note, not a failure.
    let o = run(
        &root,
        &[
            ("RSHMEM_CUDA_LIB", lib.to_str().unwrap()),
            ("RSHMEM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13"),
            ("HOSTCUDA_NO_FD_EXPORT", "1"),
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    let summary = std::fs::read_to_string(root.join("out/summary.txt")).unwrap();
    assert!(
        summary.contains("GPU: hostcuda 0 (CPU stand-in)  driver: 13000"),
        "{summary}"
    );
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("selftest-procs-2 ") && l.contains("n/a (no POSIX-fd export)"))
            && summary
                .contains("\nselftest-procs-2: this driver refuses cuMemExportToShareableHandle"),
        "{summary}"
    );
    let mut launched = Vec::new();
    for e in std::fs::read_dir(root.join("logs")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(step) = name.strip_suffix(".log") else {
            continue;
        };
        let log = std::fs::read_to_string(e.path()).unwrap();
        assert!(
            !log.contains("panicked") && !log.contains("Segmentation fault"),
            "{step}: {log}"
        );
        match step {
            "bundle-start" | "example-ring" | "nvshmem-pingpong" | "selftest-procs-2" => continue,
            "doctor" => {
                assert!(
                    log.contains("\"name\":\"hostcuda 0 (CPU stand-in)\""),
                    "{log}"
                );
                continue;
            }
            s if s.starts_with("bench-") && log.contains("no GPU bench kernel for") => continue,
            _ => {}
        }
        // The step's first launch, refused by the stand-in, and no other error: a PE whose
        // launch failed leaves, so a slower PE may report that it died instead (before it
        // got to its own launch); summaries count the failures; nothing else may go wrong.
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("failed") || l.contains("error") || l.contains("FAIL"))
            .collect();
        let other = errors.iter().find(|l| {
            !l.contains("cuLaunchKernel")
                && !l.contains(" died: ")
                && !l.contains(" passed, ")
                && !l.contains(" case(s) failed")
                && !l.contains("rshmem run: PE ")
        });
        assert!(
            log.contains("hostcuda: launch of ")
                && errors.iter().any(|l| l.contains("cuLaunchKernel"))
                && other.is_none(),
            "{step} did not get to its first kernel launch: errors {errors:#?}\n{log}"
        );
        launched.push(step.to_string());
    }
    launched.sort();
    // The selftests, traps, both EP steps, the IBGDA rate, the copy and every bench that
    // has a kernel.
    for want in [
        "selftest-2",
        "selftest-3",
        "selftest-8",
        "selftest-proxy-2",
        "traps",
        "ep-check",
        "ep",
        "ep-proxy",
        "ibgda-rate",
        "bench-copy",
        "bench-put-block",
        "bench-get-thread",
        "bench-atomic-thread",
        "bench-proxy-p-thread",
        "bench-proxy-put-block",
    ] {
        assert!(
            launched.iter().any(|s| s == want),
            "{want} missing from {launched:?}"
        );
    }
}
