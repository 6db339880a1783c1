//! Builds host/tests/hostcuda/hostcuda.c (a CPU stand-in for libcuda.so.1) for the tests
//! that include this file (`#[path = "hostcuda/build.rs"] mod hostcuda_build;`): once per
//! test process, against the pinned CUDA toolchain's `cuda.h`. Fails, never skips, when
//! the toolchain is missing: run `scripts/cuda-toolchain` (scripts/test does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The pinned toolchain's `cuda.h` directory (as host/tests/gpu_ptx.rs finds ptxas).
pub fn cuda_include() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = std::env::var_os("RSHMEM_CUDA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-cuda"));
    std::fs::read_dir(venv.join("lib"))
        .ok()
        .and_then(|rd| {
            rd.flatten()
                .map(|e| e.path().join("site-packages/nvidia/cu13/include"))
                .find(|p| p.join("cuda.h").exists())
        })
        .unwrap_or_else(|| {
            panic!(
                "cuda.h not found under {}: install the pinned CUDA toolchain with \
                 scripts/cuda-toolchain (or set RSHMEM_CUDA_VENV)",
                venv.display()
            )
        })
}

/// The path of the built stand-in (its soname is libcuda.so.1, so `RSHMEM_CUDA_LIB` can
/// name it).
pub fn hostcuda_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostcuda-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostcuda/hostcuda.c");
        let lib = dir.join("libcuda.so.1");
        let out = Command::new("cc")
            .args([
                "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
            ])
            .args(["-fvisibility=hidden", "-Wl,-soname,libcuda.so.1", "-I"])
            .arg(cuda_include())
            .arg("-o")
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("cc");
        assert!(
            out.status.success(),
            "building hostcuda failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
    .clone()
}
