//! Ping-pong latency over two endpoints in this process (two threads, one domain):
//! thread A `write_data`s `size` bytes to B, B answers with the same, and so on. The
//! one-way latency is half the round trip. Not a test: run it through
//! `host/tests/fabric_rma.rs::pingpong_prints_latency` or call it from a tool.

use super::{Completion, Domain, Endpoint, Local, PeerAddr, RemoteRegion, Target};
use crate::error::{Error, Result};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Result of [`pingpong`].
#[derive(Debug, Clone)]
pub struct PingPong {
    pub provider: String,
    pub size: usize,
    pub iters: usize,
    /// Median one-way latency (half a round trip).
    pub median_one_way: Duration,
    /// Mean one-way latency.
    pub mean_one_way: Duration,
    /// `size / mean_one_way` in MB/s (10^6 bytes per second).
    pub mb_per_s: f64,
}

impl std::fmt::Display for PingPong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} write_data ping-pong {} B x {}: one-way median {:.2} us, mean {:.2} us, {:.1} MB/s",
            self.provider,
            self.size,
            self.iters,
            self.median_one_way.as_secs_f64() * 1e6,
            self.mean_one_way.as_secs_f64() * 1e6,
            self.mb_per_s
        )
    }
}

/// Opens a fabric from the environment ([`super::FabricConfig::from_env`]), runs
/// `iters` round trips of `size` bytes (after `iters / 10 + 1` warm-up round trips),
/// prints and returns the latency.
pub fn pingpong(size: usize, iters: usize) -> Result<PingPong> {
    let fabric = super::Fabric::open_from_env()?;
    let domain = fabric.domain()?;
    let r = pingpong_on(&domain, size, iters)?;
    println!("{r}");
    Ok(r)
}

struct Side {
    ep: Endpoint,
    mr: Arc<super::MemoryRegion>,
    peer: PeerAddr,
    remote: RemoteRegion,
}

/// [`pingpong`] on an open domain.
pub fn pingpong_on(domain: &Arc<Domain>, size: usize, iters: usize) -> Result<PingPong> {
    if size == 0 || iters == 0 {
        return Err(Error::InvalidArgument(
            "pingpong needs size and iters > 0".into(),
        ));
    }
    let mk = || -> Result<(Endpoint, Arc<super::MemoryRegion>)> {
        let ep = Endpoint::new(domain)?;
        let mr = domain.alloc(size)?;
        let pattern: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
        mr.write(0, &pattern)?;
        Ok((ep, mr))
    };
    let (mut ea, ma) = mk()?;
    let (mut eb, mb) = mk()?;
    let pa = eb.insert_peer(ea.name())?;
    let pb = ea.insert_peer(eb.name())?;
    let a = Side {
        remote: mb.remote(),
        ep: ea,
        mr: ma.clone(),
        peer: pb,
    };
    let b = Side {
        remote: ma.remote(),
        ep: eb,
        mr: mb.clone(),
        peer: pa,
    };
    let warm = iters / 10 + 1;
    let total = warm + iters;
    let timeout = domain.fabric().timeout();
    let (tx, rx) = mpsc::channel();
    let responder = std::thread::spawn(move || -> Result<()> {
        let mut b = b;
        for i in 0..total {
            wait_data(&mut b.ep, i as u64, timeout)?;
            send(&mut b, i as u64)?;
        }
        drain(&mut b.ep, timeout)?;
        let _ = tx.send(());
        Ok(())
    });
    let mut a = a;
    let mut rtts = Vec::with_capacity(iters);
    let run = (|| -> Result<()> {
        for i in 0..total {
            let t = Instant::now();
            send(&mut a, i as u64)?;
            wait_data(&mut a.ep, i as u64, timeout)?;
            if i >= warm {
                rtts.push(t.elapsed());
            }
        }
        drain(&mut a.ep, timeout)
    })();
    let joined = responder
        .join()
        .map_err(|_| Error::Verification("pingpong responder thread panicked".into()))?;
    run?;
    joined?;
    let _ = rx.recv();
    rtts.sort();
    let median = rtts[rtts.len() / 2] / 2;
    let mean = rtts.iter().sum::<Duration>() / (2 * rtts.len() as u32);
    Ok(PingPong {
        provider: domain.info().provider.clone(),
        size,
        iters,
        median_one_way: median,
        mean_one_way: mean,
        mb_per_s: size as f64 / mean.as_secs_f64() / 1e6,
    })
}

fn send(s: &mut Side, i: u64) -> Result<()> {
    let dst = Target {
        peer: s.peer,
        region: s.remote,
        offset: 0,
    };
    let src = Local {
        region: &s.mr,
        offset: 0,
    };
    let len = s.mr.len();
    s.ep.write_data(dst, src, len, i, i)
}

/// Polls until the peer's immediate `i` arrives; local completions must be successes.
fn wait_data(ep: &mut Endpoint, i: u64, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut out = Vec::new();
    loop {
        out.clear();
        ep.poll_into(&mut out)?;
        let mut got = false;
        for c in &out {
            match c {
                Completion::RemoteData { data } if *data == i => got = true,
                Completion::RemoteData { data } => {
                    return Err(Error::Verification(format!(
                        "pingpong: expected immediate {i}, got {data}"
                    )))
                }
                Completion::Local { status: Ok(()), .. } => {}
                Completion::Local {
                    status: Err(e),
                    context,
                } => {
                    return Err(Error::Verification(format!(
                        "pingpong: operation {context} failed: {e}"
                    )))
                }
                Completion::Unattributed(e) => {
                    return Err(Error::Verification(format!("pingpong: {e}")))
                }
            }
        }
        if got {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                pe: 0,
                what: format!("pingpong immediate {i}"),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
    }
}

/// Polls until nothing is in flight.
fn drain(ep: &mut Endpoint, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while ep.in_flight() > 0 {
        for c in ep.poll()? {
            if let Completion::Local {
                status: Err(e),
                context,
            } = c
            {
                return Err(Error::Verification(format!(
                    "pingpong: operation {context} failed: {e}"
                )));
            }
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                pe: 0,
                what: format!("{} pingpong completions", ep.in_flight()),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
    }
    Ok(())
}
