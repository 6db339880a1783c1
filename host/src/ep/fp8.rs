//! FP8 E4M3 (OCP "e4m3fn": bias 7, max 448, no infinities, NaN = 0x7f/0xff) and the
//! per-128-channel quantisation of dispatch.
//!
//! The cast rounds to nearest, ties to even, and saturates to ±448 (CUDA's
//! `__NV_SATFINITE`), so ±inf become ±448 and NaN becomes 0x7f. It is checked against an
//! independent brute-force quantiser over every bf16 input (tests/ep_fp8.rs).

/// Largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;
/// Channels that share one scale.
pub const GROUP: usize = 128;
/// Floor of a group's amax, so an all-zero group gets a finite scale (DeepEP's margin).
pub const AMAX_FLOOR: f32 = 1e-4;

/// Rounds `x` to the nearest e4m3 value (ties to even), saturating to ±448.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal range: multiples of 2^-9 (the multiply by 2^9 is exact).
        let m = (a * 512.0).round_ties_even() as u8; // 0..=8; 8 is the smallest normal
        return sign | m;
    }
    let abits = a.to_bits();
    let exp = ((abits >> 23) & 0xff) as i32 - 127; // -6..=8
    let man = abits & 0x7f_ffff;
    let mut code = (((exp + 7) as u32) << 3) | (man >> 20);
    let rem = man & 0xf_ffff;
    const HALF: u32 = 0x8_0000;
    if rem > HALF || (rem == HALF && code & 1 == 1) {
        code += 1; // a carry into the exponent is the correct next value
    }
    sign | code.min(0x7e) as u8
}

