//! Passing a file descriptor (the POSIX-fd handle of a PE's GPU heap) to the other PEs of
//! the node over Unix sockets with `SCM_RIGHTS`.
//!
//! Every PE listens on an abstract-namespace socket named after the job, the job's token
//! and its rank (nothing in the file system, nothing to clean up after a crash) and serves
//! its fd once to each node peer that asks; at the same time it connects to each node peer
//! in another process and fetches theirs. PEs in one process map each other's heaps
//! without fds (`cuMemRetainAllocationHandle`, gpu/pe.rs).
//!
//! Handshake (all little-endian):
//! - client → server, 40 bytes: magic `RSHFD001`, the 16-byte GPU job token, the client's
//!   rank (u32), its heap size (u64), the rank it expects to reach (u32).
//! - server → client, 24 bytes: magic, status (u32: 0 ok, 1 bad token, 2 rank not a node
//!   peer / already served, 3 heap size differs, 4 wrong server), the server's rank (u32),
//!   its heap size (u64); on success the fd rides along as `SCM_RIGHTS`.
//!
//! The server also requires the client to run as the same user (`SO_PEERCRED`). The token
//! is random per job and travels over the bootstrap, so other jobs on the machine cannot
//! take a heap handle. Every step is bounded by the timeout; errors name the peer.

use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"RSHFD001";
const HELLO_LEN: usize = 40;
const REPLY_LEN: usize = 24;

/// How long one read of a hello waits before the server checks whether it was stopped.
const HELLO_SLICE: Duration = Duration::from_millis(50);

const ST_OK: u32 = 0;
const ST_BAD_TOKEN: u32 = 1;
const ST_BAD_RANK: u32 = 2;
const ST_BAD_SIZE: u32 = 3;
const ST_WRONG_SERVER: u32 = 4;

/// One PE's side of the exchange.
#[derive(Debug, Clone)]
pub struct FdExchange {
    /// The job id (names the sockets).
    pub job: String,
    pub rank: usize,
    /// Random per job, the same on every PE (from the bootstrap).
    pub token: [u8; 16],
    /// Every PE of the job must have the same heap size.
    pub heap_size: u64,
    pub timeout: Duration,
}

/// The abstract socket name of PE `rank` of job `job` (at most 107 bytes). The hash
/// covers the job's secret token and the rank, so a process that sees the job id (in
/// /dev/shm, or a name in /proc/net/unix) cannot bind the PEs' names first and fail the
/// job (since 2026-12-07, from a review; every other user's process could).
pub fn socket_name(job: &str, token: &[u8; 16], rank: usize) -> String {
    let short: String = job
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(40)
        .collect();
    let mut key = job.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(token);
    key.extend_from_slice(&(rank as u64).to_le_bytes());
    format!(
        "rshmem-gpuheap-{short}-{:016x}-pe{rank}",
        crate::pe::fnv(&key)
    )
}

