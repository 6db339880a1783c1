//! The soft HCA's libfabric backend on one machine, without namespaces or root:
//! `RSHMEM_TRANSPORT=proxy` + `RSHMEM_PROXY_BACKEND=fabric` sends every peer, this PE
//! included, through libfabric (the provider chosen automatically: tcp;ofi_rxm or shm).
//! Cross-namespace jobs are in netns_jobs.rs; the design in docs/multinode.md.
use std::process::Command;

const RSHMEM: &str = env!("CARGO_BIN_EXE_rshmem");

fn fabric_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(RSHMEM);
    c.args(args)
        .env("RSHMEM_TRANSPORT", "proxy")
        .env("RSHMEM_PROXY_BACKEND", "fabric")
        .env("RSHMEM_SYMMETRIC_SIZE", "16M")
        // A bound on progress, not a timing: a barrier waits for a peer's whole self-test
        // case, which a loaded 2-core machine stretches (docs/multinode.md, "Defaults").
        .env("RSHMEM_TIMEOUT_MS", "60000");
    c
}

/// The self-test job `out` succeeded and each of its `pes` PEs passed every case.
fn assert_selftest_passed(out: &std::process::Output, pes: usize) {
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for pe in 0..pes {
        let want = format!(
            "all {} cases passed on PE {pe}",
            rshmem::selftest::CASES.len()
        );
        assert!(text.contains(&want), "missing {want:?}:\n{text}");
    }
}

/// The whole self-test, 3 processes, every operation through libfabric.
#[test]
fn selftest_over_fabric_three_processes() {
    let out = fabric_cmd(&["run", "-n", "3", "--", RSHMEM, "selftest"])
        .output()
        .unwrap();
    assert_selftest_passed(&out, 3);
}

/// `bench put` under a launcher reports the fabric transport and its provider, with
/// verified data.
#[test]
fn bench_reports_proxy_fabric() {
    let out = fabric_cmd(&[
        "run",
        "-n",
        "2",
        "--",
        RSHMEM,
        "bench",
        "put",
        "--transport",
        "proxy",
        "--min-size",
        "8",
        "--max-size",
        "128K",
        "--iters",
        "200",
        "--warmup",
        "20",
        "--json",
    ])
    .output()
    .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let json = text
        .lines()
        .find_map(|l| l.find('{').map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no JSON in:\n{text}"));
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["transport"], "proxy-fabric", "{json}");
    assert!(
        v["provider"].as_str().is_some_and(|p| !p.is_empty()),
        "{json}"
    );
    assert_eq!(v["rows"].as_array().map(|r| r.len()), Some(15), "{json}");
}

/// A bad RSHMEM_PROXY_BACKEND is refused, naming the variable.
#[test]
fn bad_proxy_backend_is_refused() {
    let out = Command::new(RSHMEM)
        .args(["selftest"])
        .env("RSHMEM_PROXY_BACKEND", "carrier-pigeon")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("RSHMEM_PROXY_BACKEND"), "{text}");
}

/// The self-test with delivery-complete writes (no flush READs), the smallest staging
/// chunk (many WQEs per put/get) and the progress handover off (the engine thread keeps
/// running rounds while PEs wait), 2 processes.
#[test]
fn selftest_over_fabric_delivery_complete_small_chunks_no_handover() {
    let out = fabric_cmd(&["run", "-n", "2", "--", RSHMEM, "selftest"])
        .env("RSHMEM_FABRIC_DELIVERY", "complete")
        .env("RSHMEM_ENGINE_HANDOVER", "0")
        .env("RSHMEM_FABRIC_CHUNK", "8K")
        .output()
        .unwrap();
    assert_selftest_passed(&out, 2);
}

/// The self-test (quiet, fence, signals, barriers: exact checks) and the put benchmark
/// (ping-pong payload and a streamed-then-quiet 1 MiB, both verified) with eager write
/// confirmation (a flush READ after every write; the default is lazy: flush READs only
/// when a completion is needed).
#[test]
fn selftest_and_bench_over_fabric_eager_confirmation() {
    let out = fabric_cmd(&["run", "-n", "3", "--", RSHMEM, "selftest"])
        .env("RSHMEM_FABRIC_CONFIRM", "eager")
        .env("RSHMEM_FABRIC_CHUNK", "8K")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for pe in 0..3 {
        let want = format!(
            "all {} cases passed on PE {pe}",
            rshmem::selftest::CASES.len()
        );
        assert!(text.contains(&want), "missing {want:?}:\n{text}");
    }
    let out = fabric_cmd(&[
        "run",
        "-n",
        "2",
        "--",
        RSHMEM,
        "bench",
        "put",
        "--transport",
        "proxy",
        "--json",
        "--min-size",
        "8",
        "--max-size",
        "1M",
        "--iters",
        "200",
    ])
    .env("RSHMEM_FABRIC_CONFIRM", "eager")
    .output()
    .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("proxy-fabric"),
        "not over the fabric:\n{text}"
    );
    assert!(text.contains("\"size\":1048576"), "no 1 MiB row:\n{text}");
}

/// A bad RSHMEM_FABRIC_CHUNK is refused, naming the variable.
#[test]
fn bad_fabric_chunk_is_refused() {
    let out = Command::new(RSHMEM)
        .args(["selftest"])
        .env("RSHMEM_FABRIC_CHUNK", "3000")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("RSHMEM_FABRIC_CHUNK"), "{text}");
}

/// Bad values of the fabric's switches are refused at init (Settings), naming the
/// variable and the values it accepts; nothing runs.
#[test]
fn bad_fabric_switches_are_refused() {
    for (var, value, allowed) in [
        ("RSHMEM_ENGINE_HANDOVER", "yes", "0, 1"),
        ("RSHMEM_FABRIC_CONFIRM", "later", "eager, lazy"),
        ("RSHMEM_FABRIC_DELIVERY", "now", "flush, complete"),
    ] {
        let out = fabric_cmd(&["run", "-n", "2", "--", RSHMEM, "selftest"])
            .env(var, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}={value} accepted:\n{text}");
        assert!(
            text.contains(var) && text.contains(value),
            "{var}={value}:\n{text}"
        );
        assert!(
            text.contains(allowed),
            "{var}={value}: allowed values not named:\n{text}"
        );
        assert!(
            !text.contains("cases passed"),
            "{var}={value}: the self-test ran:\n{text}"
        );
    }
}

/// The self-test through libfabric's shm provider, whose writes are now confirmed with
/// flush READs (it orders reads after writes once asked; fabric_rma.rs).
#[test]
fn selftest_over_fabric_on_shm() {
    let out = fabric_cmd(&["run", "-n", "2", "--", RSHMEM, "selftest"])
        .env("RSHMEM_FABRIC_PROVIDER", "shm")
        .output()
        .unwrap();
    assert_selftest_passed(&out, 2);
}
