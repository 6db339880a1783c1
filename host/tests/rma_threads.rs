//! Every self-test case with PEs as threads of this process, at several PE counts
//! (non-powers of two and more PEs than cores included).
use rshmem::{run_threads, Settings};

fn settings() -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 16 << 20;
    s.timeout = std::time::Duration::from_secs(20);
    s
}

fn selftest(n: usize) {
    let out = run_threads(n, settings(), |pe| rshmem::selftest::run(pe, &[], |_| {}))
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
    assert!(errors.is_empty(), "{n} PEs:\n{}", errors.join("\n"));
}

#[test]
fn selftest_1_pe() {
    selftest(1);
}
#[test]
fn selftest_2_pes() {
    selftest(2);
}
#[test]
fn selftest_3_pes() {
    selftest(3);
}
#[test]
fn selftest_4_pes() {
    selftest(4);
}
#[test]
fn selftest_7_pes_more_than_cores() {
    selftest(7);
}
