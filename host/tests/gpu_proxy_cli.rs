//! GPU PEs over the proxy transport and the IBGDA producer-rate bench on a machine without
//! a GPU: the CUDA-absent error names libcuda, bad options are refused before any GPU
//! work, never a panic. The GPU paths themselves run in scripts/gpu-check
//! (`selftest-proxy-2`, `ibgda-rate`).

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RSHMEM_TRANSPORT")
        .output()
        .expect("run rshmem")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn libcuda_present() -> bool {
    ["libcuda.so", "libcuda.so.1"].iter().any(|n| {
        let c = std::ffi::CString::new(*n).unwrap();
        // SAFETY: dlopen/dlclose of a system library name.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    })
}

#[test]
fn selftest_over_proxy_without_cuda_names_libcuda() {
    if libcuda_present() {
        return; // a GPU machine: gpu-check's selftest-proxy-2 is the check
    }
    let o = run(&[
        "selftest",
        "--device",
        "gpu",
        "--pes",
        "2",
        "--transport",
        "proxy",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("transport proxy")
            && t.contains("rshmem selftest --device gpu: libcuda.so.1 could not be loaded (libcuda.so.1 not found: install the NVIDIA driver)"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

#[test]
fn selftest_refuses_an_unknown_transport() {
    let o = run(&["selftest", "--device", "gpu", "--transport", "verbs"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("invalid value 'verbs' for '--transport"), "{t}");
}

#[test]
fn ibgda_rate_without_cuda_names_libcuda() {
    if libcuda_present() {
        return;
    }
    let o = run(&["bench", "ibgda-rate", "--device", "gpu", "--json"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(
            "rshmem bench ibgda-rate: libcuda.so.1 could not be loaded (libcuda.so.1 not found"
        ),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

#[test]
fn ibgda_rate_refuses_bad_options_first() {
    let o = run(&["bench", "ibgda-rate", "--device", "cpu"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("rshmem bench ibgda-rate: invalid argument: bench ibgda-rate measures GPU producers: pass --device gpu"),
        "{t}"
    );
    let o = run(&["bench", "ibgda-rate", "--wqe-cnt", "100"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("--wqe-cnt 100 must be a power of two in 64..=16384"),
        "{t}"
    );
}
