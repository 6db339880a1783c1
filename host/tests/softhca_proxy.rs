//! The whole self-test over the proxy transport (every PE, this one included, reached
//! through the soft HCA), with PEs as threads at several counts.
use rshmem::config::TransportMode;
use rshmem::{run_threads, Settings};

#[path = "thread-pes-support/mod.rs"]
mod thread_pes;
use thread_pes::arrive_and_wait;

fn settings() -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 16 << 20;
    s.timeout = std::time::Duration::from_secs(20);
    s.transport = TransportMode::Proxy;
    s
}

fn selftest(n: usize) {
    let out = run_threads(n, settings(), |pe| {
        for r in 0..pe.n_pes() {
            assert_eq!(pe.transport_to(r), Some("proxy"));
        }
        rshmem::selftest::run(pe, &[], |_| {})
    })
    .expect("job starts");
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| match r {
            Ok(cases) if *cases == rshmem::selftest::CASES.len() => None,
            Ok(cases) => Some(format!("PE {rank}: ran {cases} cases")),
            Err(e) => Some(format!("PE {rank}: {e}")),
        })
        .collect();
    assert!(
        errors.is_empty(),
        "{n} PEs over proxy:\n{}",
        errors.join("\n")
    );
}

#[test]
fn selftest_proxy_1_pe() {
    selftest(1);
}
#[test]
fn selftest_proxy_2_pes() {
    selftest(2);
}
#[test]
fn selftest_proxy_3_pes() {
    selftest(3);
}
#[test]
fn selftest_proxy_4_pes() {
    selftest(4);
}
#[test]
fn selftest_proxy_7_pes_more_than_cores() {
    selftest(7);
}

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

