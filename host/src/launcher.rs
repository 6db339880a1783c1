//! `rshmem run`: start N local PEs and supervise them.
//!
//! This module owns the life of one local job: it checks the request, hosts the bootstrap
//! root, starts the PE processes, relays their output, watches them, tears the job down
//! when one fails or the launcher is interrupted, and removes the job's leftover
//! shared-memory segments. It does not take part in the bootstrap protocol itself (that is
//! [`crate::bootstrap::Root`]'s job) and never touches a PE's memory.
//!
//! # What a PE sees
//!
//! Each PE is a child process started with the program and arguments given, stdin from
//! `/dev/null`, the launcher's environment, and these variables:
//!
//! | variable | value |
//! |---|---|
//! | `RSHMEM_RANK` | the PE number, `0..N` |
//! | `RSHMEM_WORLD_SIZE` | `N` |
//! | `RSHMEM_LOCAL_RANK` | same as `RSHMEM_RANK` (all PEs run on this node) |
//! | `RSHMEM_LOCAL_SIZE` | `N` |
//! | `RSHMEM_MASTER_ADDR` | `127.0.0.1` |
//! | `RSHMEM_MASTER_PORT` | port of the bootstrap root the launcher hosts |
//! | `RSHMEM_TOKEN` | 32 hex characters from `/dev/urandom`, or the launcher's own `RSHMEM_TOKEN` when set |
//! | `RSHMEM_ROOT` | `external` (the root already runs; PEs only join it) |
//! | `RSHMEM_JOB_ID` | the root's job id; shared-memory segments are named `/dev/shm/rshmem-<job id>-pe<rank>` |
//!
//! # Output
//!
//! With prefixing on (the CLI default) every line a PE writes is relayed as
//! `[pe <rank>] <line>`: its stdout to the launcher's stdout, its stderr to the launcher's
//! stderr. Lines are written whole by one thread per stream, so lines of different PEs
//! never mix inside a line; when the launcher's stdout and stderr are one file (`2>&1`,
//! a terminal, one log file) the two threads take turns, so a stdout line is not spliced
//! into a stderr line either (before 2026-12-07 they could be, on a pipe that filled).
//! Bytes are relayed as they are (invalid UTF-8 included). A final line without a newline
//! is relayed at end of stream with a newline added; a line longer than [`MAX_LINE`]
//! bytes is cut into pieces of that size, each relayed as its own line.
//! Without prefixing the PEs simply inherit the launcher's stdout and stderr.
//!
//! A writer thread per stream writes the relayed lines and the launcher's own messages,
//! so a stream nobody reads (a pipeline whose reader stopped) never stops supervision:
//! PEs that fail are still seen and the job stopped, and signals still act. While
//! [`output::BACKLOG_LIMIT`] bytes wait for a stream, the PE pipes relayed to it are not
//! read, so PEs writing them block as they would on the stream itself. After the job, the
//! launcher waits for its stdout and stderr to take what is queued, as any program writing
//! to a pipe does; a signal ends that wait (exit 128 + signal unless a PE failed), saying
//! how many bytes were not written, and a job that was interrupted waits at most
//! [`STOP_GRACE`] for it. A signal that arrives after the job ended but before the
//! launcher exits (its cleanup) counts the same. The bootstrap root's own log lines are
//! dropped while 4 MiB more than [`output::BACKLOG_LIMIT`] wait for stderr (a stderr that
//! is stuck), which the PEs' output alone does not reach.
//!
//! # Supervision and exit status
//!
//! * All PEs exit 0: the launcher exits 0.
//! * A PE exits non-zero or dies by a signal: the launcher prints
//!   `rshmem run: PE 3 exited with code 7` (or `... was killed by signal 9 (SIGKILL)`),
//!   sends SIGTERM to the other PEs, SIGKILL to any still alive [`STOP_GRACE`] later, and
//!   exits with the failing PE's code, or 128 + signal number. Only the first failure
//!   counts; PEs stopped by the launcher are not reported.
//! * Which PE is named: the PEs that are told of a death by the bootstrap root usually
//!   fail too (exit 1), so when the first PE the root this launcher hosts saw leave
//!   without finalize crashed or exited non-zero itself, that PE is named (once reaped,
//!   waiting at most [`DEATH_REAP_WAIT`] for it). If it exited 0, the failure is named as
//!   below and keeps its code, and a second line says `rshmem run: PE 2 had left the job
//!   first, exiting 0 without finalize: ...`. Otherwise, of the PEs that ended together,
//!   one killed by a signal comes before one that exited non-zero, then the lowest rank.
//!   A job whose PEs all exit 0 exits 0.
//! * A signal the launcher was started with ignored (`nohup`) stays ignored.
//! * SIGINT (Ctrl-C), SIGTERM, SIGHUP (a closed terminal or ssh session) or SIGQUIT to the
//!   launcher: it prints `rshmem run: interrupted, stopping N PEs`, stops the PEs the same
//!   way and exits 128 + the signal number: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP),
//!   131 (SIGQUIT). A second signal while stopping sends SIGKILL at once. Messages that
//!   cannot be written (the terminal is gone) are dropped; they never stop the launcher.
//!
//! Each PE runs in its own process group, and signals go to the whole group, so helper
//! processes a PE started (e.g. a shell's children) are stopped with it. When every PE
//! has ended, also successfully, processes left in their groups get SIGTERM, then
//! SIGKILL [`STOP_GRACE`] later (`rshmem run: every PE ended; stopping the processes they
//! left behind ...`), as Slurm ends a step's processes; one started with setsid is not in
//! a group and is left alone. Each PE also has
//! `PR_SET_PDEATHSIG=SIGKILL`: if the launcher itself is killed, the PEs die with it
//! (their own children are not covered by this; they lose their output pipe instead).
//!
//! # Open files
//!
//! The launcher holds two descriptors per PE for the bootstrap root it hosts (the PE's
//! connection and its writer's duplicate) and, when prefixing, the read ends of two output
//! pipes per PE; it raises its soft `RLIMIT_NOFILE` to [`open_files_needed`], or as far as
//! the hard limit allows (which it cannot exceed). A job whose output pipes alone do not
//! fit is refused before it starts; one whose PEs' connections to the root do not all fit
//! starts with a warning naming how many can join (a plain command never joins). PEs
//! inherit the raised limit.
//!
//! After the job, successful or not, files in `/dev/shm` named `rshmem-<job id>-*` are
//! removed. PEs normally unlink their segments right after mapping them, so only a crashed
//! job leaves some; the launcher says how many it removed when there were any.
//!
//! # Errors before anything starts
//!
//! `-n 0`, more than [`MAX_PES`] PEs, no program, or a program that cannot be found or
//! executed (looked up in `PATH` the way `execvp` does) are reported before any process is
//! started; the CLI exits 2 on those and on any other failure to start the job.

