//! Starting, watching and stopping the PE processes.
//!
//! Each PE is the leader of its own process group (pgid = its pid); the launcher signals
//! whole groups so that processes a PE started go with it. PEs are reaped with
//! `Child::try_wait` (waitpid on their own pid), never `waitpid(-1)`, so a library caller's
//! other children are left alone.

use super::output::{OutputPump, Target};
use super::signals::SignalGuard;
use super::{say, LaunchOptions, DEATH_REAP_WAIT, STOP_GRACE};
use crate::error::{Error, Result};
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often the supervisor looks at its PEs and the signal flags.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How long output is still relayed after the last PE exited (pipes held open by
/// processes a PE left behind).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// After SIGKILL: when supervision names the PEs still alive (a process in uninterruptible
/// sleep, e.g. in a GPU driver, ignores SIGKILL until it wakes; a large GPU context can
/// take seconds to tear down), and when it gives up on them.
const KILL_NOTE: Duration = Duration::from_secs(10);
const KILL_WAIT: Duration = Duration::from_secs(60);

/// How a PE process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeExit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
    /// Its status could not be read (someone else reaped it).
    Unknown,
}

impl PeExit {
    fn from_status(status: ExitStatus) -> PeExit {
        match (status.code(), status.signal()) {
            (Some(code), _) => PeExit::Code(code),
            (None, Some(sig)) => PeExit::Signal(sig),
            (None, None) => PeExit::Unknown,
        }
    }

    /// Whether this is a successful exit (code 0).
    pub fn is_success(self) -> bool {
        self == PeExit::Code(0)
    }

    /// The exit status a shell would report: the code, or 128 + signal.
    pub fn shell_code(self) -> i32 {
        match self {
            PeExit::Code(c) => c,
            PeExit::Signal(s) => 128 + s,
            PeExit::Unknown => 1,
        }
    }

    /// `exited with code 7`, `was killed by signal 9 (SIGKILL)`.
    pub fn describe(self) -> String {
        match self {
            PeExit::Code(c) => format!("exited with code {c}"),
            PeExit::Signal(s) => match signal_name(s) {
                Some(name) => format!("was killed by signal {s} ({name})"),
                None => format!("was killed by signal {s}"),
            },
            PeExit::Unknown => "ended with an unknown status".to_string(),
        }
    }
}

/// The conventional name of a Linux signal number.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// Finds `program` the way `execvp` does: as a path when it contains `/`, else in each
/// directory of `PATH` (`/bin:/usr/bin` when unset; an empty entry is the current
/// directory). The result must be a regular file this process may execute.
pub(super) fn resolve_program(program: &OsStr) -> Result<PathBuf> {
    if program.is_empty() {
        return Err(Error::Launch(
            "no program given; usage: rshmem run -n N [--] PROGRAM [ARGS...]".to_string(),
        ));
    }
    let shown = program.to_string_lossy();
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match check_executable(&path) {
            Ok(()) => Ok(path),
            Err(why) => Err(Error::Launch(format!(
                "cannot run program `{shown}`: {why}"
            ))),
        };
    }
    let path_var = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
    let mut rejected = None;
    for dir in path_var.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let candidate = dir.join(program);
        match check_executable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(why) if candidate.exists() && rejected.is_none() => {
                rejected = Some(format!("{}: {why}", candidate.display()));
            }
            Err(_) => {}
        }
    }
    Err(Error::Launch(match rejected {
        Some(why) => format!("cannot run program `{shown}`: {why}"),
        None => format!("program `{shown}` not found in PATH"),
    }))
}

