//! The launcher as a library (`launch`) and as the host of the bootstrap root that real
//! PEs join. The PE program of the join test is this test binary itself, re-run with
//! `RSHMEM_LAUNCHER_TEST_PE=1`.

use rshmem::bootstrap::{Bootstrap, Group, JoinParams};
use rshmem::launcher::{launch, LaunchOptions, PeExit};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PE_MODE: &str = "RSHMEM_LAUNCHER_TEST_PE";

/// What a PE of the join test does: join the root from the launcher's variables,
/// allgather its rank, print what it saw.
fn pe_main() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let rank: usize = var("RSHMEM_RANK").parse().expect("RSHMEM_RANK");
    let world_size: usize = var("RSHMEM_WORLD_SIZE").parse().expect("RSHMEM_WORLD_SIZE");
    let params = JoinParams {
        rank,
        world_size,
        root_addr: format!(
            "{}:{}",
            var("RSHMEM_MASTER_ADDR"),
            var("RSHMEM_MASTER_PORT")
        ),
        token: var("RSHMEM_TOKEN"),
        node_id: "local".to_string(),
        timeout: Duration::from_secs(5),
    };
    let boot = Bootstrap::join(&params).expect("join the launcher's root");
    let world = Group {
        uid: 0,
        members: (0..world_size as u32).collect(),
    };
    let all = boot
        .allgather(&world, &(rank as u32).to_le_bytes())
        .expect("allgather");
    let ranks: Vec<String> = all
        .iter()
        .map(|b| u32::from_le_bytes(b[..4].try_into().expect("4 bytes")).to_string())
        .collect();
    // stderr: the test harness writes its own progress to stdout.
    eprintln!(
        "joined rank={} size={} gathered={} same_job={}",
        boot.rank(),
        boot.world_size(),
        ranks.join(","),
        boot.job_id() == var("RSHMEM_JOB_ID")
    );
    boot.finalize().expect("finalize");
}

#[test]
fn pes_join_the_root_hosted_by_the_launcher() {
    if std::env::var_os(PE_MODE).is_some() {
        pe_main();
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rshmem"))
        .args(["run", "-n", "3", "--"])
        .arg(exe)
        .args([
            "--exact",
            "pes_join_the_root_hosted_by_the_launcher",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PE_MODE, "1")
        .env_remove("RSHMEM_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rshmem");
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("job did not finish in 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    let mut joined: Vec<&str> = stderr.lines().filter(|l| l.contains("joined")).collect();
    joined.sort();
    assert_eq!(
        joined,
        [
            "[pe 0] joined rank=0 size=3 gathered=0,1,2 same_job=true",
            "[pe 1] joined rank=1 size=3 gathered=0,1,2 same_job=true",
            "[pe 2] joined rank=2 size=3 gathered=0,1,2 same_job=true",
        ]
    );
}

#[test]
fn launch_reports_each_pe_and_the_first_failure() {
    let mut opts = LaunchOptions::new(
        "sh",
        [
            "-c",
            "[ \"$EXTRA\" = yes ] || exit 9; [ $RSHMEM_RANK = 1 ] && { sleep 0.3; exit 5; }; exit 0",
        ],
        2,
    );
    opts.env.push(("EXTRA".into(), "yes".into()));
    let outcome = launch(&opts).expect("job starts");
    assert_eq!(outcome.exit_code, 5);
    assert_eq!(outcome.pe_exits, [PeExit::Code(0), PeExit::Code(5)]);
    assert_eq!(outcome.first_failure, Some((1, PeExit::Code(5))));
    assert_eq!(outcome.interrupted_by, None);
    assert_eq!(outcome.removed_segments, 0);
    // The root's job id: 16 hex characters.
    assert_eq!(outcome.job_id.len(), 16);
    assert!(outcome.job_id.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn launch_refuses_bad_requests_before_starting() {
    let err = launch(&LaunchOptions::new("sh", ["-c", "true"], 0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "launcher: -n must be at least 1 (got 0 PEs)"
    );
    let mut opts = LaunchOptions::new("sh", ["-c", "true"], 1);
    opts.env.push(("RSHMEM_RANK".into(), "7".into()));
    assert_eq!(
        launch(&opts).unwrap_err().to_string(),
        "launcher: RSHMEM_RANK is set by the launcher for each PE and cannot be overridden"
    );
}
