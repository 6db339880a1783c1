//! Jobs started by `rshmem run`: the self-test at several PE counts (more PEs than cores
//! included) and the benchmarks, as separate processes.
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

fn run(n: usize, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN)
        .args(["run", "-n", &n.to_string(), "--", BIN])
        .args(args)
        .env("RSHMEM_SYMMETRIC_SIZE", "64M")
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .output()
        .expect("rshmem run");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn selftest_under_rshmem_run() {
    let ncases = String::from_utf8_lossy(
        &Command::new(BIN)
            .args(["selftest", "--list"])
            .output()
            .unwrap()
            .stdout,
    )
    .lines()
    .count();
    for n in [1, 2, 3, 5, 8] {
        let (ok, out, err) = run(n, &["selftest"]);
        assert!(ok, "{n} PEs:\n{out}\n{err}");
        for r in 0..n {
            assert!(
                out.contains(&format!(
                    "[pe {r}] selftest: all {ncases} cases passed on PE {r}"
                )),
                "{n} PEs:\n{out}"
            );
        }
    }
}

/// A value that is not UTF-8 is an error naming its variable (it was taken as unset, and
/// the default heap, transport or timeout used without a word).
#[test]
fn a_value_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    for var in [
        "RSHMEM_SYMMETRIC_SIZE",
        "RSHMEM_TRANSPORT",
        "RSHMEM_TIMEOUT_MS",
    ] {
        let o = Command::new(BIN)
            .args(["selftest", "--case", "alloc"])
            .env(var, std::ffi::OsStr::from_bytes(b"64M\xff"))
            .output()
            .expect("rshmem selftest");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{var}: {err}");
        assert!(
            err.contains(var) && err.contains("not valid UTF-8"),
            "{var}: {err}"
        );
    }
}

/// A misspelled variable is named once, by PE 0, with the variable it most likely meant;
/// the job runs (with the default the variable was meant to change).
#[test]
fn a_misspelled_variable_is_named_once_by_pe_0() {
    let o = Command::new(BIN)
        .args(["run", "-n", "3", "--", BIN, "selftest", "--case", "alloc"])
        .env("RSHMEM_SYMMETRIC_SIZE", "64M")
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .env("RSHMEM_TIMEOUT", "5000")
        .env("RSHMEM_TRANSPORTS", "p2p")
        .env("RSHMEM_EMU_ANYTHING", "1")
        .output()
        .expect("rshmem run");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}\n{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(
        warnings,
        [
            "[pe 0] rshmem: warning: RSHMEM_TIMEOUT is set but rshmem reads no such variable \
             (did you mean RSHMEM_TIMEOUT_MS?)",
            "[pe 0] rshmem: warning: RSHMEM_TRANSPORTS is set but rshmem reads no such \
             variable (did you mean RSHMEM_TRANSPORT?)",
        ],
        "{err}"
    );
    for r in 0..3 {
        assert!(
            out.contains(&format!("[pe {r}] selftest: all 1 cases passed on PE {r}")),
            "{out}"
        );
    }
}

/// A case name that does not exist is refused before the PEs join the job: one line per
/// PE naming the cases, no "PE died" report from the bootstrap root, exit 1.
#[test]
fn selftest_refuses_an_unknown_case_before_starting() {
    let (ok, out, err) = run(2, &["selftest", "--case", "put-gte"]);
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.contains(
            "rshmem selftest: invalid argument: no self-test case \"put-gte\"; cases: alloc, \
             put-get,"
        ),
        "{err}"
    );
    assert!(!err.contains("died"), "{err}");
    assert!(!out.contains("selftest: PE"), "{out}");
}

