//! Host-initiated one-sided operations over the p2p and proxy transports: put/get,
//! signals, point-to-point synchronisation (wait/test) and atomics, with OpenSHMEM 1.5
//! semantics.
//!
//! Each operation validates its PE and range once ([`Pe::route`]) and then either takes
//! the p2p path (an enum match, no virtual call) or posts WQEs through the proxy
//! transport (`softhca::proxy`: the soft HCA). Waits and tests read this PE's own heap and
//! are the same for both.
//!
//! # Proxy transport
//! put, put_nbi, p, put_signal and signal_op return once the source may be reused and
//! complete at `quiet` (OpenSHMEM's contract); gets and every atomic return complete, as
//! with p2p. The engine executes a QP's WQEs in order with the same memory effects as
//! the p2p code below (Release store of a put's last word, AcqRel atomics), and `fence`
//! posts a FENCEd NOP on each QP with work in flight (signals FENCE their own WQE).
//!
//! # Transport and completion (p2p)
//! The p2p transport moves data with CPU loads and stores into the peer's heap, which is
//! mapped into this process. So every operation has *completed* when it returns — the
//! `_nbi` forms exist for API parity with OpenSHMEM and with transports where they differ,
//! and their guarantee is the OpenSHMEM one: complete at the next [`Pe::quiet`] (or barrier).
//!
//! # Memory ordering
//! - Synchronisation words (signals, atomics, waited-on variables) are only ever accessed
//!   with atomic instructions.
//! - `put`/`put_nbi` of 4 or more bytes whose last 8 (or else last 4) bytes are a naturally
//!   aligned word write that word last, with a Release store, so a PE polling that word with
//!   `wait_until` (Acquire) sees the whole put. This is a property of the p2p transport,
//!   not an OpenSHMEM guarantee: portable code uses `put_signal` or `fence` + a flag.
//! - `put_signal` writes the data, then updates the signal with Release; a
//!   `signal_wait_until`/`wait_until` that observes the signal (Acquire) observes the data.
//! - Atomics: fetching AMOs are Acquire (fetch) or AcqRel (read-modify-write); `atomic_set`
//!   is Release. They order against this PE's earlier and later accesses to the heap.
//! - `fence` is a Release fence: puts and AMOs issued before it become visible before those
//!   issued after it to any PE that acquires one of the later ones. `quiet` is a SeqCst
//!   fence: it also orders this PE's later loads after its earlier stores.
//! - Bulk data is copied with plain (non-atomic) copies. As in OpenSHMEM, a program that
//!   reads a buffer while another PE writes it without synchronisation has a data race and
//!   may see torn values; rshmem never does this for its own words.
//! - The final word of a put is stored as 8 bytes when the put's last 8 bytes are aligned,
//!   also for a put of 4-byte elements whose last element a peer polls with
//!   `wait_until::<u32>`: a 4-byte atomic load racing an 8-byte atomic store. x86 and
//!   Arm hardware order it as intended; Rust's model does not define mixed-size races
//!   between PE threads of one process (between processes it has no say). Poll 8-byte
//!   words, or use put_signal, for code that must be defined by the letter.

use crate::atomic::{AtomicInt, AtomicWord};
use crate::copy::copy_bytes;
use crate::error::{Error, Result};
use crate::pe::{ms_since, Pe, Route};
use crate::softhca::proxy::Amo;
use crate::types::{Cmp, Element, SignalOp, SymPtr};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Polls before a waiting PE starts yielding its core (tens of microseconds), when the
/// node has a core for every PE.
const SPIN_POLLS: u64 = 1 << 10;
/// Polls before yielding when the node's PEs outnumber its cores: whoever we wait for may
/// need this core, so give it up almost at once.
const SPIN_POLLS_OVERSUBSCRIBED: u64 = 16;
/// Polls between checks of the clock and of peer liveness.
const CHECK_EVERY: u64 = 256;

/// What a wait on a set of words waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SetWait {
    All,
    Any,
    Some,
}

/// The comparison operand of a set operation: one value, or one per element (`_vector`).
enum Operand<'a, T> {
    One(T),
    Each(&'a [T]),
}

impl<T: Copy> Operand<'_, T> {
    fn at(&self, i: usize) -> T {
        match self {
            Operand::One(v) => *v,
            Operand::Each(v) => v[i],
        }
    }

    fn len(&self) -> Option<usize> {
        match self {
            Operand::One(_) => None,
            Operand::Each(v) => Some(v.len()),
        }
    }
}

impl Pe {
    // ------------------------------------------------------------------ put / get

    /// Copies `src` into `dest` on PE `pe` (`src.len() <= dest.len()`). On return `src` may
    /// be reused; the data is visible to `pe` after `quiet`/barrier (with p2p: already).
    #[inline]
    pub fn put<T: Element>(&self, dest: SymPtr<T>, src: &[T], pe: usize) -> Result<()> {
        let bytes = std::mem::size_of_val(src);
        check_len("put", src.len(), dest.len())?;
        match self.route(pe, dest.offset(), bytes)? {
            // SAFETY: d..d+bytes is inside PE `pe`'s mapped heap (validated); src is a
            // valid slice of `bytes` bytes; the two cannot overlap unless the caller passes
            // a slice of the mapping itself, which copy_bytes (memmove semantics) tolerates.
            Route::P2p(d) => unsafe {
                self.p2p_put_bytes(pe, d, dest.offset(), src.as_ptr().cast(), bytes, true)?
            },
            Route::Proxy => self.proxy().put(pe, dest.offset(), as_bytes(src), "put")?,
        }
        Ok(())
    }

    /// Non-blocking put: complete at the next `quiet`. With p2p it completes at once.
    pub fn put_nbi<T: Element>(&self, dest: SymPtr<T>, src: &[T], pe: usize) -> Result<()> {
        self.put(dest, src, pe)
    }

    /// Copies `src` on PE `pe` into `dst` (`dst.len() <= src.len()`). Complete on return.
    pub fn get<T: Element>(&self, dst: &mut [T], src: SymPtr<T>, pe: usize) -> Result<()> {
        let bytes = std::mem::size_of_val(dst);
        check_len("get", dst.len(), src.len())?;
        match self.route(pe, src.offset(), bytes)? {
            // SAFETY: s..s+bytes is inside the mapped heap; dst is a valid exclusive slice
            // of `bytes` bytes; T accepts any bit pattern (Element).
            Route::P2p(s) => unsafe { copy_bytes(s, dst.as_mut_ptr().cast::<u8>(), bytes) },
            Route::Proxy => self
                .proxy()
                .get(pe, src.offset(), as_bytes_mut(dst), "get")?,
        }
        // Acquire fence: a compiler and hardware barrier that keeps the caller's later
        // accesses after this get (OpenSHMEM orders a blocking get before them). After a
        // plain copy it creates no happens-before by itself: a get that must see another
        // PE's writes relies on the caller's earlier Acquire (a wait, a signal wait or a
        // barrier), as OpenSHMEM programs do.
        fence(Ordering::Acquire);
        Ok(())
    }

