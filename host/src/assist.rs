//! Target-assisted large puts over p2p: a PE that waits inside rshmem copies chunks of the
//! large puts other PEs are making into its heap.
//!
//! # Why
//! A p2p put is a copy by the initiator's core into the mapped peer heap. From about 1 MiB
//! on, the source plus the destination no longer fit one core's L2 and one core copies at
//! DRAM/L3 speed (docs/bench-cpu.md: 20 GB/s on this project's Xeon VMs, against 37 GB/s
//! at 512 KiB). Two cores that each copy half of the put keep their halves in their own
//! L2s (62 GB/s measured with two threads). The target PE's core is often idle in a wait
//! (a barrier, `wait_until`, `signal_wait_until`) while the put streams in — the situation
//! UCX's shared-memory transport uses too, where the receiver's progress copies the
//! fragments out of its FIFO. So a waiting PE helps.
//!
//! # Protocol
//! Every PE's runtime region (heap offset [`heap::ASSIST_OFFSET`]) holds an `active`
//! word and one 64-byte slot per node-local initiator (indexed by the initiator's index in
//! the node team):
//!
//! | word | meaning |
//! |---|---|
//! | 0 `range` | `gen:24 | lo:20 | hi:20`: chunks `[lo, hi)` of descriptor `gen` are unclaimed |
//! | 1 `done`  | `gen:24 | count:40`: chunks of `gen` that helpers finished |
//! | 2 `src_pe`, 3 `src_off`, 4 `dst_off`, 5 `len` | the copy: `len` bytes from `src_off` of `src_pe`'s heap to `dst_off` of this heap |
//!
//! A put of at least [`MIN_BYTES`] from the initiator's own symmetric heap to a node-local
//! peer: the initiator writes the fields, publishes `range = (gen, 0, k)` with Release and
//! bumps the target's `active` word. It then claims chunks from the front (CAS on `range`)
//! and copies them, while a waiting target claims from the back — so each core keeps
//! copying the same half of a buffer that is put repeatedly. Once the range is empty the
//! initiator waits (bounded, like every wait) until `done` counts the helpers' chunks,
//! then writes the last 8 bytes itself (with Release, as every p2p put does) and returns.
//! The put is complete on return, as before: nothing outlives a call that succeeded. After
//! a `Timeout` (the target held a chunk past the bound), the target may still finish that
//! chunk when it runs again: the error leaves source and destination in use.
//!
//! A target that is not waiting never claims anything and the initiator copies it all,
//! paying one CAS per 64 KiB chunk. Puts from private memory (not in the symmetric heap)
//! and puts to self are copied by the initiator alone: only the symmetric heap is mapped
//! into the other PEs.
//!
//! # Memory ordering
//! - The fields are written (Relaxed) before `range` is published with Release; a helper
//!   loads `range` with Acquire before it reads them, so it sees this descriptor's values.
//! - A helper reads the fields before claiming, to validate them, and again after each
//!   claim: a claim CAS that succeeds on generation `gen` with chunks left proves the
//!   initiator has not finished `gen` (it rewrites the fields only after every chunk was
//!   claimed and counted, or after its timeout), so the fields read after it are `gen`'s.
//!   Those read before may be an older descriptor's when the 24-bit generation wrapped
//!   while the helper was stopped; then they differ and the helper leaves the chunk.
//! - A helper copies its chunk with plain stores and then counts it in `done` with
//!   Release; the initiator's Acquire load of `done` makes the helpers' stores happen
//!   before its own Release store of the last word (and before any signal it sends next),
//!   so a PE that acquires the last word or the signal sees the whole put.
//! - `done` carries the generation: a helper whose descriptor is gone (the initiator gave
//!   up after a timeout) cannot count into the next one.

