// Expands ggml weight blocks, 32 values at a time: the part every kernel that reads
// weights shares. The including shader declares `W: array<u32>` (the tensor's raw
// bytes as little-endian words) and the host prepends `const FORMAT: u32 = <ggml type
// id>;`, so each weight format gets its own pipeline with the other cases folded away.
// Block layouts are ggml's (see quant/formats/); every field sits at an even byte
// offset.

// The 32 values `fill` expanded last.
var<private> y: array<f32, 32>;

// The values IQ4_NL's and IQ4_XS's indices pick (ggml's kvalues_iq4nl).
var<private> IQ4: array<f32, 16> = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
);

// The 4 bytes at an even offset `o` as a little-endian word.
fn word_at(o: u32) -> u32 {
    let w = o >> 2u;
    if (o & 2u) == 0u {
        return W[w];
    }
    return (W[w] >> 16u) | (W[w + 1u] << 16u);
}

fn byte_at(o: u32) -> u32 {
    return (W[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

fn i8_at(o: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(o) << 24u) >> 24u);
}

fn f16_at(o: u32) -> f32 {
    return unpack2x16float((W[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu).x;
}

// A bfloat16 is the high half of an f32.
fn bf16_at(o: u32) -> f32 {
    return bitcast<f32>(((W[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu) << 16u);
}

// (scale, min) of sub-block `j` of the packed 12-byte Q4_K / Q5_K scales at byte `p`
// (ggml's get_scale_min_k4).
fn scale_min_k4(j: u32, p: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(byte_at(p + j) & 63u), f32(byte_at(p + j + 4u) & 63u));
    }
    let a = byte_at(p + j + 4u);
    return vec2<f32>(
        f32((a & 15u) | ((byte_at(p + j - 4u) >> 6u) << 4u)),
        f32((a >> 4u) | ((byte_at(p + j) >> 6u) << 4u)),
    );
}

// Values `j` and `16 + j` (j < 16) of a Q5_0 or Q5_1 block, 0..32: the nibbles of
// byte `j` of its quants at byte `qs`, with their fifth bits from its word `h`.
fn q5_pair(qs: u32, h: u32, j: u32) -> vec2<u32> {
    let v = byte_at(qs + j);
    return vec2<u32>(
        (v & 15u) | (((h >> j) & 1u) << 4u),
        (v >> 4u) | (((h >> (j + 16u)) & 1u) << 4u),
    );
}

// The signed 6-bit value of element `e` (0..256) of the Q6_K block at byte `b`.
fn q6k_value(b: u32, e: u32) -> f32 {
    let half = e / 128u;
    let p = e % 128u;
    let g = p / 32u;
    let l = p % 32u;
    let ql = byte_at(b + 64u * half + (g & 1u) * 32u + l);
    let qh = byte_at(b + 128u + 32u * half + l);
    let lo = (ql >> (4u * (g >> 1u))) & 15u;
    let hi = (qh >> (2u * g)) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// Expands values [32c, 32c + 32) of the row whose bytes start at `o` into `y`, with
// the same f32 operations as the CPU's `Format::dequantize`.
fn fill(o: u32, c: u32) {
    switch FORMAT {
        // F32
        case 0u: {
            let w = (o >> 2u) + 32u * c;
            for (var j = 0u; j < 32u; j++) {
                y[j] = bitcast<f32>(W[w + j]);
            }
        }
        // F16
        case 1u: {
            let b = o + 64u * c;
            for (var j = 0u; j < 32u; j++) {
                y[j] = f16_at(b + 2u * j);
            }
        }
        // BF16
        case 30u: {
            let b = o + 64u * c;
            for (var j = 0u; j < 32u; j++) {
                y[j] = bf16_at(b + 2u * j);
            }
        }
        // Q4_0
        case 2u: {
            let b = o + 18u * c;
            let d = f16_at(b);
            for (var i = 0u; i < 4u; i++) {
                let q = word_at(b + 2u + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    let v = q >> (8u * k);
                    y[4u * i + k] = d * (f32(v & 15u) - 8.0);
                    y[4u * i + k + 16u] = d * (f32((v >> 4u) & 15u) - 8.0);
                }
            }
        }
        // Q4_1
        case 3u: {
            let b = o + 20u * c;
            let d = f16_at(b);
            let m = f16_at(b + 2u);
            for (var i = 0u; i < 4u; i++) {
                let q = word_at(b + 4u + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    let v = q >> (8u * k);
                    y[4u * i + k] = d * f32(v & 15u) + m;
                    y[4u * i + k + 16u] = d * f32((v >> 4u) & 15u) + m;
                }
            }
        }
        // Q5_0: the fifth bits in the word after the scale.
        case 6u: {
            let b = o + 22u * c;
            let d = f16_at(b);
            for (var j = 0u; j < 16u; j++) {
                let q = q5_pair(b + 6u, word_at(b + 2u), j);
                y[j] = d * (f32(q.x) - 16.0);
                y[j + 16u] = d * (f32(q.y) - 16.0);
            }
        }
        // Q5_1
        case 7u: {
            let b = o + 24u * c;
            let d = f16_at(b);
            let m = f16_at(b + 2u);
            for (var j = 0u; j < 16u; j++) {
                let q = q5_pair(b + 8u, word_at(b + 4u), j);
                y[j] = d * f32(q.x) + m;
                y[j + 16u] = d * f32(q.y) + m;
            }
        }
        // Q8_0
        case 8u: {
            let b = o + 34u * c;
            let d = f16_at(b);
            for (var i = 0u; i < 8u; i++) {
                let q = word_at(b + 2u + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    y[4u * i + k] = d * f32(bitcast<i32>(q << (24u - 8u * k)) >> 24u);
                }
            }
        }
        // Q2_K: 8 sub-blocks of 32 per 256-value block; 2-bit values at bits
        // 2(s % 4) of the half's 32 bytes, scale and min per 16 in one byte.
        case 10u: {
            let b = o + 84u * (c / 8u);
            let s = c % 8u;
            let d = f16_at(b + 80u);
            let dmin = f16_at(b + 82u);
            let q = b + 16u + 32u * (s / 4u);
            let shift = 2u * (s % 4u);
            for (var l = 0u; l < 32u; l++) {
                let sm = byte_at(b + 2u * s + l / 16u);
                let v = f32((byte_at(q + l) >> shift) & 3u);
                y[l] = d * f32(sm & 15u) * v - dmin * f32(sm >> 4u);
            }
        }
        // Q3_K: Q2_K's low bits, the third bit `s` of byte `l` of `hmask` (clear:
        // minus 4), and sixteen 6-bit scales packed in 12 bytes.
        case 11u: {
            let b = o + 110u * (c / 8u);
            let s = c % 8u;
            let d = f16_at(b + 108u);
            let q = b + 32u + 32u * (s / 4u);
            let shift = 2u * (s % 4u);
            for (var l = 0u; l < 32u; l++) {
                let k = 2u * s + l / 16u;
                let low = (byte_at(b + 96u + k % 8u) >> (4u * (k / 8u))) & 15u;
                let high = (byte_at(b + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
                let sc = f32(i32(low | (high << 4u)) - 32);
                let third = (byte_at(b + l) >> s) & 1u;
                let v = i32((byte_at(q + l) >> shift) & 3u) - select(4, 0, third == 1u);
                y[l] = d * sc * f32(v);
            }
        }
        // IQ4_NL: the table's values at Q4_0's nibbles, times d.
        case 20u: {
            let b = o + 18u * c;
            let d = f16_at(b);
            for (var j = 0u; j < 16u; j++) {
                let q = byte_at(b + 2u + j);
                y[j] = d * IQ4[q & 15u];
                y[j + 16u] = d * IQ4[q >> 4u];
            }
        }
        // IQ4_XS: 8 sub-blocks of 32 per 256-value block, each IQ4_NL's nibbles times
        // d and its 6-bit scale (stored + 32).
        case 23u: {
            let b = o + 136u * (c / 8u);
            let s = c % 8u;
            let high = ((byte_at(b + 2u) | (byte_at(b + 3u) << 8u)) >> (2u * s)) & 3u;
            let low = (byte_at(b + 4u + s / 2u) >> (4u * (s % 2u))) & 15u;
            let dl = f16_at(b) * f32(i32(low | (high << 4u)) - 32);
            let q = b + 8u + 16u * s;
            for (var j = 0u; j < 16u; j++) {
                let v = byte_at(q + j);
                y[j] = dl * IQ4[v & 15u];
                y[j + 16u] = dl * IQ4[v >> 4u];
            }
        }
        // Q4_K: 8 sub-blocks of 32 per 256-value block.
        case 12u: {
            let b = o + 144u * (c / 8u);
            let s = c % 8u;
            let sm = scale_min_k4(s, b + 4u);
            let d1 = f16_at(b) * sm.x;
            let m1 = f16_at(b + 2u) * sm.y;
            let q = b + 16u + 32u * (s / 2u);
            let shift = 4u * (s % 2u);
            for (var l = 0u; l < 32u; l++) {
                y[l] = d1 * f32((byte_at(q + l) >> shift) & 15u) - m1;
            }
        }
        // Q5_K
        case 13u: {
            let b = o + 176u * (c / 8u);
            let s = c % 8u;
            let sm = scale_min_k4(s, b + 4u);
            let d1 = f16_at(b) * sm.x;
            let m1 = f16_at(b + 2u) * sm.y;
            let q = b + 48u + 32u * (s / 2u);
            let shift = 4u * (s % 2u);
            for (var l = 0u; l < 32u; l++) {
                let h = ((byte_at(b + 16u + l) >> s) & 1u) << 4u;
                y[l] = d1 * f32(((byte_at(q + l) >> shift) & 15u) | h) - m1;
            }
        }
        // Q6_K
        case 14u: {
            let b = o + 210u * (c / 8u);
            let s = c % 8u;
            let d = f16_at(b + 208u);
            for (var l = 0u; l < 32u; l++) {
                let e = 32u * s + l;
                y[l] = d * i8_at(b + 192u + e / 16u) * q6k_value(b, e);
            }
        }
        default: {}
    }
}
