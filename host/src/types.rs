//! Value types of the public API: symmetric addresses, element types, comparisons, signal
//! operations.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

/// Types that may live in the symmetric heap and be moved by put/get: plain data in which
/// every bit pattern is a valid value.
///
/// # Safety
/// Implementors must be `Copy`, contain no padding-sensitive invariants, no pointers or
/// references, and accept any bit pattern (a remote PE may write arbitrary bytes).
pub unsafe trait Element: Copy + Send + Sync + 'static {}

macro_rules! element {
    ($($t:ty),*) => { $(
        // SAFETY: primitive numeric type; every bit pattern is a valid value.
        unsafe impl Element for $t {}
    )* };
}
element!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
// SAFETY: an array of Elements is itself plain data with no invalid bit patterns.
unsafe impl<T: Element, const N: usize> Element for [T; N] {}

/// A typed range in the symmetric heap: `len` elements of `T` starting at byte `offset`.
/// The same value names the corresponding memory on every PE.
pub struct SymPtr<T> {
    offset: usize,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for SymPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SymPtr<T> {}
impl<T> PartialEq for SymPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.offset == o.offset && self.len == o.len
    }
}
impl<T> Eq for SymPtr<T> {}
impl<T> fmt::Debug for SymPtr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SymPtr<{}>{{offset: {:#x}, len: {}}}",
            std::any::type_name::<T>(),
            self.offset,
            self.len
        )
    }
}

impl<T> SymPtr<T> {
    /// Builds a symmetric pointer from a raw heap offset (e.g. received from another PE).
    /// Every operation checks it against the heap bounds.
    pub fn from_raw(offset: usize, len: usize) -> Self {
        SymPtr {
            offset,
            len,
            _t: PhantomData,
        }
    }
    /// Byte offset from the start of the heap.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when it names no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes. Saturates (a hand-made pointer's `len` can be anything): a size
    /// that does not fit fails every bounds check instead of wrapping into one that passes.
    pub fn bytes(&self) -> usize {
        self.len.saturating_mul(std::mem::size_of::<T>())
    }
    /// Element `i` as a one-element pointer. Panics if `i >= len` (a programming error,
    /// like slice indexing).
    pub fn at(&self, i: usize) -> SymPtr<T> {
        assert!(
            i < self.len,
            "SymPtr index {i} out of range (len {})",
            self.len
        );
        // Saturating, as `bytes`: an offset that does not fit fails the bounds checks.
        SymPtr::from_raw(
            self.offset
                .saturating_add(i.saturating_mul(std::mem::size_of::<T>())),
            1,
        )
    }
    /// A sub-range of elements. Panics if the range exceeds `len`.
    pub fn slice(&self, r: Range<usize>) -> SymPtr<T> {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "SymPtr range {r:?} out of range (len {})",
            self.len
        );
        SymPtr::from_raw(
            self.offset
                .saturating_add(r.start.saturating_mul(std::mem::size_of::<T>())),
            r.end - r.start,
        )
    }
    /// Reinterprets the bytes as elements of `U` (the length is rounded down).
    pub fn cast<U>(&self) -> SymPtr<U> {
        SymPtr::from_raw(self.offset, self.bytes() / std::mem::size_of::<U>().max(1))
    }
}

/// Comparison operators of the wait/test family (OpenSHMEM `SHMEM_CMP_*`). The values are
/// the device API's `rshmem_cmp_t` (device-kernels/include/rshmem/types.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Cmp {
    Eq = 0,
    Ne = 1,
    Gt = 2,
    Ge = 3,
    Lt = 4,
    Le = 5,
}

impl Cmp {
    /// `value <op> target`.
    #[inline]
    pub fn holds<T: PartialOrd>(self, value: T, target: T) -> bool {
        match self {
            Cmp::Eq => value == target,
            Cmp::Ne => value != target,
            Cmp::Gt => value > target,
            Cmp::Ge => value >= target,
            Cmp::Lt => value < target,
            Cmp::Le => value <= target,
        }
    }
    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
        }
    }
    pub const ALL: [Cmp; 6] = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le];
}

impl fmt::Display for Cmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// Signal update operators (OpenSHMEM `SHMEM_SIGNAL_SET` / `SHMEM_SIGNAL_ADD`). The values
/// are the device API's `rshmem_signal_op_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SignalOp {
    Set = 0,
    Add = 1,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made pointer whose byte size or element offset does not fit saturates, so
    /// every bounds check refuses it (it wrapped to a small size before).
    #[test]
    fn sizes_and_offsets_saturate() {
        let p = SymPtr::<u64>::from_raw(65536, (1 << 61) + 1);
        assert_eq!(p.bytes(), usize::MAX);
        assert_eq!(p.at(1 << 61).offset(), usize::MAX);
        assert_eq!(p.slice(1 << 61..(1 << 61) + 1).offset(), usize::MAX);
        let q = SymPtr::<u32>::from_raw(64, 4);
        assert_eq!(
            (q.bytes(), q.at(3).offset(), q.slice(1..3).offset()),
            (16, 76, 68)
        );
    }

    /// The enums cross the FFI boundary by value: check them against the CUDA header.
    #[test]
    fn values_match_the_device_header() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../device-kernels/include/rshmem/types.cuh"
        );
        let h = std::fs::read_to_string(path).expect("device header present");
        let value = |name: &str| -> u32 {
            let line = h
                .lines()
                .find(|l| l.trim_start().starts_with(name) && l.contains('='))
                .unwrap_or_else(|| panic!("{name} not in {path}"));
            line.split('=')
                .nth(1)
                .unwrap()
                .trim()
                .trim_end_matches(',')
                .parse()
                .unwrap()
        };
        for (c, n) in Cmp::ALL.iter().zip(["EQ", "NE", "GT", "GE", "LT", "LE"]) {
            assert_eq!(*c as u32, value(&format!("RSHMEM_CMP_{n} ")), "{c:?}");
        }
        assert_eq!(SignalOp::Set as u32, value("RSHMEM_SIGNAL_SET "));
        assert_eq!(SignalOp::Add as u32, value("RSHMEM_SIGNAL_ADD "));
    }
}