use crate::error::{Error, Result};
use crate::heap::{ASSIST_OFFSET, RESERVED_BYTES};
use crate::pe::{ms_since, Pe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Bytes per claimed chunk.
pub const CHUNK: usize = 64 << 10;

/// Chunks a waiting PE copies per help call (`help_scan`) before it looks at its own wait
/// again.
const HELP_CHUNKS_PER_CALL: usize = 16;
/// The smallest put that is offered to its target.
pub const MIN_BYTES: usize = 2 * CHUNK;
/// Bytes of one slot (one cache line).
const SLOT_BYTES: usize = 64;
/// Slots in a runtime region: node-local initiators with an index below this can be
/// helped (the others copy alone).
pub const MAX_SLOTS: usize = (RESERVED_BYTES - ASSIST_OFFSET - SLOT_BYTES) / SLOT_BYTES;
const _: () = assert!(MAX_SLOTS >= 256);
const _: () = assert!(ASSIST_OFFSET + SLOT_BYTES * (1 + MAX_SLOTS) <= RESERVED_BYTES);
const _: () = assert!(MIN_BYTES > 8 && CHUNK % 64 == 0);

const RANGE: usize = 0;
const DONE: usize = 1;
const SRC_PE: usize = 2;
const SRC_OFF: usize = 3;
const DST_OFF: usize = 4;
const LEN: usize = 5;

const FIELD_BITS: u32 = 20;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const GEN_SHIFT: u32 = 2 * FIELD_BITS;
const GEN_MASK: u64 = (1 << 24) - 1;
const COUNT_MASK: u64 = (1 << GEN_SHIFT) - 1;

/// Whether large p2p puts are offered to their targets (RSHMEM_P2P_ASSIST).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssistMode {
    /// On unless the node's PEs outnumber its cores (a helper that is descheduled while
    /// it holds a chunk would stall the initiator for a time slice).
    Auto,
    On,
    Off,
}

/// What this PE's puts and waits did with assistance (for tests and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssistStats {
    /// Puts of this PE that were offered to their target.
    pub puts_offered: u64,
    /// Bytes of this PE's puts that their targets copied.
    pub bytes_received: u64,
    /// Bytes this PE copied, while waiting, for puts other PEs made into its heap.
    pub bytes_given: u64,
}

/// Per-PE state of the assist protocol.
pub(crate) struct Assist {
    /// This PE's `active` word (its own heap's runtime region), read by every wait.
    active: *const AtomicU64,
    /// This PE's index in the node team: its slot in every target's table.
    slot: usize,
    /// World rank of every node-local PE, by node index (whose slot is which).
    members: Box<[usize]>,
    /// Per world rank: a thread of this PE is using its slot at that target.
    busy: Box<[AtomicBool]>,
    offered: AtomicU64,
    received: AtomicU64,
    given: AtomicU64,
}

// SAFETY: the only non-Send/Sync field is `active`, a pointer to an atomic word of a
// shared mapping that lives as long as the Assist; atomics may be used from any thread.
unsafe impl Send for Assist {}
// SAFETY: as above: shared access goes through the atomic only.
unsafe impl Sync for Assist {}

impl Assist {
    /// `members`: world ranks of the node team in node order; None when this PE's slot
    /// index is out of the table (it cannot be helped, and helps nobody).
    ///
    /// # Safety
    /// `heap` is this PE's mapped heap, which outlives the returned value (the Pe owns
    /// both, and drops the Assist first).
    pub(crate) unsafe fn new(
        heap: *mut u8,
        rank: usize,
        n_pes: usize,
        members: &[usize],
    ) -> Option<Assist> {
        let slot = members.iter().position(|&r| r == rank)?;
        if heap.is_null() {
            return None;
        }
        // SAFETY: ASSIST_OFFSET is an 8-aligned offset inside the runtime region of the
        // mapping (the caller's contract), accessed only atomically by every process.
        let active = unsafe { heap.add(ASSIST_OFFSET).cast::<AtomicU64>() };
        (slot < MAX_SLOTS && members.len() > 1).then(|| Assist {
            active,
            slot,
            members: members.iter().copied().take(MAX_SLOTS).collect(),
            busy: (0..n_pes).map(|_| AtomicBool::new(false)).collect(),
            offered: AtomicU64::new(0),
            received: AtomicU64::new(0),
            given: AtomicU64::new(0),
        })
    }

    pub(crate) fn stats(&self) -> AssistStats {
        AssistStats {
            puts_offered: self.offered.load(Ordering::Relaxed),
            bytes_received: self.received.load(Ordering::Relaxed),
            bytes_given: self.given.load(Ordering::Relaxed),
        }
    }
}

