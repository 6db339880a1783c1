//! One PE's connection to the bootstrap root.
//!
//! Owns the PE side of the protocol: connecting (retrying while the root is not up yet),
//! the hello/welcome handshake, per-group collective sequence numbers, and a reader thread
//! that delivers replies and death reports. Every wait is bounded by the join timeout and
//! ends early when [`Liveness`] reports a death. It must not keep process-global state:
//! several `Bootstrap`s may live in one process.
use super::wire::{self, CollectiveOp, Contribution, FailKind, Frame, Hello, ReadError, MAX_FRAME};
use super::{lock, socket, Group, Liveness};
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Pause between connection attempts while the root is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_millis(15);
/// Longest single connection attempt (a SYN to a silent host).
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);
/// How long a timed-out join waits for the root to say how many PEs joined.
const STATUS_WAIT: Duration = Duration::from_millis(500);
/// Upper bound on waiting for the root's finalize acknowledgement.
const FINALIZE_WAIT: Duration = Duration::from_secs(5);

/// What a PE needs to join.
#[derive(Debug, Clone)]
pub struct JoinParams {
    pub rank: usize,
    pub world_size: usize,
    pub root_addr: String,
    pub token: String,
    pub node_id: String,
    pub timeout: Duration,
}

/// One PE's connection to the root.
///
/// `Bootstrap` is `Send + Sync`: collectives on different groups may run concurrently from
/// different threads. Dropping it without [`Bootstrap::finalize`] closes the connection,
/// and the root reports this PE as dead to every other PE (a PE whose handle is dropped
/// mid-job breaks the job).
pub struct Bootstrap {
    rank: usize,
    world_size: usize,
    job_id: String,
    node_ids: Vec<String>,
    timeout: Duration,
    root_addr: String,
    /// Serialises frames written to the root.
    writer: Mutex<TcpStream>,
    shared: Arc<ClientShared>,
    /// Next sequence number per group uid.
    seqs: Mutex<HashMap<u64, u64>>,
    reader: Option<JoinHandle<()>>,
}

/// State shared with the reader thread.
struct ClientShared {
    liveness: Arc<Liveness>,
    inbox: Mutex<Inbox>,
    /// Signalled (with `inbox` locked in between) whenever the inbox or liveness changes.
    wake: Condvar,
}

#[derive(Default)]
struct Inbox {
    replies: HashMap<(u64, u64), Reply>,
    /// Calls that returned before their reply came (a timeout, a death): the reply is
    /// dropped when it comes instead of being kept until the PE leaves.
    abandoned: HashSet<(u64, u64)>,
    /// This PE closed the connection after a write to the root failed (why): the reader
    /// reports that, not a lost root.
    write_failed: Option<String>,
    finalize_acked: bool,
    /// The reader thread has stopped (connection closed).
    closed: bool,
    /// This PE is leaving (finalize or drop): a close is expected, not a lost root.
    leaving: bool,
}