mod output;
mod process;
mod signals;

/// Makes the child `cmd` starts die (SIGKILL) with the thread of this process that
/// spawns it: `PR_SET_PDEATHSIG` in the child before exec, and a child whose parent
/// already died before that took effect does not run. For children that lead their own
/// process group (out of reach of the signals sent to ours), so they are not left
/// running when this process is killed.
pub(crate) fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it calls prctl and getppid (plain system calls)
    // and builds io::Errors from raw OS codes (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before prctl took effect: do not run orphaned.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

use crate::error::{Error, Result};
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::time::Duration;

pub use process::PeExit;

/// The largest number of PEs one launcher starts.
pub const MAX_PES: usize = 4096;

/// Time between SIGTERM and SIGKILL when the launcher stops PEs.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Longest line relayed in one piece; longer lines are cut.
pub const MAX_LINE: usize = 1 << 20;

/// How long the launcher waits, after a PE failed, for the PE that the bootstrap root saw
/// die first to be reaped, so that it can name that PE instead of the failed one.
pub const DEATH_REAP_WAIT: Duration = Duration::from_millis(500);

/// Descriptors the launcher needs besides its per-PE ones: stdio, the root's listener, the
/// `/dev/null` and pipes of the PE being started, and whatever else the process has open.
const OPEN_FILES_SLACK: u64 = 64;

