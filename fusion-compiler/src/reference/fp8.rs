//! FP8 E4M3 on the host: the encoding, the rounding from wider values, and
//! scales (dequantize, quantize), as the reference computes FP8 graphs.
//!
//! E4M3 (the "FN" variant of the OCP FP8 formats, which NVIDIA's FP8
//! tensor cores read): 1 sign bit, 4 exponent bits with bias 7, 3 mantissa
//! bits. Exponent field 0 holds subnormals (m·2⁻⁹, the smallest 2⁻⁹); there
//! are no infinities, and S.1111.111 is NaN, so the largest finite value is
//! S.1111.110 = ±448.
//!
//! Conversion from a wider value rounds to nearest, ties to even, and
//! saturates: every value beyond ±448, infinities included, becomes ±448
//! (CUDA's `__NV_SATFINITE` conversion does the same). NaN becomes NaN,
//! 0x7F whatever its sign. Rounding goes straight from f64, so a value that
//! came from f32, f16 or bf16 (exact in f64) is rounded once.

/// The largest finite E4M3 value.
pub const E4M3_MAX: f64 = 448.0;

/// The smallest positive E4M3 value, a subnormal: 2⁻⁹.
pub const E4M3_MIN_POSITIVE: f64 = 1.0 / 512.0;

/// The smallest positive normal E4M3 value: 2⁻⁶.
const E4M3_MIN_NORMAL_EXP: i32 = -6;

/// The code that conversions give NaN.
pub const E4M3_NAN: u8 = 0x7F;

/// The value an E4M3 code holds (NaN for S.1111.111).
pub fn e4m3_to_f64(code: u8) -> f64 {
    let sign = if code & 0x80 == 0 { 1.0 } else { -1.0 };
    let exponent = i32::from((code >> 3) & 0xF);
    let mantissa = f64::from(code & 0x7);
    match exponent {
        0xF if mantissa == 7.0 => f64::NAN,
        0 => sign * mantissa * E4M3_MIN_POSITIVE,
        _ => sign * (8.0 + mantissa) * 2f64.powi(exponent - 7 - 3),
    }
}

