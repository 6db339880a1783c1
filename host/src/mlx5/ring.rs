//! Send-queue ring placement: slot math and copying WQEs in and out with wrap-around.
//!
//! Slot of WQE index `i` in a ring of `wqe_cnt` WQEBBs (a power of two) is
//! `(i & (wqe_cnt - 1)) << 6`; a WQE running past the end of the ring continues at its
//! start. WQE indices are 16-bit and wrap at 0xffff whatever the ring size. This module
//! moves bytes only: it does not order stores against the NIC (the send-queue code does).

use super::wire::WireStruct;
use super::wqe::{CtrlSeg, WqeSize, DS_BYTES, MAX_WQEBBS, WQEBB};

/// A ring of the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    #[error("WQE count {wqe_cnt} is not a power of two")]
    NotPowerOfTwo { wqe_cnt: usize },
    #[error("ring of {len} bytes does not hold {wqe_cnt} WQEBBs of 64 bytes")]
    BadLength { len: usize, wqe_cnt: usize },
    #[error("WQE of {len} bytes is not whole WQEBBs, or larger than the ring ({ring} bytes) or 16 WQEBBs")]
    BadWqeLength { len: usize, ring: usize },
}

/// Byte offset of WQE index `i`'s slot: `(i & (wqe_cnt - 1)) << 6`.
pub const fn slot_offset(i: u32, wqe_cnt: u32) -> usize {
    ((i & (wqe_cnt - 1)) as usize) << 6
}

/// The WQE index after a WQE of `size` at `i` (16-bit wrap).
pub const fn next_index(i: u16, size: WqeSize) -> u16 {
    i.wrapping_add(size.wqebbs())
}

fn check(ring_len: usize, wqe_cnt: usize, wqe_len: usize) -> Result<(), RingError> {
    if !wqe_cnt.is_power_of_two() {
        return Err(RingError::NotPowerOfTwo { wqe_cnt });
    }
    if ring_len != wqe_cnt * WQEBB {
        return Err(RingError::BadLength {
            len: ring_len,
            wqe_cnt,
        });
    }
    if wqe_len % WQEBB != 0 || wqe_len > ring_len || wqe_len > MAX_WQEBBS * WQEBB {
        return Err(RingError::BadWqeLength {
            len: wqe_len,
            ring: ring_len,
        });
    }
    Ok(())
}

/// Copies `wqe` (whole WQEBBs) into `ring` at WQE index `index`, wrapping at the end.
pub fn copy_into_ring(
    ring: &mut [u8],
    wqe_cnt: usize,
    index: u32,
    wqe: &[u8],
) -> Result<(), RingError> {
    check(ring.len(), wqe_cnt, wqe.len())?;
    let off = slot_offset(index, wqe_cnt as u32);
    let first = wqe.len().min(ring.len() - off);
    ring[off..off + first].copy_from_slice(&wqe[..first]);
    ring[..wqe.len() - first].copy_from_slice(&wqe[first..]);
    Ok(())
}

/// Copies `out.len()` bytes (whole WQEBBs) from `ring` at WQE index `index`, wrapping.
pub fn copy_from_ring(
    ring: &[u8],
    wqe_cnt: usize,
    index: u32,
    out: &mut [u8],
) -> Result<(), RingError> {
    check(ring.len(), wqe_cnt, out.len())?;
    let off = slot_offset(index, wqe_cnt as u32);
    let first = out.len().min(ring.len() - off);
    out[..first].copy_from_slice(&ring[off..off + first]);
    let n = out.len();
    out[first..].copy_from_slice(&ring[..n - first]);
    Ok(())
}

/// Reads the WQE at `index` into a contiguous buffer, sized from its control segment's
/// ds (a ds of 0 or over 64 still yields one WQEBB / 16 WQEBBs; the parser rejects it).
pub fn read_wqe(ring: &[u8], wqe_cnt: usize, index: u32) -> Result<Vec<u8>, RingError> {
    check(ring.len(), wqe_cnt, WQEBB)?;
    let off = slot_offset(index, wqe_cnt as u32);
    let ds = CtrlSeg::read_from(&ring[off..])
        .map_or(1, |c| c.ds())
        .max(1) as usize;
    let wqebbs = (ds * DS_BYTES).div_ceil(WQEBB).min(MAX_WQEBBS).min(wqe_cnt);
    let mut out = vec![0; wqebbs * WQEBB];
    copy_from_ring(ring, wqe_cnt, index, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_copy() {
        let mut ring = vec![0u8; 4 * 64];
        let wqe: Vec<u8> = (0..128).map(|i| i as u8).collect();
        // Index 7 in a ring of 4 is slot 3: the second WQEBB wraps to slot 0.
        copy_into_ring(&mut ring, 4, 7, &wqe).unwrap();
        assert_eq!(&ring[192..256], &wqe[..64]);
        assert_eq!(&ring[..64], &wqe[64..]);
        let mut back = vec![0u8; 128];
        copy_from_ring(&ring, 4, 0xffff, &mut back).unwrap();
        assert_eq!(back, wqe);
        assert_eq!(slot_offset(0x1_0001, 4), 64);
        assert_eq!(next_index(0xffff, WqeSize { ds: 5 }), 1);
        assert_eq!(
            copy_into_ring(&mut ring, 3, 0, &wqe),
            Err(RingError::NotPowerOfTwo { wqe_cnt: 3 })
        );
    }
}
