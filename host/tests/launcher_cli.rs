//! `rshmem run` end to end: the real binary, real PE processes (`sh`), exact outputs.
//!
//! Every test is bounded (a hung launcher is killed and the test fails) and none needs
//! more than a few seconds.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(10);

struct Finished {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
    elapsed: Duration,
}

impl Finished {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn stdout_lines(&self) -> Vec<String> {
        self.stdout_text().lines().map(str::to_string).collect()
    }
}

fn rshmem(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rshmem"));
    cmd.args(args)
        .env_remove("RSHMEM_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Sets the launcher's dispositions of the signals it handles: `ignored` ignored, the
/// others default (so the tests do not depend on what the test runner was started with:
/// a background job of a script has SIGINT and SIGQUIT ignored).
fn with_signals(cmd: &mut Command, ignored: &'static [i32]) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure calls only signal(2), which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                let how = if ignored.contains(&sig) {
                    libc::SIG_IGN
                } else {
                    libc::SIG_DFL
                };
                libc::signal(sig, how);
            }
            Ok(())
        });
    }
}

/// Reads a pipe to its end on a thread; the bytes arrive on the returned channel.
fn collect(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// Waits (bounded) for `child` and everything it wrote.
fn finish(mut child: Child, started: Instant, stdout: mpsc::Receiver<Vec<u8>>) -> Finished {
    let stderr = collect(child.stderr.take().expect("stderr piped"));
    let status = wait_bounded(&mut child, started, BOUND);
    let elapsed = started.elapsed();
    let stdout = stdout
        .recv_timeout(Duration::from_secs(3))
        .expect("launcher stdout closed");
    let stderr = stderr
        .recv_timeout(Duration::from_secs(3))
        .expect("launcher stderr closed");
    Finished {
        code: status.code(),
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        elapsed,
    }
}

fn run(args: &[&str]) -> Finished {
    run_cmd(rshmem(args))
}

fn run_cmd(mut cmd: Command) -> Finished {
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn rshmem");
    let stdout = collect(child.stdout.take().expect("stdout piped"));
    finish(child, started, stdout)
}

/// Whether `pid` is a live process (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let after = &stat[stat.rfind(')').expect("stat format") + 1..];
            !matches!(after.split_whitespace().next(), Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// A fresh directory for a job's marker files (`name` tells the tests apart).
fn marker_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rshmem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("marker directory");
    d
}

/// Shell that waits (at most 30 s, then exits 8) until every file in `files` exists:
/// orders a PE after the others' setup without guessing how long it takes.
fn await_files(dir: &std::path::Path, files: &[&str]) -> String {
    let tests: Vec<String> = files
        .iter()
        .map(|f| format!("[ -e {}/{f} ]", dir.display()))
        .collect();
    format!(
        "i=0; until {}; do sleep 0.02; i=$((i+1)); [ $i -gt 1500 ] && exit 8; done",
        tests.join(" && ")
    )
}

/// Values of `key=` found in `text` (one per line that has it), as pids.
fn pids(text: &str, key: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix(key)))
        .map(|p| p.parse().expect("pid"))
        .collect()
}

#[test]
fn sets_pe_environment_and_prefixes_lines() {
    let out = run(&[
        "run",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo rank=$RSHMEM_RANK size=$RSHMEM_WORLD_SIZE local=$RSHMEM_LOCAL_RANK/$RSHMEM_LOCAL_SIZE root=$RSHMEM_ROOT; echo err >&2",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let mut lines = out.stdout_lines();
    lines.sort();
    assert_eq!(
        lines,
        [
            "[pe 0] rank=0 size=3 local=0/3 root=external",
            "[pe 1] rank=1 size=3 local=1/3 root=external",
            "[pe 2] rank=2 size=3 local=2/3 root=external",
        ]
    );
    let mut err: Vec<&str> = out.stderr.lines().collect();
    err.sort();
    assert_eq!(err, ["[pe 0] err", "[pe 1] err", "[pe 2] err"]);
}

/// `rshmem run` passes the user's environment through: the CUDA queue count the rshmem
/// command sets for its own GPU PEs (CUDA_DEVICE_MAX_CONNECTIONS) is not forced on the
/// programs it starts.
#[test]
fn run_leaves_cuda_device_max_connections_alone() {
    for (set, want) in [(None, "unset"), (Some("4"), "4")] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rshmem"));
        c.args([
            "run",
            "-n",
            "1",
            "--",
            "sh",
            "-c",
            "echo conns=${CUDA_DEVICE_MAX_CONNECTIONS:-unset}",
        ])
        .env_remove("CUDA_DEVICE_MAX_CONNECTIONS");
        if let Some(v) = set {
            c.env("CUDA_DEVICE_MAX_CONNECTIONS", v);
        }
        let o = c.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            out.trim(),
            format!("[pe 0] conns={want}"),
            "exported: {set:?}"
        );
    }
}