    /// Non-blocking get: `dst` holds the data after the next `quiet`. With p2p it
    /// completes at once (the borrow of `dst` ends with the call).
    pub fn get_nbi<T: Element>(&self, dst: &mut [T], src: SymPtr<T>, pe: usize) -> Result<()> {
        self.get(dst, src, pe)
    }

    /// Bytes form of `put` (OpenSHMEM `putmem`).
    pub fn putmem(&self, dest: SymPtr<u8>, src: &[u8], pe: usize) -> Result<()> {
        self.put(dest, src, pe)
    }

    /// Bytes form of `get` (OpenSHMEM `getmem`).
    pub fn getmem(&self, dst: &mut [u8], src: SymPtr<u8>, pe: usize) -> Result<()> {
        self.get(dst, src, pe)
    }

    /// Writes one element (`dest`'s first) on PE `pe`.
    #[inline]
    pub fn p<T: Element>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<()> {
        self.put(dest, std::slice::from_ref(&value), pe)
    }

    /// Reads one element (`src`'s first) from PE `pe`.
    pub fn g<T: Element>(&self, src: SymPtr<T>, pe: usize) -> Result<T> {
        check_len("g", 1, src.len())?;
        match self.route(pe, src.offset(), std::mem::size_of::<T>())? {
            // SAFETY: s points to size_of::<T>() valid mapped bytes; load_acquire loads a
            // naturally aligned 4- or 8-byte word atomically and anything else with
            // read_unaligned, which copes with any alignment; T accepts any bit pattern.
            Route::P2p(s) => Ok(unsafe { load_acquire::<T>(s) }),
            Route::Proxy => {
                // SAFETY: Element types accept any bit pattern, zero included.
                let mut v = [unsafe { std::mem::zeroed::<T>() }];
                self.proxy()
                    .get(pe, src.offset(), as_bytes_mut(&mut v), "g")?;
                Ok(v[0])
            }
        }
    }

    // ------------------------------------------------------------------ signals

    /// Puts `src` into `dest` on `pe`, then updates the signal word `sig` on `pe` with
    /// `op` (set or add) so that a PE observing the signal observes the data.
    pub fn put_signal<T: Element>(
        &self,
        dest: SymPtr<T>,
        src: &[T],
        sig: SymPtr<u64>,
        signal: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        let bytes = std::mem::size_of_val(src);
        check_len("put_signal", src.len(), dest.len())?;
        let route = self.route(pe, dest.offset(), bytes)?;
        let s = self.sync_route::<u64>(sig, pe, "put_signal")?;
        // OpenSHMEM 1.5: dest and sig_addr must not overlap. Checked (since 2026-12-07,
        // from a review): the data's plain stores would race the signal's atomic update,
        // and a waiter could see the data's bytes as the signal.
        let (d0, s0) = (dest.offset(), sig.offset());
        if bytes > 0 && s0 < d0 + bytes && d0 < s0 + 8 {
            return Err(Error::InvalidArgument(format!(
                "put_signal: the signal word at {s0:#x} lies inside the destination \
                 [{d0:#x}, {:#x})",
                d0 + bytes
            )));
        }
        match (route, s) {
            (Route::P2p(d), Route::P2p(s)) => {
                // SAFETY: validated destination inside the mapping; src valid for `bytes`.
                unsafe {
                    self.p2p_put_bytes(pe, d, dest.offset(), src.as_ptr().cast(), bytes, false)?
                };
                // SAFETY: s is an aligned signal word in a live mapping, accessed only
                // atomically.
                unsafe { signal_update(s.cast(), signal, op) };
            }
            _ => {
                self.proxy()
                    .put(pe, dest.offset(), as_bytes(src), "put_signal")?;
                self.proxy_signal(sig, signal, op, pe, "put_signal")?;
            }
        }
        Ok(())
    }

    /// Non-blocking `put_signal` (complete at the next quiet; with p2p at once).
    pub fn put_signal_nbi<T: Element>(
        &self,
        dest: SymPtr<T>,
        src: &[T],
        sig: SymPtr<u64>,
        signal: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.put_signal(dest, src, sig, signal, op, pe)
    }

    /// Updates the signal word `sig` on PE `pe` (Release: orders this PE's earlier puts).
    pub fn signal_op(&self, sig: SymPtr<u64>, signal: u64, op: SignalOp, pe: usize) -> Result<()> {
        match self.sync_route::<u64>(sig, pe, "signal_op")? {
            // SAFETY: aligned signal word in a live mapping, accessed only atomically.
            Route::P2p(s) => unsafe { signal_update(s.cast(), signal, op) },
            Route::Proxy => self.proxy_signal(sig, signal, op, pe, "signal_op")?,
        }
        Ok(())
    }

    /// Reads this PE's signal word `sig` (Acquire).
    pub fn signal_fetch(&self, sig: SymPtr<u64>) -> Result<u64> {
        let s = self.sync_word::<u64>(sig, self.my_pe(), "signal_fetch")?;
        // SAFETY: aligned signal word in our own mapping, accessed only atomically.
        // Acquire: a signal value seen here makes the data put before it visible.
        Ok(unsafe { u64::load(s, Ordering::Acquire) })
    }

    /// Waits until this PE's signal word `sig` satisfies `cmp value`; returns its value.
    pub fn signal_wait_until(&self, sig: SymPtr<u64>, cmp: Cmp, value: u64) -> Result<u64> {
        let s = self.sync_word::<u64>(sig, self.my_pe(), "signal_wait_until")?;
        self.wait_word(s, sig.offset(), cmp, value, "signal_wait_until")
    }

    // ------------------------------------------------------------------ wait / test

    /// Waits until this PE's `ivar` (its first element) satisfies `cmp value`.
    #[inline]
    pub fn wait_until<T: AtomicInt>(&self, ivar: SymPtr<T>, cmp: Cmp, value: T) -> Result<()> {
        let p = self.sync_word::<T>(ivar, self.my_pe(), "wait_until")?;
        self.wait_word(p, ivar.offset(), cmp, value, "wait_until")
            .map(|_| ())
    }