/// Under a launcher the job's size is the PE count: a `--pes` that differs is refused on
/// every PE (it was ignored), one that repeats it is accepted. The first PE to refuse
/// ends the job, so only one PE's line is certain.
#[test]
fn bench_pes_under_a_launcher_must_be_the_job_size() {
    for (args, want) in [
        (
            &["bench", "put", "--pes", "3"][..],
            "] rshmem bench put: --pes 3: this process is a PE of a job of 2 PEs, whose \
             size is the PE count under a launcher (omit --pes, or start the job with that many)",
        ),
        (
            &["bench", "ep", "--pes", "2,4"][..],
            "] rshmem bench ep: --pes 2,4: this process is a PE of a job of 2 PEs",
        ),
    ] {
        let (ok, out, err) = run(2, args);
        assert!(!ok, "{args:?}: {out}\n{err}");
        assert!(
            out.contains(want) || err.contains(want),
            "{args:?}: {out}\n{err}"
        );
    }
    let (ok, out, err) = run(
        2,
        &[
            "bench",
            "put",
            "--pes",
            "2",
            "--iters",
            "10",
            "--warmup",
            "1",
            "--max-size",
            "16",
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("[pe 0]         16 "), "{out}");
}

#[test]
fn bench_json_under_rshmem_run() {
    for kind in ["put", "get", "p", "atomic", "signal", "barrier"] {
        let (ok, out, err) = run(
            2,
            &[
                "bench",
                kind,
                "--json",
                "--iters",
                "200",
                "--warmup",
                "20",
                "--min-size",
                "8",
                "--max-size",
                "64K",
            ],
        );
        assert!(ok, "{kind}:\n{out}\n{err}");
        // Only PE 0 reports.
        let lines: Vec<&str> = out.lines().filter(|l| l.contains("\"bench\"")).collect();
        assert_eq!(lines.len(), 1, "{out}");
        let json = lines[0].trim_start_matches("[pe 0] ");
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["bench"], kind);
        assert_eq!(v["pes"], 2);
        assert_eq!(v["device"], "cpu");
        assert_eq!(v["transport"], "p2p");
        let rows = v["rows"].as_array().unwrap();
        let want_sizes: Vec<u64> = match kind {
            "barrier" => vec![0],
            "atomic" => vec![8],
            "p" => vec![8],
            _ => (3..=16).map(|p| 1u64 << p).collect(),
        };
        let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
        assert_eq!(sizes, want_sizes, "{kind}");
        for r in rows {
            let med = r["latency_us_median"].as_f64().unwrap();
            let p99 = r["latency_us_p99"].as_f64().unwrap();
            assert!(med > 0.0 && p99 >= med, "{kind}: {r}");
            if kind != "barrier" {
                assert!(r["bandwidth_gbps"].as_f64().unwrap() > 0.0, "{kind}: {r}");
            }
        }
    }
}

