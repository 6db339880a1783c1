//! Bulk byte copies: `memmove`, except for one case where glibc's is 10–30× slow.
//!
//! glibc copies from about 2 KiB up to a cache-sized bound with `rep movsb` on CPUs that
//! report fast short `rep movsb` (FSRM). On AMD EPYC (Zen 3, 2 vCPUs under KVM; glibc 2.36,
//! Debian 12) that instruction runs at 2.5–3 GB/s instead of 35–90 GB/s whenever the
//! destination lies 1 to 31 bytes past the source modulo 64, for every source alignment,
//! from 8 KiB to 512 KiB (measured in C and Rust; docs/runtime.md, "Copies and glibc's
//! rep movsb"). `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=...` removes it, but only
//! for a process started with it. Symmetric puts hit that case as soon as source and
//! destination offsets differ by such an amount (e.g. an f32 array put four elements in).
//!
//! [`copy_bytes`] copies such ranges with a loop of four 32-byte AVX2 loads and aligned
//! stores (glibc's own vector loop, which it uses below the `rep movsb` threshold), and
//! leaves everything else — small, large, overlapping, other alignments, no AVX2 — to
//! `memmove`.

/// Smallest copy that takes the vector loop (below it glibc does not use `rep movsb`).
pub const VECTOR_MIN: usize = 2048;
/// Copies of this size and above go to `memmove` (glibc was fast there in every case
/// measured, and switches to non-temporal stores for the largest).
pub const VECTOR_MAX: usize = 1 << 20;

/// Whether [`copy_bytes`] takes the vector loop for these arguments.
#[inline]
pub fn takes_vector_loop(dst: *const u8, src: *const u8, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let (d, s) = (dst as usize, src as usize);
        let disjoint = d.wrapping_add(n) <= s || s.wrapping_add(n) <= d;
        let residue = d.wrapping_sub(s) % 64;
        (VECTOR_MIN..VECTOR_MAX).contains(&n)
            && disjoint
            && (1..32).contains(&residue)
            && std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, src, n);
        false
    }
}

/// Copies `n` bytes from `src` to `dst`, with `memmove`'s semantics (the ranges may
/// overlap); the argument order of [`std::ptr::copy`].
///
/// # Safety
/// As for [`std::ptr::copy`]: `src` valid for `n` bytes of reads, `dst` for `n` bytes of
/// writes, and no one else writing either range non-atomically meanwhile.
#[inline(always)]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    // Inline: one compare in front of memmove, so small copies (8-byte puts) and the
    // callers' inlining stay as they were; the rest is out of line.
    #[cfg(target_arch = "x86_64")]
    if n >= VECTOR_MIN {
        // SAFETY: the caller's contract.
        unsafe { copy_large(src, dst, n) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy(src, dst, n) }
}

/// [`copy_bytes`] from [`VECTOR_MIN`] bytes on.
///
/// # Safety
/// As for [`copy_bytes`].
#[cfg(target_arch = "x86_64")]
#[inline(never)]
unsafe fn copy_large(src: *const u8, dst: *mut u8, n: usize) {
    if takes_vector_loop(dst, src, n) {
        // SAFETY: the caller's contract; the ranges are disjoint, n >= VECTOR_MIN >= 256,
        // and the CPU has AVX2 (all checked by takes_vector_loop).
        unsafe { copy_avx2(dst, src, n) };
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy(src, dst, n) }
    }
}

