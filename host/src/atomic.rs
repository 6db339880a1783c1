//! Types usable with symmetric atomics and point-to-point waits, mapped onto the standard
//! library's atomics so that every access to a synchronisation word is atomic.

use crate::types::Element;
use std::fmt::{Debug, Display};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// 32- and 64-bit words that can be read, written and exchanged atomically: the integers
/// of [`AtomicInt`] and OpenSHMEM's extended AMO types `f32` and `f64` (atomic fetch, set
/// and swap; the floats move as their bits, so NaN payloads and -0.0 pass unchanged).
///
/// Every method takes a raw pointer into a mapped heap.
///
/// # Safety (of each method)
/// `p` must be non-null, aligned to `size_of::<Self>()`, point into a live mapping, and
/// every concurrent access to that word must be atomic (which rshmem guarantees for words
/// accessed through its atomic, signal and wait operations).
pub trait AtomicWord: Element + PartialOrd + Debug + Display {
    /// # Safety
    /// See the trait documentation.
    unsafe fn load(p: *mut Self, o: Ordering) -> Self;
    /// # Safety
    /// See the trait documentation.
    unsafe fn store(p: *mut Self, v: Self, o: Ordering);
    /// # Safety
    /// See the trait documentation.
    unsafe fn swap(p: *mut Self, v: Self, o: Ordering) -> Self;
    /// The value's bits, zero-extended to 64 (the proxy transport's operand).
    fn to_bits64(self) -> u64;
    /// The value of the low `size_of::<Self>()` bytes of `b`.
    fn from_bits64(b: u64) -> Self;
}

/// 32- and 64-bit integers: the types of OpenSHMEM's standard and bitwise AMOs and of
/// `wait_until`.
///
/// # Safety (of each method)
/// As [`AtomicWord`].
pub trait AtomicInt: AtomicWord + Eq {
    /// Returns the previous value whether or not the exchange happened.
    /// # Safety
    /// See the trait documentation.
    unsafe fn compare_swap(p: *mut Self, cond: Self, v: Self, o: Ordering) -> Self;
    /// Wrapping add.
    /// # Safety
    /// See the trait documentation.
    unsafe fn fetch_add(p: *mut Self, v: Self, o: Ordering) -> Self;
    /// # Safety
    /// See the trait documentation.
    unsafe fn fetch_and(p: *mut Self, v: Self, o: Ordering) -> Self;
    /// # Safety
    /// See the trait documentation.
    unsafe fn fetch_or(p: *mut Self, v: Self, o: Ordering) -> Self;
    /// # Safety
    /// See the trait documentation.
    unsafe fn fetch_xor(p: *mut Self, v: Self, o: Ordering) -> Self;
    /// The value 1 (for inc).
    const ONE: Self;
}

macro_rules! atomic_int {
    ($t:ty, $a:ty, $u:ty) => {
        impl AtomicWord for $t {
            #[inline]
            unsafe fn load(p: *mut Self, o: Ordering) -> Self {
                // SAFETY: caller guarantees alignment, liveness and atomic-only access.
                unsafe { <$a>::from_ptr(p).load(o) }
            }
            #[inline]
            unsafe fn store(p: *mut Self, v: Self, o: Ordering) {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p).store(v, o) }
            }
            #[inline]
            unsafe fn swap(p: *mut Self, v: Self, o: Ordering) -> Self {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p).swap(v, o) }
            }
            #[inline]
            fn to_bits64(self) -> u64 {
                self as $u as u64
            }
            #[inline]
            fn from_bits64(b: u64) -> Self {
                b as $u as Self
            }
        }
        impl AtomicInt for $t {
            const ONE: Self = 1;
            #[inline]
            unsafe fn compare_swap(p: *mut Self, cond: Self, v: Self, o: Ordering) -> Self {
                // The failure ordering only needs to make the returned value meaningful.
                let fail = match o {
                    Ordering::Release | Ordering::Relaxed => Ordering::Relaxed,
                    _ => Ordering::Acquire,
                };
                // SAFETY: as above.
                match unsafe { <$a>::from_ptr(p).compare_exchange(cond, v, o, fail) } {
                    Ok(old) | Err(old) => old,
                }
            }
            #[inline]
            unsafe fn fetch_add(p: *mut Self, v: Self, o: Ordering) -> Self {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p).fetch_add(v, o) }
            }
            #[inline]
            unsafe fn fetch_and(p: *mut Self, v: Self, o: Ordering) -> Self {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p).fetch_and(v, o) }
            }
            #[inline]
            unsafe fn fetch_or(p: *mut Self, v: Self, o: Ordering) -> Self {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p).fetch_or(v, o) }
            }
            #[inline]
            unsafe fn fetch_xor(p: *mut Self, v: Self, o: Ordering) -> Self {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p).fetch_xor(v, o) }
            }
        }
    };
}

atomic_int!(u32, AtomicU32, u32);
atomic_int!(i32, AtomicI32, u32);
atomic_int!(u64, AtomicU64, u64);
atomic_int!(i64, AtomicI64, u64);

/// f32 / f64: the same-size unsigned atomic on the value's bits.
macro_rules! atomic_float {
    ($t:ty, $a:ty, $u:ty) => {
        impl AtomicWord for $t {
            #[inline]
            unsafe fn load(p: *mut Self, o: Ordering) -> Self {
                // SAFETY: caller guarantees alignment, liveness and atomic-only access; the
                // float and its bits have the same size and alignment.
                <$t>::from_bits(unsafe { <$a>::from_ptr(p.cast::<$u>()).load(o) })
            }
            #[inline]
            unsafe fn store(p: *mut Self, v: Self, o: Ordering) {
                // SAFETY: as above.
                unsafe { <$a>::from_ptr(p.cast::<$u>()).store(v.to_bits(), o) }
            }
            #[inline]
            unsafe fn swap(p: *mut Self, v: Self, o: Ordering) -> Self {
                // SAFETY: as above.
                <$t>::from_bits(unsafe { <$a>::from_ptr(p.cast::<$u>()).swap(v.to_bits(), o) })
            }
            #[inline]
            fn to_bits64(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline]
            fn from_bits64(b: u64) -> Self {
                <$t>::from_bits(b as $u)
            }
        }
    };
}

atomic_float!(f32, AtomicU32, u32);
atomic_float!(f64, AtomicU64, u64);