/// Without --transport a bench takes RSHMEM_TRANSPORT's choice, as `bench ep` does
/// (before 2026-12-07 it measured p2p whatever RSHMEM_TRANSPORT said).
#[test]
fn bench_takes_the_transport_from_the_environment() {
    let json = |env: Option<&str>, flag: Option<&str>| {
        let mut c = Command::new(BIN);
        c.args([
            "bench",
            "put",
            "--json",
            "--iters",
            "16",
            "--warmup",
            "1",
            "--max-size",
            "8",
        ]);
        if let Some(t) = flag {
            c.args(["--transport", t]);
        }
        match env {
            Some(t) => c.env("RSHMEM_TRANSPORT", t),
            None => c.env_remove("RSHMEM_TRANSPORT"),
        };
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["transport"].as_str().unwrap().to_string()
    };
    assert_eq!(json(Some("proxy"), None), "proxy");
    assert_eq!(json(None, None), "p2p");
    assert_eq!(json(Some("auto"), None), "p2p");
    // The flag wins.
    assert_eq!(json(Some("proxy"), Some("p2p")), "p2p");
    // bench softhca uses no transport: the variable is not taken for a flag (it was
    // refused as an unused --transport, or as IBGDA needing a GPU).
    for t in ["proxy", "ibgda"] {
        let o = Command::new(BIN)
            .args(["bench", "softhca", "--max-size", "8", "--json"])
            .env("RSHMEM_TRANSPORT", t)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "RSHMEM_TRANSPORT={t}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Benches that move a word (barrier, atomic, p) size their heaps by what they move, not
/// by --max-size: before 2026-12-07 a 1T --max-size asked for a 3 TiB heap per PE and was
/// refused. p with --warmup 0 checks its stream against values of its own.
#[test]
fn word_benches_ignore_the_max_size_for_their_heaps() {
    for kind in ["barrier", "atomic", "p"] {
        let o = Command::new(BIN)
            .args(["bench", kind, "--pes", "2", "--json", "--iters", "32"])
            .args(["--warmup", "0", "--max-size", "1T"])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        // One size each (p: 8 bytes, the default --min-size being 8).
        assert_eq!(v["rows"].as_array().unwrap().len(), 1, "{kind}: {v}");
    }
}

#[test]
fn bench_starts_its_own_pes_and_rejects_bad_arguments() {
    let o = Command::new(BIN)
        .args([
            "bench",
            "put",
            "--pes",
            "3",
            "--json",
            "--iters",
            "100",
            "--warmup",
            "10",
            "--max-size",
            "1K",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pes"], 3);
    assert_eq!(v["rows"].as_array().unwrap().len(), 8); // 8 B .. 1 KiB
                                                        // `iters` is the count measured: 100 in whole batches of 16.
    assert_eq!(v["rows"][0]["iters"], 112);

    for (args, msg) in [
        (vec!["bench", "put", "--pes", "1"], "needs --pes 2"),
        (
            vec!["bench", "put", "--min-size", "1M", "--max-size", "1K"],
            "need 1 <= min <= max",
        ),
        (vec!["bench", "put", "--iters", "0"], "--iters"),
        // Sizes a kind cannot measure: refused, not replaced by ones it can.
        (
            vec!["bench", "atomic", "--min-size", "1M", "--max-size", "2M"],
            "bench atomic measures 8-byte atomics: --min-size 1048576 / --max-size 2097152 \
             must include 8",
        ),
        (
            vec!["bench", "p", "--min-size", "16", "--max-size", "64"],
            "bench p moves one 4- or 8-byte element",
        ),
        (
            vec!["bench", "get", "--min-size", "12", "--max-size", "100"],
            "--min-size 12: bench get moves whole 8-byte words",
        ),
        (
            vec!["bench", "reduce", "--min-size", "4"],
            "--min-size 4: bench reduce moves whole 8-byte words (u64 elements)",
        ),
        // The same for GPU benches (checked before any GPU is looked for).
        (
            vec![
                "bench",
                "atomic",
                "--device",
                "gpu",
                "--min-size",
                "1M",
                "--max-size",
                "2M",
            ],
            "bench atomic measures 8-byte atomics",
        ),
        // Counts no bench can run, GPU benches too (before 2026-12-07 a GPU bench with
        // --min-size 0 doubled 0 for ever, filling memory).
        (
            vec!["bench", "put", "--device", "gpu", "--min-size", "0"],
            "--min-size 0 / --max-size 33554432: need 1 <= min <= max",
        ),
        (
            vec!["bench", "put", "--iters", "2000000000"],
            "--iters 2000000000: need 1..=1000000000",
        ),
        (
            vec!["bench", "get", "--max-size", "2T"],
            "need 1 <= min <= max <= 1099511627776",
        ),
        // Heaps past the node's memory: refused, not killed by the OOM killer mid-run.
        (
            vec!["bench", "put", "--max-size", "1T"],
            "bench put: --max-size 1.0 TiB needs a 3.0 TiB heap on each of 2 PEs (6.0 TiB), \
             more than this node's memory (",
        ),
    ] {
        let o = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
    // GPU-only options on a CPU bench: a usage error (2), not silently ignored.
    for (args, msg) in [
        (
            vec!["bench", "put", "--scope", "warp"],
            "rshmem bench put: --scope only applies to GPU benches (add --device gpu)",
        ),
        (
            vec!["bench", "signal", "--reps", "3", "--manifest", "m.json"],
            "rshmem bench signal: --reps, --manifest only apply to GPU benches",
        ),
        // Options a bench would not use: refused, not ignored.
        (
            vec!["bench", "get", "--source", "private"],
            "rshmem bench get: --source: only CPU put and signal have a source buffer to place",
        ),
        (
            vec!["bench", "softhca", "--pes", "4", "--transport", "proxy"],
            "rshmem bench softhca: --pes: bench softhca measures the engine alone",
        ),
        (
            vec!["bench", "put", "--device", "gpu", "--warmup", "5"],
            "rshmem bench put: --warmup: GPU benches warm up inside each kernel launch",
        ),
        (
            vec!["bench", "p", "--device", "gpu", "--iters", "100001"],
            "--iters 100001: GPU benches time at most 100000 operations per launch",
        ),
    ] {
        let o = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn bench_collectives_as_threads_processes_and_over_the_proxy() {
    let want: Vec<u64> = (3..=16).map(|p| 1u64 << p).collect();
    let check = |kind: &str, json: &str, pes: u64, transport: &str, sizes: &[u64]| {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["bench"], kind);
        assert_eq!(v["pes"], pes);
        assert_eq!(v["transport"], transport, "{kind}");
        assert_eq!(v["latency_kind"], "collective");
        let rows = v["rows"].as_array().unwrap();
        let got: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
        assert_eq!(got, sizes, "{kind}");
        for r in rows {
            let med = r["latency_us_median"].as_f64().unwrap();
            let p99 = r["latency_us_p99"].as_f64().unwrap();
            assert!(med > 0.0 && p99 >= med, "{kind}: {r}");
            assert!(r["bandwidth_gbps"].as_f64().unwrap() > 0.0, "{kind}: {r}");
        }
    };
    // `rshmem ARGS` with its PEs as threads: must succeed; its stdout.
    let bench = |args: &str| {
        let o = Command::new(BIN)
            .args(args.split_whitespace())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // PEs as threads (3: not a power of two); every call's result is checked by every PE,
    // a mismatch fails the run.
    for kind in ["broadcast", "fcollect", "alltoall", "reduce"] {
        let out = bench(&format!(
            "bench {kind} --pes 3 --json --iters 100 --warmup 10 --max-size 64K"
        ));
        check(kind, &out, 3, "p2p", &want);
    }
    // Processes under rshmem run.
    let (ok, out, err) = run(
        2,
        &[
            "bench",
            "fcollect",
            "--json",
            "--iters",
            "100",
            "--warmup",
            "10",
            "--max-size",
            "64K",
        ],
    );
    assert!(ok, "{out}\n{err}");
    let line = out.lines().find(|l| l.contains("\"bench\"")).unwrap();
    check(
        "fcollect",
        line.trim_start_matches("[pe 0] "),
        2,
        "p2p",
        &want,
    );
    // Through the soft HCA.
    let out = bench(
        "bench alltoall --pes 3 --transport proxy --json --iters 50 --warmup 5 --max-size 4K",
    );
    check(
        "alltoall",
        &out,
        3,
        "proxy",
        &[8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
    );
    // Blocks that do not fit the collective buffer: a clear error.
    let o = Command::new(BIN)
        .args([
            "bench",
            "alltoall",
            "--pes",
            "4",
            "--min-size",
            "16M",
            "--max-size",
            "16M",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    // Refused before the PEs start: one line, no PE reported dead.
    assert_eq!(
        e,
        "rshmem bench: invalid argument: bench alltoall: --min-size 16777216 times 4 PEs \
         passes the 32 MiB collective buffer\n"
    );
    // The soft HCA bench posts one WRITE per op: messages stay below 2 GiB.
    let o = Command::new(BIN)
        .args(["bench", "softhca", "--min-size", "2G", "--max-size", "2G"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains(
            "bench softhca: --max-size 2.0 GiB: one RDMA WRITE carries less than 2 GiB (a data \
             segment's length has 31 bits)"
        ),
        "{e}"
    );
}

/// Runs `script` with sh in a private mount namespace whose /dev/shm is a 1 MiB tmpfs (a
/// container's /dev/shm is 64 MiB, too small for an EP heap); None when that cannot be
/// made here and RSHMEM_SKIP_NETNS=1 allows skipping (a loud SKIPPED line), else a failure
/// naming what is missing.
fn in_small_dev_shm(test: &str, script: &str) -> Option<std::process::Output> {
    // The marker says the namespace is ready: without it nothing of the job ran (unshare
    // or mount refused), with it every failure is the job's.
    let script = format!(
        "mount -t tmpfs -o size=1m rshmem-small-shm /dev/shm && echo RSHMEM-NS-READY && {script}"
    );
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output();
    let why = match &o {
        Err(e) => format!("`unshare` cannot be run: {e}"),
        Ok(o) if !String::from_utf8_lossy(&o.stdout).contains("RSHMEM-NS-READY") => {
            // unshare or mount refused (not root): no PE ran.
            String::from_utf8_lossy(&o.stderr).trim().to_string()
        }
        Ok(_) => return o.ok(),
    };
    if std::env::var("RSHMEM_SKIP_NETNS").as_deref() == Ok("1") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n**************** SKIPPED {test}: needs root for a mount namespace: {why} \
             (RSHMEM_SKIP_NETNS=1) ****************\n"
        );
        return None;
    }
    panic!(
        "{test} needs root (unshare --mount, mount -t tmpfs): {why}; set RSHMEM_SKIP_NETNS=1 \
         to skip it"
    );
}

/// Where /dev/shm cannot hold the heaps, each PE's heap is a memfd its node peers open
/// through /proc: the self-test under `rshmem run` (processes) and the EP bench (threads)
/// pass with 64 MiB heaps over a 1 MiB /dev/shm, and nothing is left in it.
#[test]
fn heaps_fall_back_to_memfds_when_dev_shm_is_too_small() {
    let script = format!(
        "RSHMEM_SYMMETRIC_SIZE=64M RSHMEM_TIMEOUT_MS=20000 {BIN} run -n 3 -- {BIN} selftest \
         && {BIN} bench ep --pes 2 --tokens 16 --hidden 2048 --topk 2 --experts 4 --iters 3 \
         --json && echo \"left in /dev/shm: [$(ls -A /dev/shm)]\""
    );
    let Some(o) = in_small_dev_shm(
        "heaps_fall_back_to_memfds_when_dev_shm_is_too_small",
        &script,
    ) else {
        return;
    };
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}\n{err}");
    for r in 0..3 {
        assert!(
            out.contains(&format!("[pe {r}] selftest: all "))
                && out.contains(&format!("cases passed on PE {r}")),
            "PE {r}:\n{out}\n{err}"
        );
    }
    let json = out
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("the EP bench's JSON");
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["validated"], true, "{json}");
    assert_eq!(v["pes"], 2, "{json}");
    assert!(out.contains("left in /dev/shm: []"), "{out}");
}

/// The CPUs this test's thread may use (what `rshmem` started from here inherits).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a cpu_set_t is plain data; all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(
        r,
        0,
        "sched_getaffinity: {}",
        std::io::Error::last_os_error()
    );
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i is below CPU_SETSIZE.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// `bound_cpus` of a barrier bench's JSON started as `cmd` (its last JSON line), after
/// checking its `bind`.
fn bound_cpus(cmd: &mut Command, bind: &str) -> Vec<Option<u64>> {
    let o = cmd.output().expect("start rshmem");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = out
        .lines()
        .rfind(|l| l.contains("\"bench\""))
        .expect("a JSON report");
    let v: serde_json::Value = serde_json::from_str(line.trim_start_matches("[pe 0] ")).unwrap();
    assert_eq!(v["bind"], bind);
    v["bound_cpus"]
        .as_array()
        .expect("bound_cpus")
        .iter()
        .map(|c| c.as_u64())
        .collect()
}

/// RSHMEM_BIND: by default each of a node's PEs is bound to its own CPU of the mask when
/// they fit and reach each other by load/store (PEs as threads and as processes alike),
/// none when they do not, over the proxy, or when a PE is alone; `core` shares CPUs
/// round-robin; `none` binds nothing; anything else is refused. The children run under
/// the first two CPUs of this test's mask (one where it has one), so the expected values
/// and the cost are the same on every host.
#[test]
fn pes_are_bound_to_cpus_as_rshmem_bind_says() {
    use std::os::unix::process::CommandExt;
    let all = allowed_cpus();
    assert!(!all.is_empty());
    let cpus: Vec<usize> = all.iter().copied().take(2).collect();
    // SAFETY: a cpu_set_t is plain data; all zeros is the empty set.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in &cpus {
        // SAFETY: c is a CPU of this thread's mask, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut mask) };
    }
    let each = |n: usize| -> Vec<Option<u64>> {
        (0..n).map(|i| Some(cpus[i % cpus.len()] as u64)).collect()
    };
    // The default (auto) for 2 PEs: their own CPUs where the mask has two, else none.
    let auto2 = if cpus.len() >= 2 {
        each(2)
    } else {
        vec![None, None]
    };
    let barrier = [
        "bench", "barrier", "--iters", "16", "--warmup", "0", "--json",
    ];
    let cmd = |bind: Option<&str>| {
        let mut c = Command::new(BIN);
        c.env_remove("RSHMEM_BIND");
        if let Some(b) = bind {
            c.env("RSHMEM_BIND", b);
        }
        // SAFETY: sched_setaffinity is a single system call (async-signal-safe) on a mask
        // copied into the closure.
        unsafe {
            c.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mask) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    };
    let threads = |n: &str, bind: Option<&str>| {
        let mut c = cmd(bind);
        c.args(barrier).args(["--pes", n]);
        c
    };
    let procs = |n: &str, bind: Option<&str>| {
        let mut c = cmd(bind);
        c.args(["run", "-n", n, "--", BIN]).args(barrier);
        c
    };
    assert_eq!(bound_cpus(&mut threads("2", None), "auto"), auto2);
    assert_eq!(bound_cpus(&mut procs("2", None), "auto"), auto2);
    // Through the soft HCA (its engine thread would inherit a bound PE's CPU): not bound.
    assert_eq!(
        bound_cpus(threads("2", None).args(["--transport", "proxy"]), "auto"),
        vec![None, None]
    );
    // A PE alone on its node is not bound.
    assert_eq!(bound_cpus(&mut threads("1", None), "auto"), vec![None]);
    // More PEs than CPUs: not bound under auto, round-robin under core.
    let n = cpus.len() + 1;
    assert_eq!(
        bound_cpus(&mut threads(&n.to_string(), None), "auto"),
        vec![None; n]
    );
    assert_eq!(
        bound_cpus(&mut procs(&n.to_string(), Some("core")), "core"),
        each(n)
    );
    assert_eq!(
        bound_cpus(&mut threads("2", Some("none")), "none"),
        vec![None, None]
    );
    let o = threads("2", Some("cores")).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "rshmem bench: environment variable RSHMEM_BIND=\"cores\": expected one of: auto, \
         core, none\n"
    );
}

/// `--timing slowest` (a barrier before every call, the slowest PE's time) measures and
/// validates every collective, as threads and as processes; other benches refuse it.
#[test]
fn collectives_time_the_slowest_pe_on_request() {
    for kind in ["broadcast", "fcollect", "alltoall", "reduce"] {
        let o = Command::new(BIN)
            .args([
                "bench", kind, "--pes", "3", "--json", "--iters", "40", "--warmup", "4",
            ])
            .args(["--max-size", "256K", "--timing", "slowest"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["timing"], "slowest", "{kind}");
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 16, "{kind}: 8 B .. 256 KiB");
        for r in rows {
            // One call per sample: exactly the calls asked for.
            assert_eq!(r["iters"], 40, "{kind}: {r}");
            let (med, p99) = (
                r["latency_us_median"].as_f64().unwrap(),
                r["latency_us_p99"].as_f64().unwrap(),
            );
            assert!(med > 0.0 && p99 >= med, "{kind}: {r}");
        }
    }
    let (ok, out, err) = run(
        2,
        &[
            "bench",
            "reduce",
            "--json",
            "--iters",
            "20",
            "--max-size",
            "1K",
            "--timing",
            "slowest",
        ],
    );
    assert!(ok, "{out}\n{err}");
    let line = out.lines().find(|l| l.contains("\"bench\"")).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim_start_matches("[pe 0] ")).unwrap();
    assert_eq!(v["timing"], "slowest");
    // The default, named in the report.
    let o = Command::new(BIN)
        .args([
            "bench",
            "fcollect",
            "--pes",
            "2",
            "--json",
            "--iters",
            "16",
            "--max-size",
            "8",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["timing"], "back-to-back");
    let o = Command::new(BIN)
        .args(["bench", "put", "--timing", "slowest"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "rshmem bench put: --timing: only the CPU collectives (broadcast, fcollect, alltoall, \
         reduce) choose how a call is timed\n"
    );
}

/// Output into a reader that is gone (`rshmem selftest --list | head -0`): the process ends
/// by SIGPIPE, as Unix tools do, instead of panicking in println! on EPIPE. The stdout
/// given is a pipe whose read end is closed before the child starts, so the first write
/// fails whatever the timing.
#[test]
fn a_reader_that_is_gone_ends_the_command_quietly() {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::ExitStatusExt;
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills two descriptors into a valid array of two.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is the read end pipe(2) just opened; closing it leaves the write end
    // with no reader.
    unsafe { libc::close(fds[0]) };
    // SAFETY: fds[1] is an open descriptor owned by nothing else; OwnedFd takes it.
    let write_end = unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[1]) };
    let o = Command::new(BIN)
        .args(["selftest", "--list"])
        .stdout(std::process::Stdio::from(write_end))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{err}");
}