/// The vector loop: the first 32 bytes unaligned, then 128-byte blocks with 32-byte
/// aligned stores, then the last 128 bytes unaligned (loaded before any store, so the
/// overlap with the blocks rewrites equal bytes).
///
/// # Safety
/// `n >= 256`; `src..src+n` readable and `dst..dst+n` writable; the ranges disjoint; the
/// CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_storeu_si256};
    // SAFETY (whole body): every access lies inside src..src+n or dst..dst+n (n >= 256,
    // head < 32, and the loop stops 128 bytes before the end); aligned stores go to
    // d, which is 32-byte aligned after the head; the caller guarantees the rest.
    unsafe {
        let ld = |p: *const u8| _mm256_loadu_si256(p.cast::<__m256i>());
        let first = ld(src);
        let last = [
            ld(src.add(n - 128)),
            ld(src.add(n - 96)),
            ld(src.add(n - 64)),
            ld(src.add(n - 32)),
        ];
        _mm256_storeu_si256(dst.cast::<__m256i>(), first);
        let head = (32 - (dst as usize & 31)) & 31;
        let (mut d, mut s) = (dst.add(head), src.add(head));
        let end = dst.add(n - 128);
        while d < end {
            let (a, b, c, e) = (ld(s), ld(s.add(32)), ld(s.add(64)), ld(s.add(96)));
            _mm256_store_si256(d.cast::<__m256i>(), a);
            _mm256_store_si256(d.add(32).cast::<__m256i>(), b);
            _mm256_store_si256(d.add(64).cast::<__m256i>(), c);
            _mm256_store_si256(d.add(96).cast::<__m256i>(), e);
            d = d.add(128);
            s = s.add(128);
        }
        for (k, v) in last.iter().enumerate() {
            _mm256_storeu_si256(dst.add(n - 128 + 32 * k).cast::<__m256i>(), *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 + seed * 7 + 1) as u8).collect()
    }

    #[test]
    fn every_alignment_and_size_copies_exactly() {
        // Sizes around the vector bounds and block multiples; every source alignment
        // mod 64 against every destination alignment mod 64 at a few sizes. Guard bytes
        // around the destination must survive.
        let sizes = [
            0,
            1,
            31,
            255,
            256,
            2047,
            2048,
            2049,
            2111,
            4096,
            4097,
            8191,
            65536 + 77,
            300_001,
            (1 << 20) - 1,
            1 << 20,
        ];
        let mut vector = 0;
        for &n in &sizes {
            let aligns: &[usize] = if n > 70_000 {
                &[0, 5, 16, 31, 32, 48]
            } else {
                &[0, 1, 7, 16, 17, 31, 32, 33, 63]
            };
            for &sa in aligns {
                for &da in aligns {
                    let src_buf = pattern(n + 64, sa + n);
                    let mut dst_buf = vec![0xeeu8; n + 192];
                    // Offsets that put the source at sa and the destination at da mod 64,
                    // with at least 64 guard bytes on each side of the destination.
                    let so = (sa + 64 - src_buf.as_ptr() as usize % 64) % 64;
                    let doff = 64 + (da + 64 - dst_buf.as_ptr() as usize % 64) % 64;
                    // SAFETY: so + n <= n + 64 and doff + n <= n + 128: inside the buffers.
                    let (s, d) =
                        unsafe { (src_buf.as_ptr().add(so), dst_buf.as_mut_ptr().add(doff)) };
                    if takes_vector_loop(d, s, n) {
                        vector += 1;
                    }
                    // SAFETY: in bounds (above); the buffers are disjoint.
                    unsafe { copy_bytes(s, d, n) };
                    assert_eq!(
                        &dst_buf[doff..doff + n],
                        &src_buf[so..so + n],
                        "n {n} src {sa} dst {da}"
                    );
                    assert!(
                        dst_buf[..doff].iter().all(|&b| b == 0xee),
                        "n {n}: bytes before dst"
                    );
                    assert!(
                        dst_buf[doff + n..].iter().all(|&b| b == 0xee),
                        "n {n}: bytes after dst"
                    );
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            assert!(vector > 50, "the vector loop ran {vector} times");
        }
        let _ = vector;
    }

    #[test]
    fn overlapping_ranges_move_like_memmove() {
        for n in [2048usize, 5000, 70_000] {
            for shift in [1usize, 16, 31, 64] {
                let orig = pattern(n + shift, shift);
                let mut fwd = orig.clone();
                let p = fwd.as_mut_ptr();
                // SAFETY: both ranges inside fwd; overlap allowed.
                unsafe { copy_bytes(p, p.add(shift), n) };
                assert_eq!(&fwd[shift..], &orig[..n]);
                let mut back = orig.clone();
                let p = back.as_mut_ptr();
                // SAFETY: as above.
                unsafe { copy_bytes(p.add(shift), p, n) };
                assert_eq!(&back[..n], &orig[shift..]);
                assert!(!takes_vector_loop(p, p.wrapping_add(shift), n));
            }
        }
    }

    #[test]
    fn only_the_slow_residues_take_the_vector_loop() {
        let base = 0x1000_0000usize;
        let at =
            |d: usize, s: usize, n: usize| takes_vector_loop(d as *const u8, s as *const u8, n);
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            assert!(at(base + (1 << 24) + 16, base, 65536));
            assert!(at(base + (1 << 24) + 1, base + 40, 4096 + 40));
        }
        assert!(!at(base + (1 << 24), base, 65536)); // same alignment
        assert!(!at(base + (1 << 24) + 32, base, 65536)); // residue 32
        assert!(!at(base + (1 << 24) + 48, base, 65536)); // residue 48
        assert!(!at(base + (1 << 24) + 16, base, 2047)); // too small
        assert!(!at(base + (1 << 24) + 16, base, 1 << 20)); // memmove's again
    }
}
