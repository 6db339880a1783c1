//! Combine's inner loops: `acc += w * row` over bf16 rows in f32 (a multiply, then an add:
//! no FMA, so every build and CPU gives the same bits), and the final rounding to bf16
//! (round to nearest even, NaN kept quiet: `half`'s `bf16::from_f32`, bit for bit).
//! With AVX2 present the same code is compiled for it (chosen at run time).

use half::bf16;

/// `acc[i] += w * row[i]` (row holds bf16 bits).
pub fn accumulate(acc: &mut [f32], row: &[u16], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { accumulate_avx2(acc, row, w) };
    }
    accumulate_generic(acc, row, w)
}

#[cfg(target_arch = "x86_64")]
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

/// `out[i] = bf16(acc[i])`, exactly as `bf16::from_f32`.
pub fn round_to_bf16(out: &mut [bf16], acc: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { round_avx2(out, acc) };
    }
    round_generic(out, acc)
}

#[cfg(target_arch = "x86_64")]
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
