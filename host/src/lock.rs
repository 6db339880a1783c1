//! Distributed locks (OpenSHMEM `shmem_set_lock` / `shmem_test_lock` /
//! `shmem_clear_lock`): a symmetric `u64`, zero before first use, whose copy on world PE 0
//! is a ticket lock. Its high 32 bits are the next ticket, its low 32 bits the ticket
//! being served; the lock is free when they are equal. Tickets make the lock first come,
//! first served, as OpenSHMEM requires. Every access is an atomic on PE 0 through the
//! transport that reaches it (p2p, proxy or fabric), so locks work between nodes too.
//!
//! Each PE remembers, per lock, whether a call of it waits for the lock, holds it, is
//! releasing it, or keeps a stranded ticket (below): marked before it takes a ticket, in
//! one step with the check. So clearing a lock it does not hold (another thread of it may
//! be waiting for it), or setting one it holds or waits for (from another thread sharing
//! the `Pe`), is an error (OpenSHMEM leaves both undefined; the second would wait
//! forever). It also keeps each PE to one ticket per lock, so a queue longer than the job
//! means the word was not zero before use, which is refused before taking a ticket.
//!
//! A `set_lock` that fails after taking its ticket (the timeout, a dead PE, a transport
//! error) cannot withdraw it without breaking the order of those behind it, so the PE
//! keeps the ticket ("stranded"): its next `set_lock` or `test_lock` on that lock waits
//! for or tests that same ticket instead of taking another, so a PE that retries after a
//! timeout gets the lock in its turn and everyone behind it goes on. `clear_lock` on a
//! stranded ticket that is being served gives it up (the lock passes on); before its
//! turn it is an error that says so. PEs queued behind a stranded ticket wait until its
//! PE comes back, as in any FIFO lock. A release passes the lock on only while it still
//! serves this PE's ticket, so a `clear_lock` retried after one whose reply was lost
//! (its compare-and-swap landed) does nothing instead of passing it on a second time.

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

/// What a PE's entry for a lock says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// A `set_lock` or `test_lock` of this PE runs for it.
    Waiting,
    /// This PE holds it, with this ticket (a retried release checks that the lock still
    /// serves it).
    Held(u32),
    /// A `clear_lock` of this PE runs for it.
    Releasing,
    /// A ticket a failed `set_lock` left queued.
    Stranded(u32),
}

/// Whether ticket `mine` was served and passed on already (`serving` is past it, by less
/// than half the ticket space; a ticket not yet served is behind by at most the job).
fn passed(serving: u32, mine: u32) -> bool {
    (serving.wrapping_sub(mine) as i32) > 0
}

