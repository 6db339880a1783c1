//! PEs as separate processes, bootstrapped from each launcher's variables (rank 0 hosts
//! the root, as under torchrun/mpirun/srun), plus failure and bad-environment cases.
use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `n` `rshmem selftest ARGS` processes with the variables `vars(rank)` (plus common
/// ones), waits for all (bounded), returns their outputs in rank order.
fn job(
    n: usize,
    args: &[&str],
    vars: impl Fn(usize, u16) -> Vec<(String, String)>,
    limit: Duration,
) -> Vec<Output> {
    let port = free_port();
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(BIN);
            c.arg("selftest").args(args);
            for (k, _) in std::env::vars() {
                if k.starts_with("RSHMEM_")
                    || k.starts_with("OMPI_")
                    || k.starts_with("SLURM_")
                    || k.starts_with("PMI_")
                {
                    c.env_remove(k);
                }
            }
            for k in [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "MASTER_ADDR",
                "MASTER_PORT",
            ] {
                c.env_remove(k);
            }
            c.env("RSHMEM_SYMMETRIC_SIZE", "16M")
                .env("RSHMEM_TIMEOUT_MS", "8000");
            for (k, v) in vars(r, port) {
                c.env(k, v);
            }
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            c.spawn().expect("spawn rshmem")
        })
        .collect();
    let t0 = Instant::now();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().unwrap().is_none() {
                if t0.elapsed() > limit {
                    let _ = c.kill();
                    panic!("a PE did not finish within {limit:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            c.wait_with_output().unwrap()
        })
        .collect();
    outs
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn job_id(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.split(", job ").nth(1).map(|s| s.trim().to_string()))
}

fn assert_no_segments(job: &str) {
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with(&format!("rshmem-{job}-")))
        .collect();
    assert!(left.is_empty(), "segments left in /dev/shm: {left:?}");
}

