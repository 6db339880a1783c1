//! g++ of CUDA sources as host C++ with the device emulation (`emu/cuda_emu.h`, included
//! before everything), for the tests that include this file
//! (`#[path = "device-emu/build.rs"] mod emu_build;`): the device emulator, the EP kernels'
//! emulator and hostcuda's kernel libraries all compile the unchanged .cu files this way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The crate directory (host/).
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `sources` (each as C++) with the emulation and `flags` into `out`; panics with
/// g++'s messages when it fails. `what` names the build in that message.
pub fn gxx_emulated(what: &str, flags: &[&str], sources: &[PathBuf], out: &Path) {
    let emu = crate_dir().join("tests/device-emu/emu");
    let mut cmd = Command::new("g++");
    cmd.args(["-O1", "-std=c++17", "-Wall", "-Wextra", "-Werror"])
        .arg("-Wno-unknown-pragmas") // #pragma unroll
        .arg("-D__CUDACC__")
        .args(flags)
        .arg("-include")
        .arg(emu.join("cuda_emu.h"))
        .arg("-I")
        .arg(&emu)
        .arg("-I")
        .arg(crate_dir().join("../device-kernels/include"));
    for s in sources {
        cmd.args(["-x", "c++"]).arg(s);
    }
    let r = cmd
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run g++ (install g++): {e}"));
    assert!(
        r.status.success(),
        "g++ of {what} failed:\n{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
}
