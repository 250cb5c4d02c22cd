// Float to half float, exactly as the CPU's KV cache rounds (model.rs, `to_half`): to
// nearest even, saturated at ±65504, NaN kept. The conversion is done on the bits, as
// WGSL leaves the rounding of pack2x16float to the implementation and makes it
// indeterminate past 65504. Prepended to attention.wgsl.

// The binary16 bits of x.
fn half_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    // 65504 and beyond (infinity included): the largest finite half.
    if a >= 0x477fe000u {
        return sign | 0x7bffu;
    }
    // Normal halves: rebias the exponent, round the 13 bits dropped to nearest even.
    if a >= 0x38800000u {
        let m = a - 0x38000000u;
        return sign | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
    }
    // 2^-25 or less rounds to zero (the tie included, zero being even).
    if a <= 0x33000000u {
        return sign;
    }
    // Subnormal halves: units of 2^-24, from the 24-bit significand.
    let sig = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - (a >> 23u);
    let q = sig >> shift;
    let rest = sig & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let up = rest > half || (rest == half && (q & 1u) == 1u);
    return sign | (q + select(0u, 1u, up));
}

// The half floats of a and b, two to a word (a in the low half), as the cache holds
// them.
fn half_pair(a: f32, b: f32) -> u32 {
    return half_bits(a) | (half_bits(b) << 16u);
}