#[test]
fn token_port_addr_and_job_id_are_shared() {
    let out = run(&[
        "run",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo $RSHMEM_TOKEN $RSHMEM_MASTER_ADDR $RSHMEM_MASTER_PORT $RSHMEM_JOB_ID",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let lines = out.stdout_lines();
    assert_eq!(lines.len(), 3);
    let values: Vec<Vec<&str>> = lines
        .iter()
        .map(|l| l.split_whitespace().skip(2).collect())
        .collect();
    let first = &values[0];
    assert_eq!(first.len(), 4, "line: {}", lines[0]);
    assert_eq!(first[0].len(), 32);
    assert!(first[0].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(first[1], "127.0.0.1");
    let port: u16 = first[2].parse().expect("MASTER_PORT is a number");
    assert_ne!(port, 0);
    assert!(!first[3].is_empty());
    for v in &values {
        assert_eq!(v, first);
    }
}

#[test]
fn launcher_token_passes_through() {
    let mut cmd = rshmem(&["run", "-n", "2", "--", "sh", "-c", "echo $RSHMEM_TOKEN"]);
    cmd.env("RSHMEM_TOKEN", "my-own-token");
    let out = run_cmd(cmd);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let mut lines = out.stdout_lines();
    lines.sort();
    assert_eq!(lines, ["[pe 0] my-own-token", "[pe 1] my-own-token"]);
}

#[test]
fn partial_last_line_is_flushed_with_newline() {
    let out = run(&[
        "run",
        "-n",
        "1",
        "--",
        "sh",
        "-c",
        "printf 'one\\ntwo'; printf 'x' >&2",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert_eq!(out.stdout, b"[pe 0] one\n[pe 0] two\n");
    assert_eq!(out.stderr, "[pe 0] x\n");
}

#[test]
fn invalid_utf8_passes_through_as_bytes() {
    let out = run(&[
        "run",
        "-n",
        "1",
        "--",
        "sh",
        "-c",
        "printf 'a\\377\\376b\\n'",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert_eq!(out.stdout, b"[pe 0] a\xff\xfeb\n");
}

#[test]
fn lines_of_different_pes_never_mix() {
    // 4 PEs each write 2000 lines of ~300 bytes as fast as they can.
    let script =
        "awk -v r=$RSHMEM_RANK 'BEGIN { pad = sprintf(\"%300s\", \"\"); gsub(/ /, \"x\", pad); \
                  for (i = 0; i < 2000; i++) print \"r\" r \"-\" i \"-\" pad }'";
    let out = run(&["run", "-n", "4", "--", "sh", "-c", script]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let pad = "x".repeat(300);
    let mut next = [0usize; 4];
    for line in out.stdout_lines() {
        let rank: usize = line[4..5].parse().expect("rank digit");
        let expected = format!("[pe {rank}] r{rank}-{}-{pad}", next[rank]);
        assert_eq!(line, expected);
        next[rank] += 1;
    }
    assert_eq!(next, [2000; 4]);
}

#[test]
fn failing_pe_stops_the_others_and_sets_exit_code() {
    // PE 1 fails once the others have reported their pids; PE 0 and 2 would run 30 s,
    // PE 0 as a shell with a background child, PE 2 as sleep itself.
    let d = marker_dir("failing-pe");
    let script = format!(
        "case $RSHMEM_RANK in \
           0) sleep 30 & echo pid=$$ bg=$!; touch {d}/0; wait ;; \
           1) {wait}; exit 7 ;; \
           *) echo pid=$$; touch {d}/2; exec sleep 30 ;; \
         esac",
        d = d.display(),
        wait = await_files(&d, &["0", "2"]),
    );
    let out = run(&["run", "-n", "3", "--", "sh", "-c", &script]);
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(out.code, Some(7), "stderr: {}", out.stderr);
    // Far below the others' 30 s: they were stopped.
    assert!(
        out.elapsed < Duration::from_secs(20),
        "took {:?}",
        out.elapsed
    );
    assert!(
        out.stderr.contains("rshmem run: PE 1 exited with code 7\n"),
        "stderr: {}",
        out.stderr
    );
    let stdout = out.stdout_text();
    let mut all = pids(&stdout, "pid=");
    all.extend(pids(&stdout, "bg="));
    assert_eq!(all.len(), 3, "stdout: {stdout}");
    for pid in all {
        assert!(!alive(pid), "process {pid} of the job survived");
    }
}

#[test]
fn pe_killed_by_signal_gives_128_plus_signal() {
    let script = "if [ $RSHMEM_RANK = 0 ]; then sleep 0.2; kill -9 $$; fi; exec sleep 30";
    let out = run(&["run", "-n", "2", "--", "sh", "-c", script]);
    assert_eq!(out.code, Some(137), "stderr: {}", out.stderr);
    assert!(
        out.stderr
            .contains("rshmem run: PE 0 was killed by signal 9 (SIGKILL)\n"),
        "stderr: {}",
        out.stderr
    );
    // Far below PE 1's 30 s: it was stopped.
    assert!(
        out.elapsed < Duration::from_secs(20),
        "took {:?}",
        out.elapsed
    );
}

#[test]
fn all_pes_succeed_gives_zero_even_when_they_end_at_different_times() {
    let out = run(&[
        "run",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "sleep 0.$RSHMEM_RANK; exit 0",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert_eq!(out.stderr, "");
    assert_eq!(out.stdout, b"");
}

#[test]
fn processes_left_behind_by_successful_pes_are_stopped() {
    // Both PEs exit 0 at once, each leaving a background sleeper in its process group.
    let out = run(&[
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "sleep 30 & echo bg=$!; exit 0",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert_eq!(
        out.stderr,
        "rshmem run: every PE ended; stopping the processes they left behind in their \
         process groups\n"
    );
    let bg = pids(&out.stdout_text(), "bg=");
    assert_eq!(bg.len(), 2, "stdout: {}", out.stdout_text());
    for pid in bg {
        assert!(
            !alive(pid),
            "process {pid} left behind by a PE survived the job"
        );
    }
}

/// Spawns `cmd` (with the usual signal dispositions) and reads its stdout until `count`
/// pids tagged `tag` have been printed; the receiver then yields the whole stdout once it
/// ends. Panics (killing the launcher) if they do not come within 5 s.
fn start_until(
    mut cmd: Command,
    tag: &'static str,
    count: usize,
) -> (std::process::Child, mpsc::Receiver<Option<Vec<u8>>>) {
    with_signals(&mut cmd, &[]);
    let mut child = cmd.spawn().expect("spawn rshmem");
    let mut stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        let mut reported = false;
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if !reported && pids(&String::from_utf8_lossy(&seen), tag).len() == count {
                let _ = tx.send(None);
                reported = true;
            }
        }
        let _ = tx.send(Some(seen));
    });
    let first = rx.recv_timeout(Duration::from_secs(5));
    if !matches!(first, Ok(None)) {
        let _ = child.kill();
        panic!("PEs did not start: {first:?}");
    }
    (child, rx)
}

/// Starts a 2-PE job of shells that each wait for a background sleeper, waits until both
/// report their pids, sends `sig` to the launcher, and checks the exit code and that the
/// PEs and their children are gone.
fn interrupt_with(sig: i32, expected_code: i32) {
    let started = Instant::now();
    let cmd = rshmem(&[
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "sleep 30 & echo pid=$$ bg=$!; wait",
    ]);
    let (child, rx) = start_until(cmd, "pid=", 2);
    // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    let (tx2, rx2) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok(Some(bytes)) = rx.recv() {
            let _ = tx2.send(bytes);
        }
    });
    let out = finish(child, started, rx2);
    assert_eq!(out.code, Some(expected_code), "stderr: {}", out.stderr);
    assert!(
        out.stderr
            .contains("rshmem run: interrupted, stopping 2 PEs\n"),
        "stderr: {}",
        out.stderr
    );
    let pes = pids(&out.stdout_text(), "pid=");
    assert_eq!(pes.len(), 2);
    for pid in pes {
        assert!(!alive(pid), "PE process {pid} survived");
    }
    let children = pids(&out.stdout_text(), "bg=");
    assert_eq!(children.len(), 2);
    for pid in children {
        assert!(!alive(pid), "a PE's child {pid} survived");
    }
    assert!(
        out.elapsed < Duration::from_secs(8),
        "took {:?}",
        out.elapsed
    );
}

/// A signal that comes while only what a successful job left behind is being stopped
/// still counts: exit 128 + signal (before 2026-12-07 the job exited 0).
#[test]
fn a_signal_while_stopping_leftovers_exits_128_plus_signal() {
    let started = Instant::now();
    // Each PE leaves a loop that survives SIGTERM and says when it got it, so stopping it
    // waits for SIGKILL, and the test knows the launcher is stopping the leftovers.
    let cmd = rshmem(&[
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "(trap 'echo term=$((RSHMEM_RANK + 100))' TERM; while :; do sleep 0.05; done) & echo bg=$!; exit 0",
    ]);
    // Both leftovers got the launcher's SIGTERM; it sends SIGKILL STOP_GRACE (2 s) later.
    let (child, rx) = start_until(cmd, "term=", 2);
    // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let (tx2, rx2) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok(Some(bytes)) = rx.recv() {
            let _ = tx2.send(bytes);
        }
    });
    let out = finish(child, started, rx2);
    assert_eq!(out.code, Some(130), "stderr: {}", out.stderr);
    // (The shells may also report their killed sleeps on stderr, between these.)
    let stopping = out
        .stderr
        .find("rshmem run: every PE ended; stopping the processes they left behind")
        .unwrap_or_else(|| panic!("stderr: {}", out.stderr));
    let killed = out
        .stderr
        .find("rshmem run: interrupted while stopping what the PEs left behind, sending SIGKILL\n")
        .unwrap_or_else(|| panic!("stderr: {}", out.stderr));
    assert!(stopping < killed, "stderr: {}", out.stderr);
    let bg = pids(&out.stdout_text(), "bg=");
    assert_eq!(bg.len(), 2, "stdout: {}", out.stdout_text());
    for pid in bg {
        assert!(!alive(pid), "process {pid} left behind by a PE survived");
    }
}

#[test]
fn sigint_stops_pes_and_exits_130() {
    interrupt_with(libc::SIGINT, 130);
}

#[test]
fn sigterm_stops_pes_and_exits_143() {
    interrupt_with(libc::SIGTERM, 143);
}

/// `nohup rshmem run ...`: started with SIGHUP ignored, the launcher leaves it ignored
/// (for its PEs too) and the job runs to its end.
#[test]
fn an_ignored_sighup_stays_ignored() {
    let started = Instant::now();
    let mut cmd = rshmem(&[
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo up; sleep 1; kill -HUP $$; echo done",
    ]);
    with_signals(&mut cmd, &[libc::SIGHUP]);
    let mut child = cmd.spawn().expect("spawn rshmem");
    let stdout = collect(child.stdout.take().expect("stdout piped"));
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let f = finish(child, started, stdout);
    assert_eq!(f.code, Some(0), "stderr: {}", f.stderr);
    let out = f.stdout_text();
    assert_eq!(out.matches("done").count(), 2, "stdout: {out}");
}

#[test]
fn sighup_stops_pes_and_exits_129() {
    // A dropped ssh session or closed terminal.
    interrupt_with(libc::SIGHUP, 129);
}

#[test]
fn sigquit_stops_pes_and_exits_131() {
    interrupt_with(libc::SIGQUIT, 131);
}

#[test]
fn leftover_shm_segments_of_the_job_are_removed() {
    let script = "echo job=$RSHMEM_JOB_ID; : > /dev/shm/rshmem-$RSHMEM_JOB_ID-pe$RSHMEM_RANK";
    let out = run(&["run", "-n", "2", "--", "sh", "-c", script]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let lines = out.stdout_lines();
    let job = lines[0].strip_prefix("[pe ").expect("prefixed")[3..]
        .strip_prefix("job=")
        .expect("job id line")
        .to_string();
    assert!(!job.is_empty());
    assert_eq!(
        out.stderr,
        format!("rshmem run: removed 2 leftover shared-memory segments of job {job}\n")
    );
    for rank in 0..2 {
        let path = format!("/dev/shm/rshmem-{job}-pe{rank}");
        assert!(!std::path::Path::new(&path).exists(), "{path} left behind");
    }
}

/// Runs `rshmem run` with `args`, whose program would create a marker file if it ran,
/// and checks: exit 2, `message` on stderr, no output, and no marker.
fn refused(args: &[&str], message: &str) {
    let marker = std::env::temp_dir().join(format!(
        "rshmem-launcher-refused-{}-{}",
        std::process::id(),
        message.len()
    ));
    let _ = std::fs::remove_file(&marker);
    let touch = format!("touch {}", marker.display());
    let mut full: Vec<&str> = args.to_vec();
    if !args.is_empty() && args.last() == Some(&"sh") {
        full.extend(["-c", &touch]);
    }
    let out = run(&full);
    assert_eq!(out.code, Some(2), "stderr: {}", out.stderr);
    assert_eq!(out.stderr, message);
    assert_eq!(out.stdout, b"");
    assert!(!marker.exists(), "the program ran");
}

#[test]
fn zero_pes_is_refused() {
    refused(
        &["run", "-n", "0", "--", "sh"],
        "rshmem run: launcher: -n must be at least 1 (got 0 PEs)\n",
    );
}

#[test]
fn too_many_pes_is_refused() {
    refused(
        &["run", "-n", "5000", "--", "sh"],
        "rshmem run: launcher: -n 5000 is more PEs than one launcher starts (at most 4096)\n",
    );
}

#[test]
fn missing_program_is_refused() {
    refused(
        &["run", "-n", "2"],
        "rshmem run: no program given; usage: rshmem run -n N [--] PROGRAM [ARGS...]\n",
    );
    refused(
        &["run", "-n", "2", "--"],
        "rshmem run: no program given; usage: rshmem run -n N [--] PROGRAM [ARGS...]\n",
    );
}

#[test]
fn nonexistent_program_is_refused() {
    refused(
        &["run", "-n", "2", "--", "rshmem-no-such-program"],
        "rshmem run: launcher: program `rshmem-no-such-program` not found in PATH\n",
    );
    refused(
        &["run", "-n", "2", "--", "./no/such/path"],
        "rshmem run: launcher: cannot run program `./no/such/path`: No such file or directory (os error 2)\n",
    );
}

#[test]
fn non_executable_program_is_refused() {
    let file = std::env::temp_dir().join(format!("rshmem-launcher-noexec-{}", std::process::id()));
    std::fs::write(&file, "#!/bin/sh\necho ran\n").expect("write script");
    let path = file.to_string_lossy().into_owned();
    let out = run(&["run", "-n", "1", "--", &path]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(out.code, Some(2), "stderr: {}", out.stderr);
    assert_eq!(
        out.stderr,
        format!(
            "rshmem run: launcher: cannot run program `{path}`: not executable (Permission denied (os error 13))\n"
        )
    );
    assert_eq!(out.stdout, b"");
}

#[test]
fn pe_ignoring_sigterm_is_killed_after_grace_period() {
    // PE 0 ignores SIGTERM (inherited by sleep across exec); PE 1 fails once it has.
    let d = marker_dir("ignoring-sigterm");
    let script = format!(
        "if [ $RSHMEM_RANK = 0 ]; then trap '' TERM; echo pid=$$; touch {}/0; \
         exec sleep 30; fi; {}; exit 3",
        d.display(),
        await_files(&d, &["0"]),
    );
    let out = run(&["run", "-n", "2", "--", "sh", "-c", &script]);
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(out.code, Some(3), "stderr: {}", out.stderr);
    assert_eq!(
        out.stderr,
        "rshmem run: PE 1 exited with code 3\n\
         rshmem run: stopping 1 remaining PE\n\
         rshmem run: 1 PE still alive after 2 s, sending SIGKILL\n"
    );
    // The 2 s grace, and far below PE 0's 30 s.
    assert!(
        out.elapsed >= Duration::from_secs(2) && out.elapsed < Duration::from_secs(20),
        "took {:?}",
        out.elapsed
    );
    let pes = pids(&out.stdout_text(), "pid=");
    assert_eq!(pes.len(), 1);
    assert!(!alive(pes[0]), "PE process {} survived", pes[0]);
}

#[test]
fn killed_launcher_takes_its_pes_along() {
    let mut child = rshmem(&[
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo pid=$$; exec sleep 30",
    ])
    .spawn()
    .expect("spawn rshmem");
    let mut stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            let found = pids(&String::from_utf8_lossy(&seen), "pid=");
            if found.len() == 2 {
                let _ = tx.send(found);
                break;
            }
        }
    });
    let Ok(pes) = rx.recv_timeout(Duration::from_secs(5)) else {
        let _ = child.kill();
        panic!("PEs did not start");
    };
    child.kill().expect("SIGKILL the launcher");
    child.wait().expect("reap the launcher");
    // PR_SET_PDEATHSIG delivers SIGKILL to the PEs; give the kernel a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    while pes.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in pes {
        assert!(!alive(pid), "PE process {pid} outlived the launcher");
    }
}

/// A PE whose process exits 0 before it joined the job: the launcher tells the root, so
/// the PEs waiting for it fail at once naming it, instead of waiting out their timeout
/// (60 s here, past the test's bound) and then blaming one another.
#[test]
fn a_pe_that_exits_before_joining_is_named_at_once() {
    let bin = env!("CARGO_BIN_EXE_rshmem");
    let script = format!("[ \"$RSHMEM_RANK\" = 1 ] && exit 0; exec {bin} selftest --case put-get");
    let mut cmd = rshmem(&["run", "-n", "3", "--", "sh", "-c", &script]);
    cmd.env("RSHMEM_TIMEOUT_MS", "60000");
    let out = run_cmd(cmd);
    assert_ne!(out.code, Some(0), "stderr: {}", out.stderr);
    assert!(
        out.stderr
            .contains("PE 1 died: its process exited with code 0 before joining the job"),
        "stderr: {}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("rshmem run: PE 1 had left the job first"),
        "stderr: {}",
        out.stderr
    );
}

/// Reads `pipe` line by line on a thread; each line arrives on the returned channel.
fn lines_of(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (at most `within`) for a line that `want` accepts; returns the lines seen.
fn wait_for_line(
    rx: &mpsc::Receiver<String>,
    want: impl Fn(&str) -> bool,
    within: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                let found = want(&line);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!("no line awaited within {within:?}; saw {seen:?}");
}

/// Waits for `child` to exit, killing it and failing past `bound` from `started`.
fn wait_bounded(child: &mut Child, started: Instant, bound: Duration) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rshmem run did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The launcher's stdout is a pipe nobody reads while PE 0 writes without end: the
/// launcher still sees PE 1 fail, says so on stderr and stops PE 0. Once the reader
/// comes back, it gets whole lines and the launcher exits with PE 1's code. (Before the
/// launcher had writer threads, it blocked writing stdout and noticed nothing.)
#[test]
fn a_stdout_nobody_reads_does_not_stop_supervision() {
    let started = Instant::now();
    let script = "case $RSHMEM_RANK in \
                    0) exec yes 'some output line' ;; \
                    *) sleep 0.5; exit 7 ;; \
                  esac";
    let mut child = rshmem(&["run", "-n", "2", "--", "sh", "-c", script])
        .spawn()
        .expect("spawn rshmem");
    let stdout = child.stdout.take().expect("stdout piped");
    let stderr = lines_of(child.stderr.take().expect("stderr piped"));
    let seen = wait_for_line(
        &stderr,
        |l| l == "rshmem run: stopping 1 remaining PE",
        Duration::from_secs(5),
    );
    if seen[0] != "rshmem run: PE 1 exited with code 7" {
        let _ = child.kill();
        panic!("stderr: {seen:?}");
    }
    // PE 0 was stopped while nothing read the launcher's stdout; now read it.
    let stdout = collect(stdout);
    let status = wait_bounded(&mut child, started, BOUND);
    assert_eq!(status.code(), Some(7));
    let text = String::from_utf8(stdout.recv_timeout(Duration::from_secs(3)).expect("stdout"))
        .expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    // More than a pipe holds (64 KiB, about 2700 lines) was written while nobody read:
    // the launcher's stdout was full when PE 1 failed. (Usually the whole 4 MiB backlog,
    // 170 000 lines; a loaded machine may run `yes` less in PE 1's 0.5 s.)
    assert!(lines.len() > 5_000, "{} lines", lines.len());
    // Every line whole; the last may be the piece PE 0 wrote when it was stopped.
    let (last, whole) = lines.split_last().expect("lines");
    assert!(whole.iter().all(|l| *l == "[pe 0] some output line"));
    assert!(
        "[pe 0] some output line".starts_with(last),
        "last line {last:?}"
    );
}

/// Every PE ended well but the launcher's stdout is not read: the launcher waits for
/// its reader (as any writer to a pipe does), and a signal ends that wait, saying how much
/// was not written, with 128 + the signal.
#[test]
fn a_signal_ends_the_wait_for_a_stdout_nobody_reads() {
    let started = Instant::now();
    // 1.2 MB of output, more than a pipe holds, then the PE's pid on stderr.
    let script = "yes 'a line of output' | head -n 60000; echo pid=$$ >&2";
    let mut cmd = rshmem(&["run", "-n", "1", "--", "sh", "-c", script]);
    with_signals(&mut cmd, &[]);
    let mut child = cmd.spawn().expect("spawn rshmem");
    let _unread = child.stdout.take().expect("stdout piped");
    let stderr = lines_of(child.stderr.take().expect("stderr piped"));
    let seen = wait_for_line(
        &stderr,
        |l| l.starts_with("[pe 0] pid="),
        Duration::from_secs(5),
    );
    let pe: i32 = pids(seen.last().expect("line"), "pid=")[0];
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pe) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive(pe), "the PE did not end");
    // Leave the supervisor time to see the PE reaped and start waiting for stdout (a
    // signal before that takes the interrupted path: also 143, after at most 2 s).
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the launcher did not wait for stdout"
    );
    let signalled = Instant::now();
    // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_bounded(&mut child, started, BOUND);
    assert_eq!(status.code(), Some(143));
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "took {:?}",
        signalled.elapsed()
    );
    // The launcher has exited: its stderr ends once the reader thread took the rest.
    let mut rest = Vec::new();
    while let Ok(line) = stderr.recv_timeout(Duration::from_secs(3)) {
        rest.push(line);
    }
    assert!(
        rest.iter().any(|l| l.starts_with("rshmem run: ")
            && l.contains("bytes of the PEs' output and messages were not written")),
        "stderr after the pid: {rest:?}"
    );
}

