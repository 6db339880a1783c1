//! Bootstrap: TCP rendezvous and small collectives among PEs.
//!
//! This module owns how PEs of one job find each other and agree on small things before
//! (and while) the data path runs: a [`Root`] (hub) listens on a TCP address; every PE
//! [`Bootstrap::join`]s it with its rank, the job's size, a shared token and its node id;
//! once all have joined, each receives the job id and every PE's node id. After that the
//! PEs run collectives ([`Bootstrap::allgather`], [`Bootstrap::barrier`],
//! [`Bootstrap::broadcast`]) through the root, keyed by a [`Group`], and the root reports a
//! PE whose connection closes without [`Bootstrap::finalize`] to every other PE
//! ([`Liveness`]).
//!
//! It must not carry bulk data (the transports do) and keeps no process-global state: one
//! process may host the root and several PEs (one thread each).
//!
//! Layout: [`wire`] (frame encoding), `root` (the hub), `client` (a PE's connection),
//! `socket` (socket options).
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

mod client;
mod root;
mod socket;
pub(crate) mod wire;

pub use client::{Bootstrap, JoinParams};
pub use root::Root;

/// A set of PEs taking part in a collective: a team's unique id and its members' world ranks
/// in team order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub uid: u64,
    pub members: Vec<u32>,
}

impl Group {
    /// The world group of a job of `world_size` PEs: uid 0, members `0..world_size`.
    pub fn world(world_size: usize) -> Group {
        Group {
            uid: 0,
            members: (0..world_size as u32).collect(),
        }
    }
}

/// Shared, cheaply pollable record of whether any peer died.
///
/// The first death reported wins; later ones are ignored (the job is already broken).
/// When the bootstrap root itself is lost, the PE reported is 0 (by convention the root
/// is hosted by rank 0 or by the launcher; the detail names the root's address).
#[derive(Debug, Default)]
pub struct Liveness {
    /// 0 while every peer is alive; else the dead PE's rank + 1.
    dead: AtomicU64,
    /// Why the PE is considered dead; written once, before `dead` is set.
    detail: Mutex<String>,
}

/// Locks a mutex, ignoring poisoning: every critical section in this module leaves the
/// data consistent before anything that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Liveness {
    /// `Err(Error::PeerDied { pe, detail })` once any PE of the job died or the root was lost.
    ///
    /// While all is well this is one atomic load, cheap enough for RMA wait loops.
    #[inline]
    pub fn check(&self) -> Result<()> {
        // Acquire pairs with the Release store in `report`, so that once the flag is seen
        // the detail written before it is visible (the mutex would also order it; the
        // Acquire keeps that true even if the detail moves out of the mutex). On x86 and
        // Arm64 an Acquire load costs the same as a Relaxed one in the fast path.
        let v = self.dead.load(Ordering::Acquire);
        if v == 0 {
            return Ok(());
        }
        self.died(v)
    }

    /// The error for a recorded death (kept out of line: `check` sits on hot paths).
    #[cold]
    #[inline(never)]
    fn died(&self, v: u64) -> Result<()> {
        Err(Error::PeerDied {
            pe: (v - 1) as usize,
            detail: lock(&self.detail).clone(),
        })
    }

    /// Whether no death has been reported.
    pub fn is_ok(&self) -> bool {
        // Relaxed: a boolean answer carries no data to synchronise with; callers that want
        // the detail call `check`.
        self.dead.load(Ordering::Relaxed) == 0
    }

    /// Records that PE `pe` died (the first report wins). Returns whether this report was
    /// the first. Public so that supervisors (e.g. a launcher that saw a child exit) can
    /// feed the same record.
    pub fn report(&self, pe: usize, detail: impl Into<String>) -> bool {
        let mut d = lock(&self.detail);
        // Relaxed: this read happens under the detail mutex, which serialises reporters.
        if self.dead.load(Ordering::Relaxed) != 0 {
            return false;
        }
        *d = detail.into();
        // Release: publishes the detail written above to `check`'s Acquire load.
        self.dead.store(pe as u64 + 1, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_first_report_wins() {
        let l = Liveness::default();
        assert!(l.check().is_ok());
        assert!(l.is_ok());
        assert!(l.report(3, "exited"));
        assert!(!l.report(5, "also exited"));
        assert!(!l.is_ok());
        match l.check() {
            Err(Error::PeerDied { pe, detail }) => {
                assert_eq!(pe, 3);
                assert_eq!(detail, "exited");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn world_group() {
        assert_eq!(
            Group::world(3),
            Group {
                uid: 0,
                members: vec![0, 1, 2]
            }
        );
    }
}