    /// True if this PE's `ivar` satisfies `cmp value` now.
    pub fn test<T: AtomicInt>(&self, ivar: SymPtr<T>, cmp: Cmp, value: T) -> Result<bool> {
        let p = self.sync_word::<T>(ivar, self.my_pe(), "test")?;
        // SAFETY: aligned word in our own mapping, accessed only atomically.
        // Acquire: a test that holds makes the writes before the word's Release visible.
        Ok(cmp.holds(unsafe { T::load(p, Ordering::Acquire) }, value))
    }

    /// Waits until every element of `ivars` not excluded by `status` (non-zero = excluded)
    /// satisfies `cmp value`.
    pub fn wait_until_all<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        value: T,
    ) -> Result<()> {
        self.wait_set(
            ivars,
            status,
            cmp,
            Operand::One(value),
            SetWait::All,
            "wait_until_all",
        )
        .map(|_| ())
    }

    /// Waits until some element of `ivars` not excluded by `status` satisfies `cmp value`;
    /// returns its index (the lowest such index).
    pub fn wait_until_any<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        value: T,
    ) -> Result<usize> {
        self.wait_set(
            ivars,
            status,
            cmp,
            Operand::One(value),
            SetWait::Any,
            "wait_until_any",
        )
        .map(|hits| hits[0])
    }

    /// Waits until at least one non-excluded element satisfies `cmp value`; returns the
    /// indices of all that did in the scan that found one (never empty).
    pub fn wait_until_some<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        value: T,
    ) -> Result<Vec<usize>> {
        self.wait_set(
            ivars,
            status,
            cmp,
            Operand::One(value),
            SetWait::Some,
            "wait_until_some",
        )
    }

    /// As [`Pe::wait_until_all`], element `i` compared with `values[i]`.
    pub fn wait_until_all_vector<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        values: &[T],
    ) -> Result<()> {
        let op = "wait_until_all_vector";
        self.wait_set(ivars, status, cmp, Operand::Each(values), SetWait::All, op)
            .map(|_| ())
    }

    /// As [`Pe::wait_until_any`], element `i` compared with `values[i]`.
    pub fn wait_until_any_vector<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        values: &[T],
    ) -> Result<usize> {
        let op = "wait_until_any_vector";
        self.wait_set(ivars, status, cmp, Operand::Each(values), SetWait::Any, op)
            .map(|hits| hits[0])
    }

    /// As [`Pe::wait_until_some`], element `i` compared with `values[i]`.
    pub fn wait_until_some_vector<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        values: &[T],
    ) -> Result<Vec<usize>> {
        let op = "wait_until_some_vector";
        self.wait_set(ivars, status, cmp, Operand::Each(values), SetWait::Some, op)
    }

    /// True if every non-excluded element satisfies `cmp value` now.
    pub fn test_all<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        value: T,
    ) -> Result<bool> {
        let miss = self.test_set(
            ivars,
            status,
            cmp,
            Operand::One(value),
            SetWait::All,
            "test_all",
        )?;
        Ok(miss.is_empty())
    }

    /// Index of a non-excluded element that satisfies `cmp value` now, if any.
    pub fn test_any<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        value: T,
    ) -> Result<Option<usize>> {
        let hit = self.test_set(
            ivars,
            status,
            cmp,
            Operand::One(value),
            SetWait::Any,
            "test_any",
        )?;
        Ok(hit.first().copied())
    }

    /// Indices of all non-excluded elements that satisfy `cmp value` now.
    pub fn test_some<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        value: T,
    ) -> Result<Vec<usize>> {
        self.test_set(
            ivars,
            status,
            cmp,
            Operand::One(value),
            SetWait::Some,
            "test_some",
        )
    }

    /// As [`Pe::test_all`], element `i` compared with `values[i]`.
    pub fn test_all_vector<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        values: &[T],
    ) -> Result<bool> {
        let op = "test_all_vector";
        let miss = self.test_set(ivars, status, cmp, Operand::Each(values), SetWait::All, op)?;
        Ok(miss.is_empty())
    }

    /// As [`Pe::test_any`], element `i` compared with `values[i]`.
    pub fn test_any_vector<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        values: &[T],
    ) -> Result<Option<usize>> {
        let op = "test_any_vector";
        let hit = self.test_set(ivars, status, cmp, Operand::Each(values), SetWait::Any, op)?;
        Ok(hit.first().copied())
    }

    /// As [`Pe::test_some`], element `i` compared with `values[i]`.
    pub fn test_some_vector<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        values: &[T],
    ) -> Result<Vec<usize>> {
        let op = "test_some_vector";
        self.test_set(ivars, status, cmp, Operand::Each(values), SetWait::Some, op)
    }

    // ------------------------------------------------------------------ atomics

    /// Atomically reads `src` on PE `pe` (Acquire).
    pub fn atomic_fetch<T: AtomicWord>(&self, src: SymPtr<T>, pe: usize) -> Result<T> {
        match self.sync_route(src, pe, "atomic_fetch")? {
            // SAFETY: validated aligned word, atomic-only access.
            // Acquire: the fetched value's writer's earlier stores are visible after it.
            Route::P2p(p) => Ok(unsafe { T::load(p.cast(), Ordering::Acquire) }),
            Route::Proxy => self.proxy_amo(src, pe, Amo::Fetch, "atomic_fetch"),
        }
    }

    /// Atomically writes `value` to `dest` on PE `pe` (Release).
    pub fn atomic_set<T: AtomicWord>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<()> {
        match self.sync_route(dest, pe, "atomic_set")? {
            // SAFETY: validated aligned word, atomic-only access.
            // Release: this PE's earlier puts are visible to whoever acquires the new value.
            Route::P2p(p) => unsafe { T::store(p.cast(), value, Ordering::Release) },
            Route::Proxy => {
                self.proxy_amo(dest, pe, Amo::Set(to_bits(value)), "atomic_set")?;
            }
        }
        Ok(())
    }

    /// Atomically replaces `dest` on PE `pe` with `value`; returns the old value (AcqRel).
    pub fn atomic_swap<T: AtomicWord>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<T> {
        match self.sync_route(dest, pe, "atomic_swap")? {
            // SAFETY: validated aligned word, atomic-only access.
            // AcqRel: publishes earlier puts and orders later reads after the swap.
            Route::P2p(p) => Ok(unsafe { T::swap(p.cast(), value, Ordering::AcqRel) }),
            Route::Proxy => self.proxy_amo(dest, pe, Amo::Swap(to_bits(value)), "atomic_swap"),
        }
    }

    /// Writes `value` to `dest` on PE `pe` if it equals `cond`; returns the old value.
    pub fn atomic_compare_swap<T: AtomicInt>(
        &self,
        dest: SymPtr<T>,
        cond: T,
        value: T,
        pe: usize,
    ) -> Result<T> {
        match self.sync_route(dest, pe, "atomic_compare_swap")? {
            // SAFETY: validated aligned word, atomic-only access.
            Route::P2p(p) => {
                // AcqRel: publishes earlier puts and orders later reads after the CAS.
                Ok(unsafe { T::compare_swap(p.cast(), cond, value, Ordering::AcqRel) })
            }
            Route::Proxy => self.proxy_amo(
                dest,
                pe,
                Amo::Cas(to_bits(cond), to_bits(value)),
                "atomic_compare_swap",
            ),
        }
    }

    /// Adds `value` (wrapping) to `dest` on PE `pe`; returns the old value.
    pub fn atomic_fetch_add<T: AtomicInt>(
        &self,
        dest: SymPtr<T>,
        value: T,
        pe: usize,
    ) -> Result<T> {
        match self.sync_route(dest, pe, "atomic_fetch_add")? {
            // SAFETY: validated aligned word, atomic-only access.
            // AcqRel: publishes earlier puts and orders later reads after the AMO.
            Route::P2p(p) => Ok(unsafe { T::fetch_add(p.cast(), value, Ordering::AcqRel) }),
            Route::Proxy => self.proxy_amo(dest, pe, Amo::Add(to_bits(value)), "atomic_fetch_add"),
        }
    }

    /// Adds `value` (wrapping) to `dest` on PE `pe`.
    pub fn atomic_add<T: AtomicInt>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<()> {
        self.atomic_fetch_add(dest, value, pe).map(|_| ())
    }

    /// Increments `dest` on PE `pe`; returns the old value.
    pub fn atomic_fetch_inc<T: AtomicInt>(&self, dest: SymPtr<T>, pe: usize) -> Result<T> {
        self.atomic_fetch_add(dest, T::ONE, pe)
    }

    /// Increments `dest` on PE `pe`.
    pub fn atomic_inc<T: AtomicInt>(&self, dest: SymPtr<T>, pe: usize) -> Result<()> {
        self.atomic_fetch_add(dest, T::ONE, pe).map(|_| ())
    }

    /// Bitwise AND into `dest` on PE `pe`; returns the old value.
    pub fn atomic_fetch_and<T: AtomicInt>(
        &self,
        dest: SymPtr<T>,
        value: T,
        pe: usize,
    ) -> Result<T> {
        match self.sync_route(dest, pe, "atomic_fetch_and")? {
            // SAFETY: validated aligned word, atomic-only access.
            // AcqRel: publishes earlier puts and orders later reads after the AMO.
            Route::P2p(p) => Ok(unsafe { T::fetch_and(p.cast(), value, Ordering::AcqRel) }),
            Route::Proxy => self.proxy_amo(dest, pe, Amo::And(to_bits(value)), "atomic_fetch_and"),
        }
    }

    /// Bitwise OR into `dest` on PE `pe`; returns the old value.
    pub fn atomic_fetch_or<T: AtomicInt>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<T> {
        match self.sync_route(dest, pe, "atomic_fetch_or")? {
            // SAFETY: validated aligned word, atomic-only access.
            // AcqRel: publishes earlier puts and orders later reads after the AMO.
            Route::P2p(p) => Ok(unsafe { T::fetch_or(p.cast(), value, Ordering::AcqRel) }),
            Route::Proxy => self.proxy_amo(dest, pe, Amo::Or(to_bits(value)), "atomic_fetch_or"),
        }
    }

    /// Bitwise XOR into `dest` on PE `pe`; returns the old value.
    pub fn atomic_fetch_xor<T: AtomicInt>(
        &self,
        dest: SymPtr<T>,
        value: T,
        pe: usize,
    ) -> Result<T> {
        match self.sync_route(dest, pe, "atomic_fetch_xor")? {
            // SAFETY: validated aligned word, atomic-only access.
            // AcqRel: publishes earlier puts and orders later reads after the AMO.
            Route::P2p(p) => Ok(unsafe { T::fetch_xor(p.cast(), value, Ordering::AcqRel) }),
            Route::Proxy => self.proxy_amo(dest, pe, Amo::Xor(to_bits(value)), "atomic_fetch_xor"),
        }
    }

    /// Bitwise AND into `dest` on PE `pe`.
    pub fn atomic_and<T: AtomicInt>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<()> {
        self.atomic_fetch_and(dest, value, pe).map(|_| ())
    }

    /// Bitwise OR into `dest` on PE `pe`.
    pub fn atomic_or<T: AtomicInt>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<()> {
        self.atomic_fetch_or(dest, value, pe).map(|_| ())
    }

    /// Bitwise XOR into `dest` on PE `pe`.
    pub fn atomic_xor<T: AtomicInt>(&self, dest: SymPtr<T>, value: T, pe: usize) -> Result<()> {
        self.atomic_fetch_xor(dest, value, pe).map(|_| ())
    }

    // ------------------------------------------------------------------ ordering

    /// Completes every put, AMO and signal this PE issued (OpenSHMEM `shmem_quiet`). With
    /// p2p they are complete already; through the proxy it waits for every posted WQE's
    /// completion. The SeqCst fence orders them before everything this PE does
    /// afterwards, loads included. An error (an error CQE, a timeout) cannot be returned
    /// here: it is kept and returned by the next [`Pe::try_quiet`] or barrier.
    pub fn quiet(&self) {
        if let Err(e) = self.quiet_proxy() {
            self.deferred.keep(e);
        }
        // SeqCst: quiet also orders this PE's later loads after its earlier stores.
        fence(Ordering::SeqCst);
    }

    /// [`Pe::quiet`] that reports failures: an error a transport met since the last call
    /// (including one a plain `quiet` swallowed), as it was met (its kind and the PE it
    /// names). A swallowed error is reported first; this call's own error then waits for
    /// the next call, so neither is lost. (Before 2026-12-07 a swallowed error came back as
    /// a transport error naming this PE, whatever it was, and this call's own was dropped.)
    pub fn try_quiet(&self) -> Result<()> {
        let r = self.quiet_proxy();
        // SeqCst: as in quiet.
        fence(Ordering::SeqCst);
        self.deferred.report(r)
    }

    fn quiet_proxy(&self) -> Result<()> {
        match &self.proxy {
            Some(p) => p.quiet(),
            None => Ok(()),
        }
    }

    /// Orders this PE's puts, AMOs and signals to each PE: those before the fence are
    /// visible before those after it (OpenSHMEM `shmem_fence`). A Release fence; through
    /// the proxy, a FENCEd NOP on every QP that needs one ([`SendQueue::fence_needed`]).
    ///
    /// [`SendQueue::fence_needed`]: crate::softhca::queue::SendQueue::fence_needed
    pub fn fence(&self) {
        if let Some(p) = &self.proxy {
            p.fence();
        }
        // Release: puts and AMOs before the fence become visible before those after it.
        fence(Ordering::Release);
    }

    // ------------------------------------------------------------------ internals

    /// The p2p copy of put and put_signal: `n` bytes from `src` to `dst` (heap offset
    /// `dst_off` of PE `pe`), shared with a waiting target when it is large and `src` is
    /// in our heap (assist.rs); with `release_last`, the last word is stored last with
    /// Release ([`copy_last_word_release`]).
    ///
    /// # Safety
    /// `dst` valid for `n` bytes of writes, `src` for `n` bytes of reads.
    #[inline]
    unsafe fn p2p_put_bytes(
        &self,
        pe: usize,
        dst: *mut u8,
        dst_off: usize,
        src: *const u8,
        n: usize,
        release_last: bool,
    ) -> Result<()> {
        // SAFETY: the caller's contract; assisted_put only takes sources in our heap,
        // which never overlap another PE's, and copies nothing when it returns false.
        unsafe {
            if n >= crate::assist::MIN_BYTES
                && self.assisted_put(pe, dst, dst_off, src, n, release_last)?
            {
                return Ok(());
            }
            if release_last {
                copy_last_word_release(dst, src, n);
            } else {
                copy_bytes(src, dst, n);
            }
        }
        Ok(())
    }

    /// Validates a synchronisation word (first element of `sym`) on `pe`: in bounds and
    /// naturally aligned.
    #[inline]
    fn sync_word<T>(&self, sym: SymPtr<T>, pe: usize, op: &'static str) -> Result<*mut T> {
        let size = std::mem::size_of::<T>();
        check_len(op, 1, sym.len())?;
        if sym.offset() % size != 0 {
            return Err(Error::Misaligned {
                offset: sym.offset(),
                align: size,
                op,
            });
        }
        Ok(self.target(pe, sym.offset(), size)?.cast())
    }

    /// [`Pe::sync_word`] for an operation on any PE: validated and routed.
    fn sync_route<T>(&self, sym: SymPtr<T>, pe: usize, op: &'static str) -> Result<Route> {
        let size = std::mem::size_of::<T>();
        check_len(op, 1, sym.len())?;
        if sym.offset() % size != 0 {
            return Err(Error::Misaligned {
                offset: sym.offset(),
                align: size,
                op,
            });
        }
        self.route(pe, sym.offset(), size)
    }

    fn proxy_amo<T: AtomicWord>(
        &self,
        sym: SymPtr<T>,
        pe: usize,
        a: Amo,
        op: &'static str,
    ) -> Result<T> {
        let size = std::mem::size_of::<T>();
        let old = self.proxy().amo(pe, sym.offset(), size, a, op)?;
        Ok(from_bits(old))
    }

    /// The signal half of put_signal / signal_op through the proxy: fenced after the data
    /// (FENCE on the signal's own WQE), ADD as a fetch-add, SET as an 8-byte WRITE (one
    /// Release store on the target). Completes at quiet, like a put.
    fn proxy_signal(
        &self,
        sig: SymPtr<u64>,
        signal: u64,
        op: SignalOp,
        pe: usize,
        name: &'static str,
    ) -> Result<()> {
        let p = self.proxy();
        match op {
            SignalOp::Add => p.post_add(pe, sig.offset(), signal, true, name),
            SignalOp::Set => p.post_set(pe, sig.offset(), signal, name),
        }
    }

    /// The words of the set: `ivars` without the elements `status` excludes (non-zero),
    /// each checked to be in this PE's heap; `Operand::Each` must have one value per
    /// element.
    fn ivar_words<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        operand: &Operand<'_, T>,
        op: &'static str,
    ) -> Result<Vec<(usize, *mut T)>> {
        let sizes = [
            ("status", status.map(|s| s.len())),
            ("cmp_values", operand.len()),
        ];
        for (what, len) in sizes {
            if let Some(len) = len.filter(|&l| l != ivars.len()) {
                return Err(Error::InvalidArgument(format!(
                    "{op}: {what} has {len} entries for {} variables",
                    ivars.len()
                )));
            }
        }
        // The whole set's range first, so that a set past the heap (a bad length) is
        // refused before a word list is built for it (16 bytes per element, up to 4x the
        // heap for u32 before the first element outside it was met).
        if !ivars.is_empty() {
            // Saturating: an overflowing length is past the heap all the same.
            let bytes = ivars.len().saturating_mul(std::mem::size_of::<T>());
            self.sync_word(ivars.at(0), self.my_pe(), op)?;
            self.target(self.my_pe(), ivars.offset(), bytes)?;
        }
        (0..ivars.len())
            .filter(|&i| status.is_none_or(|s| s[i] == 0))
            .map(|i| Ok((i, self.sync_word(ivars.at(i), self.my_pe(), op)?)))
            .collect()
    }

    /// Whether the set's element `(i, p)` satisfies `cmp` now (one Acquire load).
    fn holds_now<T: AtomicInt>(w: (usize, *mut T), cmp: Cmp, operand: &Operand<'_, T>) -> bool {
        // SAFETY: every word was validated by ivar_words; atomic-only access.
        cmp.holds(unsafe { T::load(w.1, Ordering::Acquire) }, operand.at(w.0))
    }

    /// The waits on a set of words (OpenSHMEM 1.5 wait_until_{all,any,some}[_vector]).
    /// `All` returns once every element has satisfied `cmp` (an element that held is not
    /// read again, as OpenSHMEM's "until all have satisfied" allows), `Any` the lowest
    /// index that holds, `Some` every index that held in the scan that found one. An empty
    /// set satisfies `All` and is an error for `Any` and `Some` (they could never return).
    fn wait_set<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        operand: Operand<'_, T>,
        mode: SetWait,
        op: &'static str,
    ) -> Result<Vec<usize>> {
        let words = self.ivar_words(ivars, status, &operand, op)?;
        if words.is_empty() && mode != SetWait::All {
            return Err(Error::InvalidArgument(format!(
                "{op}: the wait set is empty (no elements, or every one excluded by status)"
            )));
        }
        let mut done = 0; // All: words[..done] have held
        self.poll(
            || match mode {
                SetWait::All => {
                    let rest = &words[done..];
                    match rest
                        .iter()
                        .position(|&w| !Self::holds_now(w, cmp, &operand))
                    {
                        Some(k) => {
                            done += k;
                            Err(rest[k])
                        }
                        None => Ok(Vec::new()),
                    }
                }
                _ => {
                    let hits = Self::scan_set(&words, cmp, &operand, mode);
                    if hits.is_empty() {
                        Err(words[0])
                    } else {
                        Ok(hits)
                    }
                }
            },
            |&(i, p)| {
                let mut e = self.wait_error(op, ivars, i, p, cmp, operand.at(i));
                // Any / Some waited for any element of the set, not for the one named.
                if let (SetWait::Any | SetWait::Some, Error::WaitTimeout { last, .. }) =
                    (mode, &mut e)
                {
                    *last = format!(
                        "{last}, the first of the {} elements of the wait set, none of which held",
                        words.len()
                    );
                }
                e
            },
        )
    }

    /// One scan for test_{all,any,some}[_vector]. `All`: the first index that does not
    /// hold (empty: all do); `Any`: the lowest index that holds; `Some`: every index that
    /// holds.
    fn test_set<T: AtomicInt>(
        &self,
        ivars: SymPtr<T>,
        status: Option<&[i32]>,
        cmp: Cmp,
        operand: Operand<'_, T>,
        mode: SetWait,
        op: &'static str,
    ) -> Result<Vec<usize>> {
        let words = self.ivar_words(ivars, status, &operand, op)?;
        Ok(Self::scan_set(&words, cmp, &operand, mode))
    }

    /// One scan of the set (what each mode returns: as `test_set` says).
    fn scan_set<T: AtomicInt>(
        words: &[(usize, *mut T)],
        cmp: Cmp,
        operand: &Operand<'_, T>,
        mode: SetWait,
    ) -> Vec<usize> {
        let holds = |w| Self::holds_now(w, cmp, operand);
        match mode {
            SetWait::All => match words.iter().find(|&&w| !holds(w)) {
                Some(&(i, _)) => vec![i],
                None => Vec::new(),
            },
            SetWait::Any => words
                .iter()
                .find(|&&w| holds(w))
                .map(|&(i, _)| vec![i])
                .unwrap_or_default(),
            SetWait::Some => words
                .iter()
                .filter(|&&w| holds(w))
                .map(|&(i, _)| i)
                .collect(),
        }
    }

    fn wait_error<T: AtomicInt>(
        &self,
        op: &'static str,
        ivars: SymPtr<T>,
        i: usize,
        p: *mut T,
        cmp: Cmp,
        value: T,
    ) -> Error {
        // SAFETY: p is a validated word (from ivar_words), read atomically.
        // Acquire: the final value read makes the writer's earlier stores visible.
        let last = unsafe { T::load(p, Ordering::Acquire) };
        Error::WaitTimeout {
            pe: self.my_pe(),
            op,
            offset: ivars.at(i).offset(),
            cmp: cmp.symbol(),
            expected: value.to_string(),
            last: format!("{last} (element {i} of {})", ivars.len()),
            waited_ms: self.timeout().as_millis() as u64,
        }
    }

    /// Spins on one word until `cmp target` holds; returns the value seen.
    #[inline]
    fn wait_word<T: AtomicInt>(
        &self,
        p: *mut T,
        offset: usize,
        cmp: Cmp,
        target: T,
        op: &'static str,
    ) -> Result<T> {
        self.poll(
            || {
                // SAFETY: p was validated by sync_word; atomic-only access. Acquire pairs
                // with the writer's Release so data written before the update is visible.
                let v = unsafe { T::load(p, Ordering::Acquire) };
                if cmp.holds(v, target) {
                    Ok(v)
                } else {
                    Err(v)
                }
            },
            |last| Error::WaitTimeout {
                pe: self.my_pe(),
                op,
                offset,
                cmp: cmp.symbol(),
                expected: target.to_string(),
                last: last.to_string(),
                waited_ms: self.timeout().as_millis() as u64,
            },
        )
    }

    /// Waits for a runtime counter to reach `epoch`; `what` describes it for the error.
    /// Waits until the runtime word `p` reaches `epoch`; `from` is the PE that advances
    /// it, whose death ends the wait even when it is tolerated (`Pe::tolerate_death`).
    pub(crate) fn wait_internal(
        &self,
        p: *mut u64,
        epoch: u64,
        from: usize,
        what: impl Fn() -> String,
    ) -> Result<()> {
        let start = Instant::now();
        self.poll_from(
            Some(from),
            // SAFETY: p is a runtime word of our own mapping, accessed only atomically;
            // Acquire pairs with the signaller's Release.
            || {
                if unsafe { u64::load(p, Ordering::Acquire) } >= epoch {
                    Ok(())
                } else {
                    Err(())
                }
            },
            |_| Error::Timeout {
                pe: self.my_pe(),
                what: what(),
                waited_ms: ms_since(start),
            },
        )
    }

    /// The bounded wait loop shared by every wait: spin, then yield, checking the clock and
    /// peer liveness every CHECK_EVERY polls. `step` returns Ok(result) when done or
    /// Err(state) with what it saw; `expired` turns the last state into the timeout error.
    #[inline]
    pub(crate) fn poll<R, S>(
        &self,
        step: impl FnMut() -> std::result::Result<R, S>,
        expired: impl FnOnce(&S) -> Error,
    ) -> Result<R> {
        self.poll_from(None, step, expired)
    }

    /// [`Pe::poll`] for a wait on what PE `from` does: its death ends the wait even when
    /// it is tolerated (`Liveness::check_to`).
    #[inline]
    pub(crate) fn poll_from<R, S>(
        &self,
        from: Option<usize>,
        step: impl FnMut() -> std::result::Result<R, S>,
        expired: impl FnOnce(&S) -> Error,
    ) -> Result<R> {
        self.poll_checking(
            || match from {
                Some(f) => self.live.check_to(f),
                None => self.live.check(),
            },
            step,
            expired,
        )
    }

    /// [`Pe::poll`] whose liveness check is `alive` (run every `CHECK_EVERY` polls, with
    /// the clock).
    #[inline]
    pub(crate) fn poll_checking<R, S>(
        &self,
        alive: impl Fn() -> Result<()>,
        step: impl FnMut() -> std::result::Result<R, S>,
        expired: impl FnOnce(&S) -> Error,
    ) -> Result<R> {
        self.poll_within(self.timeout(), alive, step, expired)
    }

    /// [`Pe::poll`] bounded by `limit` instead of the PE's timeout (at least
    /// `CHECK_EVERY` steps).
    pub(crate) fn poll_for<R, S>(
        &self,
        limit: Duration,
        step: impl FnMut() -> std::result::Result<R, S>,
        expired: impl FnOnce(&S) -> Error,
    ) -> Result<R> {
        self.poll_within(limit, || self.live.check(), step, expired)
    }

    /// The loop of [`Pe::poll_checking`], giving up `limit` after the first miss.
    #[inline]
    fn poll_within<R, S>(
        &self,
        limit: Duration,
        alive: impl Fn() -> Result<()>,
        mut step: impl FnMut() -> std::result::Result<R, S>,
        expired: impl FnOnce(&S) -> Error,
    ) -> Result<R> {
        let mut polls: u64 = 0;
        let mut start: Option<Instant> = None;
        // Held while this wait runs engine rounds (from the first miss on): the engine
        // thread of a network backend parks meanwhile (progress handover, softhca::Waker).
        let mut _drive = None;
        loop {
            match step() {
                Ok(r) => return Ok(r),
                Err(state) => {
                    if polls == 0 {
                        _drive = self.proxy.as_ref().map(|p| p.drive());
                        // From the first miss (before 2026-12-07 from the CHECK_EVERY-th:
                        // the polls before it, each up to 1 MiB of assist copies, were
                        // not counted); a wait that succeeds at once reads no clock.
                        start = Some(Instant::now());
                    }
                    polls += 1;
                    if polls % CHECK_EVERY == 0 {
                        alive()?;
                        let t0 = *start.get_or_insert_with(Instant::now);
                        if t0.elapsed() >= limit {
                            return Err(expired(&state));
                        }
                    }
                    if self.help_peers() {
                        // Copied chunks of a peer's large put into our heap (assist.rs):
                        // that was this round's work.
                    } else if polls % 8 == 0 && self.proxy.as_ref().is_some_and(|p| p.assist()) {
                        // Ran a round of this process's soft HCA engine (what we wait for
                        // may be queued there): no need to spin or yield this time.
                    } else if polls < self.spin_polls {
                        std::hint::spin_loop();
                    } else if !self.proxy.as_ref().is_some_and(|p| p.assist()) {
                        // More PEs than cores: give the core to whoever we wait for (unless
                        // we could run a round of this process's soft HCA engine, which may
                        // be what we wait for).
                        std::thread::yield_now();
                    }
                }
            }
        }
    }
}