/// A running server: serves this PE's fd to each expected client once.
///
/// Dropping it without [`Server::join`] (this PE's setup failed, or a peer died) stops the
/// thread at its next poll and waits for it, so the socket and the duplicate of the heap
/// handle are closed on return instead of when the timeout runs out.
pub struct Server {
    handle: Option<std::thread::JoinHandle<Result<()>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    /// Waits until every expected client was served (or the timeout passed).
    pub fn join(mut self) -> Result<()> {
        let h = self.handle.take().expect("joined once");
        h.join().unwrap_or_else(|_| {
            Err(Error::Verification(
                "the fd-passing server thread panicked".into(),
            ))
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // Relaxed: the thread only needs to see the flag eventually; the join below
            // orders everything it did before exiting.
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

impl FdExchange {
    /// Binds this PE's socket and serves a duplicate of `fd` to each rank in `clients`
    /// (once each) on a thread. Bind before the node peers start fetching (the exchange
    /// in `GpuPe` puts a bootstrap barrier between binding and fetching; fetches also
    /// retry until the timeout).
    pub fn serve(&self, fd: RawFd, clients: BTreeSet<usize>) -> Result<Server> {
        let name = socket_name(&self.job, &self.token, self.rank);
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| Error::io(format!("abstract socket name {name}"), e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| {
            Error::io(
                format!(
                    "PE {}: binding the GPU heap handle socket @{name}",
                    self.rank
                ),
                e,
            )
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("fd-passing socket", e))?;
        // SAFETY: dup of a descriptor the caller owns; the copy is owned by the thread.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Error::io(
                "duplicating the heap handle",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `dup` is a fresh descriptor nobody else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        let me = self.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("pe{}-fdpass", self.rank))
            .spawn(move || me.serve_loop(listener, owned, clients, &flag))
            .map_err(|e| Error::io("spawning the fd-passing thread", e))?;
        Ok(Server {
            handle: Some(handle),
            stop,
        })
    }

    fn serve_loop(
        &self,
        listener: UnixListener,
        fd: OwnedFd,
        mut pending: BTreeSet<usize>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut refused: Vec<String> = Vec::new();
        // Relaxed: see Server::drop.
        while !pending.is_empty() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => {
                    match self.serve_one(&conn, fd.as_raw_fd(), &pending, deadline, stop) {
                        Ok(Some(r)) => {
                            pending.remove(&r);
                        }
                        Ok(None) => {}
                        Err(e) => refused.push(e.to_string()),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let mut what = format!(
                            "node peer(s) {} to fetch its GPU heap handle",
                            pending
                                .iter()
                                .map(|r| format!("PE {r}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                        if !refused.is_empty() {
                            what.push_str(&format!(" (refused meanwhile: {})", refused.join("; ")));
                        }
                        return Err(Error::Timeout {
                            pe: self.rank,
                            what,
                            waited_ms: self.timeout.as_millis() as u64,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("PE {}: accepting on the fd-passing socket", self.rank),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    /// One connection: Some(rank) when that client got the fd.
    fn serve_one(
        &self,
        conn: &UnixStream,
        fd: RawFd,
        pending: &BTreeSet<usize>,
        deadline: Instant,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<Option<usize>> {
        conn.set_nonblocking(false)
            .map_err(|e| Error::io("fd-passing socket", e))?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        // Reads wait in slices, so a client that connects and stays silent holds a
        // dropped server (Server::drop) for one slice, not until the deadline.
        conn.set_read_timeout(Some(left.min(HELLO_SLICE)))
            .map_err(|e| Error::io("fd-passing socket", e))?;
        conn.set_write_timeout(Some(left))
            .map_err(|e| Error::io("fd-passing socket", e))?;
        if peer_uid(conn)? != current_uid() {
            return Ok(None); // another user: drop silently
        }
        let mut hello = [0u8; HELLO_LEN];
        let mut got = 0;
        let hello_err = |e: std::io::Error| {
            Error::io(format!("PE {}: reading a fd-passing hello", self.rank), e)
        };
        while got < HELLO_LEN {
            match (&*conn).read(&mut hello[got..]) {
                Ok(0) => return Err(hello_err(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(k) => got += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    // Relaxed: see Server::drop.
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return Ok(None);
                    }
                    if Instant::now() >= deadline {
                        return Err(hello_err(e));
                    }
                }
                Err(e) => return Err(hello_err(e)),
            }
        }
        if &hello[..8] != MAGIC {
            return Ok(None);
        }
        let rank = u32::from_le_bytes(hello[24..28].try_into().expect("4")) as usize;
        let size = u64::from_le_bytes(hello[28..36].try_into().expect("8"));
        let want = u32::from_le_bytes(hello[36..40].try_into().expect("4")) as usize;
        let status = if hello[8..24] != self.token {
            ST_BAD_TOKEN
        } else if want != self.rank {
            ST_WRONG_SERVER
        } else if !pending.contains(&rank) {
            ST_BAD_RANK
        } else if size != self.heap_size {
            ST_BAD_SIZE
        } else {
            ST_OK
        };
        let mut reply = [0u8; REPLY_LEN];
        reply[..8].copy_from_slice(MAGIC);
        reply[8..12].copy_from_slice(&status.to_le_bytes());
        reply[12..16].copy_from_slice(&(self.rank as u32).to_le_bytes());
        reply[16..24].copy_from_slice(&self.heap_size.to_le_bytes());
        if status == ST_OK {
            send_with_fds(conn, &reply, &[fd]).map_err(|e| {
                Error::io(
                    format!("PE {}: sending its heap handle to PE {rank}", self.rank),
                    e,
                )
            })?;
            Ok(Some(rank))
        } else {
            let _ = send_all(conn, &reply);
            Err(Error::Refused {
                rank,
                reason: format!(
                    "fd-passing hello to PE {}: {}",
                    self.rank,
                    status_text(status)
                ),
            })
        }
    }

    /// Fetches PE `peer`'s fd: connects (retrying until the peer listens, within the
    /// timeout), shakes hands, receives the fd.
    pub fn fetch(&self, peer: usize) -> Result<OwnedFd> {
        self.fetch_from(peer, &socket_name(&self.job, &self.token, peer))
    }

    /// [`FdExchange::fetch`] from the socket `name` (tests: a client with another token
    /// than the server's, which would not find the server's name).
    fn fetch_from(&self, peer: usize, name: &str) -> Result<OwnedFd> {
        let deadline = Instant::now() + self.timeout;
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| Error::io(format!("abstract socket name {name}"), e))?;
        let conn = loop {
            match UnixStream::connect_addr(&addr) {
                Ok(c) => break c,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            pe: self.rank,
                            what: format!(
                                "PE {peer} to listen on @{name} (GPU heap handle exchange)"
                            ),
                            waited_ms: self.timeout.as_millis() as u64,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("PE {}: connecting to PE {peer}'s @{name}", self.rank),
                        e,
                    ))
                }
            }
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        let io = |what: &str, e| {
            Error::io(
                format!(
                    "PE {}: {what} PE {peer} (GPU heap handle exchange)",
                    self.rank
                ),
                e,
            )
        };
        conn.set_read_timeout(Some(left))
            .map_err(|e| io("socket options for", e))?;
        conn.set_write_timeout(Some(left))
            .map_err(|e| io("socket options for", e))?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(MAGIC);
        hello[8..24].copy_from_slice(&self.token);
        hello[24..28].copy_from_slice(&(self.rank as u32).to_le_bytes());
        hello[28..36].copy_from_slice(&self.heap_size.to_le_bytes());
        hello[36..40].copy_from_slice(&(peer as u32).to_le_bytes());
        send_all(&conn, &hello).map_err(|e| io("sending the hello to", e))?;
        let (reply, fd) = recv_with_fd(&conn).map_err(|e| io("receiving the heap handle of", e))?;
        if &reply[..8] != MAGIC {
            return Err(Error::Refused {
                rank: peer,
                reason: format!("PE {peer}'s fd-passing socket answered garbage"),
            });
        }
        let status = u32::from_le_bytes(reply[8..12].try_into().expect("4"));
        let their_size = u64::from_le_bytes(reply[16..24].try_into().expect("8"));
        if status != ST_OK {
            let mut reason = format!(
                "PE {peer} refused to pass its GPU heap handle to PE {}: {}",
                self.rank,
                status_text(status)
            );
            if status == ST_BAD_SIZE {
                reason.push_str(&format!(
                    " (its heap is {their_size} bytes, this PE's {})",
                    self.heap_size
                ));
            }
            return Err(Error::Refused {
                rank: self.rank,
                reason,
            });
        }
        fd.ok_or_else(|| Error::Refused {
            rank: self.rank,
            reason: format!("PE {peer} answered without a file descriptor"),
        })
    }
}

fn status_text(s: u32) -> &'static str {
    match s {
        ST_BAD_TOKEN => "wrong job token (a PE of another job?)",
        ST_BAD_RANK => "rank is not a node peer that still needs the handle",
        ST_BAD_SIZE => "symmetric heap sizes differ",
        ST_WRONG_SERVER => "reached the wrong PE",
        _ => "unknown status",
    }
}

fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

fn peer_uid(s: &UnixStream) -> Result<u32> {
    let mut cred: libc::ucred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket, out-pointer and length for SO_PEERCRED.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(Error::io(
            "SO_PEERCRED on the fd-passing socket",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(cred.uid)
}

/// Space for one SCM_RIGHTS control message carrying one fd (CMSG_SPACE(sizeof(int)),
/// 24 bytes on 64-bit Linux; 64 is ample and 8-aligned).
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// `write_all` with MSG_NOSIGNAL: a peer that closed its end gives EPIPE, not a SIGPIPE
/// that would kill this PE (only recent Rust releases pass the flag in the standard
/// library's own UnixStream writes; rshmem supports 1.85).
fn send_all(s: &UnixStream, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a live buffer of `data.len()` bytes; the socket is open for
        // the call (borrowed from `s`).
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "send wrote nothing",
            ));
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// Sends `data` with `fds` (at most 8) in one SCM_RIGHTS message.
fn send_with_fds(s: &UnixStream, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    assert!(
        fds.len() <= 8,
        "at most 8 descriptors fit the control buffer"
    );
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut buf = CmsgBuf([0; 64]);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    // SAFETY: zeroed msghdr is valid; fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` (<= 16 + 32 <= 64) bytes, enough for one cmsg
    // with `fds.len()` ints; CMSG_FIRSTHDR/CMSG_DATA and the writes stay inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
        let d = libc::CMSG_DATA(c).cast::<RawFd>();
        for (i, &fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(d.add(i), fd);
        }
    }
    // SAFETY: msg is fully initialised; the socket is connected.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short sendmsg",
        ));
    }
    Ok(())
}

fn recv_with_fd(s: &UnixStream) -> std::io::Result<([u8; REPLY_LEN], Option<OwnedFd>)> {
    let mut data = [0u8; REPLY_LEN];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut buf = CmsgBuf([0; 64]);
    // SAFETY: zeroed msghdr is valid; fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf.0.as_mut_ptr().cast();
    msg.msg_controllen = buf.0.len() as _;
    let n = loop {
        // SAFETY: msg points at live buffers of the stated sizes; MSG_CMSG_CLOEXEC marks
        // the received fds close-on-exec. The read timeout set on the socket bounds the
        // call.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Every fd that came is owned (closed on every path below), not only the first of the
    // first message: a peer that sent more would otherwise leave them open in this
    // process for good (before 2026-12-07, from a review).
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `buf` (msg_controllen
    // was updated to their length); each SCM_RIGHTS payload holds
    // (cmsg_len - CMSG_LEN(0)) / 4 descriptors, now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the reply carried {} descriptor(s){} where one was expected",
                fds.len(),
                if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                    " and more the kernel dropped"
                } else {
                    ""
                }
            ),
        ));
    }
    let fd = fds.pop();
    let mut got = n as usize;
    // The fd comes with the first bytes; read the rest of a split reply (rare).
    while got < REPLY_LEN {
        let k = (&*s).read(&mut data[got..])?;
        if k == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed mid-reply",
            ));
        }
        got += k;
    }
    Ok((data, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn memfd_with(len: usize, seed: u64) -> OwnedFd {
        let name = std::ffi::CString::new("rshmem-fdpass-test").unwrap();
        // SAFETY: valid name; flags are valid.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fresh fd owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let f = std::fs::File::from(fd.try_clone().unwrap());
        f.set_len(len as u64).unwrap();
        let words: Vec<u8> = (0..len / 8)
            .flat_map(|i| super::super::pattern_u64(seed, (i) as u64).to_le_bytes())
            .collect();
        std::os::unix::fs::FileExt::write_all_at(&f, &words, 0).unwrap();
        fd
    }

    /// Maps `fd` shared and returns (pointer, len).
    fn map(fd: &OwnedFd, len: usize) -> *mut u64 {
        // SAFETY: mapping a file of at least `len` bytes, shared.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    fn ex(job: &str, rank: usize, token: [u8; 16], heap: u64, ms: u64) -> FdExchange {
        FdExchange {
            job: job.into(),
            rank,
            token,
            heap_size: heap,
            timeout: Duration::from_millis(ms),
        }
    }

    fn job(tag: &str) -> String {
        format!("test-{tag}-{}-{:?}", std::process::id(), Instant::now())
    }

    /// Four PEs as threads: every PE receives every other PE's memfd and sees its content;
    /// a write through one mapping is visible to the owner (the memory is shared, not
    /// copied).
    #[test]
    fn four_threads_share_memfds() {
        let job = job("threads");
        let n = 4;
        let len = 1 << 16;
        let tok = [7u8; 16];
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let job = job.clone();
                    s.spawn(move || {
                        let mine = memfd_with(len, 100 + r as u64);
                        let e = ex(&job, r, tok, len as u64, 5000);
                        let others: BTreeSet<usize> = (0..n).filter(|&p| p != r).collect();
                        let server = e.serve(mine.as_raw_fd(), others.clone()).unwrap();
                        let mut got = Vec::new();
                        for &p in &others {
                            got.push((p, e.fetch(p).unwrap()));
                        }
                        server.join().unwrap();
                        for (p, fd) in &got {
                            let m = map(fd, len);
                            for i in [0usize, 1, 4095, len / 8 - 1] {
                                // SAFETY: i < len/8 words of a live mapping.
                                let v = unsafe { m.add(i).read_volatile() };
                                assert_eq!(
                                    v,
                                    super::super::pattern_u64(100 + *p as u64, (i) as u64),
                                    "PE {r} reading PE {p} word {i}"
                                );
                            }
                            // SAFETY: word 1000 + r is private to writer r in every heap.
                            unsafe { m.add(1000 + r).write_volatile(0xABC0 + r as u64) };
                            // SAFETY: unmapping what map() mapped.
                            unsafe { libc::munmap(m.cast(), len) };
                        }
                        mine
                    })
                })
                .collect();
            let fds: Vec<OwnedFd> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            for (owner, fd) in fds.iter().enumerate() {
                let m = map(fd, len);
                for w in (0..n).filter(|&w| w != owner) {
                    // SAFETY: in range; the writers have finished (threads joined).
                    assert_eq!(
                        unsafe { m.add(1000 + w).read_volatile() },
                        0xABC0 + w as u64
                    );
                }
                // SAFETY: as above.
                unsafe { libc::munmap(m.cast(), len) };
            }
        });
    }

    /// Across processes: this test re-runs its own binary as a child PE (the ignored test
    /// below) that serves a memfd; the parent fetches it and checks the content.
    #[test]
    fn passes_a_memfd_between_processes() {
        let job = job("procs");
        let exe = std::env::current_exe().unwrap();
        let child = std::process::Command::new(exe)
            .args([
                "--exact",
                "gpu::fdpass::tests::child_pe_serves_a_memfd",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RSHMEM_FDPASS_TEST_JOB", &job)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let e = ex(&job, 0, [9u8; 16], 1 << 16, 10_000);
        let fd = e.fetch(1).unwrap();
        let m = map(&fd, 1 << 16);
        for i in [0usize, 77, 8191] {
            // SAFETY: in range of the 64 KiB mapping.
            assert_eq!(
                unsafe { m.add(i).read_volatile() },
                super::super::pattern_u64(4242, (i) as u64)
            );
        }
        // SAFETY: unmapping what map() mapped.
        unsafe { libc::munmap(m.cast(), 1 << 16) };
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "the child PE did not run"
        );
    }

    /// The child PE of the test above (runs only when started by it).
    #[test]
    #[ignore = "helper process of passes_a_memfd_between_processes"]
    fn child_pe_serves_a_memfd() {
        let job = std::env::var("RSHMEM_FDPASS_TEST_JOB").expect("started by the parent test");
        let fd = memfd_with(1 << 16, 4242);
        let e = ex(&job, 1, [9u8; 16], 1 << 16, 10_000);
        e.serve(fd.as_raw_fd(), [0].into()).unwrap().join().unwrap();
    }

    /// A server dropped before its clients came (this PE's setup failed) closes its
    /// socket and its duplicate of the handle at once, not when the timeout runs out.
    #[test]
    fn a_dropped_server_stops_and_closes_its_handle() {
        let job = job("dropped");
        let fd = memfd_with(1 << 12, 1);
        let e = ex(&job, 0, [3u8; 16], 1 << 12, 600_000);
        let server = e.serve(fd.as_raw_fd(), [1, 2].into()).unwrap();
        // The name is taken while the server runs.
        let name = socket_name(&job, &[3u8; 16], 0);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        assert!(
            UnixListener::bind_addr(&addr).is_err(),
            "the server's socket is bound"
        );
        // A client that connects and never says hello must not hold the drop either.
        let silent = UnixStream::connect_addr(&addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Dropped on another thread so that a drop that waited out the 600 s timeout
        // fails this test (after 20 s) instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(server);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("dropping the server returned (its thread stopped)");
        // The thread owned the listener and the duplicate and dropped both when it
        // returned; Drop joined it, so the name is free now (an abstract name is released
        // with its last descriptor).
        UnixListener::bind_addr(&addr).expect("the name is free after the drop");
        drop(silent);
    }

    #[test]
    fn wrong_token_and_size_are_refused_naming_the_peer() {
        let job = job("refuse");
        let fd = memfd_with(4096, 1);
        let server = ex(&job, 0, [1u8; 16], 4096, 3000)
            .serve(fd.as_raw_fd(), [1].into())
            .unwrap();
        // A client with another token derives another name (it would wait out its
        // timeout); at the server's name, the server still refuses it.
        let e = ex(&job, 1, [2u8; 16], 4096, 3000)
            .fetch_from(0, &socket_name(&job, &[1u8; 16], 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PE 0 refused") && e.contains("wrong job token"),
            "{e}"
        );
        let e = ex(&job, 1, [1u8; 16], 8192, 3000)
            .fetch(0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symmetric heap sizes differ"), "{e}");
        assert!(e.contains("its heap is 4096 bytes, this PE's 8192"), "{e}");
        let e = ex(&job, 3, [1u8; 16], 4096, 3000)
            .fetch(0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a node peer"), "{e}");
        // The legitimate client still gets it.
        assert!(ex(&job, 1, [1u8; 16], 4096, 3000).fetch(0).is_ok());
        server.join().unwrap();
    }

    #[test]
    fn absent_peers_time_out_naming_them() {
        let job = job("absent");
        let t = Instant::now();
        let e = ex(&job, 0, [0u8; 16], 4096, 200)
            .fetch(5)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PE 0: timed out after 200 ms waiting for PE 5 to listen"),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(3));
        let fd = memfd_with(4096, 1);
        let e = ex(&job, 2, [0u8; 16], 4096, 200)
            .serve(fd.as_raw_fd(), [3, 6].into())
            .unwrap()
            .join()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("waiting for node peer(s) PE 3, PE 6 to fetch its GPU heap handle"),
            "{e}"
        );
    }

    #[test]
    fn socket_names_fit_and_differ() {
        let long = "x".repeat(500);
        let t = [7u8; 16];
        let a = socket_name(&long, &t, 1023);
        assert!(a.len() < 107, "{a}");
        assert_ne!(socket_name("job", &t, 0), socket_name("job", &t, 1));
        assert_ne!(socket_name("job-a", &t, 0), socket_name("job-b", &t, 0));
        // Another token, another name: the job id alone does not give it away.
        assert_ne!(socket_name("job", &t, 0), socket_name("job", &[8u8; 16], 0));
    }

    /// A name bound by someone who knows only the job id (as every user on the machine
    /// can) is not the PE's: the server binds its own and serves.
    #[test]
    fn a_name_taken_from_the_job_id_does_not_stop_the_server() {
        let job = job("squat");
        let squatted = format!(
            "rshmem-gpuheap-{}-{:016x}-pe0",
            job.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .take(40)
                .collect::<String>(),
            crate::pe::fnv(job.as_bytes())
        );
        let _squatter =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(squatted.as_bytes()).unwrap())
                .unwrap();
        let fd = memfd_with(1 << 12, 5);
        let server = ex(&job, 0, [4u8; 16], 1 << 12, 10_000);
        let client = ex(&job, 1, [4u8; 16], 1 << 12, 10_000);
        let s = server.serve(fd.as_raw_fd(), [1].into()).unwrap();
        client.fetch(0).unwrap();
        s.join().unwrap();
    }

    /// A reply with two descriptors is refused and both are closed (before 2026-12-07 the
    /// second stayed open in this process).
    #[test]
    fn extra_descriptors_in_a_reply_are_refused_and_closed() {
        let tag = format!("rshmem-extra-{}", std::process::id());
        let named = |n: &str| {
            let c = std::ffi::CString::new(n).unwrap();
            // SAFETY: valid name and flags.
            let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: a fresh descriptor owned here.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let open_here = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains(&tag))
                .count()
        };
        let (a, b) = UnixStream::pair().unwrap();
        {
            let (f1, f2) = (named(&tag), named(&tag));
            send_with_fds(&a, &[0u8; REPLY_LEN], &[f1.as_raw_fd(), f2.as_raw_fd()]).unwrap();
        }
        // The sender's copies are closed; two are in flight.
        let e = recv_with_fd(&b).expect_err("two descriptors");
        assert!(e.to_string().contains("carried 2 descriptor(s)"), "{e}");
        assert_eq!(open_here(), 0, "a received descriptor stayed open");
    }
}