impl Pe {
    /// Waits until this PE holds `lock` (OpenSHMEM `shmem_set_lock`), in the order PEs
    /// asked for it. The wait is bounded by the PE's timeout; after a failure that left
    /// this PE's ticket queued, the next call waits for that ticket again.
    pub fn set_lock(&self, lock: SymPtr<u64>) -> Result<()> {
        let r = match self.claim_lock(lock, "set_lock")? {
            Some(ticket) => self.wait_turn(lock, ticket, true).map(|()| ticket),
            None => self.take_lock(lock),
        };
        match r {
            Ok(ticket) => {
                self.set_claim(lock, Claim::Held(ticket));
                Ok(())
            }
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

    /// Takes a ticket and waits for it; returns the ticket, or on an error the ticket if
    /// one was taken.
    fn take_lock(&self, lock: SymPtr<u64>) -> std::result::Result<u32, (Error, Option<u32>)> {
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
        self.wait_turn(lock, next(old), false).map(|()| next(old))
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
            if passed(serving(last), mine) {
                // Only a release whose reply was lost gets here (nobody else passes this
                // PE's ticket on): the ticket is spent, and the next call takes a new one.
                return Err((self.spent(lock, mine, serving(last)), None));
            }
            polls = polls.saturating_add(1);
            if polls % 64 == 0 {
                self.live.check().map_err(fail)?;
                if start.elapsed() >= self.timeout() {
                    return Err(fail(Error::Timeout {
                        pe: self.my_pe(),
                        what: format!(
                            "the lock at offset {:#x} (kept on PE {HOME}): it serves ticket \
                             {}, this PE holds ticket {mine}{}, {} ahead of it; the ticket \
                             stays queued, and the PEs behind it wait: this PE's next \
                             set_lock or test_lock waits for it again, and clear_lock gives \
                             it up once it is served",
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

    fn spent(&self, lock: SymPtr<u64>, mine: u32, serving: u32) -> Error {
        Error::InvalidArgument(format!(
            "the lock at offset {:#x} serves ticket {serving}, past ticket {mine} that PE {} \
             kept from a failed set_lock: that ticket was passed on (a release whose reply \
             was lost) and is dropped",
            lock.offset(),
            self.my_pe()
        ))
    }

    /// Takes `lock` if it is free (OpenSHMEM `shmem_test_lock`): true when this PE now
    /// holds it, false when another PE held it or was queued for it. Never waits. With a
    /// ticket a failed `set_lock` left queued, true exactly when that ticket is served.
    pub fn test_lock(&self, lock: SymPtr<u64>) -> Result<bool> {
        let stranded = self.claim_lock(lock, "test_lock")?;
        let mut spent = false;
        let mut taken = None;
        let r = (|| {
            // Acquire, as in wait_turn.
            let v = self.atomic_fetch(lock, HOME)?;
            if let Some(mine) = stranded {
                if passed(serving(v), mine) {
                    spent = true;
                    return Err(self.spent(lock, mine, serving(v)));
                }
                taken = Some(mine);
                return Ok(serving(v) == mine);
            }
            if next(v) != serving(v) {
                return Ok(false);
            }
            // A free lock: take the next ticket only if nobody took it since (AcqRel). A
            // failure means another PE did.
            taken = Some(next(v));
            Ok(self.atomic_compare_swap(lock, v, v.wrapping_add(TICKET), HOME)? == v)
        })();
        match (r.as_ref(), stranded, taken) {
            (Ok(true), _, Some(t)) => self.set_claim(lock, Claim::Held(t)),
            (_, Some(t), _) if !spent => self.set_claim(lock, Claim::Stranded(t)),
            _ => {
                self.unclaim_lock(lock);
            }
        }
        r
    }

    /// Releases `lock`, held by this PE, to the next PE in line (OpenSHMEM
    /// `shmem_clear_lock`), after completing this PE's puts and atomics (quiet), so the
    /// next holder sees them. On an error before the release was posted (the quiet) the
    /// PE still holds the lock; on a transport error of the release itself it may already
    /// have passed on (the compare-and-swap landed, its reply was lost): retry
    /// `clear_lock`, which then finds it passed and does nothing, and do not write under
    /// the lock meanwhile. A ticket a failed
    /// `set_lock` left queued is given up here once it is served (the lock passes on);
    /// before that it is an error.
    pub fn clear_lock(&self, lock: SymPtr<u64>) -> Result<()> {
        // Marked as being released first (in one step with the check), so that two
        // threads of this PE cannot both release it (serving would advance twice), and no
        // other thread takes a second ticket meanwhile.
        let claim = {
            let mut held = self.held_locks();
            let entry = held.iter_mut().find(|(o, _)| *o == lock.offset());
            match entry {
                Some((_, c @ (Claim::Held(_) | Claim::Stranded(_)))) => {
                    let was = *c;
                    *c = Claim::Releasing;
                    was
                }
                other => {
                    let why = match other.map(|(_, c)| *c) {
                        Some(Claim::Waiting) => " (another thread of it waits for it)",
                        Some(Claim::Releasing) => " (another thread of it is releasing it)",
                        _ => "",
                    };
                    return Err(Error::InvalidArgument(format!(
                        "clear_lock: PE {} does not hold the lock at offset {:#x}{why}",
                        self.my_pe(),
                        lock.offset()
                    )));
                }
            }
        };
        let r = match claim {
            // Nothing was written under a stranded ticket: no quiet needed.
            Claim::Stranded(mine) => self.serve_next(lock, mine, true),
            Claim::Held(mine) => self
                .try_quiet()
                .and_then(|()| self.serve_next(lock, mine, false)),
            Claim::Waiting | Claim::Releasing => unreachable!("taken from Held or Stranded"),
        };
        match r {
            Ok(()) => {
                self.unclaim_lock(lock);
            }
            Err(_) => self.set_claim(lock, claim),
        }
        r
    }

    /// Serves the ticket after `mine`, this PE's: the low half plus one, without carrying
    /// into the high half (a carry would hand out a ticket nobody holds). Other PEs may
    /// take tickets meanwhile, so a compare-and-swap, retried until it lands; AcqRel: the
    /// release publishes this PE's writes (completed by the quiet before) to the next
    /// holder. Only while the lock still serves `mine`: a retry after a release whose
    /// reply was lost finds it passed on and does nothing (before 2026-12-07 it advanced
    /// the lock a second time, letting a third PE in beside the one that held it).
    /// `stranded`: `mine` was left queued by a failed set_lock (for the error).
    fn serve_next(&self, lock: SymPtr<u64>, mine: u32, stranded: bool) -> Result<()> {
        let mut v = self.atomic_fetch(lock, HOME)?;
        loop {
            if serving(v) != mine {
                if passed(serving(v), mine) {
                    // Given up already (a release whose reply was lost): nothing to do.
                    return Ok(());
                }
                return Err(Error::InvalidArgument(format!(
                    "clear_lock: PE {} does not hold the lock at offset {:#x}: its ticket \
                     {mine}{} waits behind ticket {}{}",
                    self.my_pe(),
                    lock.offset(),
                    if stranded {
                        ", left queued by a set_lock that failed,"
                    } else {
                        ""
                    },
                    serving(v),
                    if stranded {
                        " (set_lock waits for it again)"
                    } else {
                        ""
                    }
                )));
            }
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

    /// Marks `lock` as waited for by this PE, in one step with the check that no call of
    /// it waits for, holds or releases it already (locks are not recursive, and one
    /// ticket per PE keeps a queue no longer than the job). A ticket a failed `set_lock`
    /// left is returned, to be waited for again.
    fn claim_lock(&self, lock: SymPtr<u64>, op: &str) -> Result<Option<u32>> {
        let mut held = self.held_locks();
        let Some((_, c)) = held.iter_mut().find(|(o, _)| *o == lock.offset()) else {
            held.push((lock.offset(), Claim::Waiting));
            return Ok(None);
        };
        match *c {
            Claim::Stranded(t) => {
                *c = Claim::Waiting;
                Ok(Some(t))
            }
            _ => Err(Error::InvalidArgument(format!(
                "{op}: PE {} already holds or waits for the lock at offset {:#x} (locks are \
                 not recursive)",
                self.my_pe(),
                lock.offset()
            ))),
        }
    }

    /// Sets this PE's entry for `lock`, which the calling thread marked Waiting or
    /// Releasing (nobody else changes or removes such an entry).
    fn set_claim(&self, lock: SymPtr<u64>, claim: Claim) {
        let mut held = self.held_locks();
        let entry = held.iter_mut().find(|(o, _)| *o == lock.offset());
        debug_assert!(
            matches!(entry, Some((_, Claim::Waiting | Claim::Releasing))),
            "lock entry {entry:?}"
        );
        if let Some((_, c)) = entry {
            *c = claim;
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
