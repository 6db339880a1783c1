//! Relaying PE output as whole, prefixed lines.
//!
//! One thread (the supervisor) polls every PE's stdout and stderr pipe and cuts what it
//! reads into complete lines, each prefixed with `[pe N] `. It never writes them itself:
//! it queues them for one writer thread per launcher stream (stdout, stderr), so that a
//! stream nobody reads (`rshmem run ... | cmd` where cmd stopped reading) blocks only its
//! writer, and the supervisor still sees PEs fail, stops them and acts on signals. While
//! [`BACKLOG_LIMIT`] bytes wait for a stream, the pipes relayed to it are not read: the
//! PEs writing them block, as they would writing to that stream themselves. Because a
//! line is only ever queued whole and one thread writes a stream's queue in order, lines
//! of different PEs never mix.

use super::MAX_LINE;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes queued for one launcher stream past which the pipes relayed to it are no longer
/// read until its writer catches up.
pub(super) const BACKLOG_LIMIT: usize = 4 << 20;

/// Which of the launcher's streams a pipe is relayed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Stdout,
    Stderr,
}

/// Cuts a byte stream into lines and prefixes them.
#[derive(Debug)]
pub(super) struct LineSplitter {
    prefix: Vec<u8>,
    pending: Vec<u8>,
    max_line: usize,
}

impl LineSplitter {
    pub(super) fn new(prefix: Vec<u8>, max_line: usize) -> LineSplitter {
        LineSplitter {
            prefix,
            pending: Vec::new(),
            max_line: max_line.max(1),
        }
    }

    /// Appends `data`; every line it completes goes to `out`, prefixed, with its newline.
    /// A pending line reaching `max_line` bytes is emitted as a line of its own.
    pub(super) fn push(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            // `pending` holds at most `max_line` bytes; look one byte further for the
            // newline so that a line of exactly `max_line` bytes is not cut.
            let room = self.max_line - self.pending.len();
            let window = &data[..data.len().min(room + 1)];
            match window.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.emit(&window[..=i], false, out);
                    data = &data[i + 1..];
                }
                None if window.len() > room => {
                    self.emit(&window[..room], true, out);
                    data = &data[room..];
                }
                None => {
                    self.pending.extend_from_slice(window);
                    data = &[];
                }
            }
        }
    }

    /// End of stream: a pending partial line goes to `out` with a newline added.
    pub(super) fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.pending.is_empty() {
            self.emit(&[], true, out);
        }
    }

    fn emit(&mut self, tail: &[u8], add_newline: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(&self.pending);
        out.extend_from_slice(tail);
        if add_newline {
            out.push(b'\n');
        }
        self.pending.clear();
    }
}

struct Source {
    pipe: std::fs::File,
    target: Target,
    lines: LineSplitter,
}

/// All PE pipes still open, relayed by [`OutputPump::pump`].
pub(super) struct OutputPump {
    sources: Vec<Source>,
    buf: Vec<u8>,
}

impl OutputPump {
    pub(super) fn new() -> OutputPump {
        OutputPump {
            sources: Vec::new(),
            buf: vec![0; 64 * 1024],
        }
    }

    /// Relays `pipe` to `target` with the prefix `[pe <rank>] `.
    pub(super) fn add(
        &mut self,
        rank: usize,
        pipe: impl Into<std::os::fd::OwnedFd>,
        target: Target,
    ) {
        self.sources.push(Source {
            pipe: std::fs::File::from(pipe.into()),
            target,
            lines: LineSplitter::new(format!("[pe {rank}] ").into_bytes(), MAX_LINE),
        });
    }

    /// Whether every pipe reached end of stream.
    pub(super) fn is_done(&self) -> bool {
        self.sources.is_empty()
    }

    /// Waits up to `timeout` for output and relays what arrived. Sleeps for `timeout` when
    /// no pipe is open.
    pub(super) fn pump(&mut self, timeout: Duration) {
        self.pump_within(timeout, true);
    }

