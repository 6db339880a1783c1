//! Embeds every device header (device-kernels/include/**) and every library PTX file
//! (ptx/*.ptx) into the crate, so that a header or module added on the device side is
//! picked up without editing Rust (host/src/gpu/module.rs). Needs nothing but cargo.

use std::fmt::Write;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let include = root.join("device-kernels/include");
    let ptx = root.join("ptx");
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-changed={}", ptx.display());

    let mut headers = Vec::new();
    walk(&include, &mut headers);
    let mut s = String::from("/// (include name, text) of every header under device-kernels/include.\npub const EMBEDDED_HEADERS: &[(&str, &str)] = &[\n");
    for h in &headers {
        let rel = h
            .strip_prefix(&include)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        writeln!(
            s,
            "    ({rel:?}, include_str!({:?})),",
            h.canonicalize().unwrap().display().to_string()
        )
        .unwrap();
    }
    s.push_str("];\n");

    let mut ptxs = Vec::new();
    walk(&ptx, &mut ptxs);
    s.push_str("/// (module name, PTX) of every file in ptx/.\npub const EMBEDDED_PTX: &[(&str, &str)] = &[\n");
    for p in ptxs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "ptx"))
    {
        let stem = p.file_stem().unwrap().to_string_lossy();
        writeln!(
            s,
            "    ({stem:?}, include_str!({:?})),",
            p.canonicalize().unwrap().display().to_string()
        )
        .unwrap();
    }
    s.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("embedded_device.rs");
    std::fs::write(out, s).unwrap();
}
