//! SIGINT, SIGTERM, SIGHUP and SIGQUIT handling while a job runs.
//!
//! All four stop the job the same way (the launcher exits 128 + the signal), unless the
//! launcher was started with the signal ignored (`nohup`, a script's background job):
//! then it stays ignored, for the launcher and its PEs. SIGHUP
//! matters most when the launcher runs in an ssh session or terminal that goes away: its
//! default action would kill the launcher at once, and though `PR_SET_PDEATHSIG` takes the
//! PEs along, their own children would live on and `/dev/shm` would not be cleaned.
//!
//! The handler only records the signal in two atomics; the supervisor loop polls them
//! every few milliseconds (its `poll` also returns early with EINTR when the signal lands
//! on its thread). Nothing else is shared between handler and supervisor, so Relaxed
//! ordering is enough: the atomics publish no other memory, and the supervisor needs only
//! the values themselves, which it observes eventually (within one poll round).
//! `LAUNCHER_PID` is written before the handlers are installed; a handler that saw a
//! stale 0 would merely record the signal, the safe default.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// The last signal received (0: none).
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How many signals were received since install.
static SIGNAL_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Whether a [`SignalGuard`] exists (the handlers are process-wide).
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The launcher's pid, to recognise a forked PE that has not exec'd yet.
static LAUNCHER_PID: AtomicI32 = AtomicI32::new(0);

/// The signals that stop the job.
const CAUGHT: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

extern "C" fn record_signal(sig: libc::c_int) {
    // A PE between fork and exec still has this handler. Were the launcher's SIGTERM
    // recorded here, the PE would exec and never see it; so it dies of the signal instead,
    // as it would with the default disposition it gets at exec.
    // SAFETY: getpid, signal and raise are async-signal-safe system calls.
    unsafe {
        let launcher = LAUNCHER_PID.load(Ordering::Relaxed);
        if launcher != 0 && libc::getpid() != launcher {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
            return;
        }
    }
    // Only lock-free atomic operations: async-signal-safe.
    LAST_SIGNAL.store(sig, Ordering::Relaxed);
    // Release: a reader that sees this count sees the signal stored above.
    SIGNAL_COUNT.fetch_add(1, Ordering::Release);
}

/// Handlers for the [`CAUGHT`] signals installed for the life of the guard; the previous
/// dispositions come back when it is dropped.
pub(super) struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    pub(super) fn install() -> Result<SignalGuard> {
        if INSTALLED.swap(true, Ordering::Relaxed) {
            return Err(Error::Launch(
                "another launch already handles SIGINT/SIGTERM/SIGHUP/SIGQUIT in this process"
                    .to_string(),
            ));
        }
        LAUNCHER_PID.store(std::process::id() as i32, Ordering::Relaxed);
        LAST_SIGNAL.store(0, Ordering::Relaxed);
        SIGNAL_COUNT.store(0, Ordering::Relaxed);
        let mut guard = SignalGuard {
            previous: Vec::new(),
        };
        for sig in CAUGHT {
            // A signal the launcher was started with ignored stays ignored, for it and its
            // PEs (an ignored disposition survives exec): `nohup rshmem run ...` must
            // outlive its terminal, and a shell starts background jobs of a script with
            // SIGINT and SIGQUIT ignored.
            // SAFETY: a zeroed sigaction is valid storage for the current action.
            let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a null new action only reads the current one into `current`.
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut current) } == 0
                && current.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            // SAFETY: sigaction is plain old data; all-zero is a valid (empty) value that
            // we fill in before use.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = record_signal as extern "C" fn(libc::c_int) as usize;
            // SA_RESTART: the writer threads' blocking writes to stdout/stderr resume
            // after the handler; poll is never restarted, so the supervisor still wakes up.
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: `action.sa_mask` is a valid sigset_t owned by `action`.
            unsafe { libc::sigemptyset(&mut action.sa_mask) };
            // SAFETY: as above, a zeroed sigaction is valid storage for the old action.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are valid for the call; the handler only touches
            // atomics, which is async-signal-safe.
            if unsafe { libc::sigaction(sig, &action, &mut old) } != 0 {
                let e = std::io::Error::last_os_error();
                drop(guard); // restores what was installed so far
                return Err(Error::io(
                    format!("installing a handler for signal {sig}"),
                    e,
                ));
            }
            guard.previous.push((sig, old));
        }
        Ok(guard)
    }

    /// The last signal received and how many arrived so far.
    pub(super) fn received(&self) -> (Option<i32>, usize) {
        // The count first (Acquire, pairs with the handler's Release): a signal counted
        // here has its number stored, so a new count never comes with no signal (before
        // 2026-12-07 the signal was read first, and one landing between the two loads
        // gave a new count with the old signal, or none).
        let count = SIGNAL_COUNT.load(Ordering::Acquire);
        let sig = LAST_SIGNAL.load(Ordering::Relaxed);
        ((sig != 0).then_some(sig), count)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in self.previous.drain(..) {
            // SAFETY: `old` is the action sigaction returned for this signal; restoring
            // it is always valid. A null pointer for the old action is allowed.
            unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
        }
        INSTALLED.store(false, Ordering::Relaxed);
    }
}
