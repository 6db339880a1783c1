//! The bootstrap root: the hub every PE connects to.
//!
//! Owns the listening socket, the handshake checks, the table of joined PEs, the pending
//! collectives and death reports. It must never be crashed, blocked or wedged by what a
//! connection sends: every connection has its own reader thread (the whole hello bounded
//! by [`HANDSHAKE_TIMEOUT`]) and its own writer thread fed by a channel, so the shared state
//! lock is only ever held for in-memory work, never across socket I/O.
//!
//! Threads: one accept thread (stopped by dropping the [`Root`]), and per joined PE a reader
//! and a writer thread, which end when that PE's connection closes.
use super::lock;
use super::socket;
use super::wire::{
    self, CollectiveOp, Contribution, FailKind, Frame, Hello, ReadError, MAX_FRAME, MAX_HELLO_FRAME,
};
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long a new connection may take to send its hello.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write to one PE may block before that PE is considered unreachable.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept thread checks whether the Root was dropped.
const ACCEPT_POLL_MS: libc::c_int = 50;
/// At most this many missing ranks are listed in a join status.
const MAX_MISSING_LISTED: usize = 16;
/// How long dropping the [`Root`] waits for its writer threads to send what is queued.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// The bootstrap root (hub): accepts PEs, runs collectives, reports deaths.
///
/// Dropping the `Root` stops accepting new connections (within ~50 ms; the listening port
/// is closed when `drop` returns) and waits (at most 2 s) until what was queued
/// for each PE has been written: a PE hosting the root that fails because it was told of
/// a death, and exits, must not take the same news to the others with it (they would
/// report the lost root instead of the PE that died). PEs already connected are not
/// disturbed: their connection threads keep serving collectives and death reports until
/// each PE leaves (finalize or close). A job whose PEs have all joined therefore survives
/// its root handle being dropped early; a job still waiting for PEs will not get them.
pub struct Root {
    local_addr: SocketAddr,
    hub: Arc<Hub>,
    accept_thread: Option<JoinHandle<()>>,
}

/// Reads through `stream` until `deadline`, whatever the number of reads: a peer that
/// trickles its hello a byte at a time still ends at the deadline (a read timeout alone
/// bounds each read, not the frame: a 64 KiB hello sent a byte every 4.9 s held a thread
/// and a descriptor of the root for days). Connections are not counted: a limit on those
/// still in their handshake would let junk connections keep PEs out, and with the deadline
/// each one is gone within [`HANDSHAKE_TIMEOUT`].
struct UntilDeadline<'a> {
    stream: &'a mut TcpStream,
    deadline: std::time::Instant,
}

impl Read for UntilDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "handshake deadline passed",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// State shared by the root's threads.
struct Hub {
    world_size: usize,
    token: Vec<u8>,
    job_id: String,
    /// Set by `Root::drop`; read by the accept thread.
    stop: AtomicBool,
    state: Mutex<HubState>,
}

struct HubState {
    /// Connected PEs, index = rank.
    peers: Vec<Option<Peer>>,
    /// Ranks that have ever joined (a rank joins once per job).
    has_joined: Vec<bool>,
    joined: usize,
    node_ids: Vec<String>,
    pending: HashMap<(u64, u64), Pending>,
    /// The first death: once set, the job is broken (joins are refused, pending and later
    /// collectives dropped). Every death, this one and later ones, is sent as PeerDied.
    broken: Option<(u32, String)>,
    /// Every writer thread's backlog, for the drain when the root is dropped.
    backlogs: Vec<Arc<Backlog>>,
}

struct Peer {
    /// Encoded frames for this PE's writer thread (order preserved).
    tx: mpsc::Sender<Arc<[u8]>>,
    backlog: Arc<Backlog>,
    finalized: bool,
}