enum Reply {
    Done(Vec<Vec<u8>>),
    Failed(FailKind, String),
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Shows a member list, shortened for large teams.
fn show_members(m: &[u32]) -> String {
    if m.len() <= 16 {
        format!("{m:?}")
    } else {
        format!("{:?}... ({} members)", &m[..16], m.len())
    }
}

impl Bootstrap {
    /// Connects to the root at `p.root_addr` (retrying while it is not listening yet),
    /// says hello and waits until every PE of the job has joined. Bounded by `p.timeout`.
    pub fn join(p: &JoinParams) -> Result<Bootstrap> {
        if p.world_size == 0 || p.world_size > u32::MAX as usize || p.rank >= p.world_size {
            return Err(Error::InvalidArgument(format!(
                "joining as rank {} of a {}-PE job: the rank must be below the job size",
                p.rank, p.world_size
            )));
        }
        if p.timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the bootstrap timeout must be positive".into(),
            ));
        }
        let start = Instant::now();
        let deadline = start + p.timeout;
        let mut stream = connect(p, start, deadline)?;
        let ctx = |what: &str| format!("{what} (rank {}, root {})", p.rank, p.root_addr);
        socket::tune(&stream).map_err(|e| Error::bootstrap(ctx("configuring the socket"), e))?;
        stream
            .set_write_timeout(Some(p.timeout))
            .map_err(|e| Error::bootstrap(ctx("configuring the socket"), e))?;
        let hello = Frame::Hello(Hello {
            magic: wire::MAGIC,
            version: wire::PROTOCOL_VERSION,
            token: p.token.as_bytes().to_vec(),
            rank: p.rank as u32,
            world_size: p.world_size as u32,
            node_id: p.node_id.clone(),
        });
        wire::write_frame(&mut stream, &hello)
            .map_err(|e| Error::bootstrap(ctx("sending the hello"), e))?;

        let (job_id, node_ids) = wait_welcome(p, &mut stream, start, deadline)?;
        if node_ids.len() != p.world_size {
            return Err(Error::bootstrap(
                ctx("reading the welcome"),
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} node ids for {} PEs", node_ids.len(), p.world_size),
                ),
            ));
        }
        stream
            .set_read_timeout(None)
            .map_err(|e| Error::bootstrap(ctx("configuring the socket"), e))?;
        let read_half = stream
            .try_clone()
            .map_err(|e| Error::bootstrap(ctx("duplicating the socket"), e))?;
        let shared = Arc::new(ClientShared {
            liveness: Arc::new(Liveness::default()),
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
        });
        let sh = shared.clone();
        let addr = p.root_addr.clone();
        let reader = thread::Builder::new()
            .name(format!("rshmem-bootstrap-{}", p.rank))
            .spawn(move || read_loop(&sh, read_half, &addr))
            .map_err(|e| Error::bootstrap(ctx("spawning the reader thread"), e))?;
        Ok(Bootstrap {
            rank: p.rank,
            world_size: p.world_size,
            job_id,
            node_ids,
            timeout: p.timeout,
            root_addr: p.root_addr.clone(),
            writer: Mutex::new(stream),
            shared,
            seqs: Mutex::new(HashMap::new()),
            reader: Some(reader),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The job id chosen by the root (16 hex characters), the same on every PE.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Every PE's node id, index = rank.
    pub fn node_ids(&self) -> &[String] {
        &self.node_ids
    }

    /// The death record, shareable with threads that poll it in their wait loops.
    pub fn liveness(&self) -> Arc<Liveness> {
        self.shared.liveness.clone()
    }

    /// Every member's `data`, index = position in `g.members` (lengths may differ).
    pub fn allgather(&self, g: &Group, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.collective(CollectiveOp::Allgather, g, 0, data, self.timeout)
    }

    /// [`Bootstrap::allgather`] of one kind of call, named by `tag` (up to 8 bytes, e.g.
    /// `*b"barrier\0"`), that waits at most `timeout` for the other members. The root
    /// pairs it only with calls of the same tag: members at different kinds of call (one
    /// in a team's barrier, another already in its destroy) all fail with
    /// `CollectiveMismatch` naming both, instead of passing each other's call.
    pub fn allgather_tagged(
        &self,
        g: &Group,
        tag: [u8; 8],
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        self.collective(
            CollectiveOp::Allgather,
            g,
            u64::from_le_bytes(tag),
            data,
            timeout,
        )
    }

    /// Replies held for calls not yet collected (diagnostics and tests): a reply to a call
    /// that already returned (it timed out) is dropped when it comes, not held.
    pub fn held_replies(&self) -> usize {
        lock(&self.shared.inbox).replies.len()
    }

    /// Returns once every member of `g` has called `barrier(g)`.
    pub fn barrier(&self, g: &Group) -> Result<()> {
        self.collective(CollectiveOp::Barrier, g, 0, &[], self.timeout)
            .map(|_| ())
    }

    /// The `data` of the member at position `root_index` of `g.members`, on every member
    /// (other members' `data` is ignored and not sent).
    pub fn broadcast(&self, g: &Group, root_index: usize, data: &[u8]) -> Result<Vec<u8>> {
        if root_index >= g.members.len() {
            // Refused here, but counted as a call on the group (see `collective`).
            self.next_seq(g.uid);
            return Err(Error::InvalidArgument(format!(
                "broadcast root index {root_index} on group {} with {} members",
                g.uid,
                g.members.len()
            )));
        }
        let mine = g.members.iter().position(|&m| m as usize == self.rank);
        let data = if mine == Some(root_index) { data } else { &[] };
        let mut out = self.collective(
            CollectiveOp::Broadcast,
            g,
            root_index as u64,
            data,
            self.timeout,
        )?;
        match out.pop() {
            Some(d) if out.is_empty() => Ok(d),
            _ => Err(Error::bootstrap(
                format!("broadcast on group {}", g.uid),
                io::Error::new(io::ErrorKind::InvalidData, "root sent a malformed reply"),
            )),
        }
    }

    /// Leaves the job cleanly: tells the root (so this PE's close is not reported as a
    /// death), waits for its acknowledgement (at most the join timeout, capped at 5 s),
    /// then closes the connection.
    pub fn finalize(self) -> Result<()> {
        let start = Instant::now();
        lock(&self.shared.inbox).leaving = true;
        let sent = {
            let mut w = lock(&self.writer);
            wire::write_frame(&mut *w, &Frame::Finalize)
        };
        if let Err(e) = sent {
            self.shared.liveness.check_strict()?;
            return Err(Error::bootstrap(
                format!("rank {}: sending finalize to {}", self.rank, self.root_addr),
                e,
            ));
        }
        let deadline = start + self.timeout.min(FINALIZE_WAIT);
        let mut inbox = lock(&self.shared.inbox);
        loop {
            if inbox.finalize_acked {
                return Ok(());
            }
            if inbox.closed {
                drop(inbox);
                self.shared.liveness.check_strict()?;
                return Err(Error::PeerDied {
                    pe: 0,
                    detail: format!(
                        "lost the bootstrap root at {} during finalize",
                        self.root_addr
                    ),
                });
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(Error::Timeout {
                    pe: self.rank,
                    what: format!(
                        "the bootstrap root at {} to acknowledge finalize",
                        self.root_addr
                    ),
                    waited_ms: ms(start.elapsed()),
                });
            }
            inbox = self
                .shared
                .wake
                .wait_timeout(inbox, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn check_group(&self, op: CollectiveOp, g: &Group) -> Result<()> {
        let bad = |why: String| {
            Err(Error::InvalidArgument(format!(
                "{} on group {} (members {}): {why}",
                op.name(),
                g.uid,
                show_members(&g.members)
            )))
        };
        if !g.members.iter().any(|&m| m as usize == self.rank) {
            return bad(format!("the calling PE {} is not a member", self.rank));
        }
        if let Some(&m) = g.members.iter().find(|&&m| m as usize >= self.world_size) {
            return bad(format!(
                "{m} is not a PE of this {}-PE job",
                self.world_size
            ));
        }
        let mut sorted = g.members.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("PE {} is listed twice", w[0]));
        }
        Ok(())
    }

    /// Takes this PE's next call number on group `uid`.
    fn next_seq(&self, uid: u64) -> u64 {
        let mut seqs = lock(&self.seqs);
        let s = seqs.entry(uid).or_insert(0);
        let seq = *s;
        *s += 1;
        seq
    }

    fn collective(
        &self,
        op: CollectiveOp,
        g: &Group,
        arg: u64,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let start = Instant::now();
        // The call number is taken before anything can refuse the call here: a call
        // refused on one member only (its payload too large, a bad group or root index)
        // still counts on that member, as the call of every other member does, so the
        // next call of each is paired with the next. (Before 2026-12-07 a refused call took
        // no number, and that member's next call was paired with the others' refused one:
        // an allgather returned their stale data, and every later call was one off.)
        let seq = self.next_seq(g.uid);
        // A refused call is abandoned: a reply the root may still send it (a member's
        // call failed early, or mismatched, and every member is told) is dropped.
        let refused = |e: Error| {
            lock(&self.shared.inbox).abandoned.insert((g.uid, seq));
            Err(e)
        };
        if let Err(e) = self.check_group(op, g) {
            return refused(e);
        }
        let limit = MAX_FRAME.saturating_sub(64 + 4 * g.members.len());
        if data.len() > limit {
            return refused(Error::InvalidArgument(format!(
                "{} of {} bytes on group {}: the bootstrap carries at most {limit} bytes per \
                 call (move bulk data through the symmetric heap)",
                op.name(),
                data.len(),
                g.uid
            )));
        }
        self.shared.liveness.check_strict()?;
        let frame = Frame::Collective(Contribution {
            op,
            uid: g.uid,
            seq,
            arg,
            members: g.members.clone(),
            payload: data.to_vec(),
        });
        let sent = {
            let mut w = lock(&self.writer);
            let r = wire::write_frame(&mut *w, &frame);
            if let Err(e) = &r {
                // Part of the frame may be on the connection: nothing written after it
                // could be read as a frame, so the connection ends here (the root then
                // sees this PE leave) rather than carrying a broken stream on. Noted
                // first, so that the reader names this, not a lost root.
                lock(&self.shared.inbox)
                    .write_failed
                    .get_or_insert_with(|| {
                        format!("sending {} on group {}: {e}", op.name(), g.uid)
                    });
                let _ = w.shutdown(Shutdown::Both);
            }
            r
        };
        if let Err(e) = sent {
            // A broken connection usually means a death the reader is about to report.
            self.shared.liveness.check_strict()?;
            return Err(Error::bootstrap(
                format!(
                    "rank {}: sending {} on group {} to the root at {}",
                    self.rank,
                    op.name(),
                    g.uid,
                    self.root_addr
                ),
                e,
            ));
        }
        let deadline = start + timeout;
        let mut inbox = lock(&self.shared.inbox);
        loop {
            if let Some(reply) = inbox.replies.remove(&(g.uid, seq)) {
                return match reply {
                    Reply::Done(payloads) => {
                        let want = match op {
                            CollectiveOp::Allgather => g.members.len(),
                            CollectiveOp::Barrier => 0,
                            CollectiveOp::Broadcast => 1,
                        };
                        if payloads.len() != want {
                            return Err(Error::bootstrap(
                                format!("{} on group {}", op.name(), g.uid),
                                io::Error::new(
                                    io::ErrorKind::InvalidData,
                                    format!(
                                        "root sent {} payloads, expected {want}",
                                        payloads.len()
                                    ),
                                ),
                            ));
                        }
                        Ok(payloads)
                    }
                    Reply::Failed(FailKind::Mismatch, detail) => Err(Error::CollectiveMismatch {
                        op: op.name(),
                        detail,
                    }),
                    Reply::Failed(FailKind::Invalid, detail) => Err(Error::InvalidArgument(
                        format!("{} on group {}: {detail}", op.name(), g.uid),
                    )),
                };
            }
            if let Err(e) = self.shared.liveness.check_strict() {
                inbox.abandoned.insert((g.uid, seq));
                return Err(e);
            }
            if inbox.closed {
                return Err(Error::PeerDied {
                    pe: 0,
                    detail: format!("lost the bootstrap root at {}", self.root_addr),
                });
            }
            let left = remaining(deadline);
            if left.is_zero() {
                inbox.abandoned.insert((g.uid, seq));
                return Err(Error::Timeout {
                    pe: self.rank,
                    what: format!(
                        "{} on group {} (call #{seq}, members {}) — no answer from the \
                         bootstrap root at {}: some member has not made this call yet",
                        op.name(),
                        g.uid,
                        show_members(&g.members),
                        self.root_addr
                    ),
                    waited_ms: ms(start.elapsed()),
                });
            }
            inbox = self
                .shared
                .wake
                .wait_timeout(inbox, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        lock(&self.shared.inbox).leaving = true;
        // Shutting down wakes the reader thread (its read returns 0) so it can be joined.
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// Connects to the root, retrying refusals (and unresolvable names) until `deadline`.
fn connect(p: &JoinParams, start: Instant, deadline: Instant) -> Result<TcpStream> {
    loop {
        let err = match p.root_addr.to_socket_addrs() {
            Ok(addrs) => {
                let mut last =
                    io::Error::new(io::ErrorKind::NotFound, "the name resolved to no addresses");
                for a in addrs {
                    let t = remaining(deadline).min(CONNECT_ATTEMPT);
                    if t.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&a, t) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = e,
                    }
                }
                last
            }
            // An address without a port (or otherwise unparsable) will never work.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(Error::bootstrap(
                    format!("rank {}: bootstrap root address {:?}", p.rank, p.root_addr),
                    e,
                ))
            }
            // A name that does not resolve yet may resolve soon (e.g. a pod starting).
            Err(e) => e,
        };
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(Error::Timeout {
                pe: p.rank,
                what: format!(
                    "the bootstrap root at {} to accept a connection (last error: {err})",
                    p.root_addr
                ),
                waited_ms: ms(start.elapsed()),
            });
        }
        thread::sleep(CONNECT_RETRY.min(left));
    }
}

