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

/// The check that stands between a bundled cubin and `cuModuleLoadData` (which trusts the
/// ELF offsets and takes no length): a cubin ptxas just made passes; every truncation of
/// it, and a file whose ELF machine is not CUDA, fail with a reason.
#[test]
fn cubin_check_accepts_ptxas_output_and_refuses_truncations() {
    use rshmem::gpu::module::cubin_check;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ptx/rshmem_kernels.ptx");
    let out = dir.join(format!("kernels-{}.cubin", std::process::id()));
    let r = Command::new(ptxas())
        .args(["-arch=sm_90", "-O3"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run ptxas");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let image = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(cubin_check(&image), Ok(()));
    // With its sidecar in a folder, it is what the doctor says the module loads from.
    let d = dir.join(format!("cubins-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let c = d.join("rshmem_kernels.sm_90.cubin");
    std::fs::write(&c, &image).unwrap();
    let ptx = std::fs::read(&src).unwrap();
    std::fs::write(
        d.join("rshmem_kernels.sm_90.cubin.fnv"),
        format!("{:016x}\n", fnv1a64(&ptx)),
    )
    .unwrap();
    let load = rshmem::gpu::module::module_sources_in(Some(&d), (9, 0))
        .into_iter()
        .find(|(m, _)| *m == "rshmem_kernels")
        .unwrap()
        .1;
    assert_eq!(load, format!("cubin {}", c.display()));
    std::fs::remove_dir_all(&d).unwrap();
    let n = image.len();
    for cut in [0, 4, 63, 64, 200, n / 3, n / 2, n - 100, n - 1] {
        let e = cubin_check(&image[..cut]).unwrap_err();
        assert!(
            e.contains("not a 64-bit") || e.contains("ends past") || e.contains("end past"),
            "cut at {cut}: {e}"
        );
    }
    let mut x86 = image.clone();
    x86[18] = 62; // EM_X86_64
    assert!(cubin_check(&x86).unwrap_err().contains("not CUDA (190)"));
}

/// FNV-1a 64, as scripts/build-gpu-bundle writes it into the `.cubin.fnv` sidecars.
fn fnv1a64(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}