fn pack(gen: u64, lo: u64, hi: u64) -> u64 {
    (gen & GEN_MASK) << GEN_SHIFT | (lo & FIELD_MASK) << FIELD_BITS | (hi & FIELD_MASK)
}

fn unpack(r: u64) -> (u64, u64, u64) {
    (
        r >> GEN_SHIFT & GEN_MASK,
        r >> FIELD_BITS & FIELD_MASK,
        r & FIELD_MASK,
    )
}

/// Claims one chunk of descriptor `gen` from the front or the back of `range`.
fn claim(range: &AtomicU64, gen: u64, back: bool) -> Option<u64> {
    // Acquire: a helper that sees `gen` sees the fields written before its publication.
    let mut cur = range.load(Ordering::Acquire);
    loop {
        let (g, lo, hi) = unpack(cur);
        if g != gen || lo >= hi {
            return None;
        }
        let (next, chunk) = if back {
            (pack(g, lo, hi - 1), hi - 1)
        } else {
            (pack(g, lo + 1, hi), lo)
        };
        // AcqRel: claims of one word form a total order; nothing else is published by it.
        match range.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(chunk),
            Err(now) => cur = now,
        }
    }
}

/// The six words of one slot.
struct Slot<'a>(&'a [AtomicU64; 8]);

impl Slot<'_> {
    fn w(&self, i: usize) -> &AtomicU64 {
        &self.0[i]
    }
}

impl Pe {
    /// Slot `index` of PE `pe`'s table, or its `active` word (`index == None`).
    fn assist_words(&self, pe: usize, index: Option<usize>) -> Result<&[AtomicU64; 8]> {
        let off = match index {
            None => ASSIST_OFFSET,
            Some(i) => ASSIST_OFFSET + SLOT_BYTES * (1 + i),
        };
        let p = self.runtime_word(pe, off)?;
        // SAFETY: runtime_word returned an 8-aligned address inside PE `pe`'s live mapping,
        // and off + 64 <= RESERVED_BYTES (MAX_SLOTS bounds i), so the 8 words lie in the
        // runtime region, which every process accesses only atomically. The mapping lives
        // as long as the Pe this borrow comes from.
        Ok(unsafe { &*p.cast::<[AtomicU64; 8]>() })
    }

    /// Statistics of this PE's assisted puts and of the help it gave.
    pub fn assist_stats(&self) -> AssistStats {
        self.assist.as_ref().map(|a| a.stats()).unwrap_or_default()
    }

    /// Offers the p2p put `src -> dst` (`n >= MIN_BYTES` bytes, `dst` inside PE `pe`'s
    /// mapping at heap offset `dst_off`) to `pe` when `src` lies in this PE's heap. Returns
    /// Ok(false), having copied nothing, when the put cannot be offered; Ok(true) when it
    /// is complete (its last 8 bytes stored last with Release when `release_last`).
    ///
    /// # Safety
    /// `dst` valid for `n` bytes of writes, `src` for `n` bytes of reads; they do not
    /// overlap (src is in this PE's heap and `pe` is another PE).
    #[cold]
    pub(crate) unsafe fn assisted_put(
        &self,
        pe: usize,
        dst: *mut u8,
        dst_off: usize,
        src: *const u8,
        n: usize,
        release_last: bool,
    ) -> Result<bool> {
        let Some(a) = self.assist.as_ref() else {
            return Ok(false);
        };
        let base = self.heap_host_base() as usize;
        let s = src as usize;
        if pe == self.my_pe()
            || base == 0
            || s < base + RESERVED_BYTES
            || s.checked_add(n).is_none_or(|e| e > base + self.heap_size())
        {
            return Ok(false);
        }
        let src_off = s - base;
        let body = n - 8;
        let k = body.div_ceil(CHUNK) as u64;
        if k > FIELD_MASK {
            return Ok(false);
        }
        // Acquire/Release on the flag: one thread of this PE at a time owns the slot.
        let Some(busy) = a.busy.get(pe) else {
            return Ok(false);
        };
        if busy.swap(true, Ordering::Acquire) {
            return Ok(false);
        }
        struct Owner<'a>(&'a AtomicBool);
        impl Drop for Owner<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _owner = Owner(busy);
        let slot = Slot(self.assist_words(pe, Some(a.slot))?);
        let active = &self.assist_words(pe, None)?[0];

