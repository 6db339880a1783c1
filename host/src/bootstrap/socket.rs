//! Socket options shared by both ends of a bootstrap connection.
//!
//! Owns how a bootstrap TCP connection is tuned (no Nagle delay, aggressive keepalive and a
//! TCP user timeout so a dead link or host is noticed within seconds) and the constant-time token comparison.
//! It must not read or write frames.
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Seconds of idleness before the first keepalive probe, between probes, and probes lost
/// before the kernel declares the connection dead (about 4 s in all).
const KEEPALIVE_IDLE_S: libc::c_int = 1;
const KEEPALIVE_INTERVAL_S: libc::c_int = 1;
const KEEPALIVE_PROBES: libc::c_int = 3;
/// Milliseconds sent data may stay unacknowledged before the kernel drops the connection.
/// Keepalive only covers idle connections; this covers a link that dies with data in
/// flight (TCP would otherwise retransmit for minutes).
const USER_TIMEOUT_MS: libc::c_int = 5000;

fn setsockopt_int(
    s: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the fd is a live socket owned by `s` for the duration of the call; the option
    // value points at a c_int on our stack whose size we pass.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// TCP_NODELAY (collectives are small request/response messages) and keepalive.
pub(crate) fn tune(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    setsockopt_int(s, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S)?;
        setsockopt_int(
            s,
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            KEEPALIVE_INTERVAL_S,
        )?;
        setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES)?;
        setsockopt_int(
            s,
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            USER_TIMEOUT_MS,
        )?;
    }
    Ok(())
}

/// Compares two secrets in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..n {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    // black_box keeps the optimiser from turning the loop into an early-exit compare.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abc\0"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