/// Waits for the welcome; on timeout asks the root how many PEs joined, for the error.
fn wait_welcome(
    p: &JoinParams,
    stream: &mut TcpStream,
    start: Instant,
    deadline: Instant,
) -> Result<(String, Vec<String>)> {
    let lost = |e: io::Error| {
        Error::bootstrap(
            format!(
                "rank {}: waiting for the welcome from the bootstrap root at {}",
                p.rank, p.root_addr
            ),
            e,
        )
    };
    let mut status: Option<(u32, u32, Vec<u32>)> = None;
    let mut asked = false;
    let mut hard_deadline = deadline;
    loop {
        let left = remaining(hard_deadline).max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(lost)?;
        match wire::read_frame(stream, MAX_FRAME) {
            Ok(Frame::Welcome { job_id, node_ids }) => return Ok((job_id, node_ids)),
            Ok(Frame::Refused { reason }) => {
                return Err(Error::Refused {
                    rank: p.rank,
                    reason,
                })
            }
            Ok(Frame::PeerDied { rank, detail }) => {
                return Err(Error::PeerDied {
                    pe: rank as usize,
                    detail,
                })
            }
            Ok(Frame::JoinStatus {
                joined,
                world_size,
                missing,
            }) => status = Some((joined, world_size, missing)),
            Ok(_) => {} // nothing else is expected before the welcome; ignore it
            Err(ReadError::Io(e)) if is_timeout(&e) => {}
            Err(e) => return Err(lost(e.into_io())),
        }
        if status.is_some() || remaining(hard_deadline).is_zero() {
            if !asked {
                // The join timeout expired: ask the root for the count, briefly.
                asked = true;
                hard_deadline = Instant::now() + STATUS_WAIT;
                if wire::write_frame(stream, &Frame::JoinStatusQuery).is_ok() {
                    continue;
                }
            }
            let progress = match status {
                Some((joined, n, missing)) => {
                    let shown: Vec<String> = missing.iter().map(|r| r.to_string()).collect();
                    let more = if (missing.len() as u32) < n - joined.min(n) {
                        ", ..."
                    } else {
                        ""
                    };
                    format!(
                        "{joined} of {n} PEs joined; missing rank(s) {}{more}",
                        shown.join(", ")
                    )
                }
                None => format!(
                    "the root did not say how many of the {} PEs joined",
                    p.world_size
                ),
            };
            return Err(Error::Timeout {
                pe: p.rank,
                what: format!(
                    "all PEs to join the bootstrap root at {} ({progress})",
                    p.root_addr
                ),
                waited_ms: ms(start.elapsed()),
            });
        }
    }
}

