//! Shared by the mlx5 integration tests: compiling and running the C/C++ oracle programs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Header the oracle tests need; its absence is a test failure, never a skip.
pub const MLX5DV_H: &str = "/usr/include/infiniband/mlx5dv.h";

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `src` (relative to host/tests/mlx5-oracle) with `compiler` and returns the
/// binary's path; panics with the compiler's output on failure.
pub fn compile(compiler: &str, src: &str, extra: &[&str]) -> PathBuf {
    let dir = manifest_dir().join("tests/mlx5-oracle");
    // Unique per call: tests in one binary compile concurrently.
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{src}-{}-{n}.bin", std::process::id()));
    let include = manifest_dir().join("../device-kernels/include");
    let r = Command::new(compiler)
        .args(["-O1", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .args(extra)
        .arg(dir.join(src))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler} (install gcc/g++): {e}"));
    assert!(
        r.status.success(),
        "{compiler} {src} failed:\n{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// Runs a compiled oracle and returns its stdout lines split as (key, value).
pub fn run_pairs(bin: &Path) -> Vec<(String, String)> {
    let r = Command::new(bin).output().expect("run oracle program");
    assert!(
        r.status.success(),
        "{} failed: {}",
        bin.display(),
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8(r.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("'key value' line");
            (k.to_string(), v.to_string())
        })
        .collect()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