/// The value of an e4m3 code (NaN for 0x7f and 0xff).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    if b & 0x7f == 0x7f {
        return f32::NAN;
    }
    if e == 0 {
        sign * m * (1.0 / 512.0)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// `1/448` rounded to f32, as DeepEP's `kFP8AmaxInv`.
pub const E4M3_MAX_INV: f32 = 1.0 / 448.0;

/// Scale of one 128-channel group: `(scale, scale_inv)` with `q = e4m3(x * scale)` and
/// `x ≈ q * scale_inv`. `scale = 448 / amax` and `scale_inv = amax * (1/448)`, DeepEP's
/// formulas bit for bit (`amax / 448` differs from it in the last bit for about a third
/// of bf16 amax values); with `round_scale`, `scale_inv` is `amax * (1/448)` rounded up
/// to a power of two (so `scale` is exact too).
pub fn group_scale(amax: f32, round_scale: bool) -> (f32, f32) {
    let amax = amax.max(AMAX_FLOOR);
    if round_scale {
        let inv = (amax * E4M3_MAX_INV).log2().ceil().exp2();
        (1.0 / inv, inv)
    } else {
        (E4M3_MAX / amax, amax * E4M3_MAX_INV)
    }
}

/// [`f32_to_e4m3`] without branches, bit for bit the same result (tested on every bf16
/// input times several scales and on a sweep of f32 bit patterns): the form the
/// quantisation loop uses, so that the compiler vectorises it.
#[inline(always)]
pub fn f32_to_e4m3_branchless(x: f32) -> u8 {
    let bits = x.to_bits();
    let abits = bits & 0x7fff_ffff;
    let sign = (bits >> 24) & 0x80;
    // Normal range: drop 20 mantissa bits rounding to nearest even, then rebias 127 -> 7.
    let rounded = abits.wrapping_add(0x7_ffff + ((abits >> 20) & 1)) >> 20;
    let normal = rounded.wrapping_sub(120 << 3).min(0x7e);
    // Subnormal range (|x| < 2^-6): multiples of 2^-9; adding 2^23 rounds a*512 to the
    // nearest even integer, which then sits in the low mantissa bits.
    let a = f32::from_bits(abits);
    let sub = (a * 512.0 + 8_388_608.0)
        .to_bits()
        .wrapping_sub(0x4b00_0000);
    let code = if abits < 0x3c80_0000 { sub } else { normal }; // 0x3c80_0000 = 2^-6
    let code = if abits > 0x7f80_0000 {
        0x7f
    } else {
        sign | code
    }; // NaN -> 0x7f
    code as u8
}

/// Quantises one row of `H` bf16 values: `q` gets H e4m3 bytes, `scales` H/128 values
/// of `scale_inv`. `H` must be a multiple of 128.
pub fn quantize_row(x: &[half::bf16], round_scale: bool, q: &mut [u8], scales: &mut [f32]) {
    debug_assert!(x.len() % GROUP == 0 && q.len() == x.len() && scales.len() == x.len() / GROUP);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU supports AVX-512 F and BW (BW implies F; checked just above).
        return unsafe { quantize_row_avx512(x, round_scale, q, scales) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { quantize_row_avx2(x, round_scale, q, scales) };
    }
    quantize_row_generic(x, round_scale, q, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(
    x: &[half::bf16],
    round_scale: bool,
    q: &mut [u8],
    scales: &mut [f32],
) {
    quantize_row_generic(x, round_scale, q, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(x: &[half::bf16], round_scale: bool, q: &mut [u8], scales: &mut [f32]) {
    quantize_row_generic(x, round_scale, q, scales)
}

#[inline(always)]
fn quantize_row_generic(x: &[half::bf16], round_scale: bool, q: &mut [u8], scales: &mut [f32]) {
    for (g, (xs, qs)) in x
        .chunks_exact(GROUP)
        .zip(q.chunks_exact_mut(GROUP))
        .enumerate()
    {
        // amax over the group, ignoring NaN (as f32::max does): for non-NaN bf16 values
        // |x| orders as the integer `bits & 0x7fff`, which vectorises.
        // Lane-wise maxima first, then across lanes: a single running max is a serial
        // chain the compiler leaves scalar.
        let mut lanes = [0u16; 32];
        for c in xs.chunks_exact(32) {
            for (m, v) in lanes.iter_mut().zip(c) {
                let a = v.to_bits() & 0x7fff;
                *m = (*m).max(if a > 0x7f80 { 0 } else { a });
            }
        }
        let amax_bits = lanes.iter().copied().max().unwrap_or(0);
        let amax = f32::from_bits((amax_bits as u32) << 16);
        let (scale, inv) = group_scale(amax, round_scale);
        scales[g] = inv;
        for (d, v) in qs.iter_mut().zip(xs) {
            *d = f32_to_e4m3_branchless(f32::from_bits((v.to_bits() as u32) << 16) * scale);
        }
    }
}

/// Dequantises one row back to f32: `q * scale_inv` per group.
pub fn dequantize_row(q: &[u8], scales: &[f32], out: &mut [f32]) {
    for ((qs, os), &inv) in q
        .chunks_exact(GROUP)
        .zip(out.chunks_exact_mut(GROUP))
        .zip(scales)
    {
        for (o, &b) in os.iter_mut().zip(qs) {
            *o = E4M3_TABLE[b as usize] * inv;
        }
    }
}

/// Every e4m3 code's value.
pub static E4M3_TABLE: std::sync::LazyLock<[f32; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|i| e4m3_to_f32(i as u8)));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(f32_to_e4m3(448.0), 0x7e);
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xfe);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        assert_eq!(f32_to_e4m3(1.0), 0x38);
        assert_eq!(f32_to_e4m3(-0.0), 0x80);
        assert_eq!(f32_to_e4m3(2f32.powi(-9)), 0x01);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        // 1.0625 is halfway between 1.0 (even) and 1.125: ties to even.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(group_scale(127.0, true).1, 0.5);
    }

    #[test]
    fn branchless_cast_is_the_scalar_cast() {
        let scales = [
            1.0f32,
            448.0 / 3.0,
            0.0625,
            3.5,
            1e-3,
            1e4,
            7.0,
            1.0 / 448.0,
        ];
        for &s in &scales {
            for bits in 0..=u16::MAX {
                let x = f32::from_bits((bits as u32) << 16) * s;
                assert_eq!(
                    f32_to_e4m3_branchless(x),
                    f32_to_e4m3(x),
                    "{x:e} ({bits:#x} * {s})"
                );
            }
        }
        // A sweep of f32 bit patterns (every 4099th, both signs, NaNs and infinities).
        let mut b = 0u32;
        loop {
            let x = f32::from_bits(b);
            assert_eq!(f32_to_e4m3_branchless(x), f32_to_e4m3(x), "{b:#x}");
            match b.checked_add(4099) {
                Some(n) => b = n,
                None => break,
            }
        }
        for x in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            0.0,
            -0.0,
            448.0,
            464.0,
            480.0,
        ] {
            assert_eq!(f32_to_e4m3_branchless(x), f32_to_e4m3(x), "{x}");
        }
    }

    #[test]
    fn quantize_row_matches_the_scalar_definition() {
        // Every bf16 bit pattern once, in rows of 1024 (8 groups each), NaNs and infinities
        // included, then the same with round_scale.
        let all: Vec<half::bf16> = (0..=u16::MAX).map(half::bf16::from_bits).collect();
        for round_scale in [false, true] {
            for row in all.chunks_exact(1024) {
                let (mut q, mut s) = (vec![0u8; 1024], vec![0f32; 8]);
                quantize_row(row, round_scale, &mut q, &mut s);
                for (g, xs) in row.chunks_exact(GROUP).enumerate() {
                    let amax = xs.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
                    let (scale, inv) = group_scale(amax, round_scale);
                    assert_eq!(s[g].to_bits(), inv.to_bits());
                    for (c, v) in xs.iter().enumerate() {
                        assert_eq!(q[g * GROUP + c], f32_to_e4m3(v.to_f32() * scale));
                    }
                }
            }
        }
    }
}