/// The reader thread: delivers replies and death reports until the connection closes.
fn read_loop(sh: &ClientShared, mut stream: TcpStream, root_addr: &str) {
    loop {
        let frame = wire::read_frame(&mut stream, MAX_FRAME);
        let mut inbox = lock(&sh.inbox);
        match frame {
            Ok(Frame::CollectiveDone { uid, seq, payloads }) => {
                if !inbox.abandoned.remove(&(uid, seq)) {
                    inbox.replies.insert((uid, seq), Reply::Done(payloads));
                }
            }
            Ok(Frame::CollectiveFailed {
                uid,
                seq,
                kind,
                reason,
            }) => {
                if !inbox.abandoned.remove(&(uid, seq)) {
                    inbox
                        .replies
                        .insert((uid, seq), Reply::Failed(kind, reason));
                }
            }
            Ok(Frame::PeerDied { rank, detail }) => {
                // Reported while holding the inbox lock: a waiter checks liveness under
                // that lock, so it either sees the death or is already waiting for the
                // notification below.
                sh.liveness.report(rank as usize, detail);
            }
            Ok(Frame::FinalizeAck) => inbox.finalize_acked = true,
            Ok(_) => {} // stray status/welcome frames carry nothing for us now
            Err(e) => {
                inbox.closed = true;
                if !inbox.leaving {
                    let why = match e {
                        ReadError::Closed => "it closed the connection".to_string(),
                        other => other.to_string(),
                    };
                    match inbox.write_failed.clone() {
                        Some(w) => sh.liveness.report_root_lost(format!(
                            "closed the connection to the bootstrap root at {root_addr} \
                             after a write to it failed ({w}): the root stopped reading, \
                             or the network failed"
                        )),
                        None => sh.liveness.report_root_lost(format!(
                            "lost the bootstrap root at {root_addr}: {why} (the process \
                             hosting it, rank 0 or the launcher, exited or was killed, or \
                             the network failed)"
                        )),
                    };
                }
                drop(inbox);
                sh.wake.notify_all();
                return;
            }
        }
        drop(inbox);
        sh.wake.notify_all();
    }
}
