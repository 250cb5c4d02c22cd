// Stores one sequence's new keys and values (in the step's rows of QKV: queries, keys,
// values side by side, `stride` floats a row) in its cache as half floats, two to a word (the lower index in the low half), rounded exactly as the CPU
// cache rounds them (model.rs, `to_half`): to nearest even, saturated at ±65504, NaN
// kept. The conversion is done on the bits, as WGSL leaves the rounding of
// pack2x16float to the implementation and makes it indeterminate past 65504.

struct Params {
    row0: u32,
    pos0: u32,
    words: u32,
    kv: u32,
    stride: u32,
    // Where a row's keys start (its values follow them).
    k_at: u32,
}

@group(0) @binding(0) var<storage, read> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> CK: array<u32>;
@group(0) @binding(2) var<storage, read_write> CV: array<u32>;
@group(0) @binding(3) var<uniform> P: Params;

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

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i >= P.words {
        return;
    }
    // kv is even, so a word's pair never straddles rows.
    let row = 2u * i / P.kv;
    let k = (P.row0 + row) * P.stride + P.k_at + 2u * i % P.kv;
    let v = k + P.kv;
    let dst = P.pos0 * P.kv / 2u + i;
    CK[dst] = half_bits(QKV[k]) | (half_bits(QKV[k + 1u]) << 16u);
    CV[dst] = half_bits(QKV[v]) | (half_bits(QKV[v + 1u]) << 16u);
}