/// Environment variables the launcher sets for every PE; callers cannot override them.
pub const PE_VARIABLES: [&str; 9] = [
    "RSHMEM_RANK",
    "RSHMEM_WORLD_SIZE",
    "RSHMEM_LOCAL_RANK",
    "RSHMEM_LOCAL_SIZE",
    "RSHMEM_MASTER_ADDR",
    "RSHMEM_MASTER_PORT",
    "RSHMEM_TOKEN",
    "RSHMEM_ROOT",
    "RSHMEM_JOB_ID",
];

// Shown by `rshmem run --help`. (after_long_help rather than long_about: the doc comment
// of the `Run` variant in main.rs sets the about text and would replace a long_about.)
const LONG_HELP: &str = "\
Each PE gets RSHMEM_RANK, RSHMEM_WORLD_SIZE, RSHMEM_LOCAL_RANK, RSHMEM_LOCAL_SIZE,
RSHMEM_MASTER_ADDR=127.0.0.1, RSHMEM_MASTER_PORT (the bootstrap root this launcher hosts),
RSHMEM_TOKEN (random, or the launcher's own RSHMEM_TOKEN unless blank), RSHMEM_ROOT=external and
RSHMEM_JOB_ID. The rest of the environment passes through; stdin is /dev/null.

Output: every line is relayed as '[pe RANK] line', stdout to stdout and stderr to
stderr, whole lines only; a last line without newline gets one. A stdout nobody reads
does not stop supervision; at the end rshmem waits for its reader (a signal ends the wait).

Failure: when a PE exits non-zero or dies by a signal, the other PEs get SIGTERM, then
SIGKILL after 2 s, and rshmem exits with that PE's exit code (128+N for signal N). The PE
named is the first one the bootstrap root saw leave without finalize when it crashed or
failed itself (PEs told of its death fail too); one that left first exiting 0 is named on
a second line. A PE whose process ends before it joined the job (a wrapper that starts
the program in the background and exits, for one) breaks the job at once: the others fail
naming it. Ctrl-C, SIGTERM, SIGHUP or SIGQUIT stops all PEs the same way; rshmem then
exits 128+N (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP); a signal rshmem was
started with ignored (nohup) stays ignored.

Cleanup: each PE runs in its own process group; processes a PE left running there (a
shell's background job) get SIGTERM when every PE has ended, SIGKILL 2 s later, also in a
job that succeeded (start a process with setsid to keep it); a signal to rshmem meanwhile
still makes it exit 128+N. A PE still alive 10 s after SIGKILL is named, and after 60 s
given up on (the job fails). Leftover shared-memory segments of the job
(/dev/shm/rshmem-JOBID-*) are removed at the end.

Exit status 2: nothing was started (bad -n, no program, program not found or not
executable, or the job could not be set up).";

/// Arguments of `rshmem run`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = LONG_HELP,
    override_usage = "rshmem run -n N [--] PROGRAM [ARGS]..."
)]
pub struct RunArgs {
    /// Number of PEs to start (1 to 4096).
    #[arg(short = 'n', long = "npes")]
    pub npes: usize,
    /// Program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<String>,
}

/// What to launch, for [`launch`].
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Program to run, looked up in `PATH` unless it contains a `/`.
    pub program: OsString,
    /// Its arguments (without the program name).
    pub args: Vec<OsString>,
    /// Number of PEs, 1 to [`MAX_PES`].
    pub npes: usize,
    /// Extra environment for every PE, on top of the launcher's. Must not name a
    /// variable of [`PE_VARIABLES`].
    pub env: Vec<(OsString, OsString)>,
    /// Relay output as `[pe N] line` (true) or let PEs inherit stdout/stderr (false).
    pub prefix_output: bool,
    /// Job token; `None`: the launcher's `RSHMEM_TOKEN`, else a random one.
    pub token: Option<String>,
    /// Catch SIGINT, SIGTERM, SIGHUP and SIGQUIT while the job runs and stop the PEs on
    /// them. The handlers are process-wide: only one launch with this set may run at a
    /// time, and the previous handlers are restored when it returns.
    pub handle_signals: bool,
}

