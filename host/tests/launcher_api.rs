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

/// Runs `rshmem run -n N -- THIS_TEST_BINARY --exact TEST` with `PE_MODE=mode` (the PEs
/// run `test` in that mode), through `sh -c 'SHELL_PREFIX; exec rshmem ...'`, bounded by
/// `limit`. Returns the launcher's exit code, stdout and stderr.
fn run_pes(
    n: usize,
    test: &str,
    mode: &str,
    shell_prefix: &str,
    limit: Duration,
) -> (Option<i32>, String, String) {
    let exe = std::env::current_exe().expect("test binary path");
    let started = Instant::now();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("{shell_prefix}\nexec \"$@\""))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_rshmem"))
        .args(["run", "-n", &n.to_string(), "--"])
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(PE_MODE, mode)
        .env_remove("RSHMEM_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rshmem");
    // Pipes are read on threads so that a chatty job never blocks on them.
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if started.elapsed() > limit {
            // SIGTERM first: the launcher then stops its PEs.
            // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!("job did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out.join().expect("stdout reader");
    let stderr = err.join().expect("stderr reader");
    (status.code(), stdout, stderr)
}

/// Joins the launcher's root as the PE it was started as (join timeout `timeout`).
fn join_from_env(timeout: Duration) -> Bootstrap {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    Bootstrap::join(&JoinParams {
        rank: var("RSHMEM_RANK").parse().expect("RSHMEM_RANK"),
        world_size: var("RSHMEM_WORLD_SIZE").parse().expect("RSHMEM_WORLD_SIZE"),
        root_addr: format!(
            "{}:{}",
            var("RSHMEM_MASTER_ADDR"),
            var("RSHMEM_MASTER_PORT")
        ),
        token: var("RSHMEM_TOKEN"),
        node_id: "local".to_string(),
        timeout,
    })
    .expect("join the launcher's root")
}