/// Spin budget of a waiting PE given the node's PE and core counts.
pub(crate) fn spin_polls(local_pes: usize, cores: usize) -> u64 {
    if local_pes > cores {
        SPIN_POLLS_OVERSUBSCRIBED
    } else {
        SPIN_POLLS
    }
}

#[inline]
fn check_len(op: &'static str, n: usize, room: usize) -> Result<()> {
    if n > room {
        return Err(Error::InvalidArgument(format!(
            "{op}: {n} elements do not fit a symmetric range of {room}"
        )));
    }
    Ok(())
}

/// Copies `n` bytes and, when the last 8 destination bytes are naturally aligned (else the
/// last 4), writes them last with a Release store.
///
/// # Safety
/// `dst` must be valid for `n` bytes of writes, `src` for `n` bytes of reads.
#[inline]
pub(crate) unsafe fn copy_last_word_release(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY (whole body): the caller guarantees both ranges; the atomic stores target
    // naturally aligned words inside dst..dst+n.
    unsafe {
        if n >= 8 && (dst as usize + n) % 8 == 0 {
            // Read before the copy: when src and dst overlap (a put from the mapping
            // itself, which the callers allow as memmove does), the copy may overwrite the
            // source's last word.
            let last = std::ptr::read_unaligned(src.add(n - 8).cast::<u64>());
            if n > 8 {
                copy_bytes(src, dst, n - 8);
            }
            // Release: the bytes copied above are visible to whoever acquires this word.
            AtomicU64::from_ptr(dst.add(n - 8).cast()).store(last, Ordering::Release);
        } else if n >= 4 && (dst as usize + n) % 4 == 0 {
            // The last 4 bytes are a naturally aligned u32 (a put of u32s that ends on a
            // 4- but not 8-aligned address, or a single u32): written last, as above.
            // Before 2026-12-07 only a single u32 was, and a longer put of u32s ending
            // there was a plain copy with the fence after it.
            let last = std::ptr::read_unaligned(src.add(n - 4).cast::<u32>());
            if n > 4 {
                copy_bytes(src, dst, n - 4);
            }
            // Release: the bytes copied above (and this PE's earlier stores) are visible
            // to whoever acquires this word.
            AtomicU32::from_ptr(dst.add(n - 4).cast()).store(last, Ordering::Release);
        } else {
            copy_bytes(src, dst, n);
            // Release fence: later stores (e.g. a flag) are not seen before this copy.
            fence(Ordering::Release);
        }
    }
}

