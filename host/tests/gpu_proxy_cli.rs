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
        // "No driver" on any machine: the runtime loads the file RSHMEM_CUDA_LIB names
        // instead of searching, and this one is not there (the other tests here stop
        // before loading CUDA).
        .env("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1")
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

/// `selftest --device gpu --transport T` without a driver: the CUDA-absent error, after
/// the header naming the transport. The NIC path (ibgda, docs/ibgda.md) starts with the
/// GPU too, so that is its error here as well.
fn selftest_without_cuda_names_libcuda(transport: &str) {
    let o = run(&[
        "selftest",
        "--device",
        "gpu",
        "--pes",
        "2",
        "--transport",
        transport,
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("transport {transport}"))
            && t.contains("rshmem selftest --device gpu: libcuda.so.1 could not be loaded (libcuda.so.1 not found at RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1); install the NVIDIA driver and point RSHMEM_CUDA_LIB at its libcuda.so.1, or unset RSHMEM_CUDA_LIB"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

#[test]
fn selftest_over_proxy_without_cuda_names_libcuda() {
    selftest_without_cuda_names_libcuda("proxy");
}

#[test]
fn selftest_over_ibgda_without_cuda_names_libcuda() {
    selftest_without_cuda_names_libcuda("ibgda");
}

#[test]
fn cpu_pes_refuse_the_ibgda_transport() {
    // From the environment (any CPU PE) and from --transport (the benches), each saying
    // that ibgda is for GPU PEs.
    let o = Command::new(BIN)
        .args(["selftest"])
        .env("RSHMEM_TRANSPORT", "ibgda")
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("RSHMEM_TRANSPORT=\"ibgda\": ibgda is for GPU PEs"),
        "{t}"
    );
    for (args, code, says) in [
        (
            vec!["bench", "put", "--transport", "ibgda", "--iters", "10"],
            2,
            "rshmem bench put: --transport ibgda is for GPU PEs (GPU threads write the NIC's \
             queues): add --device gpu",
        ),
        (
            vec!["bench", "ep", "--transport", "ibgda", "--tokens", "4"],
            1,
            "--transport ibgda is for GPU PEs (GPU threads write the NIC's queues): add --device gpu",
        ),
        (
            vec!["selftest", "--transport", "ibgda"],
            2,
            "rshmem selftest: --transport ibgda is a GPU option (add --device gpu); CPU PEs \
             take RSHMEM_TRANSPORT",
        ),
    ] {
        let o = run(&args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {t}");
        assert!(t.contains(says), "{args:?}: {t}");
    }
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