/// PE side of `the_pe_that_died_is_named_not_the_pes_told_of_it`: PE 2 leaves after a
/// world barrier without finalize, exiting 0 (`exit0`) or killed by SIGKILL (`kill`);
/// the others wait in a second barrier, fail with PeerDied and exit 1.
fn dying_pe_main(mode: &str) {
    let boot = join_from_env(Duration::from_secs(10));
    let world = Group::world(boot.world_size());
    boot.barrier(&world).expect("first barrier");
    if boot.rank() == 2 {
        if mode == "kill" {
            // SAFETY: raise has no memory-safety preconditions; SIGKILL ends this process.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        std::process::exit(0); // without finalize: the root reports PE 2 dead
    }
    match boot.barrier(&world) {
        Err(rshmem::Error::PeerDied { pe: 2, .. }) => std::process::exit(1),
        other => {
            eprintln!("PE {}: expected PE 2's death, got {other:?}", boot.rank());
            std::process::exit(3);
        }
    }
}

#[test]
fn the_pe_that_died_is_named_not_the_pes_told_of_it() {
    const TEST: &str = "the_pe_that_died_is_named_not_the_pes_told_of_it";
    if let Ok(mode) = std::env::var(PE_MODE) {
        dying_pe_main(&mode);
        return;
    }
    // PE 2 exits 0 without finalize; the others exit 1 on learning it. The launcher names
    // the first of those failures (its code is the job's) and then PE 2, which left first.
    let (code, _, stderr) = run_pes(4, TEST, "exit0", "", Duration::from_secs(20));
    assert_eq!(code, Some(1), "stderr: {stderr}");
    let named: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rshmem run: PE "))
        .collect();
    assert_eq!(named.len(), 2, "stderr: {stderr}");
    assert!(
        [
            "rshmem run: PE 0 exited with code 1",
            "rshmem run: PE 1 exited with code 1",
            "rshmem run: PE 3 exited with code 1"
        ]
        .contains(&named[0]),
        "stderr: {stderr}"
    );
    assert_eq!(
        named[1],
        "rshmem run: PE 2 had left the job first, exiting 0 without finalize: the other \
         PEs' failures may follow from it",
        "stderr: {stderr}"
    );
    // Killed: named with its signal, and the exit code is 128 + 9.
    let (code, _, stderr) = run_pes(4, TEST, "kill", "", Duration::from_secs(20));
    assert_eq!(code, Some(137), "stderr: {stderr}");
    let named: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rshmem run: PE "))
        .collect();
    assert_eq!(
        named,
        ["rshmem run: PE 2 was killed by signal 9 (SIGKILL)"],
        "stderr: {stderr}"
    );
}

/// The soft and hard open-file limits of this process.
fn nofile_limits() -> (u64, u64) {
    // SAFETY: rlimit is plain old data; getrlimit fills it in.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is valid writable storage for the call.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    (lim.rlim_cur as u64, lim.rlim_max as u64)
}

#[test]
fn three_hundred_pes_join_under_a_soft_limit_of_1024_open_files() {
    const TEST: &str = "three_hundred_pes_join_under_a_soft_limit_of_1024_open_files";
    if let Ok(mode) = std::env::var(PE_MODE) {
        if mode == "join" {
            let boot = join_from_env(Duration::from_secs(60));
            boot.barrier(&Group::world(boot.world_size()))
                .expect("barrier");
            boot.finalize().expect("finalize");
        }
        return; // "alone": a program that never joins the bootstrap root
    }
    let needs = |n: usize| {
        let all = rshmem::launcher::open_files_needed(n, true);
        (all - 2 * n as u64, all)
    };
    // Soft and hard limits of 1024, 500 PEs: their output pipes alone (1064 files) do not
    // fit, so the job is refused before any PE starts.
    let (pipes, all) = needs(500);
    let (code, _, stderr) = run_pes(
        500,
        TEST,
        "join",
        "ulimit -n 1024 || exit 99",
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains(&format!(
            "the job needs {pipes} open files in the launcher for itself and its PEs' output pipes \
             ({all} with their connections to the bootstrap root), but the hard limit \
             (ulimit -Hn) is 1024"
        )),
        "stderr: {stderr}"
    );
    // Limits of 1024, 300 PEs that never join: the pipes fit (664), the roots' sockets
    // would not all (1264): the job runs, with a warning naming the room, (1024-664)/2.
    let (_, all) = needs(300);
    let warning = format!(
        "rshmem run: the hard open-file limit (ulimit -Hn) is 1024: room for 180 of the 300 \
         PEs to join the bootstrap root (2 open files each in the launcher); programs that \
         use rshmem need {all}"
    );
    let (code, _, stderr) = run_pes(
        300,
        TEST,
        "alone",
        "ulimit -n 1024 || exit 99",
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stderr.contains(&warning), "stderr: {stderr}");
    // A soft limit of 1024 under this machine's hard limit: 300 joining PEs hold 600 root
    // sockets and 600 pipe ends in the launcher, more than 1024, so the launcher raises
    // the soft limit (the old launcher ran out of files).
    let (_, hard) = nofile_limits();
    let mode = if hard >= all { "join" } else { "alone" };
    let (code, _, stderr) = run_pes(
        300,
        TEST,
        mode,
        "ulimit -Sn 1024 || exit 99",
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(0), "stderr: {stderr}");
    // No warning when the hard limit has room for every PE.
    assert_eq!(
        stderr.contains("room for"),
        hard < all,
        "hard limit {hard}, stderr: {stderr}"
    );
}

#[test]
fn launch_reports_each_pe_and_the_first_failure() {
    // PE 1 fails once PE 0 has ended (exited and been reaped by the launcher: `kill -0`
    // fails), so PE 0 is not stopped by PE 1's failure whatever the machine's load.
    let dir = std::env::temp_dir().join(format!("rshmem-first-failure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("marker directory");
    let script = format!(
        "[ \"$EXTRA\" = yes ] || exit 9; f={}/pe0; \
         if [ $RSHMEM_RANK = 0 ]; then echo $$ > $f.tmp && mv $f.tmp $f; exit 0; fi; \
         i=0; until [ -e $f ]; do sleep 0.02; i=$((i+1)); [ $i -gt 1500 ] && exit 8; done; \
         while kill -0 $(cat $f) 2>/dev/null; do \
           sleep 0.02; i=$((i+1)); [ $i -gt 3000 ] && exit 8; \
         done; exit 5",
        dir.display()
    );
    let mut opts = LaunchOptions::new("sh", ["-c", script.as_str()], 2);
    opts.env.push(("EXTRA".into(), "yes".into()));
    let outcome = launch(&opts).expect("job starts");
    let _ = std::fs::remove_dir_all(&dir);
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