/// Reads a T, atomically when it is a naturally aligned 4- or 8-byte word.
///
/// # Safety
/// `src` must be valid for `size_of::<T>()` bytes of reads; T must accept any bit pattern.
#[inline]
unsafe fn load_acquire<T: Element>(src: *const u8) -> T {
    let n = std::mem::size_of::<T>();
    // SAFETY (whole body): the caller guarantees the range; atomic loads only on naturally
    // aligned words. Acquire on those pairs with a Release store of the same word by the
    // writer. The fallback (unaligned, or not a 4/8-byte type) is a plain read followed by
    // an Acquire fence: best effort, a barrier but no synchronisation, since no atomic read
    // precedes the fence; a reader that needs one uses wait_until or a signal.
    unsafe {
        if n == 8 && (src as usize) % 8 == 0 {
            let v = AtomicU64::from_ptr(src as *mut u64).load(Ordering::Acquire);
            std::mem::transmute_copy(&v)
        } else if n == 4 && (src as usize) % 4 == 0 {
            let v = AtomicU32::from_ptr(src as *mut u32).load(Ordering::Acquire);
            std::mem::transmute_copy(&v)
        } else {
            let v = std::ptr::read_unaligned(src.cast::<T>());
            fence(Ordering::Acquire);
            v
        }
    }
}

