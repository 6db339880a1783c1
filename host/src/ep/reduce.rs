//! Combine's inner loops: `acc += w * row` over bf16 rows in f32 (a multiply, then an add:
//! no FMA, so every build and CPU gives the same bits), and the final rounding to bf16
//! (round to nearest even, NaN kept quiet: `half`'s `bf16::from_f32`, bit for bit).
//! With AVX2 present the same code is compiled for it (chosen at run time).

use half::bf16;

/// `acc[i] += w * row[i]` (row holds bf16 bits).
#[cfg(test)]
pub fn accumulate(acc: &mut [f32], row: &[u16], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { accumulate_avx2(acc, row, w) };
    }
    accumulate_generic(acc, row, w)
}

#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2")]
unsafe fn accumulate_avx2(acc: &mut [f32], row: &[u16], w: f32) {
    accumulate_generic(acc, row, w)
}

#[inline(always)]
fn accumulate_generic(acc: &mut [f32], row: &[u16], w: f32) {
    for (a, &b) in acc.iter_mut().zip(row) {
        // bf16 -> f32 is exact: the bits shifted into the high half.
        *a += w * f32::from_bits((b as u32) << 16);
    }
}

/// `out[i] = bf16(sum over k in order of w[k] * rows[k][i])`, the sum in f32 starting at
/// 0.0 with a multiply then an add per term: bit for bit what [`accumulate`] over the rows
/// in order followed by [`round_to_bf16`] gives, but in one pass over the output (a block
/// of 64 lanes is summed over every row before moving on), so the f32 accumulator never
/// leaves registers / L1. `rows` and `w` have the same length; every row is `out.len()` long.
pub fn weighted_sum_to_bf16(out: &mut [bf16], rows: &[&[u16]], w: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { weighted_sum_avx2(out, rows, w) };
    }
    weighted_sum_generic(out, rows, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weighted_sum_avx2(out: &mut [bf16], rows: &[&[u16]], w: &[f32]) {
    weighted_sum_generic(out, rows, w)
}

#[inline(always)]
fn weighted_sum_generic(out: &mut [bf16], rows: &[&[u16]], w: &[f32]) {
    const B: usize = 64;
    assert_eq!(
        rows.len(),
        w.len(),
        "weighted_sum_to_bf16: rows and weights differ in count"
    );
    let n = out.len();
    assert!(
        rows.iter().all(|r| r.len() == n),
        "weighted_sum_to_bf16: row length differs from out"
    );
    let mut start = 0;
    while start < n {
        let len = B.min(n - start);
        let mut acc = [0f32; B];
        for (row, &wk) in rows.iter().zip(w) {
            accumulate_generic(&mut acc[..len], &row[start..start + len], wk);
        }
        round_generic(&mut out[start..start + len], &acc[..len]);
        start += len;
    }
}

/// `out[i] = bf16(acc[i])`, exactly as `bf16::from_f32`.
#[cfg(test)]
pub fn round_to_bf16(out: &mut [bf16], acc: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { round_avx2(out, acc) };
    }
    round_generic(out, acc)
}

#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2")]
unsafe fn round_avx2(out: &mut [bf16], acc: &[f32]) {
    round_generic(out, acc)
}

#[inline(always)]
fn round_generic(out: &mut [bf16], acc: &[f32]) {
    for (o, a) in out.iter_mut().zip(acc) {
        *o = bf16::from_bits(f32_to_bf16_bits(*a));
    }
}

/// `half`'s f32 -> bf16 without branches: NaN -> high half with the quiet bit set;
/// otherwise round to nearest, ties to even.
#[inline(always)]
fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let nan = (x >> 16) | 0x40;
    let up = (x & 0x8000 != 0 && x & 0x1_7fff != 0) as u32;
    let rounded = (x >> 16) + up;
    (if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// Copies `bytes` from `src` to `dst` with non-temporal (streaming) stores: the
/// destination lines are written without being read first and without displacing this
/// core's cache (combine's rows go to another PE, which reads them once). Bytes before the
/// first 16-byte boundary of `dst` and after the last one are copied with plain stores.
///
/// The stores are weakly ordered: call [`store_fence`] before publishing them (a flag).
///
/// # Safety
/// `src` valid for `bytes` reads, `dst` for `bytes` writes, the two ranges disjoint.
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = dst.align_offset(16).min(bytes);
        let blocks = (bytes - head) / 16;
        // SAFETY (whole block): every access is inside the caller's two ranges
        // (head + 16 * blocks <= bytes); the streaming stores' addresses are 16-aligned
        // (dst + head is); SSE2 is part of x86_64.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            for i in 0..blocks {
                let at = head + i * 16;
                let v = _mm_loadu_si128(src.add(at).cast::<__m128i>());
                _mm_stream_si128(dst.add(at).cast::<__m128i>(), v);
            }
            let done = head + blocks * 16;
            std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), bytes - done);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's guarantee.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, bytes)
    };
}

