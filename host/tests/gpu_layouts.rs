//! The host C compiler as the oracle for the GPU ABI: sizes, offsets and constants of
//! rshmem/state.cuh and rshmem/internal/harness.cuh, compared with the Rust mirrors in
//! host/src/gpu/{state,harness}.rs. Fails (never skips) when no C compiler is installed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn oracle() -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Unique per call: the tests of this binary compile concurrently.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpu-layouts-{}-{n}.bin", std::process::id()));
    let r = Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Werror", "-I"])
        .arg(dir.join("../device-kernels/include"))
        .arg(dir.join("tests/gpu-oracle/layouts.c"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc (install gcc): {e}"));
    assert!(
        r.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let r = Command::new(&out).output().expect("run the layout oracle");
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
fn state_and_harness_layouts_match_the_c_compiler() {
    let o = oracle();
    let mut rows = rshmem::gpu::state::layout_table();
    rows.extend(rshmem::gpu::harness::layout_table());
    assert_eq!(rows.len(), 61, "every field listed");
    for (k, v) in &rows {
        assert_eq!(
            o.get(*k).map(String::as_str),
            Some(v.to_string().as_str()),
            "{k}"
        );
    }
    // Nothing in the oracle that Rust does not mirror (constants aside).
    let layout_keys = o.keys().filter(|k| k.contains('.')).count();
    assert_eq!(layout_keys, rows.len());
}

#[test]
fn state_constants_match_the_header() {
    let o = oracle();
    for (k, v) in rshmem::gpu::state::constant_table() {
        assert_eq!(
            o.get(k).map(String::as_str),
            Some(v.to_string().as_str()),
            "{k}"
        );
    }
    assert_eq!(o["RSHMEM_STATE_SYMBOL"], rshmem::gpu::state::STATE_SYMBOL);
}
