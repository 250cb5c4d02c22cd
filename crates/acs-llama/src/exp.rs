//! `e^x` as straight-line arithmetic, which the compiler vectorises in the loops of
//! the forward pass (SiLU, attention's softmax) and of sampling, where libm's `expf`
//! is a call per value.

/// `e^x` within 2 ulp of libm's `expf` for `x` in [-87, 88]. Below -87 (where `e^x`
/// leaves the normal floats), and for -inf and NaN, it gives 0; above 88 it gives
/// `e^88` (about 1.65e38), which the forward pass only ever divides by.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // x = n ln 2 + r with |r| ≤ ln 2 / 2; e^x = 2^n e^r. Adding 1.5 * 2^23 rounds
    // x log2(e) to the integer n in the low mantissa bits; ln 2 is split in two so
    // that n ln 2 is subtracted without rounding error (Cody and Waite).
    const SHIFT: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let in_range = x > -87.0;
    let xc = if in_range { x.min(88.0) } else { -87.0 };
    let t = xc * std::f32::consts::LOG2_E + SHIFT;
    let n = t - SHIFT;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // e^r by its Taylor series to r^7: the error term is under 1e-8 on |r| ≤ 0.35.
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    let two_n = f32::from_bits(((t.to_bits() as i32 - SHIFT.to_bits() as i32 + 127) << 23) as u32);
    if in_range { p * two_n } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::exp;

    #[test]
    fn within_two_ulp_of_libm() {
        let mut x = 88.0f32;
        while x > -87.0 {
            let (got, want) = (exp(x), x.exp());
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "e^{x}: {got} vs {want} ({ulps} ulp)");
            x -= 0.000_731;
        }
        for x in [-87.5, -1e30, f32::NEG_INFINITY, f32::NAN] {
            assert_eq!(exp(x), 0.0, "e^{x}");
        }
        assert_eq!(exp(1e30), exp(88.0));
        assert_eq!(exp(f32::INFINITY), exp(88.0));
    }
}