impl Peer {
    /// Queues `msg` for this PE's writer thread.
    fn send(&self, msg: Arc<[u8]>) {
        // Relaxed (here and in `Backlog`): the count carries no data, it only has to
        // reach zero once the writer is done; the drain reads it until then.
        self.backlog.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(msg).is_err() {
            // The writer is gone (it failed a write): nothing will send this.
            self.backlog.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What one writer thread has yet to send: frames queued and not yet written, and whether
/// it has ended (after a failed write, or once its PE left and the channel closed).
struct Backlog {
    /// The PE the writer serves.
    rank: u32,
    queued: AtomicUsize,
    ended: AtomicBool,
}

impl Backlog {
    fn drained(&self) -> bool {
        // Relaxed: see `Peer::send`.
        self.ended.load(Ordering::Relaxed) || self.queued.load(Ordering::Relaxed) == 0
    }
}

/// A collective some members have contributed to.
struct Pending {
    op: CollectiveOp,
    arg: u64,
    members: Vec<u32>,
    first: u32,
    payloads: Vec<Option<Vec<u8>>>,
    arrived: usize,
    /// Bytes an allgather's result holds so far (payloads and their length fields).
    bytes: usize,
    /// Set when the call failed for everyone (a mismatch, a result too large): how, the
    /// reason, and the ranks already told. Its payloads are dropped then.
    failed: Option<(FailKind, String, HashSet<u32>)>,
    /// The members whose call came (any version of it): once all have, a failed call's
    /// entry goes.
    came: HashSet<u32>,
}

/// Where the root's log lines go instead of stderr (one line, newline included), when set:
/// `rshmem run` sets its stderr writer thread, so that a stderr nobody reads blocks
/// neither a connection thread nor, through the locks it holds, the launcher's
/// supervisor.
static LOG_SINK: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Sends the root's log lines to `sink` from now on (the first call wins).
pub fn set_log_sink(sink: fn(&str)) {
    let _ = LOG_SINK.set(sink);
}

fn log(msg: impl std::fmt::Display) {
    let line = format!("rshmem bootstrap: {msg}\n");
    if let Some(sink) = LOG_SINK.get() {
        return sink(&line);
    }
    // Not eprintln!: after the terminal went away (SIGHUP) a write error must not panic
    // a connection thread before it records a death.
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn random_job_id() -> Result<String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::io("reading /dev/urandom for the job id", e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Root {
    /// Binds `addr` (e.g. `127.0.0.1:0`, `0.0.0.0:29500`, `host:port`) and starts serving a
    /// job of `world_size` PEs that must present `token`. Returns immediately.
    pub fn bind(addr: &str, world_size: usize, token: &str) -> Result<Root> {
        if world_size == 0 || world_size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "bootstrap root for {world_size} PEs: the job needs 1 to {} PEs",
                u32::MAX
            )));
        }
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::bootstrap(format!("binding the bootstrap root to {addr}"), e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::bootstrap("reading the bootstrap root's address", e))?;
        // Non-blocking, so a connection that vanishes between poll and accept cannot block
        // the accept thread past a stop request.
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::bootstrap("configuring the bootstrap listener", e))?;
        let hub = Arc::new(Hub {
            world_size,
            token: token.as_bytes().to_vec(),
            job_id: random_job_id()?,
            stop: AtomicBool::new(false),
            state: Mutex::new(HubState {
                peers: (0..world_size).map(|_| None).collect(),
                has_joined: vec![false; world_size],
                joined: 0,
                node_ids: vec![String::new(); world_size],
                pending: HashMap::new(),
                broken: None,
                backlogs: Vec::new(),
            }),
        });
        let h = hub.clone();
        let accept_thread = thread::Builder::new()
            .name("rshmem-root-accept".into())
            .spawn(move || accept_loop(&h, listener))
            .map_err(|e| Error::bootstrap("spawning the bootstrap accept thread", e))?;
        Ok(Root {
            local_addr,
            hub,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the root listens on (with the port chosen when binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This job's id: 16 random hex characters.
    pub fn job_id(&self) -> &str {
        &self.hub.job_id
    }

    /// How many PEs have joined so far.
    pub fn joined(&self) -> usize {
        lock(&self.hub.state).joined
    }

    /// The first PE whose connection closed without finalize (its rank and why), once
    /// one has: the death that broke the job. A launcher hosting the root names this PE
    /// rather than the PEs that failed because they were told of its death.
    pub fn first_death(&self) -> Option<(usize, String)> {
        lock(&self.hub.state)
            .broken
            .as_ref()
            .map(|(rank, detail)| (*rank as usize, detail.clone()))
    }

    /// A launcher hosting the root saw PE `rank`'s process end (`how`). If that PE never
    /// joined, nothing else can tell the root, and the other PEs would wait out their
    /// bound for it and then blame whoever they waited on: the job is broken now, with
    /// `rank` as its first death, and every connected PE is told (PeerDied), joiners
    /// included. A PE that joined is left to its connection (its close is the report).
    pub fn mark_exited(&self, rank: usize, how: &str) {
        let mut st = lock(&self.hub.state);
        if rank >= st.has_joined.len() || st.has_joined[rank] {
            return;
        }
        // Marked joined, so a late connection under this rank is refused.
        st.has_joined[rank] = true;
        // Not logged: a job whose program never joins (`rshmem run -- hostname`) ends
        // this way on every PE; the PEs that do join are told why they are refused.
        let detail = format!("its process {how} before joining the job");
        report_death(&mut st, rank as u32, detail);
    }

    /// Waits (at most `timeout`) until every PE that joined has left — finalized or died,
    /// also after a death (PEs that tolerate it go on). A PE hosting the root calls this
    /// before its process exits, so the other PEs' farewells are still answered. Returns
    /// the ranks still connected when it gave up (empty: all left).
    pub fn wait_all_left(&self, timeout: std::time::Duration) -> Vec<usize> {
        let t0 = std::time::Instant::now();
        loop {
            {
                let st = lock(&self.hub.state);
                // Not "or the job broke": PEs that tolerate a death (EP shrink mode) go on
                // using the root after it, so a rank-0-hosted root waits for them too.
                if st.joined > 0 && st.peers.iter().all(|p| p.is_none()) {
                    return Vec::new();
                }
                if t0.elapsed() >= timeout {
                    return (0..st.peers.len())
                        .filter(|&r| st.peers[r].is_some())
                        .collect();
                }
            }
            thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // Relaxed: the flag carries no data; the accept thread only needs to see it
        // eventually, and the join below waits for it.
        self.hub.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        if let Err(waiting) = self.drain(DRAIN_WAIT) {
            log(format!(
                "gave up after {} s on sending what was queued for PE(s) {waiting:?} (not \
                 reading, or a link that stalled): they may report the lost root rather \
                 than what was sent them last",
                DRAIN_WAIT.as_secs()
            ));
        }
    }
}

impl Root {
    /// Waits (at most `timeout`) until every writer thread has written what was queued
    /// for its PE, or ended. Err: the PEs whose frames were still queued.
    fn drain(&self, timeout: Duration) -> std::result::Result<(), Vec<u32>> {
        let t0 = std::time::Instant::now();
        loop {
            let waiting: Vec<u32> = lock(&self.hub.state)
                .backlogs
                .iter()
                .filter(|b| !b.drained())
                .map(|b| b.rank)
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            if t0.elapsed() >= timeout {
                return Err(waiting);
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

fn accept_loop(hub: &Arc<Hub>, listener: TcpListener) {
    // The errno of the last accept error logged (None after a successful accept).
    let mut last_error: Option<Option<i32>> = None;
    // Relaxed: see `Root::drop`.
    while !hub.stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is one valid pollfd on our stack and the count passed is 1; the fd
        // stays open while `listener` lives (all of this function).
        let rc = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if rc <= 0 {
            continue; // timeout, or EINTR
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                last_error = None;
                let h = hub.clone();
                let spawned = thread::Builder::new()
                    .name("rshmem-root-conn".into())
                    .spawn(move || serve_connection(&h, stream, peer));
                if let Err(e) = spawned {
                    log(format!(
                        "dropped connection from {peer}: cannot spawn a thread: {e}"
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning, and say so
                // once (until an accept succeeds again) rather than every 10 ms.
                let kind = e.raw_os_error();
                if last_error != Some(kind) {
                    log(format!(
                        "accept failed: {e}{}",
                        if kind == Some(libc::EMFILE) {
                            " (the root's process is out of open files: PEs cannot join; \
                             raise its open-file limit)"
                        } else {
                            ""
                        }
                    ));
                    last_error = Some(kind);
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Sends a refusal (best effort) and logs it.
fn refuse(stream: &mut TcpStream, peer: SocketAddr, reason: &str) {
    log(format!("refused connection from {peer}: {reason}"));
    let _ = stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT));
    let _ = wire::write_frame(
        stream,
        &Frame::Refused {
            reason: reason.to_string(),
        },
    );
    let _ = stream.shutdown(Shutdown::Both);
}

fn serve_connection(hub: &Arc<Hub>, mut stream: TcpStream, peer: SocketAddr) {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| socket::tune(&stream))
        .and_then(|()| stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)));
    if let Err(e) = setup {
        log(format!(
            "dropped connection from {peer}: configuring the socket: {e}"
        ));
        return;
    }
    let hello = match wire::read_frame(
        &mut UntilDeadline {
            deadline: std::time::Instant::now() + HANDSHAKE_TIMEOUT,
            stream: &mut stream,
        },
        MAX_HELLO_FRAME,
    ) {
        Ok(Frame::Hello(h)) => h,
        Ok(other) => {
            let reason = format!("expected a hello frame, got {}", frame_name(&other));
            return refuse(&mut stream, peer, &reason);
        }
        Err(ReadError::Malformed(e)) => {
            return refuse(&mut stream, peer, &format!("malformed hello: {e}"));
        }
        Err(ReadError::Closed) => {
            return log(format!(
                "dropped connection from {peer}: closed before sending a hello"
            ));
        }
        Err(ReadError::Io(e)) => {
            let why = if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                format!("no hello within {} s", HANDSHAKE_TIMEOUT.as_secs())
            } else {
                format!("reading the hello: {e}")
            };
            return log(format!("dropped connection from {peer}: {why}"));
        }
    };
    let rank = match admit(hub, &stream, &hello) {
        Ok(rank) => rank,
        Err(reason) => return refuse(&mut stream, peer, &reason),
    };
    if let Err(e) = stream.set_read_timeout(None) {
        log(format!(
            "PE {rank} ({peer}): clearing the read timeout: {e}"
        ));
    }
    // Read frames until the PE leaves.
    let mut finalized = false;
    let death = loop {
        match wire::read_frame(&mut stream, MAX_FRAME) {
            Ok(Frame::Collective(c)) => on_collective(hub, rank, c),
            Ok(Frame::Finalize) => {
                finalized = true;
                let mut st = lock(&hub.state);
                if let Some(p) = st.peers[rank as usize].as_mut() {
                    p.finalized = true;
                    p.send(Arc::from(Frame::FinalizeAck.encode()));
                }
            }
            Ok(Frame::JoinStatusQuery) => {
                let mut st = lock(&hub.state);
                let missing: Vec<u32> = (0..hub.world_size as u32)
                    .filter(|&r| !st.has_joined[r as usize])
                    .take(MAX_MISSING_LISTED)
                    .collect();
                let status = Frame::JoinStatus {
                    joined: st.joined as u32,
                    world_size: hub.world_size as u32,
                    missing,
                };
                send(&mut st, rank, Arc::from(status.encode()));
            }
            Ok(other) => {
                break Some(format!(
                    "sent an unexpected {} frame to the bootstrap root",
                    frame_name(&other)
                ))
            }
            // After a clean leave, however the connection ends is not a death.
            Err(_) if finalized => break None,
            Err(ReadError::Closed) => {
                break Some(
                    "connection to the bootstrap root closed without finalize \
                     (the process exited or was killed, or dropped its Bootstrap)"
                        .to_string(),
                )
            }
            Err(ReadError::Io(e)) => {
                break Some(format!(
                    "connection to the bootstrap root failed (exited, killed or unreachable): {e}"
                ))
            }
            Err(ReadError::Malformed(e)) => {
                break Some(format!("sent a malformed frame to the bootstrap root: {e}"))
            }
        }
    };
    let _ = stream.shutdown(Shutdown::Both);
    let mut st = lock(&hub.state);
    // Dropping the sender ends the writer thread once it has sent what is queued.
    st.peers[rank as usize] = None;
    if let Some(detail) = death {
        let line = format!("PE {rank} ({peer}) died: {detail}");
        report_death(&mut st, rank, detail);
        // Logged after the state lock is released: a write that blocks (a stderr nobody
        // reads) must not hold the lock every other connection and the launcher need.
        drop(st);
        log(line);
    }
}

/// Records the death of `rank` (the first one breaks the job: pending collectives are
/// dropped) and tells every connected PE. Every death is reported, not only the first: a
/// PE that tolerates a death (`Liveness::tolerate`, EP shrink mode) goes on and must learn
/// of later ones. A rank dies at most once (it joins once), so no PE hears of a death
/// twice.
fn report_death(st: &mut HubState, rank: u32, detail: String) {
    if st.broken.is_none() {
        st.broken = Some((rank, detail.clone()));
        st.pending.clear();
    }
    let msg: Arc<[u8]> = Arc::from(Frame::PeerDied { rank, detail }.encode());
    for p in st.peers.iter().flatten() {
        p.send(msg.clone());
    }
}

/// Validates a hello and registers the PE; on success the PE has a writer thread and,
/// if it completed the job, every PE has been sent the welcome. Err: the refusal reason.
fn admit(hub: &Arc<Hub>, stream: &TcpStream, h: &Hello) -> std::result::Result<u32, String> {
    if h.magic != wire::MAGIC {
        return Err("not an rshmem bootstrap client (bad magic)".into());
    }
    if h.version != wire::PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {} is not supported (the root speaks version {})",
            h.version,
            wire::PROTOCOL_VERSION
        ));
    }
    if !socket::constant_time_eq(&h.token, &hub.token) {
        return Err(format!(
            "wrong token from rank {} (check RSHMEM_TOKEN: every PE of a job must use the root's)",
            h.rank
        ));
    }
    if h.world_size as usize != hub.world_size {
        return Err(format!(
            "rank {} believes the job has {} PEs, but this root serves {}",
            h.rank, h.world_size, hub.world_size
        ));
    }
    if h.rank as usize >= hub.world_size {
        return Err(format!(
            "rank {} is out of range for a job of {} PEs",
            h.rank, hub.world_size
        ));
    }
    let rank = h.rank;
    let mut st = lock(&hub.state);
    if let Some((dead, detail)) = &st.broken {
        return Err(format!("the job is broken: PE {dead} died: {detail}"));
    }
    if st.has_joined[rank as usize] {
        return Err(format!("rank {rank} has already joined this job"));
    }
    let writer_stream = stream
        .try_clone()
        .map_err(|e| format!("root cannot duplicate the socket: {e}"))?;
    let (tx, rx) = mpsc::channel::<Arc<[u8]>>();
    let backlog = Arc::new(Backlog {
        rank,
        queued: AtomicUsize::new(0),
        ended: AtomicBool::new(false),
    });
    let b = backlog.clone();
    thread::Builder::new()
        .name("rshmem-root-writer".into())
        .spawn(move || write_loop(writer_stream, rx, &b))
        .map_err(|e| format!("root cannot spawn a writer thread: {e}"))?;
    st.backlogs.push(backlog.clone());
    st.peers[rank as usize] = Some(Peer {
        tx,
        backlog,
        finalized: false,
    });
    st.has_joined[rank as usize] = true;
    st.node_ids[rank as usize] = h.node_id.clone();
    st.joined += 1;
    if st.joined == hub.world_size {
        let welcome: Arc<[u8]> = Arc::from(
            Frame::Welcome {
                job_id: hub.job_id.clone(),
                node_ids: st.node_ids.clone(),
            }
            .encode(),
        );
        for p in st.peers.iter().flatten() {
            p.send(welcome.clone());
        }
    }
    Ok(rank)
}

/// Writes queued frames to one PE. On a write failure (the PE stopped reading, or the
/// link died) the socket is shut down, so its reader sees the close and reports the PE.
fn write_loop(mut stream: TcpStream, rx: mpsc::Receiver<Arc<[u8]>>, backlog: &Backlog) {
    for msg in rx {
        let sent = stream.write_all(&msg).and_then(|()| stream.flush());
        if sent.is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            break;
        }
        // Relaxed: see `Peer::send`.
        backlog.queued.fetch_sub(1, Ordering::Relaxed);
    }
    backlog.ended.store(true, Ordering::Relaxed);
}

fn send(st: &mut HubState, rank: u32, msg: Arc<[u8]>) {
    if let Some(p) = st.peers[rank as usize].as_ref() {
        p.send(msg);
    }
}

/// Fails pending call `key` for every rank in `told` (each is sent the failure now; a
/// later arrival of another rank is told on arrival): its parts are dropped (never
/// delivered, not held for the job's life), and its entry goes once every member's call
/// came.
fn fail_everyone(
    st: &mut HubState,
    key: (u64, u64),
    kind: FailKind,
    reason: String,
    told: HashSet<u32>,
) {
    let Some(p) = st.pending.get_mut(&key) else {
        return;
    };
    p.failed = Some((kind, reason.clone(), told.clone()));
    p.payloads = Vec::new();
    if p.members.iter().all(|m| p.came.contains(m)) {
        st.pending.remove(&key);
    }
    let msg: Arc<[u8]> = Arc::from(
        Frame::CollectiveFailed {
            uid: key.0,
            seq: key.1,
            kind,
            reason,
        }
        .encode(),
    );
    for r in told {
        send(st, r, msg.clone());
    }
}

fn fail(st: &mut HubState, rank: u32, c: &Contribution, kind: FailKind, reason: String) {
    let msg = Frame::CollectiveFailed {
        uid: c.uid,
        seq: c.seq,
        kind,
        reason,
    };
    send(st, rank, Arc::from(msg.encode()));
}

fn describe(op: CollectiveOp, arg: u64, members: &[u32]) -> String {
    match op {
        CollectiveOp::Broadcast => format!("broadcast(root index {arg}) over members {members:?}"),
        // A tagged allgather (Bootstrap::allgather_tagged): its tag as text.
        CollectiveOp::Allgather if arg != 0 => {
            let tag = arg.to_le_bytes();
            let end = tag.iter().position(|&b| b == 0).unwrap_or(8);
            format!(
                "allgather({:?}) over members {members:?}",
                String::from_utf8_lossy(&tag[..end])
            )
        }
        _ => format!("{} over members {members:?}", op.name()),
    }
}

fn on_collective(hub: &Hub, rank: u32, c: Contribution) {
    let mut st = lock(&hub.state);
    if st.broken.is_some() {
        // Every connected PE was already sent PeerDied; its waiters fail on that.
        return;
    }
    // The client validates too; this guards the root against a broken or hostile one.
    let mut seen = HashSet::with_capacity(c.members.len());
    let invalid = if c.members.is_empty() {
        Some("the member list is empty".to_string())
    } else if let Some(&m) = c.members.iter().find(|&&m| m as usize >= hub.world_size) {
        Some(format!(
            "member {m} is not a PE of this {}-PE job",
            hub.world_size
        ))
    } else if let Some(&m) = c.members.iter().find(|&&m| !seen.insert(m)) {
        Some(format!("member {m} is listed twice"))
    } else if !c.members.contains(&rank) {
        Some(format!("the caller, PE {rank}, is not a member"))
    } else if c.op == CollectiveOp::Broadcast && c.arg >= c.members.len() as u64 {
        Some(format!("root index {} is not a member position", c.arg))
    } else {
        None
    };
    if let Some(reason) = invalid {
        return fail(&mut st, rank, &c, FailKind::Invalid, reason);
    }
    let key = (c.uid, c.seq);
    let p = st.pending.entry(key).or_insert_with(|| Pending {
        op: c.op,
        arg: c.arg,
        members: c.members.clone(),
        first: rank,
        payloads: vec![None; c.members.len()],
        arrived: 0,
        bytes: 0,
        failed: None,
        came: HashSet::new(),
    });
    p.came.insert(rank);
    if let Some((kind, reason, told)) = p.failed.as_mut() {
        let tell = told.insert(rank).then(|| (*kind, reason.clone()));
        // Every member's call came: nothing will look the entry up again.
        if p.members.iter().all(|m| p.came.contains(m)) {
            st.pending.remove(&key);
        }
        if let Some((kind, reason)) = tell {
            fail(&mut st, rank, &c, kind, reason);
        }
        return;
    }
    if p.op != c.op || p.arg != c.arg || p.members != c.members {
        let reason = format!(
            "call #{} on group {}: PE {} called {}, but PE {} called {}",
            c.seq,
            c.uid,
            rank,
            describe(c.op, c.arg, &c.members),
            p.first,
            describe(p.op, p.arg, &p.members),
        );
        // Tell every PE named by either side, once; later arrivals are told on arrival.
        let told: HashSet<u32> = p.members.iter().chain(&c.members).copied().collect();
        return fail_everyone(&mut st, key, FailKind::Mismatch, reason, told);
    }
    let pos = c.members.iter().position(|&m| m == rank).unwrap_or(0);
    if p.payloads[pos].is_some() {
        let reason = format!(
            "PE {rank} contributed twice to call #{} on group {}",
            c.seq, c.uid
        );
        return fail(&mut st, rank, &c, FailKind::Invalid, reason);
    }
    if p.op == CollectiveOp::Allgather {
        p.bytes += c.payload.len() + 4;
        // The result's size is known to be too large as soon as the parts that came say
        // so: the call fails for every member now, and the parts are dropped (before
        // 2026-12-07 the root held every part until the last came, up to a frame per
        // member, and only then failed the call).
        if p.bytes + 32 > MAX_FRAME {
            let reason = format!(
                "the result would be more than {} bytes, more than the bootstrap's \
                 {MAX_FRAME}-byte frame limit (move bulk data through the symmetric heap)",
                p.bytes + 32
            );
            let told: HashSet<u32> = p.members.iter().copied().collect();
            return fail_everyone(&mut st, key, FailKind::Invalid, reason, told);
        }
    }
    p.payloads[pos] = Some(c.payload);
    p.arrived += 1;
    if p.arrived < p.members.len() {
        return;
    }
    let Some(done) = st.pending.remove(&key) else {
        return;
    };
    let mut all: Vec<Vec<u8>> = done.payloads.into_iter().flatten().collect();
    let payloads = match done.op {
        CollectiveOp::Allgather => all,
        CollectiveOp::Barrier => Vec::new(),
        CollectiveOp::Broadcast => vec![std::mem::take(&mut all[done.arg as usize])],
    };
    let total: usize = payloads.iter().map(|p| p.len() + 4).sum::<usize>() + 32;
    let msg = if total > MAX_FRAME {
        Frame::CollectiveFailed {
            uid: c.uid,
            seq: c.seq,
            kind: FailKind::Invalid,
            reason: format!(
                "the result would be {total} bytes, more than the bootstrap's {MAX_FRAME}-byte \
                 frame limit (move bulk data through the symmetric heap)"
            ),
        }
    } else {
        Frame::CollectiveDone {
            uid: c.uid,
            seq: c.seq,
            payloads,
        }
    };
    let msg: Arc<[u8]> = Arc::from(msg.encode());
    for &m in &done.members {
        send(&mut st, m, msg.clone());
    }
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello(_) => "hello",
        Frame::Refused { .. } => "refused",
        Frame::Welcome { .. } => "welcome",
        Frame::Collective(_) => "collective",
        Frame::CollectiveDone { .. } => "collective-done",
        Frame::CollectiveFailed { .. } => "collective-failed",
        Frame::PeerDied { .. } => "peer-died",
        Frame::Finalize => "finalize",
        Frame::FinalizeAck => "finalize-ack",
        Frame::JoinStatusQuery => "join-status-query",
        Frame::JoinStatus { .. } => "join-status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Joins as `rank` over a plain socket (hello only; reading is left to the caller).
    fn hello(root: &Root, rank: u32, token: &str) -> TcpStream {
        let mut s = TcpStream::connect(root.local_addr()).unwrap();
        let h = Hello {
            magic: wire::MAGIC,
            version: wire::PROTOCOL_VERSION,
            token: token.as_bytes().to_vec(),
            rank,
            world_size: 2,
            node_id: "n".into(),
        };
        wire::write_frame(&mut s, &Frame::Hello(h)).unwrap();
        s
    }

    /// Dropping the root waits for what its writers have queued: a frame a PE has not
    /// read yet (here 64 MiB, more than the sockets hold) keeps the drain waiting until
    /// the PE reads it, and no longer.
    #[test]
    fn the_drain_waits_for_queued_frames() {
        let root = Root::bind("127.0.0.1:0", 2, "tok").unwrap();
        let _a = hello(&root, 0, "tok");
        let mut b = hello(&root, 1, "tok");
        let t0 = std::time::Instant::now();
        while root.joined() < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the PEs never joined"
            );
            thread::sleep(Duration::from_millis(1));
        }
        const BIG: usize = 64 << 20;
        send(&mut lock(&root.hub.state), 1, Arc::from(vec![7u8; BIG]));
        match root.drain(Duration::from_millis(200)) {
            // PE 0's writer may still be sending its welcome on a loaded machine.
            Err(waiting) if waiting.contains(&1) => {}
            other => panic!("drained with 64 MiB unread by PE 1: {other:?}"),
        }
        let reader = thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < BIG {
                match b.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            got
        });
        assert_eq!(root.drain(Duration::from_secs(30)), Ok(()), "never drained");
        assert!(reader.join().unwrap() >= BIG);
    }
}
