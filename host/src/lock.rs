//! Distributed locks (OpenSHMEM `shmem_set_lock` / `shmem_test_lock` /
//! `shmem_clear_lock`): a symmetric `u64`, zero before first use, whose copy on world PE 0
//! is a ticket lock. Its high 32 bits are the next ticket, its low 32 bits the ticket
//! being served; the lock is free when they are equal. Tickets make the lock first come,
//! first served, as OpenSHMEM requires. Every access is an atomic on PE 0 through the
//! transport that reaches it (p2p, proxy or fabric), so locks work between nodes too.
//!
//! Each PE remembers the locks it holds or waits for (marked before it takes a ticket, in
//! one step with the check), so that clearing a lock it does not hold, or setting one it
//! holds or waits for (from another thread sharing the `Pe`), is an error (OpenSHMEM leaves
//! both undefined; the second would wait forever). It also keeps each PE to one ticket per
//! lock, so a queue longer than the job means the word was not zero before use, which is
//! refused before taking a ticket.
//!
//! A `set_lock` that fails after taking its ticket (the timeout, a dead PE, a transport
//! error) cannot withdraw it without breaking the order of those behind it, so the PE
//! keeps the ticket ("stranded"): its next `set_lock` or `test_lock` on that lock waits
//! for or tests that same ticket instead of taking another, so a PE that retries after a
//! timeout gets the lock in its turn and everyone behind it goes on. `clear_lock` on a
//! stranded ticket that is being served passes the lock on; before its turn it is an
//! error that says so.

use crate::error::{Error, Result};
use crate::pe::{ms_since, Pe};
use crate::types::SymPtr;
use std::time::Instant;

/// The PE whose copy of the lock word is the lock.
const HOME: usize = 0;
/// One ticket, in the word's high half.
const TICKET: u64 = 1 << 32;

fn next(v: u64) -> u32 {
    (v >> 32) as u32
}

fn serving(v: u64) -> u32 {
    v as u32
}

/// What a PE's entry for a lock says: held or waited for by a call now running, or a
/// ticket a failed `set_lock` left queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    Busy,
    Stranded(u32),
}

impl Pe {
    /// Waits until this PE holds `lock` (OpenSHMEM `shmem_set_lock`), in the order PEs
    /// asked for it. The wait is bounded by the PE's timeout; after a failure that left
    /// this PE's ticket queued, the next call waits for that ticket again.
    pub fn set_lock(&self, lock: SymPtr<u64>) -> Result<()> {
        let r = match self.claim_lock(lock, "set_lock")? {
            Some(ticket) => self.wait_turn(lock, ticket, true),
            None => self.take_lock(lock),
        };
        match r {
            Ok(()) => Ok(()),
            Err((e, Some(ticket))) => {
                self.set_claim(lock, Claim::Stranded(ticket));
                Err(e)
            }
            Err((e, None)) => {
                self.unclaim_lock(lock);
                Err(e)
            }
        }
    }

    /// Takes a ticket and waits for it; on an error, the ticket if one was taken.
    fn take_lock(&self, lock: SymPtr<u64>) -> std::result::Result<(), (Error, Option<u32>)> {
        // A word whose queue is longer than one ticket per PE (the claim above keeps each
        // PE to one) was not zero before first use: refused before taking a ticket, so the
        // word is left as it was.
        let seen = self.atomic_fetch(lock, HOME).map_err(|e| (e, None))?;
        let queued = next(seen).wrapping_sub(serving(seen));
        if queued as usize >= self.n_pes() {
            return Err((
                Error::InvalidArgument(format!(
                    "set_lock: the word at offset {:#x} on PE {HOME} is not a lock (next \
                     ticket {}, serving {}): a lock must be zero before its first use",
                    lock.offset(),
                    next(seen),
                    serving(seen)
                )),
                None,
            ));
        }
        let old = self
            .atomic_fetch_add(lock, TICKET, HOME)
            .map_err(|e| (e, None))?;
        self.wait_turn(lock, next(old), false)
    }

    /// Waits until `lock` serves `mine`, this PE's ticket; `resumed`: the ticket was left
    /// by an earlier call that failed.
    fn wait_turn(
        &self,
        lock: SymPtr<u64>,
        mine: u32,
        resumed: bool,
    ) -> std::result::Result<(), (Error, Option<u32>)> {
        let fail = |e| (e, Some(mine));
        // Not `Pe::poll`: its loop holds the proxy engine's progress handover while it
        // spins, and each step here is itself an atomic through the proxy or fabric.
        let start = Instant::now();
        let mut polls = 0u32;
        // Acquire (atomic_fetch): what the previous holder wrote before its release is
        // visible once its release is seen here.
        let mut last = self.atomic_fetch(lock, HOME).map_err(fail)?;
        while serving(last) != mine {
            polls = polls.saturating_add(1);
            if polls % 64 == 0 {
                self.live.check().map_err(fail)?;
                if start.elapsed() >= self.timeout() {
                    return Err(fail(Error::Timeout {
                        pe: self.my_pe(),
                        what: format!(
                            "the lock at offset {:#x} (kept on PE {HOME}): it serves ticket \
                             {}, this PE holds ticket {mine}{}, {} ahead of it; the ticket \
                             stays queued: the next set_lock or test_lock of this PE waits \
                             for it again",
                            lock.offset(),
                            serving(last),
                            if resumed {
                                " (kept from a failed set_lock)"
                            } else {
                                ""
                            },
                            mine.wrapping_sub(serving(last))
                        ),
                        waited_ms: ms_since(start),
                    }));
                }
            }
            if polls > 16 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            last = self.atomic_fetch(lock, HOME).map_err(fail)?;
        }
        Ok(())
    }