/// # Safety
/// `s` must be an aligned signal word in a live mapping, accessed only atomically.
#[inline]
unsafe fn signal_update(s: *mut u64, signal: u64, op: SignalOp) {
    // SAFETY: per the contract. Release: the data put before the signal is visible to a PE
    // that observes the new signal value with an Acquire load.
    unsafe {
        match op {
            SignalOp::Set => u64::store(s, signal, Ordering::Release),
            SignalOp::Add => {
                // Release: the data put before the signal is visible to whoever acquires it.
                u64::fetch_add(s, signal, Ordering::Release);
            }
        }
    }
}

/// The bytes of a slice of plain data.
fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data; the slice covers size_of_val(s) initialised
    // bytes for the borrow's lifetime.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of plain data (any bit pattern written is a valid T).
fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and Element accepts any bit pattern, so writes through the byte
    // view cannot create an invalid T.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

fn to_bits<T: AtomicWord>(v: T) -> u64 {
    v.to_bits64()
}

/// The inverse of [`to_bits`] (truncating to T's size).
fn from_bits<T: AtomicWord>(b: u64) -> T {
    T::from_bits64(b)
}

/// The first error a `quiet` met since the last `try_quiet` took it (`quiet` returns
/// nothing). Checking costs one load: most `try_quiet`s (every collective and barrier) find
/// nothing kept and take no lock.
#[derive(Default)]
pub(crate) struct KeptError {
    /// Whether `error` holds one: written under its lock, read without it as a hint.
    set: std::sync::atomic::AtomicBool,
    error: std::sync::Mutex<Option<Error>>,
}