/// `v` rounded to the nearest E4M3 value (ties to even), saturating to
/// ±448; NaN gives [`E4M3_NAN`].
pub fn e4m3_from_f64(v: f64) -> u8 {
    if v.is_nan() {
        return E4M3_NAN;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let magnitude = v.abs();
    if magnitude >= E4M3_MAX {
        return sign | 0x7E;
    }
    // The spacing of E4M3 values around `magnitude`: 2^(e-3) for a normal
    // value in [2^e, 2^(e+1)), 2⁻⁹ below the normals. Dividing by a power of
    // two is exact, so the rounding below is the only one.
    let exponent = f64_exponent(magnitude).max(E4M3_MIN_NORMAL_EXP);
    let step = 2f64.powi(exponent - 3);
    let steps = (magnitude / step).round_ties_even();
    let rounded = steps * step;
    if rounded == 0.0 {
        return sign;
    }
    // Rounding up may reach the next power of two: encode what it reached.
    let exponent = f64_exponent(rounded);
    if exponent < E4M3_MIN_NORMAL_EXP {
        return sign | (rounded / E4M3_MIN_POSITIVE) as u8;
    }
    let mantissa = (rounded / 2f64.powi(exponent - 3)) as u8 - 8;
    sign | (((exponent + 7) as u8) << 3) | mantissa
}

/// ⌊log₂ v⌋ of a positive finite v (the exponent field of its f64, which
/// is exact where `log2` need not be); below f64's normals, its smallest
/// normal exponent, which is far below E4M3's.
fn f64_exponent(v: f64) -> i32 {
    ((v.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

/// `v` rounded to E4M3 and widened back: the value an FP8 tensor stores.
pub fn round_to_e4m3(v: f64) -> f64 {
    e4m3_to_f64(e4m3_from_f64(v))
}

/// The value an FP8 tensor means: its stored value times its scale.
pub fn dequantize(stored: f64, scale: f64) -> f64 {
    stored * scale
}

/// The E4M3 code that stores `v` under `scale`: `v / scale`, rounded to
/// nearest even and saturated to ±448, as a kernel quantizes an output for
/// the next FP8 GEMM.
pub fn quantize(v: f64, scale: f64) -> u8 {
    e4m3_from_f64(v / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        let mut finite = 0;
        for code in 0..=255u8 {
            let v = e4m3_to_f64(code);
            if code & 0x7F == 0x7F {
                assert!(v.is_nan(), "{code:#04x}");
                assert_eq!(e4m3_from_f64(v), E4M3_NAN);
                continue;
            }
            finite += 1;
            // -0 keeps its sign: 0x80 comes back as 0x80.
            assert_eq!(e4m3_from_f64(v), code, "{code:#04x} holds {v}");
            assert_eq!(v.is_sign_negative(), code & 0x80 != 0, "{code:#04x}");
            assert!(v.abs() <= E4M3_MAX);
        }
        assert_eq!(finite, 254, "two NaNs, no infinities");
        // Codes in order are values in order (for each sign).
        let positives: Vec<f64> = (0..0x7Fu8).map(e4m3_to_f64).collect();
        assert!(positives.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn known_codes_hold_known_values() {
        let cases = [
            (0x00, 0.0),
            (0x01, 2f64.powi(-9)),
            (0x07, 7.0 * 2f64.powi(-9)),
            (0x08, 2f64.powi(-6)),
            (0x38, 1.0),
            (0x39, 1.125),
            (0x40, 2.0),
            (0x7E, 448.0),
            (0xFE, -448.0),
            (0xB8, -1.0),
        ];
        for (code, value) in cases {
            assert_eq!(e4m3_to_f64(code), value, "{code:#04x}");
            assert_eq!(e4m3_from_f64(value), code, "{value}");
        }
        assert_eq!(E4M3_MIN_POSITIVE, 2f64.powi(-9));
    }

    #[test]
    fn ties_go_to_the_even_mantissa_at_every_exponent() {
        // Between two neighbours a and b (a's mantissa even), the midpoint
        // goes to a, and just above it to b; between b and the next, c, the
        // midpoint goes to c (even again).
        for exponent in [-9, -8, -6, -3, 0, 1, 4, 7] {
            let step = 2f64.powi(exponent.max(-6) - 3);
            let a = if exponent < -6 {
                2f64.powi(exponent + 1)
            } else {
                2f64.powi(exponent)
            };
            let (b, c) = (a + step, a + 2.0 * step);
            assert_eq!(e4m3_from_f64(a) & 1, 0, "{a} has an even code");
            assert_eq!(round_to_e4m3(a + step / 2.0), a, "tie above {a}");
            assert_eq!(round_to_e4m3(b + step / 2.0), c, "tie above {b}");
            assert_eq!(round_to_e4m3(a + step / 2.0 + step / 64.0), b);
            assert_eq!(round_to_e4m3(-(a + step / 2.0)), -a, "negative ties too");
        }
        // At the top of a binade a tie rounds up into the next one: 15.5 is
        // halfway between 15 (mantissa 7, odd) and 16.
        assert_eq!(round_to_e4m3(15.5), 16.0);
        assert_eq!(e4m3_from_f64(15.5), 0x58);
    }

    #[test]
    fn values_past_448_saturate() {
        for v in [448.0, 449.0, 463.9, 464.0, 480.0, 1e6, f64::MAX, f64::INFINITY] {
            assert_eq!(e4m3_from_f64(v), 0x7E, "{v}");
            assert_eq!(e4m3_from_f64(-v), 0xFE, "-{v}");
        }
        // Below 448 it rounds as usual: 416 is 448's neighbour, 432 a tie
        // that goes to 448 (mantissa 6, even, where 416's is 5).
        assert_eq!(round_to_e4m3(416.0), 416.0);
        assert_eq!(round_to_e4m3(432.0), 448.0);
        assert_eq!(round_to_e4m3(431.9), 416.0);
    }

    #[test]
    fn subnormals_and_underflow() {
        let smallest = 2f64.powi(-9);
        for m in 1..8 {
            let v = f64::from(m) * smallest;
            assert_eq!(e4m3_from_f64(v), m as u8, "{v}");
        }
        // Half the smallest is a tie between 0 (even) and 2⁻⁹.
        assert_eq!(round_to_e4m3(smallest / 2.0), 0.0);
        assert_eq!(round_to_e4m3(smallest * 0.5001), smallest);
        // 1.5·2⁻⁹ ties to 2·2⁻⁹; 7.5·2⁻⁹ ties up into the normals, 2⁻⁶.
        assert_eq!(round_to_e4m3(1.5 * smallest), 2.0 * smallest);
        assert_eq!(round_to_e4m3(7.5 * smallest), 2f64.powi(-6));
        assert_eq!(e4m3_from_f64(7.5 * smallest), 0x08);
        // Far below: zero, with its sign; f64's own subnormals too.
        assert_eq!(e4m3_from_f64(1e-10), 0x00);
        assert_eq!(e4m3_from_f64(-1e-10), 0x80);
        assert_eq!(e4m3_from_f64(f64::MIN_POSITIVE / 4.0), 0x00);
        assert_eq!(e4m3_from_f64(-0.0), 0x80);
    }

    #[test]
    fn nan_becomes_the_positive_nan_code() {
        assert_eq!(e4m3_from_f64(f64::NAN), E4M3_NAN);
        assert_eq!(e4m3_from_f64(-f64::NAN), E4M3_NAN);
        assert!(e4m3_to_f64(0x7F).is_nan());
        assert!(e4m3_to_f64(0xFF).is_nan());
        assert!(round_to_e4m3(f64::NAN).is_nan());
    }

    #[test]
    fn scales_multiply_stored_values_and_divide_quantized_ones() {
        assert_eq!(dequantize(3.0, 0.5), 1.5);
        // 1.5 under scale 0.5 is 3.0, held exactly.
        assert_eq!(quantize(1.5, 0.5), e4m3_from_f64(3.0));
        // 1000 under scale 2 is 500: saturates to 448.
        assert_eq!(quantize(1000.0, 2.0), 0x7E);
        // 7.75 / 0.25 = 31, a tie between 30 (mantissa 7) and 32 (the next
        // binade's mantissa 0): 32.
        assert_eq!(e4m3_to_f64(quantize(7.75, 0.25)), 32.0);
        // A quantized value comes back within half a step of its value.
        for v in [0.001, 0.37, 1.0, 3.3] {
            let scale = 0.0625;
            let back = dequantize(e4m3_to_f64(quantize(v, scale)), scale);
            let step = 2f64.powi(f64_exponent(v / scale).max(E4M3_MIN_NORMAL_EXP) - 3) * scale;
            assert!((back - v).abs() <= step / 2.0, "{v} came back as {back}");
        }
    }
}