        // Only this thread writes the slot (the flag above), so Relaxed reads of our own
        // last values are exact.
        let gen = (unpack(slot.w(RANGE).load(Ordering::Relaxed)).0 + 1) & GEN_MASK;
        slot.w(DONE).store(gen << GEN_SHIFT, Ordering::Relaxed);
        slot.w(SRC_PE).store(self.my_pe() as u64, Ordering::Relaxed);
        slot.w(SRC_OFF).store(src_off as u64, Ordering::Relaxed);
        slot.w(DST_OFF).store(dst_off as u64, Ordering::Relaxed);
        slot.w(LEN).store(body as u64, Ordering::Relaxed);
        // Release: publishes the fields above to the helper that acquires this word.
        slot.w(RANGE).store(pack(gen, 0, k), Ordering::Release);
        // Relaxed: a hint that makes the target scan its table; the scan acquires `range`.
        active.fetch_add(1, Ordering::Relaxed);
        a.offered.fetch_add(1, Ordering::Relaxed);

        let (mut mine, mut mine_bytes) = (0u64, 0usize);
        while let Some(c) = claim(slot.w(RANGE), gen, false) {
            let off = c as usize * CHUNK;
            let len = CHUNK.min(body - off);
            // SAFETY: off + len <= body < n: inside both ranges (the caller's contract).
            unsafe { crate::copy::copy_bytes(src.add(off), dst.add(off), len) };
            mine += 1;
            mine_bytes += len;
        }
        let theirs = k - mine;
        let start = Instant::now();
        // Only the target's death ends the wait early (with PeerDied, even when
        // tolerated), instead of the whole timeout for the chunks it held. Another PE's
        // death must not: the target may still be copying a chunk from our source into
        // its heap, and a caller that returned would reuse the source (and EP's shrink
        // mode resends the same put at once) under it. Its chunks take microseconds; the
        // death is reported by the next call. (Before 2026-12-07 any death ended it.)
        let waited = self.poll_checking(
            || self.live.check_only(pe),
            || {
                // Acquire: pairs with each helper's Release count, so their chunk stores
                // happen before the last-word store below.
                let d = slot.w(DONE).load(Ordering::Acquire) & COUNT_MASK;
                if d == theirs {
                    Ok(())
                } else {
                    Err(d)
                }
            },
            |d| Error::Timeout {
                pe: self.my_pe(),
                what: format!(
                    "PE {pe} to finish the {theirs} chunks it claimed of a {n}-byte put \
                     into its heap (offset {dst_off}); {d} finished"
                ),
                waited_ms: ms_since(start),
            },
        );
        active.fetch_sub(1, Ordering::Relaxed);
        waited?;
        a.received
            .fetch_add((body - mine_bytes) as u64, Ordering::Relaxed);
        // SAFETY: the last 8 bytes of both ranges.
        unsafe {
            if release_last {
                crate::rma::copy_last_word_release(dst.add(body), src.add(body), 8);
            } else {
                std::ptr::copy_nonoverlapping(src.add(body), dst.add(body), 8);
            }
        }
        Ok(true)
    }

    /// Called by waits: copies chunks of the puts peers are offering into this PE's heap.
    /// Returns whether it copied anything. One Relaxed load when nobody offers anything.
    #[inline]
    pub(crate) fn help_peers(&self) -> bool {
        let Some(a) = self.assist.as_ref() else {
            return false;
        };
        // SAFETY: `active` points into this PE's own mapping, which outlives the Assist
        // (Assist::new's contract); the word is only accessed atomically.
        let active = unsafe { &*a.active };
        // Relaxed: only a hint; every slot is acquired by help_scan.
        active.load(Ordering::Relaxed) != 0 && self.help_scan(a)
    }

    #[cold]
    fn help_scan(&self, a: &Assist) -> bool {
        let me = self.my_pe();
        let mut helped = false;
        // At most this many chunks (1 MiB) per call, then back to the wait that called
        // it: its condition, liveness and clock, and the engine rounds it owes, come
        // around again in tens of microseconds rather than after a whole large put (a
        // 1 GiB put's share was half a gigabyte in one call before 2026-12-07).
        let mut budget = HELP_CHUNKS_PER_CALL;
        for (i, &from) in a.members.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if i == a.slot {
                continue;
            }
            let Ok(words) = self.assist_words(me, Some(i)) else {
                continue;
            };
            let slot = Slot(words);
            // Acquire: pairs with the initiator's publication of this descriptor.
            let (gen, lo, hi) = unpack(slot.w(RANGE).load(Ordering::Acquire));
            if lo >= hi {
                continue;
            }
            let src_pe = slot.w(SRC_PE).load(Ordering::Relaxed) as usize;
            let src_off = slot.w(SRC_OFF).load(Ordering::Relaxed) as usize;
            let dst_off = slot.w(DST_OFF).load(Ordering::Relaxed) as usize;
            let len = slot.w(LEN).load(Ordering::Relaxed) as usize;
            // Never trust shared memory with an address: both ranges must be in their
            // heaps and mapped here, or the slot is left to its initiator.
            if src_pe != from || (hi as usize) > len.div_ceil(CHUNK) {
                continue;
            }
            let (Ok(src), Ok(dst)) = (
                self.target(src_pe, src_off, len),
                self.target(me, dst_off, len),
            ) else {
                continue;
            };
            while budget > 0 {
                let Some(c) = claim(slot.w(RANGE), gen, true) else {
                    break;
                };
                budget -= 1;
                // Once a chunk of `gen` is claimed, the initiator rewrites the fields only
                // after it is counted (or after its timeout), so they are exact now. The
                // ones read before the claim may belong to an older descriptor whose 24-bit
                // generation wrapped to `gen` while this thread was stopped: then the chunk
                // is left uncounted (its initiator times out, naming this PE) rather than
                // copied from and to the wrong place.
                let same = slot.w(SRC_PE).load(Ordering::Relaxed) as usize == src_pe
                    && slot.w(SRC_OFF).load(Ordering::Relaxed) as usize == src_off
                    && slot.w(DST_OFF).load(Ordering::Relaxed) as usize == dst_off
                    && slot.w(LEN).load(Ordering::Relaxed) as usize == len;
                if !same {
                    break;
                }
                let off = c as usize * CHUNK;
                if off >= len {
                    // A claimed chunk past the put (a range word corrupted in shared
                    // memory): never copy outside the validated ranges.
                    break;
                }
                let n = CHUNK.min(len - off);
                // SAFETY: off + n <= len and both ranges were validated inside their live
                // mappings; src is another PE's heap and dst ours, so they do not overlap.
                // The claim makes this chunk ours alone until it is counted.
                unsafe { crate::copy::copy_bytes(src.add(off), dst.add(off), n) };
                count_done(slot.w(DONE), gen);
                a.given.fetch_add(n as u64, Ordering::Relaxed);
                helped = true;
            }
        }
        helped
    }
}