impl KeptError {
    /// Keeps `e` unless an earlier error is kept.
    pub(crate) fn keep(&self, e: Error) {
        let mut kept = self.error.lock().unwrap_or_else(|p| p.into_inner());
        kept.get_or_insert(e);
        // Relaxed: written under the lock; `take` reads it without the lock only as a hint
        // (a thread that misses an error kept at that moment by another thread sees it at
        // its next call, as if it had come after this one).
        self.set.store(true, Ordering::Relaxed);
    }

    /// The outcome of a call whose own result is `r`: the kept error first (it came
    /// first), `r`'s error then kept for the next call; else `r`.
    pub(crate) fn report(&self, r: Result<()>) -> Result<()> {
        match self.take() {
            Some(kept) => {
                if let Err(e) = r {
                    self.keep(e);
                }
                Err(kept)
            }
            None => r,
        }
    }

    /// The kept error, if any, which is kept no longer.
    pub(crate) fn take(&self) -> Option<Error> {
        // Relaxed: a hint (see `keep`); what counts is read under the lock.
        if !self.set.load(Ordering::Relaxed) {
            return None;
        }
        let mut kept = self.error.lock().unwrap_or_else(|p| p.into_inner());
        self.set.store(false, Ordering::Relaxed);
        kept.take()
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_last_word_release, KeptError};