    /// Takes `lock` if it is free (OpenSHMEM `shmem_test_lock`): true when this PE now
    /// holds it, false when another PE held it or was queued for it. Never waits. With a
    /// ticket a failed `set_lock` left queued, true exactly when that ticket is served.
    pub fn test_lock(&self, lock: SymPtr<u64>) -> Result<bool> {
        let stranded = self.claim_lock(lock, "test_lock")?;
        let r = (|| {
            // Acquire, as in wait_turn.
            let v = self.atomic_fetch(lock, HOME)?;
            if let Some(mine) = stranded {
                return Ok(serving(v) == mine);
            }
            if next(v) != serving(v) {
                return Ok(false);
            }
            // A free lock: take the next ticket only if nobody took it since (AcqRel). A
            // failure means another PE did.
            Ok(self.atomic_compare_swap(lock, v, v.wrapping_add(TICKET), HOME)? == v)
        })();
        match (r.as_ref(), stranded) {
            (Ok(true), _) => {}
            (_, Some(t)) => self.set_claim(lock, Claim::Stranded(t)),
            (_, None) => {
                self.unclaim_lock(lock);
            }
        }
        r
    }

    /// Releases `lock`, held by this PE, to the next PE in line (OpenSHMEM
    /// `shmem_clear_lock`), after completing this PE's puts and atomics (quiet), so the
    /// next holder sees them. On an error the PE still holds the lock. A ticket a failed
    /// `set_lock` left queued is given up here once it is served (the lock passes on);
    /// before that it is an error.
    pub fn clear_lock(&self, lock: SymPtr<u64>) -> Result<()> {
        // Taken out of the held set first, so that two threads of this PE cannot both
        // release it (serving would advance twice).
        let Some(claim) = self.unclaim_lock(lock) else {
            return Err(Error::InvalidArgument(format!(
                "clear_lock: PE {} does not hold the lock at offset {:#x}",
                self.my_pe(),
                lock.offset()
            )));
        };
        if let Claim::Stranded(mine) = claim {
            let r = self.atomic_fetch(lock, HOME).and_then(|v| {
                if serving(v) == mine {
                    return self.serve_next(lock);
                }
                Err(Error::InvalidArgument(format!(
                    "clear_lock: PE {} does not hold the lock at offset {:#x}: its ticket \
                     {mine}, left queued by a set_lock that failed, waits behind ticket {} \
                     (set_lock waits for it again)",
                    self.my_pe(),
                    lock.offset(),
                    serving(v)
                )))
            });
            if r.is_err() {
                self.held_locks().push((lock.offset(), claim));
            }
            return r;
        }
        let r = self.try_quiet().and_then(|()| self.serve_next(lock));
        if r.is_err() {
            self.held_locks().push((lock.offset(), claim));
        }
        r
    }

    /// Serves the next ticket: the low half plus one, without carrying into the high half
    /// (a carry would hand out a ticket nobody holds). Other PEs may take tickets
    /// meanwhile, so a compare-and-swap, retried until it lands; AcqRel: the release
    /// publishes this PE's writes (completed by the quiet before) to the next holder.
    fn serve_next(&self, lock: SymPtr<u64>) -> Result<()> {
        let mut v = self.atomic_fetch(lock, HOME)?;
        loop {
            let served = (v & !0xffff_ffff) | serving(v).wrapping_add(1) as u64;
            let seen = self.atomic_compare_swap(lock, v, served, HOME)?;
            if seen == v {
                return Ok(());
            }
            v = seen;
        }
    }

    fn held_locks(&self) -> std::sync::MutexGuard<'_, Vec<(usize, Claim)>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `lock` as held or waited for by this PE, in one step with the check that it
    /// is not already (locks are not recursive, and one ticket per PE keeps a queue no
    /// longer than the job). A ticket a failed `set_lock` left is returned, to be waited
    /// for again.
    fn claim_lock(&self, lock: SymPtr<u64>, op: &str) -> Result<Option<u32>> {
        let mut held = self.held_locks();
        let Some((_, c)) = held.iter_mut().find(|(o, _)| *o == lock.offset()) else {
            held.push((lock.offset(), Claim::Busy));
            return Ok(None);
        };
        match *c {
            Claim::Busy => Err(Error::InvalidArgument(format!(
                "{op}: PE {} already holds or waits for the lock at offset {:#x} (locks are \
                 not recursive)",
                self.my_pe(),
                lock.offset()
            ))),
            Claim::Stranded(t) => {
                *c = Claim::Busy;
                Ok(Some(t))
            }
        }
    }

    /// Sets this PE's entry for `lock` (present: claimed before).
    fn set_claim(&self, lock: SymPtr<u64>, claim: Claim) {
        let mut held = self.held_locks();
        match held.iter_mut().find(|(o, _)| *o == lock.offset()) {
            Some((_, c)) => *c = claim,
            None => held.push((lock.offset(), claim)),
        }
    }

    /// Removes `lock` from this PE's held set and returns its entry; None when it was
    /// not there.
    fn unclaim_lock(&self, lock: SymPtr<u64>) -> Option<Claim> {
        let mut held = self.held_locks();
        let i = held.iter().position(|&(o, _)| o == lock.offset())?;
        Some(held.swap_remove(i).1)
    }
}