/// The launcher's stdout and stderr are one pipe (`2>&1 | tee`), read slowly, while PE 0
/// writes long lines to stdout and PE 1 to stderr: every line arrives whole. The two
/// writer threads take turns on a shared file; before, a chunk written to a full pipe
/// (past the 4 KiB a pipe write keeps whole) could be spliced into the other stream's.
#[test]
fn stdout_and_stderr_on_one_pipe_do_not_splice_lines() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe writes two new fds into the array, each owned below exactly once.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: fds[0] and fds[1] are the new pipe's ends, owned by nothing else.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let both = write_end.try_clone().expect("dup");
    let a = "a".repeat(999);
    let b = "b".repeat(999);
    let script = format!(
        "if [ $RSHMEM_RANK = 0 ]; then yes {a} | head -n 3000; \
         else yes {b} | head -n 3000 >&2; fi"
    );
    let mut cmd = rshmem(&["run", "-n", "2", "--", "sh", "-c", &script]);
    cmd.stdout(Stdio::from(write_end)).stderr(Stdio::from(both));
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn rshmem");
    drop(cmd); // the parent's copies of the write end: EOF comes when the launcher exits
    let mut pipe = std::fs::File::from(read_end);
    let mut text = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        // Slowly: the pipe stays full, so the launcher's writes block part-way.
        std::thread::sleep(Duration::from_micros(300));
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading the pipe: {e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the job did not end"
        );
    }
    let status = wait_bounded(&mut child, started, BOUND);
    assert_eq!(status.code(), Some(0));
    let text = String::from_utf8(text).expect("utf-8");
    let (pe0, pe1) = (format!("[pe 0] {a}"), format!("[pe 1] {b}"));
    let mut counts = [0usize; 2];
    for (i, line) in text.lines().enumerate() {
        if line == pe0 {
            counts[0] += 1;
        } else if line == pe1 {
            counts[1] += 1;
        } else {
            panic!(
                "line {i} is not one PE's whole line: {:?}",
                &line[..line.len().min(80)]
            );
        }
    }
    assert_eq!(counts, [3000, 3000]);
}