/// `Ok` when `path` is a regular file we may execute; else why not.
fn check_executable(path: &Path) -> std::result::Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| "the path contains a NUL byte".to_string())?;
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    if unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } != 0 {
        return Err(format!(
            "not executable ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Raises the soft open-file limit to `needed` (the output pipes and the root's sockets
/// of every PE), or as far as the hard limit allows. Refuses only when the hard limit is
/// below `must` (what the launcher itself opens: the pipes and the slack); between the two
/// it returns a warning, since programs that never join the bootstrap root (a plain
/// command) run anyway, and rshmem programs past the room would fail to join.
pub(super) fn ensure_fd_limit(npes: usize, must: u64, needed: u64) -> Result<Option<String>> {
    // SAFETY: rlimit is plain old data; zeroed is a valid value, filled in by getrlimit.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is valid writable storage for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(Error::io(
            "reading the open-file limit (getrlimit)",
            std::io::Error::last_os_error(),
        ));
    }
    let cure = |n: u64| format!("as root: ulimit -Hn {n}, or nofile in /etc/security/limits.conf");
    if lim.rlim_max < must {
        return Err(Error::Launch(format!(
            "the job needs {must} open files in the launcher for itself and its PEs' output \
             pipes ({needed} with their connections to the bootstrap root), but the hard \
             limit (ulimit -Hn) is {}: raise it ({}) or start fewer PEs",
            lim.rlim_max,
            cure(needed)
        )));
    }
    let want = needed.min(lim.rlim_max);
    if lim.rlim_cur < want {
        lim.rlim_cur = want;
        // SAFETY: `lim` is a valid rlimit with rlim_cur <= rlim_max.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(Error::io(
                format!("raising the open-file limit to {want} (setrlimit)"),
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok((want < needed).then(|| {
        format!(
            "rshmem run: the hard open-file limit (ulimit -Hn) is {}: room for {} of the \
             {npes} PEs to join the bootstrap root (2 open files each in the launcher); \
             programs that use rshmem need {needed}: raise it ({})",
            lim.rlim_max,
            (want - must) / 2,
            cure(needed)
        )
    }))
}

struct Pe {
    child: Child,
    /// Process group id of the PE (= its pid).
    pgid: libc::pid_t,
    exit: Option<PeExit>,
    /// Reaped, and no process of its group was left at some scan since: the id is free
    /// and may name an unrelated group later, which must never be signalled.
    group_gone: bool,
}

/// The started PEs of one job.
pub(super) struct Job {
    pes: Vec<Pe>,
    output: OutputPump,
}

/// What supervision found.
pub(super) struct Report {
    pub pe_exits: Vec<PeExit>,
    pub first_failure: Option<(usize, PeExit)>,
    pub interrupted_by: Option<i32>,
    /// Signals received that supervision acted on (a later one is new to the caller).
    pub signals_seen: usize,
}

impl Report {
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.interrupted_by {
            return 128 + sig;
        }
        match self.first_failure {
            Some((_, exit)) => match exit.shell_code() {
                0 => 1, // not expected: only failures are recorded
                code => code,
            },
            None => 0,
        }
    }
}

/// Which PE to name when PEs that ended together (`batch`, by rank) include a failure:
/// `root_first`, the first PE the bootstrap root saw die (with its exit, once reaped) when
/// it failed itself, since the others usually failed because they were told of its death
/// (supervise names a first death that exited 0 separately); else the first PE
/// of the batch killed by a signal (a crash); else the first that exited non-zero. None
/// when nothing in the batch failed.
fn blame(
    batch: &[(usize, PeExit)],
    root_first: Option<(usize, PeExit)>,
) -> Option<(usize, PeExit)> {
    if batch.iter().all(|(_, exit)| exit.is_success()) {
        return None;
    }
    root_first
        .or_else(|| {
            batch
                .iter()
                .find(|(_, exit)| matches!(exit, PeExit::Signal(_)))
                .copied()
        })
        .or_else(|| batch.iter().find(|(_, exit)| !exit.is_success()).copied())
}

