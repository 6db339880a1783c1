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
pub use root::{set_log_sink, Root};

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

/// Shared, cheaply pollable record of the peers that died.
///
/// Every reported death is kept. [`Liveness::check`] fails with the first death that is
/// not *tolerated*: a PE can tolerate a peer's death ([`Liveness::tolerate`]; EP shrink
/// mode does, after masking the peer) so that its waits and RMA to other peers go on.
/// [`Liveness::check_strict`] fails on any death: bootstrap collectives use it, since they
/// include every PE of their group. When the bootstrap root itself is lost, the PE
/// reported is 0 (by convention the root is hosted by rank 0 or by the launcher; the
/// detail names the root's address), and that loss cannot be tolerated.
#[derive(Debug, Default)]
pub struct Liveness {
    /// 0 while no untolerated death is known; else the first such PE's rank + 1.
    dead: AtomicU64,
    /// 0 while every peer is alive; else the first dead PE's rank + 1.
    any: AtomicU64,
    /// Every death and every tolerated PE; `dead` and `any` are recomputed under it.
    record: Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    /// (PE, why, fatal) in report order; fatal = the bootstrap root was lost.
    deaths: Vec<(usize, String, bool)>,
    tolerated: Vec<usize>,
}

impl Record {
    fn first_untolerated(&self) -> Option<&(usize, String, bool)> {
        self.deaths
            .iter()
            .find(|(pe, _, fatal)| *fatal || !self.tolerated.contains(pe))
    }
}

