//! The FP8 e4m3 cast against an independent brute-force quantiser: every bf16 input
//! (65536 bit patterns) times a few scales, nearest of the 254 finite e4m3 values with
//! ties to the even code, saturating at ±448, NaN → 0x7f.
use rshmem::ep::{bf16, fp8};

/// Value of an e4m3 code, decoded from the format's definition (f64, no shared code).
fn decode(code: u8) -> Option<f64> {
    let (s, e, m) = ((code >> 7) & 1, (code >> 3) & 0xf, code & 7);
    if e == 0xf && m == 7 {
        return None; // NaN
    }
    let mag = if e == 0 {
        m as f64 / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
    };
    Some(if s == 1 { -mag } else { mag })
}

fn reference(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = (x as f64).abs().min(448.0);
    let mut best = 0u8;
    let mut best_d = f64::INFINITY;
    for code in 0u8..0x7f {
        let d = (decode(code).unwrap() - a).abs();
        if d < best_d || (d == best_d && code & 1 == 0 && best & 1 == 1) {
            best = code;
            best_d = d;
        }
    }
    sign | best
}

#[test]
fn e4m3_cast_matches_brute_force_over_all_bf16_inputs() {
    // Scales: identity, typical amax/448 inverses, a power of two, one that pushes values
    // into the subnormal range and one that saturates most of them.
    let scales = [1.0f32, 448.0 / 3.0, 0.0625, 3.5, 1e-3, 1e4];
    let mut checked = 0u64;
    for &s in &scales {
        for bits in 0..=u16::MAX {
            let x = bf16::from_bits(bits).to_f32() * s;
            let (got, want) = (fp8::f32_to_e4m3(x), reference(x));
            assert_eq!(
                got, want,
                "bf16 {bits:#06x} * {s} = {x:e}: got {got:#04x}, want {want:#04x}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 6 * 65536);
}

#[test]
fn e4m3_decode_matches_definition() {
    for code in 0..=255u8 {
        match decode(code) {
            None => assert!(fp8::e4m3_to_f32(code).is_nan()),
            Some(v) => assert_eq!(fp8::e4m3_to_f32(code) as f64, v, "code {code:#04x}"),
        }
    }
}

#[test]
fn group_scales_are_amax_over_448_and_round_up_to_powers_of_two() {
    let mut row = vec![bf16::from_f32(1.0); 384];
    row[5] = bf16::from_f32(-7.0); // group 0 amax 7
    row[200] = bf16::from_f32(300.0); // group 1 amax 300
    row[300] = bf16::from_f32(3.0); // group 2 amax 3
    let (mut q, mut s) = (vec![0u8; 384], vec![0f32; 3]);
    fp8::quantize_row(&row, false, &mut q, &mut s);
    // DeepEP's scale_inv: amax * (1/448 in f32), not amax / 448, which differs in the
    // last bit for amax 3.
    let inv = 1.0f32 / 448.0;
    assert_eq!(s, vec![7.0 * inv, 300.0 * inv, 3.0 * inv]);
    assert_eq!(s[2].to_bits(), 0x3bdb_6db8);
    assert_ne!(s[2], 3.0f32 / 448.0);
    assert_eq!(q[5], 0xfe); // -7 * 448/7 = -448
    fp8::quantize_row(&row, true, &mut q, &mut s);
    // 7/448 = 2^-6 exactly; 300/448 -> 1; 3/448 -> 2^-7
    assert_eq!(s, vec![2f32.powi(-6), 1.0, 2f32.powi(-7)]);
}

/// quantize_row (the vectorised path this CPU takes) against a scalar quantiser built from
/// the definitions: amax over each group ignoring NaN (±inf count), `scale = 448 / amax`
/// (amax floored at 1e-4), every code the brute-force `reference` of `x * scale`. Rows of
/// random bf16 bit patterns with NaN, ±inf, ±0 and subnormals planted, the group maximum
/// placed in every one of the 128 positions (the vector code splits a group into lanes).
#[test]
fn quantize_row_matches_a_scalar_quantiser() {
    let h = 7168;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -3e-39,
    ];
    for round_scale in [false, true] {
        for trial in 0..12 {
            let mut row: Vec<bf16> = (0..h)
                .map(|_| {
                    // Finite values with exponents in roughly 2^-20 .. 2^12.
                    let v = next();
                    let e = (v % 33) as i32 - 20;
                    let m = ((v >> 8) % 1000) as f32 / 1000.0 + 1.0;
                    let s = if (v >> 20) & 1 == 1 { -1.0 } else { 1.0 };
                    bf16::from_f32(s * m * 2f32.powi(e))
                })
                .collect();
            for g in 0..h / 128 {
                // The group's largest finite magnitude at position (g + trial) % 128.
                let at = g * 128 + (g * 7 + trial) % 128;
                row[at] = bf16::from_f32(if g % 2 == 0 { 9000.0 } else { -9000.0 });
                // A special value somewhere else in half of the groups.
                if g % 2 == 1 {
                    let sp = specials[(g / 2 + trial) % specials.len()];
                    row[g * 128 + (at + 61) % 128] = bf16::from_f32(sp);
                }
            }
            let (mut q, mut s) = (vec![0u8; h], vec![0f32; h / 128]);
            fp8::quantize_row(&row, round_scale, &mut q, &mut s);
            for g in 0..h / 128 {
                let xs = &row[g * 128..(g + 1) * 128];
                let amax = xs
                    .iter()
                    .map(|v| v.to_f32().abs())
                    .filter(|a| !a.is_nan())
                    .fold(0f32, f32::max);
                let (scale, inv) = fp8::group_scale(amax, round_scale);
                assert_eq!(s[g], inv, "trial {trial}, group {g}: scale_inv");
                for (i, v) in xs.iter().enumerate() {
                    let want = reference(v.to_f32() * scale);
                    assert_eq!(
                        q[g * 128 + i],
                        want,
                        "trial {trial}, group {g}, element {i}: x = {v}, scale {scale}"
                    );
                }
            }
        }
    }
}
