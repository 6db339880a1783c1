//! `rshmem selftest --device gpu` / `rshmem bench ... --device gpu` on a machine without a
//! GPU: argument errors, the CUDA-absent error, and a driver too old for the GPU layer (a
//! fake libcuda.so.1 that exports only what the doctor needs) — all clear errors, never a
//! panic. The GPU paths themselves run in scripts/gpu-check.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    // The tests say which driver each run sees; not the developer's environment.
    c.args(args).env_remove("RSHMEM_CUDA_LIB");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("run rshmem")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn no_panic(o: &Output) {
    let t = text(o);
    assert!(!t.contains("panicked"), "{t}");
}

/// "No driver" on any machine: the runtime loads the file RSHMEM_CUDA_LIB names instead of
/// searching, and this one is not there.
const NO_DRIVER: (&str, &str) = ("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1");
/// What every GPU path then says.
const NO_DRIVER_ERR: &str = "libcuda.so.1 not found at RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1); \
     install the NVIDIA driver and point RSHMEM_CUDA_LIB at its libcuda.so.1, or unset RSHMEM_CUDA_LIB";

#[test]
fn without_libcuda_the_gpu_commands_say_so() {
    for args in [
        &["selftest", "--device", "gpu", "--case", "host_heap_mapping"][..],
        &[
            "bench",
            "copy",
            "--device",
            "gpu",
            "--max-size",
            "64K",
            "--reps",
            "1",
        ][..],
    ] {
        let o = run(args, &[NO_DRIVER]);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(NO_DRIVER_ERR), "{args:?}: {}", text(&o));
        no_panic(&o);
    }
}