    /// [`OutputPump::pump`]; `bounded`: pipes whose stream has [`BACKLOG_LIMIT`] bytes
    /// waiting are not read.
    fn pump_within(&mut self, timeout: Duration, bounded: bool) {
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        let full = |t: Target| bounded && stream(t).backlog() >= BACKLOG_LIMIT;
        let (out_full, err_full) = (full(Target::Stdout), full(Target::Stderr));
        let mut fds: Vec<libc::pollfd> = self
            .sources
            .iter()
            .map(|s| libc::pollfd {
                // A negative fd is ignored by poll: this pipe waits for its stream.
                fd: match s.target {
                    Target::Stdout if out_full => -1,
                    Target::Stderr if err_full => -1,
                    _ => s.pipe.as_raw_fd(),
                },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd
        // structs (a null pointer with length 0 when empty, which poll accepts); the fds
        // are open, owned by `self.sources`, for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if ready <= 0 {
            // Timeout, or EINTR from a signal the supervisor will look at.
            return;
        }
        let mut closed = Vec::new();
        for (i, pfd) in fds.iter().enumerate() {
            if pfd.revents == 0 {
                continue;
            }
            // Looked at again before each read: many pipes ready in one round would each
            // add a read's worth (64 KiB) past the limit.
            if full(self.sources[i].target) {
                continue;
            }
            if !self.read_one(i) {
                closed.push(i);
            }
        }
        for i in closed.into_iter().rev() {
            self.sources.swap_remove(i);
        }
    }

    /// Relays everything still pending (at most `timeout` of waiting), then closes all
    /// pipes, flushing partial lines. Pipes can stay open past the PEs when a PE left a
    /// process behind that holds them. The PEs are gone, so what their pipes hold is
    /// queued whatever the backlog ([`flush`] writes it).
    pub(super) fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.is_done() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.pump_within((deadline - now).min(Duration::from_millis(50)), false);
        }
        for mut s in self.sources.drain(..) {
            let mut out = Vec::new();
            s.lines.finish(&mut out);
            write_to(s.target, &out);
        }
    }

    /// One read from source `i`; false at end of stream (or a read error).
    fn read_one(&mut self, i: usize) -> bool {
        let source = &mut self.sources[i];
        let mut out = Vec::new();
        let open = loop {
            match source.pipe.read(&mut self.buf) {
                Ok(0) => {
                    source.lines.finish(&mut out);
                    break false;
                }
                Ok(n) => {
                    source.lines.push(&self.buf[..n], &mut out);
                    break true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    source.lines.finish(&mut out);
                    break false;
                }
            }
        };
        write_to(source.target, &out);
        open
    }
}

/// Queues `bytes` (whole lines) for the launcher's stream; its writer thread writes them.
pub(super) fn write_to(target: Target, bytes: &[u8]) {
    if !bytes.is_empty() {
        stream(target).queue(bytes.to_vec());
    }
}

/// [`write_to`] stderr for a log line of the launcher's own (the bootstrap root's): dropped
/// while stderr has [`BACKLOG_LIMIT`] + 4 MiB bytes waiting, so that lines nobody reads (a
/// stderr that is stuck, and something that keeps connecting to the root's port) cannot
/// grow the queue without end. The PEs' relayed output stops at about [`BACKLOG_LIMIT`]
/// (one read past it), so a slow reader of busy PEs' stderr still gets these lines: only
/// log lines use the room above.
pub(super) fn log_line(line: &str) {
    if stream(Target::Stderr).backlog() < BACKLOG_LIMIT + (4 << 20) {
        write_to(Target::Stderr, line.as_bytes());
    }
}

/// [`flush`] for at most `limit` (or until `stop`).
pub(super) fn flush_within(limit: Duration, stop: &dyn Fn() -> bool) -> usize {
    let give_up = Instant::now() + limit;
    flush(&|| stop() || Instant::now() >= give_up)
}

/// Waits until everything queued for the launcher's stdout and stderr was written (or
/// dropped on a write error), or until `stop` returns true (checked every 50 ms). Returns
/// the bytes still queued: 0 unless stopped.
///
/// Not bounded by time: it waits for the reader of the launcher's own output (a pager, a
/// pipeline), as any program writing to a pipe does. Callers have stopped every PE before
/// and pass a `stop` that sees the launcher's signals, so Ctrl-C ends the wait.
pub(super) fn flush(stop: &dyn Fn() -> bool) -> usize {
    loop {
        let left = stream(Target::Stdout).backlog() + stream(Target::Stderr).backlog();
        if left == 0 || stop() {
            return left;
        }
        stream(Target::Stdout).wait_below(1, Duration::from_millis(25));
        stream(Target::Stderr).wait_below(1, Duration::from_millis(25));
    }
}

/// The queue of one launcher stream and its writer thread.
struct Stream {
    target: Target,
    queue: Mutex<Queue>,
    /// Signalled when bytes are queued (for the writer) and when bytes were written (for
    /// [`Stream::wait_below`]).
    changed: Condvar,
}

struct Queue {
    chunks: VecDeque<Vec<u8>>,
    /// Bytes queued plus the bytes of the chunk being written.
    bytes: usize,
    writer_started: bool,
}

static STDOUT: Stream = Stream::new(Target::Stdout);
static STDERR: Stream = Stream::new(Target::Stderr);