impl LaunchOptions {
    /// Options to run `program` with `args` on `npes` PEs, prefixed output, no signal
    /// handling, no extra environment.
    pub fn new(
        program: impl Into<OsString>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        npes: usize,
    ) -> LaunchOptions {
        LaunchOptions {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            npes,
            env: Vec::new(),
            prefix_output: true,
            token: None,
            handle_signals: false,
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// The exit status `rshmem run` uses: 0, the failing PE's code, or 128 + signal.
    pub exit_code: i32,
    /// The job id of the bootstrap root.
    pub job_id: String,
    /// How each PE ended, by rank.
    pub pe_exits: Vec<PeExit>,
    /// The PE named for the job's failure, if any: the first PE the bootstrap root saw
    /// leave without finalize when it failed itself, else the first PE that exited
    /// non-zero or died by a signal on its own. PEs the launcher stopped are never named.
    pub first_failure: Option<(usize, PeExit)>,
    /// The signal (SIGINT, SIGTERM, SIGHUP or SIGQUIT) that interrupted the job, if any.
    pub interrupted_by: Option<i32>,
    /// Leftover shared-memory segments of the job removed afterwards.
    pub removed_segments: usize,
}

/// `rshmem run`: returns the process exit status.
pub fn run_cli(args: RunArgs) -> i32 {
    let Some((program, rest)) = args.program.split_first() else {
        eprintln!("rshmem run: no program given; usage: rshmem run -n N [--] PROGRAM [ARGS...]");
        return 2;
    };
    let mut opts = LaunchOptions::new(program, rest, args.npes);
    opts.handle_signals = true;
    match launch(&opts) {
        Ok(outcome) => outcome.exit_code,
        Err(e) => {
            // Through the stderr writer, after what it has queued, and bounded: the writer
            // may be stuck in a write to a stderr nobody reads (holding its lock, which
            // eprintln! would wait for), and a stderr that is gone must not panic.
            output::write_to(
                output::Target::Stderr,
                format!("rshmem run: {e}\n").as_bytes(),
            );
            output::flush_within(STOP_GRACE, &|| false);
            2
        }
    }
}

/// Runs one job to its end: checks the request, hosts the bootstrap root, starts
/// `opts.npes` PEs and supervises them (see the module documentation).
///
/// `Err` means the job could not be started (nothing runs any more when it returns);
/// a job that ran and failed is `Ok` with a non-zero [`LaunchOutcome::exit_code`].
pub fn launch(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    // The root this launcher hosts logs through the stderr writer thread too: it logs
    // deaths while the supervisor may wait for its state (see bootstrap::set_log_sink).
    crate::bootstrap::set_log_sink(output::log_line);
    let signals = if opts.handle_signals {
        Some(signals::SignalGuard::install()?)
    } else {
        None
    };
    let result = run_job(opts, signals.as_ref());
    let result = result.map(|(outcome, seen)| finish_output(outcome, signals.as_ref(), seen));
    if result.is_err() {
        // The messages queued before the job failed to start come before the error; a
        // signal, or 2 s, ends the wait for a stream nobody reads.
        let seen = signals.as_ref().map_or(0, |s| s.received().1);
        output::flush_within(STOP_GRACE, &|| {
            signals.as_ref().is_some_and(|s| s.received().1 > seen)
        });
    }
    drop(signals);
    result
}

/// Writes the output still queued for the launcher's stdout and stderr (see
/// [`output::flush`]). A signal that arrives meanwhile drops what is left; the job then
/// exits 128 + that signal unless a PE's failure already set its status. A job that was
/// interrupted already waits at most [`STOP_GRACE`] for its output.
/// `seen`: the signals the supervisor acted on; one that arrived after its last look
/// (during the final drain or the cleanup) counts as new here.
fn finish_output(
    mut outcome: LaunchOutcome,
    signals: Option<&signals::SignalGuard>,
    seen: usize,
) -> LaunchOutcome {
    let interrupted = outcome.interrupted_by.is_some();
    let give_up_at = std::time::Instant::now() + STOP_GRACE;
    let stopped_by = std::cell::Cell::new(None);
    let stop = || {
        if let Some((sig, count)) = signals.map(|s| s.received()) {
            if count > seen {
                stopped_by.set(sig);
                return true;
            }
        }
        interrupted && std::time::Instant::now() >= give_up_at
    };
    let left = output::flush(&stop);
    // A signal that came while nothing was left to write (during the cleanup, or the
    // root's drain) is seen here: `flush` asks `stop` only while bytes wait.
    if stopped_by.get().is_none() {
        stop();
    }
    if left > 0 {
        say(format_args!(
            "rshmem run: {left} bytes of the PEs' output and messages were not written \
             (nothing read them{})",
            if stopped_by.get().is_some() {
                " before the signal"
            } else {
                ""
            }
        ));
        // A short, bounded try: stderr may be the stream nobody reads.
        output::flush_within(Duration::from_millis(200), &|| false);
    }
    if let (Some(sig), None) = (stopped_by.get(), outcome.first_failure) {
        outcome.interrupted_by.get_or_insert(sig);
        outcome.exit_code = 128 + outcome.interrupted_by.unwrap_or(sig);
    }
    outcome
}

/// [`launch`] up to the end of the job, with the signal handlers installed when asked;
/// also the number of signals the supervisor acted on.
fn run_job(
    opts: &LaunchOptions,
    signals: Option<&signals::SignalGuard>,
) -> Result<(LaunchOutcome, usize)> {
    check_npes(opts.npes)?;
    let program = process::resolve_program(&opts.program)?;
    check_extra_env(&opts.env)?;
    let token = match &opts.token {
        Some(t) => t.clone(),
        None => token_from_env_or_random()?,
    };
    let pipes = open_files_needed(opts.npes, opts.prefix_output) - 2 * opts.npes as u64;
    let needed = open_files_needed(opts.npes, opts.prefix_output);
    if let Some(w) = process::ensure_fd_limit(opts.npes, pipes, needed)? {
        say(format_args!("{w}"));
    }

    // The root lives in this scope: it serves until every PE is gone.
    let (report, job_id) = {
        let root = host_root(opts.npes, &token)?;
        let port = root.local_addr().port();
        let job_id = root.job_id().to_string();
        let env = pe_environment(opts, port, &token, &job_id);
        let job = process::Job::spawn(&program, opts, &env)?;
        let first_death = || root.first_death().map(|(rank, _)| rank);
        let exited = |rank: usize, how: &str| root.mark_exited(rank, how);
        (job.supervise(signals, &first_death, &exited), job_id)
    };

    let removed_segments = remove_leftover_segments(std::path::Path::new("/dev/shm"), &job_id);
    if removed_segments > 0 {
        say(format_args!(
            "rshmem run: removed {removed_segments} leftover shared-memory segment{} of job {job_id}",
            if removed_segments == 1 { "" } else { "s" }
        ));
    }

    Ok((
        LaunchOutcome {
            exit_code: report.exit_code(),
            job_id,
            pe_exits: report.pe_exits,
            first_failure: report.first_failure,
            interrupted_by: report.interrupted_by,
            removed_segments,
        },
        report.signals_seen,
    ))
}

/// Open files the launcher needs for a job of `npes` PEs: two per PE for the bootstrap
/// root it hosts (each PE's connection and the duplicate its writer thread owns), two
/// more per PE when relaying output (the read ends of its stdout and stderr pipes), and
/// [`OPEN_FILES_SLACK`].
pub fn open_files_needed(npes: usize, prefix_output: bool) -> u64 {
    let per_pe = if prefix_output { 4 } else { 2 };
    per_pe * npes as u64 + OPEN_FILES_SLACK
}

/// Queues one line for stderr (written by the stream's writer thread, like relayed
/// output): a stderr nobody reads cannot stop the launcher, and after SIGHUP the terminal
/// may be gone (EIO), where `eprintln!` would panic instead of letting the launcher stop
/// its PEs.
fn say(msg: std::fmt::Arguments<'_>) {
    output::write_to(output::Target::Stderr, format!("{msg}\n").as_bytes());
}

/// Hosts the bootstrap root for `npes` PEs on an ephemeral loopback port. It serves PEs
/// until dropped.
fn host_root(npes: usize, token: &str) -> Result<crate::bootstrap::Root> {
    crate::bootstrap::Root::bind("127.0.0.1:0", npes, token)
}

fn check_npes(npes: usize) -> Result<()> {
    if npes == 0 {
        return Err(Error::Launch(
            "-n must be at least 1 (got 0 PEs)".to_string(),
        ));
    }
    if npes > MAX_PES {
        return Err(Error::Launch(format!(
            "-n {npes} is more PEs than one launcher starts (at most {MAX_PES})"
        )));
    }
    Ok(())
}

fn check_extra_env(env: &[(OsString, OsString)]) -> Result<()> {
    for (k, _) in env {
        if PE_VARIABLES.iter().any(|v| OsStr::new(v) == k) {
            return Err(Error::Launch(format!(
                "{} is set by the launcher for each PE and cannot be overridden",
                k.to_string_lossy()
            )));
        }
    }
    Ok(())
}

/// The launcher's `RSHMEM_TOKEN` if set and non-empty, else 32 random hex characters.
fn token_from_env_or_random() -> Result<String> {
    match std::env::var("RSHMEM_TOKEN") {
        Ok(t) if !t.trim().is_empty() => Ok(t),
        Ok(_) | Err(std::env::VarError::NotPresent) => random_token(),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Env {
            var: "RSHMEM_TOKEN".to_string(),
            value: v.to_string_lossy().into_owned(),
            reason: "not valid UTF-8".to_string(),
        }),
    }
}

/// 16 bytes of `/dev/urandom` as 32 lowercase hex characters.
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("reading 16 bytes from /dev/urandom for the job token", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The variables of every PE, without the per-rank ones (added at spawn).
fn pe_environment(
    opts: &LaunchOptions,
    port: u16,
    token: &str,
    job_id: &str,
) -> Vec<(OsString, OsString)> {
    let mut env = opts.env.clone();
    let n = opts.npes.to_string();
    for (k, v) in [
        ("RSHMEM_WORLD_SIZE", n.as_str()),
        ("RSHMEM_LOCAL_SIZE", n.as_str()),
        ("RSHMEM_MASTER_ADDR", "127.0.0.1"),
        ("RSHMEM_MASTER_PORT", &port.to_string()),
        ("RSHMEM_TOKEN", token),
        ("RSHMEM_ROOT", "external"),
        ("RSHMEM_JOB_ID", job_id),
    ] {
        env.push((k.into(), v.into()));
    }
    env
}

/// Removes the regular files in `dir` named `rshmem-<job_id>-*`; returns how many.
fn remove_leftover_segments(dir: &std::path::Path, job_id: &str) -> usize {
    if job_id.is_empty() || job_id.contains('/') {
        return 0;
    }
    let prefix = format!("rshmem-{job_id}-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        let name = entry.file_name();
        if is_file
            && name.as_encoded_bytes().starts_with(prefix.as_bytes())
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_token_is_32_hex_chars_and_varies() {
        let a = random_token().expect("urandom");
        let b = random_token().expect("urandom");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn open_files_cover_the_roots_sockets_with_or_without_relaying() {
        // 2 per PE for the root (connection + writer's duplicate), 2 per PE of pipes.
        assert_eq!(open_files_needed(1, true), 68);
        assert_eq!(open_files_needed(300, true), 1264);
        assert_eq!(open_files_needed(300, false), 664);
        assert_eq!(open_files_needed(MAX_PES, true), 16448);
    }

    #[test]
    fn npes_bounds() {
        assert!(check_npes(0).is_err());
        assert!(check_npes(1).is_ok());
        assert!(check_npes(MAX_PES).is_ok());
        assert!(check_npes(MAX_PES + 1).is_err());
    }

    #[test]
    fn extra_env_cannot_override_pe_variables() {
        assert!(check_extra_env(&[("RSHMEM_RANK".into(), "3".into())]).is_err());
        assert!(check_extra_env(&[("RSHMEM_SYMMETRIC_SIZE".into(), "1M".into())]).is_ok());
    }

    #[test]
    fn leftover_segments_of_this_job_only() {
        let dir = std::env::temp_dir().join(format!("rshmem-launcher-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for name in [
            "rshmem-abc-pe0",
            "rshmem-abc-pe1",
            "rshmem-abcd-pe0",
            "other",
        ] {
            std::fs::write(dir.join(name), b"x").expect("write");
        }
        assert_eq!(remove_leftover_segments(&dir, "abc"), 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["other", "rshmem-abcd-pe0"]);
        assert_eq!(remove_leftover_segments(&dir, ""), 0);
        std::fs::remove_dir_all(&dir).expect("rmdir");
    }
}