/// Sends `sig` to the process group `pgid`; false if the group no longer exists.
fn signal_group(pgid: libc::pid_t, sig: libc::c_int) -> bool {
    if pgid <= 1 {
        return false; // never signal "every process" or init's group
    }
    // SAFETY: kill has no memory-safety preconditions. A negative pid addresses the
    // process group of a PE we started; its leader is ours until we reap it.
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// The status of PE process `pid` if it has ended, without reaping it (`waitid` with
/// WNOWAIT): the zombie keeps the pid and its process group id reserved until
/// [`Job::reap_ended`] reaps it.
fn exited_unreaped(pid: libc::pid_t) -> std::io::Result<Option<ExitStatus>> {
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value (si_pid 0 = none).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t; waitid writes only into it. `pid` is
    // our child, not yet reaped (WNOWAIT leaves it waitable).
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` for a child's state change (SIGCHLD layout), or left it
    // zeroed when none had ended (WNOHANG); si_pid and si_status read that layout.
    let (spid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if spid == 0 {
        return Ok(None);
    }
    // The wait status a reaping wait would have returned.
    let raw = match info.si_code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_KILLED => status & 0x7f,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => return Ok(None), // stopped or continued: WEXITED asks for neither
    };
    Ok(Some(ExitStatus::from_raw(raw)))
}

/// Whether `proc` lists a process, other than a zombie, in one of `groups`. When `proc`
/// cannot be read, assumes there is one.
fn live_members_in(proc: &Path, groups: &[libc::pid_t]) -> bool {
    !live_groups_in(proc, groups).is_empty()
}

/// Which of `groups` still have a live (not zombie) process under `proc`; all of them
/// when `proc` cannot be read (as [`live_members_in`] answers then).
fn live_groups_in(proc: &Path, groups: &[libc::pid_t]) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return groups.to_vec();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        if let Some(pgrp) = live_group_of(&entry) {
            if groups.contains(&pgrp) && !out.contains(&pgrp) {
                out.push(pgrp);
            }
        }
    }
    out
}

/// The process group of the live (not zombie) process `entry` of /proc names, if so.
fn live_group_of(entry: &std::fs::DirEntry) -> Option<libc::pid_t> {
    let name = entry.file_name();
    if !name.as_bytes().iter().all(u8::is_ascii_digit) {
        return None;
    }
    // None when the process just went away.
    let stat = std::fs::read(entry.path().join("stat")).ok()?;
    let (state, pgrp) = parse_stat(&stat)?;
    (state != b'Z' && state != b'X').then_some(pgrp)
}

/// State and process group from the text of `/proc/<pid>/stat`:
/// `pid (comm) state ppid pgrp ...`; comm may contain spaces and parentheses.
fn parse_stat(stat: &[u8]) -> Option<(u8, libc::pid_t)> {
    let after_comm = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let text = std::str::from_utf8(after_comm).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

impl Job {
    /// Starts `opts.npes` PEs of `program`; `env` is the environment common to all of them.
    /// When one cannot be started, those already started are killed and reaped.
    pub(super) fn spawn(
        program: &Path,
        opts: &LaunchOptions,
        env: &[(OsString, OsString)],
    ) -> Result<Job> {
        let mut job = Job {
            pes: Vec::with_capacity(opts.npes),
            output: OutputPump::new(),
        };
        for rank in 0..opts.npes {
            let mut cmd = Command::new(program);
            cmd.arg0(&opts.program)
                .args(&opts.args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("RSHMEM_RANK", rank.to_string())
                .env("RSHMEM_LOCAL_RANK", rank.to_string())
                .stdin(Stdio::null())
                .process_group(0);
            if opts.prefix_output {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            // The PE dies with the launcher (with the thread that forked it, to be exact:
            // `launch` blocks on that thread until every PE has ended, or gives up on it
            // KILL_WAIT after SIGKILL).
            super::die_with_parent(&mut cmd);
            let mut child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let why = format!("starting PE {rank} ({}) failed: {e}", program.display());
                    if !job.pes.is_empty() {
                        say(format_args!(
                            "rshmem run: {why}; stopping the {} PE(s) started",
                            job.pes.len()
                        ));
                    }
                    job.kill_all_now(KILL_NOTE, KILL_WAIT);
                    return Err(Error::Launch(why));
                }
            };
            if let Some(out) = child.stdout.take() {
                job.output.add(rank, out, Target::Stdout);
            }
            if let Some(err) = child.stderr.take() {
                job.output.add(rank, err, Target::Stderr);
            }
            let pgid = child.id() as libc::pid_t;
            job.pes.push(Pe {
                child,
                pgid,
                exit: None,
                group_gone: false,
            });
        }
        Ok(job)
    }

    /// SIGKILL to every PE group and a bounded reap (used when starting fails): PEs still
    /// alive `note` after it are named, and given up on at `give_up` (a process in
    /// uninterruptible sleep, as in a GPU driver, ignores SIGKILL until it wakes; before
    /// 2026-12-07 this waited for each without end, before the start error was shown).
    /// Returns the ranks given up on; a thread reaps them when they end.
    fn kill_all_now(&mut self, note: Duration, give_up: Duration) -> Vec<usize> {
        for pe in &self.pes {
            signal_group(pe.pgid, libc::SIGKILL);
        }
        let t0 = Instant::now();
        let mut noted = false;
        let alive = loop {
            let alive: Vec<usize> = (0..self.pes.len())
                .filter(|&r| !matches!(self.pes[r].child.try_wait(), Ok(Some(_)) | Err(_)))
                .collect();
            if alive.is_empty() {
                break alive;
            }
            let named = || {
                let a: Vec<String> = alive.iter().map(|r| r.to_string()).collect();
                format!("PE{} {}", if a.len() == 1 { "" } else { "s" }, a.join(", "))
            };
            if t0.elapsed() >= give_up {
                say(format_args!(
                    "rshmem run: {} still not ended {} s after SIGKILL; giving up",
                    named(),
                    give_up.as_secs_f64()
                ));
                break alive;
            }
            if t0.elapsed() >= note && !noted {
                noted = true;
                say(format_args!(
                    "rshmem run: {} still not ended {} s after SIGKILL; waiting up to {} s",
                    named(),
                    note.as_secs_f64(),
                    give_up.as_secs_f64()
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        for &r in &alive {
            let pid = self.pes[r].child.id() as libc::pid_t;
            std::thread::spawn(move || {
                // SAFETY: waitpid on our own child, not reaped yet; a null status pointer
                // is allowed.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            });
        }
        self.output.drain(Duration::ZERO);
        alive
    }

    /// Notes PEs that ended; returns their ranks. A PE that ended is seen without being
    /// reaped (`waitid` with WNOWAIT): its zombie keeps its pid, and so its process group
    /// id, reserved while processes of its group live on, so signalling the group can
    /// never reach an unrelated group that reused the id; it is reaped once its group is
    /// found empty (`note_gone_groups`) or when supervision is over. (Before 2026-12-07 a
    /// PE was reaped at once, and its id could be reused between that and the /proc scan
    /// that found its group alive: an unrelated group could then be signalled.)
    fn reap(&mut self) -> Vec<usize> {
        let mut reaped = Vec::new();
        for (rank, pe) in self.pes.iter_mut().enumerate() {
            if pe.exit.is_some() {
                continue;
            }
            match exited_unreaped(pe.pgid) {
                Ok(Some(status)) => pe.exit = Some(PeExit::from_status(status)),
                Ok(None) => continue,
                Err(_) => {
                    // Reaped by someone else (SIGCHLD ignored, a waitpid(-1) in the
                    // caller): its ids may be reused already, so its group is never
                    // signalled again.
                    pe.exit = Some(PeExit::Unknown);
                    pe.group_gone = true;
                }
            }
            reaped.push(rank);
        }
        self.note_gone_groups();
        reaped
    }

    /// Reaps every PE that ended (their zombies, kept by [`Job::reap`]); a PE still
    /// running (given up on after SIGKILL) is reaped by a detached thread when it ends, so
    /// no zombie outlives it in a long-lived caller of `launch`.
    fn reap_ended(&mut self) {
        for pe in &mut self.pes {
            if pe.exit.is_some() {
                let _ = pe.child.try_wait();
            } else {
                let pid = pe.pgid;
                std::thread::spawn(move || {
                    // SAFETY: waitpid on our own child, not reaped yet; a null status
                    // pointer is allowed.
                    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                });
            }
        }
    }

    /// Marks the groups of reaped PEs that have no process left (one /proc scan, only
    /// while some reaped PE's group is not known to be gone).
    fn note_gone_groups(&mut self) {
        let open: Vec<libc::pid_t> = self
            .pes
            .iter()
            .filter(|pe| pe.exit.is_some() && !pe.group_gone)
            .map(|pe| pe.pgid)
            .collect();
        if open.is_empty() {
            return;
        }
        let live = live_groups_in(Path::new("/proc"), &open);
        for pe in &mut self.pes {
            if pe.exit.is_some() && !pe.group_gone && !live.contains(&pe.pgid) {
                // No process is left to join the group again: it is never signalled from
                // now on, so its leader's zombie may go.
                pe.group_gone = true;
                let _ = pe.child.try_wait();
            }
        }
    }

    fn running(&self) -> usize {
        self.pes.iter().filter(|pe| pe.exit.is_none()).count()
    }

    fn signal_all(&self, sig: libc::c_int) {
        // A PE is reaped only once its group was found empty (see `reap`), so the id of
        // every group not known to be gone is still reserved by its leader, running or a
        // zombie. A PE still running is also signalled itself, in case it left its group.
        for pe in &self.pes {
            if !pe.group_gone {
                signal_group(pe.pgid, sig);
            }
            // SAFETY (both calls): no memory-safety preconditions; `pgid` is the pid of a
            // PE that has not been reaped, so it names that PE. Signalled by pid only when
            // it left its group, so it does not get the signal twice.
            if pe.exit.is_none() && pe.pgid > 1 && unsafe { libc::getpgid(pe.pgid) } != pe.pgid {
                unsafe { libc::kill(pe.pgid, sig) };
            }
        }
    }

    /// Whether any process of any PE's group is still alive (zombies do not count).
    fn any_group_alive(&self) -> bool {
        let groups: Vec<libc::pid_t> = self
            .pes
            .iter()
            .filter(|pe| !pe.group_gone)
            .map(|pe| pe.pgid)
            .filter(|&pgid| signal_group(pgid, 0))
            .collect();
        // kill(-pgid, 0) also succeeds for zombies: processes a PE left behind are
        // reparented to init, which may be slow to reap them (or never, in a container).
        !groups.is_empty() && live_members_in(Path::new("/proc"), &groups)
    }

    /// After a failure: the first PE the bootstrap root saw die (`first_death`) and its
    /// exit, waiting up to [`DEATH_REAP_WAIT`] (relaying output) for it to be reaped; None
    /// when the root saw no death, or that PE is still running (it closed its connection
    /// but lives on). PEs reaped meanwhile are added to `batch`.
    fn root_first_death(
        &mut self,
        first_death: &dyn Fn() -> Option<usize>,
        batch: &mut Vec<(usize, PeExit)>,
    ) -> Option<(usize, PeExit)> {
        let rank = first_death().filter(|&r| r < self.pes.len())?;
        let deadline = Instant::now() + DEATH_REAP_WAIT;
        loop {
            if let Some(exit) = self.pes[rank].exit {
                return Some((rank, exit));
            }
            if Instant::now() >= deadline {
                return None;
            }
            self.output.pump(Duration::from_millis(5));
            for r in self.reap() {
                batch.push((r, self.pes[r].exit.unwrap_or(PeExit::Unknown)));
            }
        }
    }

    /// Relays output and waits for every PE, stopping the job on the first failure or on
    /// a signal (when `signals` is given). `first_death` returns the first PE the bootstrap
    /// root saw die, if any (see [`blame`]). Returns once every PE has ended, or
    /// [`KILL_WAIT`] after SIGKILL (a PE still alive then is reaped by a thread of its own
    /// whenever it ends).
    pub(super) fn supervise(
        mut self,
        signals: Option<&SignalGuard>,
        first_death: &dyn Fn() -> Option<usize>,
        exited: &dyn Fn(usize, &str),
    ) -> Report {
        let mut first_failure: Option<(usize, PeExit)> = None;
        let mut interrupted_by = None;
        // Some(deadline for SIGKILL) once the job is being stopped.
        let mut stopping: Option<Instant> = None;
        let mut killed = false;
        // When SIGKILL was sent, for the bound on waiting after it; whether the PEs still
        // alive then were named.
        let mut killed_at: Option<Instant> = None;
        let mut noted = false;
        let mut signals_seen = 0;

        loop {
            self.output.pump(POLL_INTERVAL);
            let mut batch: Vec<(usize, PeExit)> = self
                .reap()
                .into_iter()
                .map(|rank| (rank, self.pes[rank].exit.unwrap_or(PeExit::Unknown)))
                .collect();
            let failed = batch.iter().any(|(_, exit)| !exit.is_success());
            if stopping.is_none() && first_failure.is_none() && failed {
                // The first PE the root saw die is blamed when it failed itself (a crash,
                // a non-zero exit); one that exited 0 without finalize is named after the
                // failure, which keeps its own code (it may have nothing to do with it).
                let root_first = self.root_first_death(first_death, &mut batch);
                let (crashed, left) = match root_first {
                    Some((r, exit)) if exit.is_success() => (None, Some(r)),
                    other => (other, None),
                };
                if let Some((rank, exit)) = blame(&batch, crashed) {
                    first_failure = Some((rank, exit));
                    say(format_args!("rshmem run: PE {rank} {}", exit.describe()));
                }
                if let Some(r) = left {
                    say(format_args!(
                        "rshmem run: PE {r} had left the job first, exiting 0 without \
                         finalize: the other PEs' failures may follow from it"
                    ));
                }
            }
            // The root learns of every process that ended, those reaped while the first
            // death was looked up included (it matters for one that never joined: nothing
            // else would tell the other PEs).
            for (rank, exit) in &batch {
                exited(*rank, &exit.describe());
            }

            if let Some((sig, count)) = signals.map(|s| s.received()) {
                if count > signals_seen {
                    signals_seen = count;
                    if stopping.is_none() {
                        let running = self.running();
                        say(format_args!(
                            "rshmem run: interrupted, stopping {running} PE{}",
                            if running == 1 { "" } else { "s" }
                        ));
                        // A PE's failure seen in the same round keeps its exit code.
                        if first_failure.is_none() {
                            interrupted_by = sig;
                        }
                        self.signal_all(libc::SIGTERM);
                        stopping = Some(Instant::now() + STOP_GRACE);
                    } else if !killed {
                        // A signal counts for the exit status also while only what a
                        // successful job left behind is being stopped (before
                        // 2026-12-07 such a job exited 0).
                        let leftovers = first_failure.is_none() && interrupted_by.is_none();
                        let again = interrupted_by.is_some();
                        if leftovers {
                            interrupted_by = sig;
                        }
                        say(format_args!(
                            "rshmem run: interrupted {}, sending SIGKILL",
                            // Stopping for neither a failure nor a signal: only the
                            // leftovers of a job that succeeded are being stopped.
                            if leftovers {
                                "while stopping what the PEs left behind"
                            } else if again {
                                "again"
                            } else {
                                "while stopping the PEs after the failure"
                            }
                        ));
                        self.signal_all(libc::SIGKILL);
                        killed = true;
                        killed_at = Some(Instant::now());
                    }
                }
            }

            if stopping.is_none() && first_failure.is_some() {
                let running = self.running();
                if running > 0 {
                    say(format_args!(
                        "rshmem run: stopping {running} remaining PE{}",
                        if running == 1 { "" } else { "s" }
                    ));
                }
                self.signal_all(libc::SIGTERM);
                stopping = Some(Instant::now() + STOP_GRACE);
            }

            let all_reaped = self.running() == 0;
            match stopping {
                // Every PE ended well, but processes it started are still in its group
                // (a background job of a shell): they are stopped as on a failure, as
                // Slurm ends a step's processes, so none outlives the job holding its
                // output pipe or a GPU. A process started with setsid is not in the group.
                None if all_reaped && self.any_group_alive() => {
                    say(format_args!(
                        "rshmem run: every PE ended; stopping the processes they left \
                         behind in their process groups"
                    ));
                    self.signal_all(libc::SIGTERM);
                    stopping = Some(Instant::now() + STOP_GRACE);
                }
                None if all_reaped => break,
                None => {}
                Some(deadline) => {
                    let past_deadline = Instant::now() >= deadline;
                    if past_deadline && !killed {
                        let running = self.running();
                        if running > 0 {
                            say(format_args!(
                                "rshmem run: {running} PE{} still alive after {} s, sending SIGKILL",
                                if running == 1 { "" } else { "s" },
                                STOP_GRACE.as_secs()
                            ));
                        }
                        self.signal_all(libc::SIGKILL);
                        killed = true;
                        killed_at = Some(Instant::now());
                    }
                    // Wait for the PEs' own children too, until the deadline.
                    if all_reaped && (killed || !self.any_group_alive()) {
                        break;
                    }
                    // A PE that outlives SIGKILL (stuck in the kernel) is named and given
                    // up on: its exit is unknown, so the job fails (before 2026-12-07 the
                    // launcher waited for it without end).
                    let since_kill = killed_at.map_or(Duration::ZERO, |t| t.elapsed());
                    if since_kill >= KILL_NOTE {
                        let alive: Vec<usize> = (0..self.pes.len())
                            .filter(|&r| self.pes[r].exit.is_none())
                            .collect();
                        let a: Vec<String> = alive.iter().map(|r| r.to_string()).collect();
                        let named =
                            format!("PE{} {}", if a.len() == 1 { "" } else { "s" }, a.join(", "));
                        if !noted {
                            noted = true;
                            say(format_args!(
                                "rshmem run: {named} still not ended {} s after SIGKILL; \
                                 waiting up to {} s",
                                KILL_NOTE.as_secs(),
                                KILL_WAIT.as_secs()
                            ));
                        }
                        if since_kill >= KILL_WAIT {
                            say(format_args!(
                                "rshmem run: {named} still not ended {} s after SIGKILL; giving up",
                                KILL_WAIT.as_secs()
                            ));
                            if first_failure.is_none() && interrupted_by.is_none() {
                                if let Some(&r) = alive.first() {
                                    first_failure = Some((r, PeExit::Unknown));
                                }
                            }
                            break;
                        }
                    }
                }
            }
        }

        self.output.drain(DRAIN_TIMEOUT);
        self.reap_ended();
        Report {
            pe_exits: self
                .pes
                .iter()
                .map(|pe| pe.exit.unwrap_or(PeExit::Unknown))
                .collect(),
            first_failure,
            interrupted_by,
            signals_seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn killing_after_a_failed_start_is_bounded() {
        // PE 1's recorded group is not its own (a stand-in for a process SIGKILL does not
        // end at once: one in uninterruptible sleep): the reap gives it up after the bound
        // and names it, instead of waiting for it without end; PE 0 dies and is reaped.
        let mut c0 = Command::new("sleep");
        c0.arg("30").process_group(0);
        let c0 = c0.spawn().unwrap();
        let c1 = Command::new("sleep").arg("30").spawn().unwrap();
        let (p0, p1) = (c0.id() as libc::pid_t, c1.id() as libc::pid_t);
        let pe = |child, pgid| Pe {
            child,
            pgid,
            exit: None,
            group_gone: false,
        };
        let mut job = Job {
            // A group id no process has (pid_max is at most 2^22).
            pes: vec![pe(c0, p0), pe(c1, (1 << 22) + 7)],
            output: OutputPump::new(),
        };
        let t0 = Instant::now();
        let left = job.kill_all_now(Duration::from_millis(100), Duration::from_millis(300));
        assert_eq!(left, vec![1]);
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(matches!(job.pes[0].child.try_wait(), Ok(Some(_))));
        // SAFETY: kill on our own child's pid, still unreaped (a zombie at worst).
        unsafe { libc::kill(p1, libc::SIGKILL) };
        let _ = job.pes[1].child.wait();
    }

    #[test]
    fn exit_descriptions() {
        assert_eq!(PeExit::Code(7).describe(), "exited with code 7");
        assert_eq!(PeExit::Code(7).shell_code(), 7);
        assert_eq!(
            PeExit::Signal(9).describe(),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(PeExit::Signal(9).shell_code(), 137);
        assert_eq!(PeExit::Signal(64).describe(), "was killed by signal 64");
    }

    #[test]
    fn blame_prefers_the_roots_first_death_then_a_signal() {
        use PeExit::{Code, Signal};
        // Nothing failed: nobody is named, whatever the root saw.
        assert_eq!(blame(&[(0, Code(0))], Some((2, Code(0)))), None);
        // Survivors told of PE 2's death exit 1; PE 2 exited 0 without finalize.
        assert_eq!(
            blame(&[(0, Code(1)), (1, Code(1))], Some((2, Code(0)))),
            Some((2, Code(0)))
        );
        assert_eq!(
            blame(&[(0, Code(1)), (2, Signal(9))], Some((2, Signal(9)))),
            Some((2, Signal(9)))
        );
        // No death seen by the root: a signal before a code, then the lowest rank.
        assert_eq!(
            blame(&[(0, Code(1)), (1, Code(0)), (3, Signal(11))], None),
            Some((3, Signal(11)))
        );
        assert_eq!(
            blame(&[(0, Code(0)), (1, Code(3)), (2, Code(4))], None),
            Some((1, Code(3)))
        );
        assert_eq!(
            blame(&[(4, Code(0)), (5, PeExit::Unknown)], None),
            Some((5, PeExit::Unknown))
        );
    }

    #[test]
    fn exit_code_of_a_pe_that_exited_0_without_finalize_is_1() {
        let report = |first_failure, interrupted_by| Report {
            pe_exits: Vec::new(),
            first_failure,
            interrupted_by,
            signals_seen: 0,
        };
        assert_eq!(report(Some((2, PeExit::Code(0))), None).exit_code(), 1);
        assert_eq!(report(Some((2, PeExit::Code(7))), None).exit_code(), 7);
        assert_eq!(report(Some((2, PeExit::Signal(9))), None).exit_code(), 137);
        assert_eq!(report(None, Some(libc::SIGHUP)).exit_code(), 129);
        assert_eq!(report(None, None).exit_code(), 0);
    }

    #[test]
    fn stat_parsing() {
        assert_eq!(
            parse_stat(b"42 (a) b (c)) S 1 4242 4242 0 -1 4194560"),
            Some((b'S', 4242))
        );
        assert_eq!(parse_stat(b"42 (sleep) Z 1 17 17 0"), Some((b'Z', 17)));
        assert_eq!(parse_stat(b"garbage"), None);
    }

    #[test]
    fn own_group_is_live() {
        // SAFETY: getpgrp has no preconditions.
        let pgrp = unsafe { libc::getpgrp() };
        assert!(live_members_in(Path::new("/proc"), &[pgrp]));
        assert!(!live_members_in(Path::new("/proc"), &[i32::MAX]));
        assert_eq!(
            live_groups_in(Path::new("/proc"), &[i32::MAX, pgrp, pgrp]),
            vec![pgrp]
        );
        assert_eq!(
            live_groups_in(Path::new("/nonexistent-proc"), &[i32::MAX]),
            vec![i32::MAX]
        );
    }

    #[test]
    fn resolves_like_execvp() {
        let sh = resolve_program(OsStr::new("sh")).expect("sh is in PATH");
        assert!(sh.is_absolute() || sh.starts_with("."));
        assert!(resolve_program(OsStr::new("/bin/sh")).is_ok());
        let missing = resolve_program(OsStr::new("rshmem-no-such-program")).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "launcher: program `rshmem-no-such-program` not found in PATH"
        );
        assert!(resolve_program(OsStr::new("/etc/passwd")).is_err());
        assert!(resolve_program(OsStr::new("/")).is_err());
        assert!(resolve_program(OsStr::new("")).is_err());
    }
}
