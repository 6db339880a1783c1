//! Distributed locks (OpenSHMEM `shmem_set_lock` / `shmem_test_lock` /
//! `shmem_clear_lock`): a symmetric `u64`, zero before first use, whose copy on world PE 0
//! is a ticket lock. Its high 32 bits are the next ticket, its low 32 bits the ticket
//! being served; the lock is free when they are equal. Tickets make the lock first come,
//! first served, as OpenSHMEM requires. Every access is an atomic on PE 0 through the
//! transport that reaches it (p2p, proxy or fabric), so locks work between nodes too.
//!
//! Each PE remembers the locks it holds, so that clearing a lock it does not hold or
//! setting one it already holds is an error (OpenSHMEM leaves both undefined; the second
//! would wait forever). A `set_lock` that gives up after the PE's timeout keeps its ticket
//! (a ticket cannot be withdrawn without breaking the order of those behind it): the lock
//! stays unusable, which the error says.

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

impl Pe {
    /// Waits until this PE holds `lock` (OpenSHMEM `shmem_set_lock`), in the order PEs
    /// asked for it. The wait is bounded by the PE's timeout.
    pub fn set_lock(&self, lock: SymPtr<u64>) -> Result<()> {
        self.lock_not_held(lock, "set_lock")?;
        let old = self.atomic_fetch_add(lock, TICKET, HOME)?;
        let mine = next(old);
        // At most one ticket per PE is outstanding on a lock, so a longer queue means the
        // word was not zero before first use (or is not a lock).
        let ahead = mine.wrapping_sub(serving(old));
        if ahead as usize >= self.n_pes() {
            return Err(Error::InvalidArgument(format!(
                "set_lock: the word at offset {:#x} on PE {HOME} is not a lock (next ticket \
                 {mine}, serving {}): a lock must be zero before its first use",
                lock.offset(),
                serving(old)
            )));
        }
        let start = Instant::now();
        let mut polls = 0u32;
        let mut last = old;
        while serving(last) != mine {
            polls = polls.saturating_add(1);
            if polls % 64 == 0 {
                self.live.check()?;
                if start.elapsed() >= self.timeout() {
                    return Err(Error::Timeout {
                        pe: self.my_pe(),
                        what: format!(
                            "the lock at offset {:#x} (kept on PE {HOME}): it serves ticket \
                             {}, this PE holds ticket {mine}, {} ahead of it; the ticket \
                             stays queued, so the lock cannot be used again",
                            lock.offset(),
                            serving(last),
                            mine.wrapping_sub(serving(last))
                        ),
                        waited_ms: ms_since(start),
                    });
                }
            }
            if polls > 16 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            // Acquire (atomic_fetch): what the previous holder wrote before its release
            // is visible once its release is seen here.
            last = self.atomic_fetch(lock, HOME)?;
        }
        self.held_locks().push(lock.offset());
        Ok(())
    }

    /// Takes `lock` if it is free (OpenSHMEM `shmem_test_lock`): true when this PE now
    /// holds it, false when another PE held it or was queued for it. Never waits.
    pub fn test_lock(&self, lock: SymPtr<u64>) -> Result<bool> {
        self.lock_not_held(lock, "test_lock")?;
        let v = self.atomic_fetch(lock, HOME)?;
        if next(v) != serving(v) {
            return Ok(false);
        }
        // A free lock: take the next ticket only if nobody took it since (AcqRel). A
        // failure means another PE did.
        let taken = self.atomic_compare_swap(lock, v, v.wrapping_add(TICKET), HOME)? == v;
        if taken {
            self.held_locks().push(lock.offset());
        }
        Ok(taken)
    }

    /// Releases `lock`, held by this PE, to the next PE in line (OpenSHMEM
    /// `shmem_clear_lock`), after completing this PE's puts and atomics (quiet), so the
    /// next holder sees them.
    pub fn clear_lock(&self, lock: SymPtr<u64>) -> Result<()> {
        if !self.held_locks().contains(&lock.offset()) {
            return Err(Error::InvalidArgument(format!(
                "clear_lock: PE {} does not hold the lock at offset {:#x}",
                self.my_pe(),
                lock.offset()
            )));
        }
        self.try_quiet()?;
        // Serve the next ticket: the low half plus one, without carrying into the high half
        // (a carry would hand out a ticket nobody holds). Other PEs may take tickets
        // meanwhile, so a compare-and-swap, retried until it lands; AcqRel: the release
        // publishes this PE's writes (completed by the quiet above) to the next holder.
        let mut v = self.atomic_fetch(lock, HOME)?;
        loop {
            let served = (v & !0xffff_ffff) | serving(v).wrapping_add(1) as u64;
            let seen = self.atomic_compare_swap(lock, v, served, HOME)?;
            if seen == v {
                break;
            }
            v = seen;
        }
        let mut held = self.held_locks();
        if let Some(i) = held.iter().position(|&o| o == lock.offset()) {
            held.swap_remove(i);
        }
        Ok(())
    }

    fn held_locks(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_not_held(&self, lock: SymPtr<u64>, op: &str) -> Result<()> {
        if self.held_locks().contains(&lock.offset()) {
            return Err(Error::InvalidArgument(format!(
                "{op}: PE {} already holds the lock at offset {:#x} (locks are not recursive)",
                self.my_pe(),
                lock.offset()
            )));
        }
        Ok(())
    }
}
