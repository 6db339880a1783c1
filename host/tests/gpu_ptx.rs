//! The hand-written PTX in the crate (the host-side signal kernel, host/src/gpu/module.rs)
//! assembled with the pinned ptxas (scripts/cuda-toolchain): it must assemble for sm_90
//! without spills. Fails (never skips) when the toolchain is not installed: run
//! `scripts/cuda-toolchain` (scripts/test does).

use std::path::{Path, PathBuf};
use std::process::Command;

fn ptxas() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = std::env::var_os("RSHMEM_CUDA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-cuda"));
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path().join("site-packages/nvidia/cu13/bin/ptxas"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "ptxas not found under {}: install the pinned CUDA toolchain with scripts/cuda-toolchain \
             (or set RSHMEM_CUDA_VENV)",
            venv.display()
        )
    })
}

#[test]
fn signal_kernel_assembles_for_sm90() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join(format!("signal-{}.ptx", std::process::id()));
    std::fs::write(&src, rshmem::gpu::module::SIGNAL_PTX).unwrap();
    let out = dir.join(format!("signal-{}.cubin", std::process::id()));
    let r = Command::new(ptxas())
        .args(["-arch=sm_90", "-O3", "-v"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run ptxas");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(r.status.success(), "ptxas failed:\n{log}");
    assert!(
        log.contains("Compiling entry function 'rshmem_host_signal'"),
        "{log}"
    );
    assert!(
        log.contains("0 bytes spill stores, 0 bytes spill loads"),
        "{log}"
    );
}