fn assert_all_passed(outs: &[Output]) {
    let cases = Command::new(BIN)
        .args(["selftest", "--list"])
        .output()
        .unwrap();
    let ncases = String::from_utf8_lossy(&cases.stdout).lines().count();
    for (r, o) in outs.iter().enumerate() {
        let (out, err) = text(o);
        assert!(
            o.status.success(),
            "PE {r} failed: {:?}\nstdout:\n{out}\nstderr:\n{err}",
            o.status
        );
        assert!(
            out.contains(&format!("selftest: all {ncases} cases passed on PE {r}")),
            "PE {r}:\n{out}"
        );
    }
    let id = job_id(&text(&outs[0]).0).expect("job id printed");
    assert_no_segments(&id);
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn kv(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn rshmem_variables() {
    let n = 3;
    let outs = job(
        n,
        &[],
        |r, port| {
            kv(&[
                ("RSHMEM_RANK", r.to_string()),
                ("RSHMEM_WORLD_SIZE", n.to_string()),
                ("RSHMEM_MASTER_ADDR", "127.0.0.1".into()),
                ("RSHMEM_MASTER_PORT", port.to_string()),
                ("RSHMEM_TOKEN", TOKEN.into()),
            ])
        },
        Duration::from_secs(60),
    );
    assert_all_passed(&outs);
}

/// torchrun's variables, with MASTER_PORT held by another listener as torchrun's agent
/// holds it (its rendezvous store): the root listens on MASTER_PORT + 1.
#[test]
fn torchrun_variables() {
    let n = 2;
    let outs = job(
        n,
        &[],
        |r, port| {
            if r == 0 {
                // Held for the rest of the test process, like the agent for the job.
                if let Ok(agent) = std::net::TcpListener::bind(("127.0.0.1", port - 1)) {
                    std::mem::forget(agent);
                }
            }
            kv(&[
                ("RANK", r.to_string()),
                ("WORLD_SIZE", n.to_string()),
                ("LOCAL_RANK", r.to_string()),
                ("LOCAL_WORLD_SIZE", n.to_string()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", (port - 1).to_string()),
                ("RSHMEM_TOKEN", TOKEN.into()),
            ])
        },
        Duration::from_secs(60),
    );
    assert_all_passed(&outs);
}

/// An empty RSHMEM_TOKEN (`RSHMEM_TOKEN=$TOKEN` with TOKEN unset) is refused on every PE
/// of a launched job; a one-PE run, which uses no token, ignores it.
#[test]
fn an_empty_token_is_refused_in_a_job() {
    let n = 2;
    let outs = job(
        n,
        &["--case", "alloc"],
        |r, port| {
            kv(&[
                ("RSHMEM_RANK", r.to_string()),
                ("RSHMEM_WORLD_SIZE", n.to_string()),
                ("RSHMEM_MASTER_ADDR", "127.0.0.1".into()),
                ("RSHMEM_MASTER_PORT", port.to_string()),
                ("RSHMEM_TOKEN", String::new()),
            ])
        },
        Duration::from_secs(60),
    );
    for (r, o) in outs.iter().enumerate() {
        let (out, err) = text(o);
        assert!(!o.status.success(), "PE {r}: {out}");
        assert!(
            err.contains("RSHMEM_TOKEN") && err.contains("must not be empty"),
            "PE {r}: {err}"
        );
    }
    let one = Command::new(BIN)
        .args(["selftest", "--case", "alloc"])
        .env("RSHMEM_TOKEN", "")
        .env_remove("RSHMEM_RANK")
        .env_remove("RANK")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("PMI_RANK")
        // Job variables without a rank are refused (a test run inside a job has them).
        .env_remove("RSHMEM_WORLD_SIZE")
        .env_remove("RSHMEM_MASTER_ADDR")
        .env_remove("RSHMEM_MASTER_PORT")
        .env_remove("RSHMEM_ROOT")
        .output()
        .unwrap();
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
}

#[test]
fn open_mpi_variables() {
    let n = 3;
    let outs = job(
        n,
        &["--case", "put-get", "--case", "atomics-concurrent"],
        |r, port| {
            kv(&[
                ("OMPI_COMM_WORLD_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_SIZE", n.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", n.to_string()),
                ("RSHMEM_MASTER_ADDR", "127.0.0.1".into()),
                ("RSHMEM_MASTER_PORT", port.to_string()),
                ("RSHMEM_TOKEN", TOKEN.into()),
            ])
        },
        Duration::from_secs(60),
    );
    for (r, o) in outs.iter().enumerate() {
        let (out, err) = text(o);
        assert!(o.status.success(), "PE {r}: {out}\n{err}");
        assert!(
            out.contains(&format!("selftest: all 2 cases passed on PE {r}")),
            "{out}"
        );
    }
}

#[test]
fn slurm_and_pmi_variables() {
    for slurm in [true, false] {
        let n = 2;
        let outs = job(
            n,
            &["--case", "signal"],
            |r, port| {
                let mut v = if slurm {
                    kv(&[
                        ("SLURM_PROCID", r.to_string()),
                        ("SLURM_NTASKS", n.to_string()),
                        ("SLURM_LOCALID", r.to_string()),
                    ])
                } else {
                    kv(&[("PMI_RANK", r.to_string()), ("PMI_SIZE", n.to_string())])
                };
                v.extend(kv(&[
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.to_string()),
                    ("RSHMEM_TOKEN", TOKEN.into()),
                ]));
                v
            },
            Duration::from_secs(60),
        );
        for (r, o) in outs.iter().enumerate() {
            let (out, err) = text(o);
            assert!(o.status.success(), "slurm={slurm} PE {r}: {out}\n{err}");
            assert!(
                out.contains(&format!("all 1 cases passed on PE {r}")),
                "{out}"
            );
        }
    }
}

#[test]
fn missing_token_and_root_address_are_clear_errors() {
    let o = Command::new(BIN)
        .args(["selftest"])
        .env("RSHMEM_RANK", "0")
        .env("RSHMEM_WORLD_SIZE", "2")
        .env("RSHMEM_MASTER_ADDR", "127.0.0.1")
        .env("RSHMEM_MASTER_PORT", "1")
        .env_remove("RSHMEM_TOKEN")
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("RSHMEM_TOKEN is not set"), "{err}");

    let o = Command::new(BIN)
        .args(["selftest"])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("RSHMEM_TOKEN", TOKEN)
        .env_remove("MASTER_ADDR")
        .env_remove("RSHMEM_MASTER_ADDR")
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("RSHMEM_MASTER_ADDR"), "{err}");

    let o = Command::new(BIN)
        .args(["selftest"])
        .env("RSHMEM_RANK", "5")
        .env("RSHMEM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("RSHMEM_RANK"), "{err}");
}

#[test]
fn mismatched_heap_sizes_fail_on_every_pe() {
    let n = 2;
    let outs = job(
        n,
        &[],
        |r, port| {
            kv(&[
                ("RSHMEM_RANK", r.to_string()),
                ("RSHMEM_WORLD_SIZE", n.to_string()),
                ("RSHMEM_MASTER_ADDR", "127.0.0.1".into()),
                ("RSHMEM_MASTER_PORT", port.to_string()),
                ("RSHMEM_TOKEN", TOKEN.into()),
                (
                    "RSHMEM_SYMMETRIC_SIZE",
                    if r == 0 { "16M".into() } else { "32M".into() },
                ),
            ])
        },
        Duration::from_secs(30),
    );
    for (r, o) in outs.iter().enumerate() {
        let (_, err) = text(o);
        assert_eq!(o.status.code(), Some(1), "PE {r}: {err}");
        assert!(
            err.contains("PE 0: 16777216 bytes; PE 1: 33554432 bytes"),
            "PE {r}: {err}"
        );
    }
}

#[test]
fn a_pe_killed_mid_job_is_reported_by_the_others() {
    let n = 3;
    let t0 = Instant::now();
    let outs = job(
        n,
        &["--crash-pe", "1", "--crash-at", "barrier"],
        |r, port| {
            kv(&[
                ("RSHMEM_RANK", r.to_string()),
                ("RSHMEM_WORLD_SIZE", n.to_string()),
                ("RSHMEM_MASTER_ADDR", "127.0.0.1".into()),
                ("RSHMEM_MASTER_PORT", port.to_string()),
                ("RSHMEM_TOKEN", TOKEN.into()),
                // Far above the bound asserted below, which also covers the start of
                // three processes on a loaded machine.
                ("RSHMEM_TIMEOUT_MS", "30000".into()),
            ])
        },
        Duration::from_secs(60),
    );
    let elapsed = t0.elapsed();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(outs[1].status.signal(), Some(9), "PE 1 killed itself");
    let mut ids = HashMap::new();
    for r in [0, 2] {
        let (out, err) = text(&outs[r]);
        assert_eq!(outs[r].status.code(), Some(1), "PE {r}:\n{out}\n{err}");
        assert!(
            err.contains("PE 1 died"),
            "PE {r} names the dead PE:\n{err}"
        );
        ids.insert(r, job_id(&out).unwrap());
    }
    // Well inside RSHMEM_TIMEOUT_MS (30 s): the death is pushed, not timed out.
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
    assert_no_segments(&ids[&0]);
}