/// Counts one finished chunk of descriptor `gen` (nothing when the descriptor is gone).
fn count_done(done: &AtomicU64, gen: u64) {
    let mut cur = done.load(Ordering::Relaxed);
    while cur >> GEN_SHIFT == gen {
        // Release: this helper's chunk stores happen before the initiator's Acquire load
        // that sees the count.
        match done.compare_exchange_weak(cur, cur + 1, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_words_round_trip_and_claims_meet_in_the_middle() {
        assert_eq!(unpack(pack(0xABCDEF, 3, 17)), (0xABCDEF, 3, 17));
        let r = AtomicU64::new(pack(5, 0, 5));
        assert_eq!(claim(&r, 5, false), Some(0));
        assert_eq!(claim(&r, 5, true), Some(4));
        assert_eq!(
            claim(&r, 4, true),
            None,
            "another generation claims nothing"
        );
        assert_eq!(claim(&r, 5, true), Some(3));
        assert_eq!(claim(&r, 5, false), Some(1));
        assert_eq!(claim(&r, 5, false), Some(2));
        assert_eq!(claim(&r, 5, true), None);
        assert_eq!(claim(&r, 5, false), None);
    }

    #[test]
    fn done_counts_only_its_own_generation() {
        let d = AtomicU64::new(7 << GEN_SHIFT);
        count_done(&d, 7);
        count_done(&d, 7);
        count_done(&d, 6);
        assert_eq!(d.load(Ordering::Relaxed), 7 << GEN_SHIFT | 2);
    }
}
