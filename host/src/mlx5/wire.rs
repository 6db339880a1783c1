//! Big-endian wire integers and the plain-bytes contract of mlx5 wire structs.
//!
//! Every multi-byte field the NIC reads or writes is big-endian. The newtypes here hold the
//! wire bytes themselves (`[u8; N]`, alignment 1), so a field can never be read in host
//! order by mistake and a wire struct built from them has no padding and alignment 1: it
//! can be copied out of (or into) any byte offset of a ring. Offsets and sizes equal those
//! of rdma-core's `mlx5dv.h` structs (checked by `host/tests/mlx5_oracle.rs`); only the
//! alignment differs (rdma-core's `__be32` is 4-aligned), which matters to no one who
//! copies bytes.
//!
//! This module owns byte order and byte copies; it knows nothing about what a field means.

use std::fmt;

macro_rules! be_int {
    ($name:ident, $int:ty, $n:expr) => {
        #[doc = concat!("A big-endian `", stringify!($int), "` as it lies on the wire.")]
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name([u8; $n]);

        impl $name {
            /// Encodes a host-order value.
            #[inline]
            pub const fn new(v: $int) -> Self {
                Self(v.to_be_bytes())
            }
            /// Decodes to host order.
            #[inline]
            pub const fn get(self) -> $int {
                <$int>::from_be_bytes(self.0)
            }
            /// Takes wire bytes as they are.
            #[inline]
            pub const fn from_bytes(b: [u8; $n]) -> Self {
                Self(b)
            }
            /// The wire bytes.
            #[inline]
            pub const fn to_bytes(self) -> [u8; $n] {
                self.0
            }
        }

        impl From<$int> for $name {
            fn from(v: $int) -> Self {
                Self::new(v)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#x})", stringify!($name), self.get())
            }
        }
    };
}

be_int!(Be16, u16, 2);
be_int!(Be32, u32, 4);
be_int!(Be64, u64, 8);

/// A wire struct: `#[repr(C)]`, made only of `u8`, byte arrays and `Be*` fields, so it has
/// alignment 1, no padding, and every bit pattern is a valid value.
///
/// # Safety
/// Implement only for types that satisfy exactly that (the [`wire_struct!`] macro checks
/// size and alignment at compile time).
pub unsafe trait WireStruct: Copy + Sized {
    /// Size in bytes on the wire.
    const SIZE: usize = std::mem::size_of::<Self>();

    /// The struct's wire bytes.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: the trait contract says Self is repr(C) plain bytes without padding, so
        // all SIZE bytes behind &self are initialised u8s for the lifetime of the borrow.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), Self::SIZE) }
    }

    /// Copies the struct out of the first `SIZE` bytes of `bytes`; `None` if too short.
    fn read_from(bytes: &[u8]) -> Option<Self> {
        let src = bytes.get(..Self::SIZE)?;
        // SAFETY: src has SIZE readable bytes; Self has alignment 1 and every bit pattern
        // is a valid Self (trait contract), so an unaligned read of SIZE bytes is sound.
        Some(unsafe { std::ptr::read_unaligned(src.as_ptr().cast::<Self>()) })
    }

    /// Copies the struct into the first `SIZE` bytes of `bytes`; `None` if too short.
    fn write_to(&self, bytes: &mut [u8]) -> Option<()> {
        bytes
            .get_mut(..Self::SIZE)?
            .copy_from_slice(self.as_bytes());
        Some(())
    }
}

/// Declares `WireStruct` for a struct and asserts at compile time its size and alignment 1.
macro_rules! wire_struct {
    ($t:ty, $size:expr) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $size);
        const _: () = assert!(std::mem::align_of::<$t>() == 1);
        // SAFETY: $t is repr(C) of u8 / [u8; N] / Be* fields (alignment 1, so no padding
        // is possible; size checked above), and every bit pattern is valid.
        unsafe impl $crate::mlx5::wire::WireStruct for $t {}
    };
}
pub(crate) use wire_struct;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn be_roundtrip_and_layout() {
        assert_eq!(Be32::new(0x1122_3344).to_bytes(), [0x11, 0x22, 0x33, 0x44]);
        assert_eq!(Be16::new(0xabcd).to_bytes(), [0xab, 0xcd]);
        assert_eq!(
            Be64::new(0x0102_0304_0506_0708).get(),
            0x0102_0304_0506_0708
        );
        assert_eq!(std::mem::align_of::<Be64>(), 1);
        assert_eq!(std::mem::size_of::<Be64>(), 8);
    }
}
