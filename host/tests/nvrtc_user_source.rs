//! The NVRTC path (`GpuPe::compile_user_source`'s compile step, `gpu::module::nvrtc_compile`)
//! on a machine without a GPU: NVRTC needs no device. User kernels that include the
//! device API are compiled with the embedded headers and the options a GPU PE uses, and
//! the PTX is assembled by ptxas for sm_90.
//!
//! NVRTC is the PyPI wheel nvidia-cuda-nvrtc, which `scripts/check-device-code` installs
//! into the CUDA venv; it runs this test with `--ignored`, `RSHMEM_NVRTC_LIB` and
//! `RSHMEM_PTXAS` set. Plain `cargo test` lists it as ignored, not as passed.
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compiles `src` through rshmem's NVRTC path for compute capability 9.0 and checks
/// that ptxas accepts the PTX for sm_90; returns the PTX.
fn compile_and_assemble(name: &str, src: &str) -> String {
    let ptx = rshmem::gpu::module::nvrtc_compile(src, name, (9, 0), &[])
        .unwrap_or_else(|e| panic!("NVRTC failed on {name}: {e}"));
    assert!(
        ptx.contains(".target sm_90"),
        "{name}: PTX target: {}",
        &ptx[..ptx.len().min(400)]
    );
    let ptxas = std::env::var("RSHMEM_PTXAS").expect(
        "RSHMEM_PTXAS names the ptxas of the CUDA venv (scripts/check-device-code sets it)",
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvrtc-user-source");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.ptx"));
    std::fs::write(&file, &ptx).unwrap();
    let o = Command::new(&ptxas)
        .args(["-arch=sm_90", "-o"])
        .arg(dir.join(format!("{name}.cubin")))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {ptxas}: {e}"));
    assert!(
        o.status.success(),
        "ptxas rejected the NVRTC PTX of {name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    ptx
}

#[test]
#[ignore = "needs NVRTC (PyPI nvidia-cuda-nvrtc); run by scripts/check-device-code"]
fn user_kernels_compile_through_nvrtc() {
    // The example user kernel: a ring exchange with put_signal + signal_wait_until.
    let ring = std::fs::read_to_string(root().join("examples/gpu_ring/ring.cu")).unwrap();
    let ptx = compile_and_assemble("ring.cu", &ring);
    // It uses the device API, so the module carries the state global a PE binds.
    assert!(
        ptx.contains("rshmemi_device_state"),
        "ring.cu: no device state global in the PTX"
    );
    // The GPU self-test's host_nvrtc kernel, exactly as the runner compiles it.
    compile_and_assemble("rshmem_user_probe.cu", rshmem::gpu::runner::NVRTC_SRC);
    // A kernel written here, touching each family of the device API at each scope.
    let api = r#"
#include "rshmem/rshmem.cuh"
extern "C" __global__ void user_api(uint64_t *buf, uint64_t *sig, int peer) {
    rshmem_uint64_put(buf, buf + 8, 8, peer);
    rshmem_uint64_put_nbi_warp(buf, buf + 8, 64, peer);
    rshmem_uint64_get_block(buf + 64, buf, 64, peer);
    rshmem_putmem_block(buf, buf + 16, 512, peer);
    rshmem_uint64_p(buf, 7, peer);
    uint64_t v = rshmem_uint64_g(buf, peer);
    rshmem_uint64_put_signal_nbi(buf, buf + 8, 8, sig, 1, RSHMEM_SIGNAL_ADD, peer);
    rshmem_signal_op(sig, 1, RSHMEM_SIGNAL_SET, peer);
    rshmem_fence();
    rshmem_quiet();
    rshmem_atomic_fetch_add(buf, v, peer);
    rshmem_atomic_compare_swap(buf, (uint64_t)1, (uint64_t)2, peer);
    rshmem_atomic_inc((unsigned int *)sig, peer);
    rshmem_signal_wait_until(sig, RSHMEM_CMP_GE, 1);
    rshmem_wait_until(buf, RSHMEM_CMP_NE, (uint64_t)0);
}
"#;
    compile_and_assemble("user_api.cu", api);
}

/// The library's own kernels compile through NVRTC too (NVRTC has no host headers, so
/// this catches a header that only builds under nvcc).
#[test]
#[ignore = "needs NVRTC (PyPI nvidia-cuda-nvrtc); run by scripts/check-device-code"]
fn library_kernels_compile_through_nvrtc() {
    let src = root().join("device-kernels/src");
    let mut n = 0;
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cu") {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            compile_and_assemble(&name, &std::fs::read_to_string(&p).unwrap());
            n += 1;
        }
    }
    assert!(n >= 4, "found only {n} .cu files under {}", src.display());
}
