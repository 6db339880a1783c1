//! The whole self-test over the proxy transport (every PE, this one included, reached
//! through the soft HCA), with PEs as threads at several counts.
use rshmem::config::TransportMode;
use rshmem::{run_threads, Settings};

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