#[test]
fn gpu_argument_errors_are_clear() {
    let o = run(&["bench", "put", "--device", "gpu", "--scope", "grid"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("invalid value 'grid' for '--scope"),
        "{}",
        text(&o)
    );
    let o = run(&["bench", "barrier", "--device", "gpu"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("not a GPU benchmark"), "{}", text(&o));
    let o = run(&["bench", "copy"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("a GPU benchmark; pass --device gpu"),
        "{}",
        text(&o)
    );
    // ibgda is for GPU PEs; a CPU bench refuses it, naming --device gpu.
    for kind in ["put", "p"] {
        let o = run(&["bench", kind, "--transport", "ibgda"], &[]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("--transport ibgda is for GPU PEs")
                && text(&o).contains("add --device gpu"),
            "{}",
            text(&o)
        );
    }
    let o = run(
        &["bench", "copy", "--device", "gpu", "--transport", "proxy"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("uses no transport"), "{}", text(&o));
    let o = run(&["bench", "put", "--transport", "rdma"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("expected p2p, proxy or ibgda"),
        "{}",
        text(&o)
    );
    let o = run(&["selftest", "--device", "tpu"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["selftest", "--device", "gpu", "--pes", "0"], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("--pes 0 is out of range"), "{}", text(&o));
    // --pes is a GPU option, and under a launcher it may only repeat the job's size.
    let o = run(&["selftest", "--pes", "3"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("rshmem selftest: --pes 3 is a GPU option (add --device gpu)"),
        "{}",
        text(&o)
    );
    let o = run(
        &["selftest", "--device", "gpu", "--pes", "3"],
        &[("RSHMEM_RANK", "0"), ("RSHMEM_WORLD_SIZE", "2")],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("--pes 3: this process is a PE of a job of 2 PEs"),
        "{}",
        text(&o)
    );
    let o = run(
        &[
            "selftest",
            "--device",
            "gpu",
            "--manifest",
            "/nonexistent.json",
            "--case",
            "put",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("/nonexistent.json"), "{}", text(&o));
    no_panic(&o);
}

#[test]
fn gpu_list_names_the_host_cases_and_the_manifest_cases() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let m = dir.join("gpu-cli-manifest.json");
    std::fs::write(
        &m,
        r#"{"tests": [{"name": "rshmem_test_put_thread", "module": "rshmem_device_tests", "grid": 4,
            "block": 128, "collective": false, "scratch_bytes": 4096, "checks_per_pe": 8}], "benches": []}"#,
    )
    .unwrap();
    let o = run(
        &[
            "selftest",
            "--device",
            "gpu",
            "--list",
            "--manifest",
            m.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "host_heap_mapping",
            "host_put_get_on_stream",
            "host_signal_on_stream",
            "host_bind_module",
            "host_nvrtc",
            "rshmem_test_put_thread"
        ]
    );
}

/// A libcuda.so.1 exporting only cuInit and friends: the GPU layer must name the first
/// missing entry point instead of panicking inside cudarc.
#[test]
fn a_driver_missing_entry_points_is_named() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpu-cli-old-cuda");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("old.c");
    std::fs::write(&src, "int cuInit(unsigned f) { return 0; }\nint cuDriverGetVersion(int *v) { *v = 11000; return 0; }\n").unwrap();
    let lib: PathBuf = dir.join("libcuda.so.1");
    let b = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    // cudarc tries libcuda.so first: this folder has it too, so that no real driver of the
    // machine is found before the stand-in.
    let _ = std::fs::remove_file(dir.join("libcuda.so"));
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    let o = run(
        &["selftest", "--device", "gpu", "--case", "host_heap_mapping"],
        &[("LD_LIBRARY_PATH", dir.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("libcuda.so.1 lacks cuGetErrorName: the driver is too old"),
        "{}",
        text(&o)
    );
    no_panic(&o);
}

/// The trap runner through the real binary: each case runs in a child of it; without
/// libcuda the child fails with the driver's error and the parent reports that as the
/// case's failure (exit 1), never as a pass.
#[test]
fn trap_cases_without_libcuda_fail_naming_the_driver() {
    let o = run(
        &[
            "selftest",
            "--device",
            "gpu",
            "--trap",
            "bad_pe",
            "--trap",
            "rshmem_trap_unbound",
        ],
        &[NO_DRIVER],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    // Each case is named before it runs (a step cut off by its limit still says which),
    // then judged.
    let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("gpu trap ")).collect();
    assert_eq!(lines.len(), 4, "{t}");
    assert!(
        lines[0].starts_with("gpu trap rshmem_trap_bad_pe: running (limit ")
            && lines[2].starts_with("gpu trap rshmem_trap_unbound: running (limit "),
        "{t}"
    );
    let verdicts = [lines[1], lines[3]];
    assert!(
        verdicts[0].starts_with("gpu trap rshmem_trap_bad_pe: FAIL ("),
        "{t}"
    );
    assert!(
        verdicts[1].starts_with("gpu trap rshmem_trap_unbound: FAIL ("),
        "{t}"
    );
    for v in verdicts {
        assert!(
            v.contains("the child ran no trap (exit 1)") && v.contains(NO_DRIVER_ERR),
            "{v}"
        );
    }
    assert!(
        t.contains("gpu traps: 0 passed, 2 failed, of 2 case(s)"),
        "{t}"
    );
    no_panic(&o);
    // --traps: every case of the manifest, each failing the same way.
    let n = rshmem::gpu::manifest::Manifest::load(None)
        .expect("embedded manifest")
        .traps
        .len();
    let o = run(&["selftest", "--device", "gpu", "--traps"], &[NO_DRIVER]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("gpu traps: 0 passed, {n} failed, of {n} case(s)")),
        "{t}"
    );
    no_panic(&o);
}

#[test]
fn trap_argument_errors_are_clear() {
    let o = run(&["selftest", "--device", "gpu", "--trap", "nope"], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("no GPU trap case \"nope\"; known: rshmem_trap_bad_pe, "),
        "{}",
        text(&o)
    );
    let o = run(&["selftest", "--traps"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("add --device gpu"), "{}", text(&o));
    let o = run(
        &["selftest", "--device", "gpu", "--traps", "--trap", "bad_pe"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    no_panic(&o);
}
