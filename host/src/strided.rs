//! Strided put and get (OpenSHMEM `shmem_iput` / `shmem_iget`): element `i` of the
//! transfer is at index `i * stride` on each side. Both sides are checked whole before any
//! element moves, so a bad call changes nothing. Each element is one put or get of the
//! transport under it (p2p, proxy or fabric), so ordering and completion are theirs: an
//! `iput` completes at the next quiet, an `iget` on return.

use crate::error::{Error, Result};
use crate::pe::Pe;
use crate::types::{Element, SymPtr};

/// Elements a strided side spans: `(nelems - 1) * stride + 1`, or None on overflow.
fn span(nelems: usize, stride: usize) -> Option<usize> {
    (nelems - 1).checked_mul(stride)?.checked_add(1)
}

/// The common checks of iput/iget: strides of at least 1 and both sides long enough.
fn check(
    op: &str,
    (dst, dest_len): (usize, usize),
    (sst, source_len): (usize, usize),
    nelems: usize,
) -> Result<()> {
    if dst == 0 || sst == 0 {
        return Err(Error::InvalidArgument(format!(
            "{op}: strides must be at least 1 element (dest stride {dst}, source stride {sst})"
        )));
    }
    for (side, stride, len) in [("dest", dst, dest_len), ("source", sst, source_len)] {
        match span(nelems, stride) {
            Some(need) if need <= len => {}
            need => {
                return Err(Error::InvalidArgument(format!(
                    "{op}: {nelems} elements at {side} stride {stride} span {} elements, \
                     {side} has {len}",
                    need.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                )))
            }
        }
    }
    Ok(())
}

impl Pe {
    /// The PE and the whole strided span of `sym` on it, checked before any element moves
    /// (a `SymPtr` made with `from_raw` may reach past the heap; each element's own check
    /// would then fail only after the earlier ones moved).
    fn check_span<T>(&self, pe: usize, sym: SymPtr<T>, stride: usize, nelems: usize) -> Result<()> {
        let bytes = span(nelems, stride)
            .and_then(|n| n.checked_mul(size_of::<T>()))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{nelems} elements at stride {stride} span more than the address space"
                ))
            })?;
        self.route(pe, sym.offset(), bytes).map(|_| ())
    }

    /// `dest[i * dst] = source[i * sst]` on PE `pe` for `i < nelems` (OpenSHMEM
    /// `shmem_iput`; strides in elements). `source` may be reused on return; the data is
    /// complete at the next quiet, as with [`Pe::put`].
    pub fn iput<T: Element>(
        &self,
        dest: SymPtr<T>,
        source: &[T],
        dst: usize,
        sst: usize,
        nelems: usize,
        pe: usize,
    ) -> Result<()> {
        if nelems == 0 {
            return Ok(());
        }
        check("iput", (dst, dest.len()), (sst, source.len()), nelems)?;
        if dst == 1 && sst == 1 {
            return self.put(dest.slice(0..nelems), &source[..nelems], pe);
        }
        self.check_span(pe, dest, dst, nelems)?;
        for i in 0..nelems {
            let s = i * sst;
            self.put_nbi(dest.at(i * dst), &source[s..s + 1], pe)?;
        }
        Ok(())
    }

    /// `dest[i * dst] = source[i * sst]` read from PE `pe` for `i < nelems` (OpenSHMEM
    /// `shmem_iget`; strides in elements). Complete on return, as [`Pe::get`].
    pub fn iget<T: Element>(
        &self,
        dest: &mut [T],
        source: SymPtr<T>,
        dst: usize,
        sst: usize,
        nelems: usize,
        pe: usize,
    ) -> Result<()> {
        if nelems == 0 {
            return Ok(());
        }
        check("iget", (dst, dest.len()), (sst, source.len()), nelems)?;
        if dst == 1 && sst == 1 {
            return self.get(&mut dest[..nelems], source.slice(0..nelems), pe);
        }
        self.check_span(pe, source, sst, nelems)?;
        for i in 0..nelems {
            let d = i * dst;
            self.get(&mut dest[d..d + 1], source.at(i * sst), pe)?;
        }
        Ok(())
    }
}