fn run(n: usize, args: &[&str]) -> (bool, String, String) {
    let o = std::process::Command::new(BIN)
        .args(["run", "-n", &n.to_string(), "--", BIN])
        .args(args)
        .env("RSHMEM_SYMMETRIC_SIZE", "32M")
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .env("RSHMEM_TRANSPORT", "proxy")
        .output()
        .expect("rshmem run");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn selftest_proxy_under_rshmem_run_3_processes() {
    let (ok, out, err) = run(3, &["selftest"]);
    assert!(ok, "{out}\n{err}");
    for r in 0..3 {
        assert!(
            out.contains(&format!(
                "[pe {r}] selftest: all {} cases passed on PE {r}",
                rshmem::selftest::CASES.len()
            )),
            "{out}"
        );
    }
}

#[test]
fn bench_put_over_proxy_reports_proxy() {
    // PEs as threads of the bench process.
    let args = [
        "bench",
        "put",
        "--transport",
        "proxy",
        "--json",
        "--iters",
        "100",
        "--warmup",
        "10",
        "--max-size",
        "64K",
    ];
    let o = std::process::Command::new(BIN)
        .args(args)
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["transport"], "proxy");
    assert_eq!(v["rows"].as_array().unwrap().len(), 14); // 8 B .. 64 KiB
                                                         // Under a launcher, the PEs' RSHMEM_TRANSPORT must agree with --transport.
    let (ok, out, err) = run(
        2,
        &[
            "bench",
            "get",
            "--transport",
            "proxy",
            "--json",
            "--iters",
            "50",
            "--warmup",
            "5",
            "--max-size",
            "1K",
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("\"transport\":\"proxy\""), "{out}");
}

#[test]
fn bench_softhca_rows_ops_and_rates() {
    // 8 B inline + 8 B .. 4 KiB through SGEs, at least 200 000 WRITEs each (the floor),
    // every slot verified by the bench itself (a wrong byte fails the run).
    let o = std::process::Command::new(BIN)
        .args(["bench", "softhca", "--max-size", "4K", "--json"])
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["bench"], "softhca");
    // The cross-core probe ran before and after the rows and timed real round trips.
    for when in ["before", "after"] {
        let ns = v["core_round_trip_ns"][when].as_f64();
        assert!(
            ns.is_some_and(|x| x.is_finite() && x > 0.0),
            "core_round_trip_ns.{when}: {v}"
        );
    }
    let rows = v["rows"].as_array().unwrap();
    let shape: Vec<(u64, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["size"].as_u64().unwrap(),
                r["payload"].as_str().unwrap(),
                r["ops"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want = vec![(8, "inline", 200_000)];
    want.extend((3..=12).map(|k| (1u64 << k, "sge", 200_000)));
    assert_eq!(shape, want);
    for r in rows {
        let (ops_s, gbps) = (
            r["ops_per_s"].as_f64().unwrap(),
            r["gbps"].as_f64().unwrap(),
        );
        let size = r["size"].as_f64().unwrap();
        assert!(ops_s > 0.0 && ops_s.is_finite(), "{r}");
        // GB/s is ops/s times the size, in 1e9 bytes.
        assert!(
            (gbps - ops_s * size / 1e9).abs() <= 1e-9 * gbps.max(1.0),
            "{r}"
        );
    }
}

/// Two threads of one PE share its queue pair to a peer: one gets 512 KiB at a time (a
/// batch of 64 READs whose staging slots it holds until it has copied them out), the other
/// puts 1 MiB at a time (128 WRITEs, a whole ring). A batch posted one READ at a time could
/// hold its first slot while the put's reservation one ring later waited for it, and then
/// wait itself to publish a READ reserved after that put: both ended at the timeout and the
/// queue pair was broken. Every byte is checked.
#[test]
fn a_large_get_and_a_large_put_share_a_queue_pair_from_two_threads() {
    const GET: usize = 512 << 10;
    const PUT: usize = 1 << 20;
    const ROUNDS: usize = 40;
    let mut s = settings();
    s.timeout = std::time::Duration::from_secs(10);
    // PE 1 waits for PE 0's 60 MiB outside rshmem: in a barrier its wait would be bounded
    // by the 10 s meant for single operations (a debug build on a loaded machine nears it).
    let done = std::sync::atomic::AtomicUsize::new(0);
    let out = run_threads(2, s, |pe| {
        let src: rshmem::SymPtr<u8> = pe.calloc(GET)?;
        let dst: rshmem::SymPtr<u8> = pe.calloc(PUT)?;
        let me = pe.my_pe();
        let pattern = |i: usize| (i * 31 + 7 * (me + 1)) as u8;
        let mine: Vec<u8> = (0..GET).map(pattern).collect();
        pe.put(src, &mine, me)?;
        pe.barrier_all()?;
        let traffic = if me != 0 {
            Ok(())
        } else {
            let theirs: Vec<u8> = (0..GET).map(|i| (i * 31 + 7 * 2) as u8).collect();
            let data: Vec<u8> = (0..PUT).map(|i| (i % 251) as u8).collect();
            std::thread::scope(|sc| -> rshmem::Result<()> {
                let getter = sc.spawn(|| -> rshmem::Result<()> {
                    let mut buf = vec![0u8; GET];
                    for round in 0..ROUNDS {
                        pe.get(&mut buf, src, 1)?;
                        if buf != theirs {
                            let at = buf.iter().zip(&theirs).position(|(a, b)| a != b);
                            return Err(rshmem::Error::Verification(format!(
                                "get round {round}: first wrong byte at {at:?}"
                            )));
                        }
                    }
                    Ok(())
                });
                for _ in 0..ROUNDS {
                    pe.put(dst, &data, 1)?;
                }
                pe.try_quiet()?;
                getter.join().expect("getter thread")
            })
        };
        // Also after a failure, so that PE 1 does not wait out its bound for nothing.
        arrive_and_wait(&done, 2);
        traffic?;
        pe.barrier_all()?;
        if me == 1 {
            let mut got = vec![0u8; PUT];
            pe.get(&mut got, dst, 1)?;
            if got.iter().enumerate().any(|(i, &b)| b != (i % 251) as u8) {
                return Err(rshmem::Error::Verification("put data differs".into()));
            }
        }
        Ok(())
    })
    .expect("job starts");
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| r.as_ref().err().map(|e| format!("PE {rank}: {e}")))
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