fn stream(target: Target) -> &'static Stream {
    match target {
        Target::Stdout => &STDOUT,
        Target::Stderr => &STDERR,
    }
}

impl Stream {
    const fn new(target: Target) -> Stream {
        Stream {
            target,
            queue: Mutex::new(Queue {
                chunks: VecDeque::new(),
                bytes: 0,
                writer_started: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // The writer holds the lock only to move chunks and counts, which cannot panic
        // half-done: a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backlog(&self) -> usize {
        self.lock().bytes
    }

    fn queue(&'static self, bytes: Vec<u8>) {
        let mut q = self.lock();
        if !q.writer_started {
            let spawned = std::thread::Builder::new()
                .name(format!("rshmem-run-{:?}", self.target).to_lowercase())
                .spawn(move || self.write_forever());
            if spawned.is_err() {
                // No thread to be had: write here, as before there were writer threads.
                drop(q);
                write_now(self.target, &bytes);
                return;
            }
            q.writer_started = true;
        }
        q.bytes += bytes.len();
        q.chunks.push_back(bytes);
        drop(q);
        self.changed.notify_all();
    }

    /// The writer thread: writes chunks in the order they were queued. It lives as long as
    /// the process and idles on the condition variable between jobs.
    fn write_forever(&self) {
        let mut q = self.lock();
        loop {
            let Some(chunk) = q.chunks.pop_front() else {
                q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            drop(q);
            write_now(self.target, &chunk);
            q = self.lock();
            q.bytes -= chunk.len();
            self.changed.notify_all();
        }
    }

    /// Waits at most `timeout` for the backlog to drop below `bytes`.
    fn wait_below(&self, bytes: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut q = self.lock();
        while q.bytes >= bytes {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            q = self
                .changed
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Whether the launcher's stdout and stderr are one file (`2>&1`, a terminal, one log
/// file): then the two writer threads take turns ([`TOGETHER`]), or a chunk of one could
/// be spliced into the other's (a pipe write past 4 KiB is not atomic).
fn one_file() -> bool {
    static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONE.get_or_init(|| {
        let id = |fd| {
            // SAFETY: fstat writes one stat struct into `st`, a valid local; a closed fd
            // gives an error, checked before `st` is read.
            unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
            }
        };
        matches!((id(1), id(2)), (Some(a), Some(b)) if a == b)
    })
}

/// Held around each write while stdout and stderr are one file ([`one_file`]).
static TOGETHER: Mutex<()> = Mutex::new(());

/// Writes `bytes` to the launcher's stream in one locked write. Errors (e.g. a closed
/// stdout, EPIPE, or EIO from a terminal that is gone) drop the bytes: losing output must
/// not stop the launcher.
fn write_now(target: Target, bytes: &[u8]) {
    // A poisoned lock guards nothing that can be half done: take it anyway.
    let _turn = one_file().then(|| TOGETHER.lock().unwrap_or_else(|e| e.into_inner()));
    match target {
        Target::Stdout => {
            let mut out = io::stdout().lock();
            let _ = out.write_all(bytes);
            let _ = out.flush();
        }
        Target::Stderr => {
            let _ = io::stderr().lock().write_all(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], max: usize) -> Vec<u8> {
        let mut s = LineSplitter::new(b"[pe 2] ".to_vec(), max);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        out
    }

    #[test]
    fn lines_across_chunks_are_prefixed_once() {
        assert_eq!(
            split(&[b"ab", b"c\nde", b"f\n\n"], 100),
            b"[pe 2] abc\n[pe 2] def\n[pe 2] \n".to_vec()
        );
    }

    #[test]
    fn partial_last_line_gets_a_newline() {
        assert_eq!(split(&[b"x\ny"], 100), b"[pe 2] x\n[pe 2] y\n".to_vec());
        assert_eq!(split(&[b""], 100), b"".to_vec());
    }

    #[test]
    fn invalid_utf8_passes_through() {
        assert_eq!(split(&[b"\xff\xfe\n"], 100), b"[pe 2] \xff\xfe\n".to_vec());
    }

    #[test]
    fn long_lines_are_cut_at_max() {
        assert_eq!(
            split(&[b"abcdefg\nhi"], 3),
            b"[pe 2] abc\n[pe 2] def\n[pe 2] g\n[pe 2] hi\n".to_vec()
        );
        // A line of exactly max bytes plus its newline is not cut.
        assert_eq!(split(&[b"abc\n"], 3), b"[pe 2] abc\n".to_vec());
        assert_eq!(
            split(&[b"abc", b"\nd"], 3),
            b"[pe 2] abc\n[pe 2] d\n".to_vec()
        );
    }
}