    /// The first error kept is the one taken, once; one kept after that is taken next;
    /// threads that keep and take at once leave nothing behind.
    #[test]
    fn a_kept_error_is_taken_once() {
        let k = KeptError::default();
        let e = |m: &str| crate::Error::InvalidArgument(m.into());
        let taken_msg = |k: &KeptError| k.take().map(|e| e.to_string());
        assert!(k.take().is_none());
        k.keep(e("first"));
        k.keep(e("second"));
        assert_eq!(taken_msg(&k), Some(e("first").to_string()));
        assert!(k.take().is_none());
        k.keep(e("third"));
        assert_eq!(taken_msg(&k), Some(e("third").to_string()));
        assert!(k.take().is_none());
        // Threads keep and take at once; after they joined, what is left is taken.
        let taken = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (k, taken) = (&k, &taken);
                s.spawn(move || {
                    for i in 0..1000 {
                        k.keep(e(&format!("{t}.{i}")));
                        if k.take().is_some() {
                            taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        // Errors kept while one is kept coalesce, and a take may find the error another
        // thread kept; but each thread ends with a take after its last keep, so nothing is
        // left, and the flag agrees with what is kept.
        assert!((1..=4000).contains(&taken.into_inner()));
        assert!(k.take().is_none());
        k.keep(e("after"));
        assert_eq!(taken_msg(&k), Some(e("after").to_string()));
    }

    /// `report` returns the kept error as it was kept (its kind and the PE it names), and
    /// keeps the call's own error for the next call: neither is lost.
    #[test]
    fn a_kept_error_is_reported_first_and_the_new_one_next() {
        use crate::Error;
        let k = KeptError::default();
        k.keep(Error::PeerDied {
            pe: 3,
            detail: "gone".into(),
        });
        let own = || Error::InvalidArgument("this call's own".into());
        assert!(matches!(
            k.report(Err(own())),
            Err(Error::PeerDied { pe: 3, .. })
        ));
        assert!(
            matches!(k.report(Ok(())), Err(Error::InvalidArgument(m)) if m == "this call's own")
        );
        assert!(k.report(Ok(())).is_ok());
    }

    /// A copy whose source overlaps its destination (memmove semantics, which `put`
    /// allows for a source in the mapping itself) moves every element, the last word
    /// included: it was read after the copy had overwritten it. Raw pointers only.
    #[test]
    fn the_release_copy_is_a_memmove() {
        for shift in [1usize, 2] {
            let mut v: Vec<u64> = (0..8).collect();
            let p = v.as_mut_ptr();
            // SAFETY: both ranges are inside `v` (8 elements), read and written only
            // through `p` here.
            unsafe { copy_last_word_release(p.add(shift).cast(), p.cast_const().cast(), 32) };
            let want: Vec<u64> = (0..8)
                .map(|i| {
                    if (shift..shift + 4).contains(&i) {
                        (i - shift) as u64
                    } else {
                        i as u64
                    }
                })
                .collect();
            assert_eq!(v, want, "shift {shift}");
        }
        // The u32 branch (the destination ends 4- but not 8-aligned): u32 elements, 5 of
        // them, moved by 1 and 3 elements, overlapping.
        for shift in [1usize, 3] {
            let mut v: Vec<u32> = (0..10).collect();
            let p = v.as_mut_ptr();
            // SAFETY: both ranges are inside `v` (10 elements), read and written only
            // through `p` here.
            unsafe { copy_last_word_release(p.add(shift).cast(), p.cast_const().cast(), 20) };
            let want: Vec<u32> = (0..10)
                .map(|i| {
                    if (shift..shift + 5).contains(&i) {
                        (i - shift) as u32
                    } else {
                        i as u32
                    }
                })
                .collect();
            assert_eq!(v, want, "u32 shift {shift}");
        }
    }

    /// Every byte lands, whichever branch the destination's end selects (8-aligned,
    /// 4-aligned, neither), for every start alignment and length up to 39.
    #[test]
    fn the_release_copy_moves_every_byte_for_every_end() {
        let src: Vec<u8> = (0..64u8).collect();
        for start in 0..8usize {
            for n in 0..40usize {
                let mut dst = vec![0xeeu8; 64];
                // SAFETY: dst[start..start + n] and src[..n] are in bounds (start + n < 64).
                unsafe { copy_last_word_release(dst.as_mut_ptr().add(start), src.as_ptr(), n) };
                assert_eq!(&dst[start..start + n], &src[..n], "start {start} n {n}");
                assert!(
                    dst[..start].iter().all(|&b| b == 0xee),
                    "start {start} n {n}"
                );
                assert!(
                    dst[start + n..].iter().all(|&b| b == 0xee),
                    "start {start} n {n}"
                );
            }
        }
    }
}