/// Locks a mutex, ignoring poisoning: every critical section in this module leaves the
/// data consistent before anything that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Liveness {
    /// `Err(Error::PeerDied { pe, detail })` once a PE died whose death this PE does not
    /// tolerate, or the root was lost.
    ///
    /// While all is well this is one atomic load, cheap enough for RMA wait loops.
    #[inline]
    pub fn check(&self) -> Result<()> {
        // Acquire pairs with the Release stores in `update`, so that once the flag is seen
        // the record written before it is visible (the mutex orders it as well; the
        // Acquire keeps the fast path honest). On x86 and Arm64 an Acquire load costs the
        // same as a Relaxed one.
        if self.dead.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.died(false)
    }

    /// Like [`Liveness::check`], but any death fails, tolerated or not (for collectives
    /// that include every PE).
    #[inline]
    pub fn check_strict(&self) -> Result<()> {
        // Acquire: as in `check`.
        if self.any.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.died(true)
    }

    /// [`Liveness::check`] for an operation on PE `pe`: also fails when `pe` itself died,
    /// tolerated or not (data sent to a dead PE would be lost silently).
    #[inline]
    pub fn check_to(&self, pe: usize) -> Result<()> {
        // Acquire: as in `check`. `any` is 0 whenever `dead` is, so one load suffices.
        if self.any.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.died_to(pe, true)
    }

    /// Fails only when PE `pe` itself died (tolerated or not): for a wait that must not
    /// end while `pe` may still be working on this PE's memory, whatever else died.
    pub fn check_only(&self, pe: usize) -> Result<()> {
        // Acquire: as in `check`.
        if self.any.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.died_to(pe, false)
    }

    /// The death of `target`, or (`any_untolerated`) the first untolerated death first.
    #[cold]
    #[inline(never)]
    fn died_to(&self, target: usize, any_untolerated: bool) -> Result<()> {
        let r = lock(&self.record);
        let d = any_untolerated
            .then(|| r.first_untolerated())
            .flatten()
            .or_else(|| r.deaths.iter().find(|d| d.0 == target));
        match d {
            Some((pe, detail, _)) => Err(Error::PeerDied {
                pe: *pe,
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The error for a recorded death (kept out of line: `check` sits on hot paths).
    #[cold]
    #[inline(never)]
    fn died(&self, strict: bool) -> Result<()> {
        let r = lock(&self.record);
        let d = if strict {
            r.deaths.first()
        } else {
            r.first_untolerated()
        };
        match d {
            Some((pe, detail, _)) => Err(Error::PeerDied {
                pe: *pe,
                detail: detail.clone(),
            }),
            None => Ok(()), // tolerated meanwhile
        }
    }

    /// Whether no death has been reported.
    pub fn is_ok(&self) -> bool {
        // Relaxed: a boolean answer carries no data to synchronise with; callers that want
        // the detail call `check`.
        self.any.load(Ordering::Relaxed) == 0
    }

    /// The PEs reported dead, in report order.
    pub fn dead_pes(&self) -> Vec<usize> {
        lock(&self.record).deaths.iter().map(|d| d.0).collect()
    }

    /// Records that PE `pe` died. Returns whether this was the first report of its death.
    /// Public so that supervisors (e.g. a launcher that saw a child exit) can feed the
    /// same record.
    pub fn report(&self, pe: usize, detail: impl Into<String>) -> bool {
        self.add(pe, detail.into(), false)
    }

    /// Records that the bootstrap root was lost (reported as PE 0; never tolerated).
    pub fn report_root_lost(&self, detail: impl Into<String>) -> bool {
        self.add(0, detail.into(), true)
    }

    fn add(&self, pe: usize, detail: String, fatal: bool) -> bool {
        let mut r = lock(&self.record);
        if r.deaths.iter().any(|d| d.0 == pe && d.2 == fatal) {
            return false;
        }
        r.deaths.push((pe, detail, fatal));
        self.update(&r);
        true
    }

    /// Stops failing [`Liveness::check`] for the death of PE `pe` (reported already or
    /// later). Fails if the bootstrap root was lost: nothing can go on without it.
    pub fn tolerate(&self, pe: usize) -> Result<()> {
        let mut r = lock(&self.record);
        if let Some((p, detail, _)) = r.deaths.iter().find(|d| d.2) {
            return Err(Error::PeerDied {
                pe: *p,
                detail: detail.clone(),
            });
        }
        if !r.tolerated.contains(&pe) {
            r.tolerated.push(pe);
        }
        self.update(&r);
        Ok(())
    }

    /// Recomputes the two flags from the record (called with the record locked).
    fn update(&self, r: &Record) {
        let first = r.first_untolerated().map_or(0, |d| d.0 as u64 + 1);
        let any = r.deaths.first().map_or(0, |d| d.0 as u64 + 1);
        // Release: publishes the record written above to the Acquire loads in `check` and
        // `check_strict`.
        self.dead.store(first, Ordering::Release);
        self.any.store(any, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_keeps_every_death_and_tolerates_some() {
        let l = Liveness::default();
        assert!(l.check().is_ok());
        assert!(l.check_strict().is_ok());
        assert!(l.is_ok());
        assert!(l.report(3, "exited"));
        assert!(!l.report(3, "again"));
        assert!(l.report(5, "also exited"));
        assert!(!l.is_ok());
        assert_eq!(l.dead_pes(), vec![3, 5]);
        let pe_of = |r: Result<()>| match r {
            Err(Error::PeerDied { pe, detail }) => (pe, detail),
            other => panic!("{other:?}"),
        };
        assert_eq!(pe_of(l.check()), (3, "exited".to_string()));
        l.tolerate(3).unwrap();
        assert_eq!(pe_of(l.check()), (5, "also exited".to_string()));
        assert_eq!(pe_of(l.check_strict()).0, 3, "strict fails on any death");
        assert_eq!(pe_of(l.check_to(3)).0, 5, "the untolerated death first");
        l.tolerate(5).unwrap();
        assert!(l.check().is_ok());
        assert!(l.check_to(4).is_ok());
        assert_eq!(
            pe_of(l.check_to(3)),
            (3, "exited".to_string()),
            "RMA to a dead PE"
        );
        assert_eq!(pe_of(l.check_strict()).0, 3);
        // Tolerated before it dies: no failure when it does.
        l.tolerate(7).unwrap();
        assert!(l.report(7, "killed"));
        assert!(l.check().is_ok());
        // The root lost: fatal, cannot be tolerated, even for PE 0 tolerated before.
        l.tolerate(0).unwrap();
        assert!(l.report_root_lost("lost the root"));
        assert_eq!(pe_of(l.check()), (0, "lost the root".to_string()));
        assert_eq!(pe_of(l.tolerate(0)).1, "lost the root");
        assert_eq!(pe_of(l.tolerate(2)).1, "lost the root");
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