/// Orders every earlier [`copy_streaming`] store before any later store (x86 `sfence`;
/// a release fence elsewhere).
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions (SSE, part of x86_64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_half_bf16_from_f32() {
        let mut b = 0u32;
        loop {
            let v = f32::from_bits(b);
            assert_eq!(f32_to_bf16_bits(v), bf16::from_f32(v).to_bits(), "{b:#x}");
            match b.checked_add(997) {
                Some(n) => b = n,
                None => break,
            }
        }
        for b in [
            0x7f80_0000u32,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0x7f7f_ffff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0,
        ] {
            let v = f32::from_bits(b);
            assert_eq!(f32_to_bf16_bits(v), bf16::from_f32(v).to_bits(), "{b:#x}");
        }
        let acc: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1.37e-3).collect();
        let mut out = vec![bf16::ZERO; 1000];
        round_to_bf16(&mut out, &acc);
        for (o, a) in out.iter().zip(&acc) {
            assert_eq!(o.to_bits(), bf16::from_f32(*a).to_bits());
        }
    }

    #[test]
    fn copy_streaming_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..17 {
            for len in [0usize, 1, 15, 16, 17, 31, 64, 100, 255] {
                let mut dst = vec![0xeeu8; 300 + 32];
                // SAFETY: both ranges in bounds (off + len <= 17 + 255 < 332), disjoint.
                unsafe { copy_streaming(dst.as_mut_ptr().add(off), src.as_ptr().add(3), len) };
                store_fence();
                assert!(
                    dst[..off].iter().all(|&b| b == 0xee),
                    "off {off} len {len}: head"
                );
                assert_eq!(
                    &dst[off..off + len],
                    &src[3..3 + len],
                    "off {off} len {len}"
                );
                assert!(
                    dst[off + len..].iter().all(|&b| b == 0xee),
                    "off {off} len {len}: tail"
                );
            }
        }
    }

    #[test]
    fn weighted_sum_matches_accumulate_then_round() {
        for (n, k) in [
            (7168usize, 8usize),
            (100, 1),
            (130, 11),
            (64, 3),
            (0, 2),
            (5, 0),
        ] {
            let rows: Vec<Vec<u16>> = (0..k)
                .map(|r| {
                    (0..n)
                        .map(|i| {
                            bf16::from_f32(((i * 31 + r * 17) % 997) as f32 * 0.0131 - 6.5)
                                .to_bits()
                        })
                        .collect()
                })
                .collect();
            let w: Vec<f32> = (0..k).map(|r| 0.07 + r as f32 * 0.113).collect();
            let mut acc = vec![0f32; n];
            for (row, &wk) in rows.iter().zip(&w) {
                accumulate(&mut acc, row, wk);
            }
            let mut want = vec![bf16::ZERO; n];
            round_to_bf16(&mut want, &acc);
            let refs: Vec<&[u16]> = rows.iter().map(|r| r.as_slice()).collect();
            let mut got = vec![bf16::from_f32(1.0); n];
            weighted_sum_to_bf16(&mut got, &refs, &w);
            assert_eq!(
                got.iter().map(|b| b.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|b| b.to_bits()).collect::<Vec<_>>(),
                "n={n} k={k}"
            );
        }
    }

    #[test]
    fn accumulate_is_mul_then_add() {
        let row: Vec<u16> = (0..1000u32)
            .map(|i| bf16::from_f32(i as f32 * 0.013 - 3.0).to_bits())
            .collect();
        let mut acc: Vec<f32> = (0..1000).map(|i| i as f32 * 0.7).collect();
        let want: Vec<f32> = acc
            .iter()
            .zip(&row)
            .map(|(a, &b)| a + 0.37f32 * bf16::from_bits(b).to_f32())
            .collect();
        accumulate(&mut acc, &row, 0.37);
        for (a, w) in acc.iter().zip(&want) {
            assert_eq!(a.to_bits(), w.to_bits());
        }
    }
}
