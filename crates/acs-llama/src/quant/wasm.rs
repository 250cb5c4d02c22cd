//! WebAssembly SIMD128 kernels, the browser's CPU backend: the dot products of the
//! 8-, 5- and 4-bit formats, of the K-quants (Q2_K to Q6_K) and of IQ4_NL and
//! IQ4_XS with 8-bit activations, 16 lanes at a time (widened to 16 bits and multiplied pairwise into
//! 32-bit sums). Compiled in when the build enables `simd128`, as
//! `.cargo/config.toml` does for every wasm32 build; wasm has no runtime feature
//! detection, and every browser ACS targets runs SIMD128.

use std::arch::wasm32::*;

use super::activations::{BlockQ8, QuantizedActivations};
use super::format::{Half, blocks};
use super::formats::{
    BlockIq4Nl, BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, IQ4_VALUES, KBlock, Q4Block, unpack_scales_k4,
};
use super::runner::{RowKernel, rows_by_four};
use super::{GgmlType, QK};
use crate::cpu::f16_table;

/// A half float, by table.
#[inline(always)]
fn le_f16(table: &[f32], h: Half) -> f32 {
    table[usize::from(u16::from_le_bytes(h.0))]
}

/// `b[at..at + 16]` as a vector.
#[inline(always)]
fn load(b: &[u8], at: usize) -> v128 {
    let s: &[u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
    // SAFETY: `s` is 16 readable bytes, and `v128_load` needs no alignment.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// Half `h` (0 or 1) of a block's 32 activation values.
#[inline(always)]
fn load_x(x: &BlockQ8, h: usize) -> v128 {
    let s: &[i8; 16] = x.qs[16 * h..16 * h + 16].try_into().expect("16 values");
    // SAFETY: as in `load`.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// Four partial sums of `a[i] * b[i]` over 16 signed bytes.
#[inline(always)]
fn dot16(a: v128, b: v128) -> v128 {
    i32x4_add(
        i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), i16x8_extend_low_i8x16(b)),
        i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), i16x8_extend_high_i8x16(b)),
    )
}

/// `acc + isum * scale`, lane-wise.
#[inline(always)]
fn add_scaled(acc: v128, isum: v128, scale: f32) -> v128 {
    f32x4_add(
        acc,
        f32x4_mul(f32x4_convert_i32x4(isum), f32x4_splat(scale)),
    )
}

/// Values `32s..32s + 32` (sub-block `s`) of a Q4_K or Q5_K super-block as two
/// vectors of 16: `qs` holds the nibbles (sub-blocks `2j` and `2j + 1` share
/// bytes `32j..`, low nibbles and high), `qh` Q5_K's fifth bits (bit `s` of byte
/// `l` for value `l`). Values 0..31 are valid signed bytes.
#[inline(always)]
fn k4_values(qs: &[u8], qh: Option<&[u8]>, s: usize) -> [v128; 2] {
    std::array::from_fn(|h| {
        let q = load(qs, 32 * (s / 2) + 16 * h);
        let w = if s.is_multiple_of(2) {
            v128_and(q, u8x16_splat(0x0F))
        } else {
            u8x16_shr(q, 4)
        };
        match qh {
            Some(qh) => {
                let bit = v128_and(u8x16_shr(load(qh, 16 * h), s as u32), u8x16_splat(1));
                v128_or(w, i8x16_shl(bit, 4))
            }
            None => w,
        }
    })
}

/// Values `32s..32s + 32` (sub-block `s`) of a Q6_K super-block as two vectors
/// of 16 signed values (-32..31): four low bits from `ql`, two high ones from
/// `qh`, laid out as `BlockQ6K::value` reads them.
#[inline(always)]
fn q6_values(b: &BlockQ6K, s: usize) -> [v128; 2] {
    let (half, g) = (s / 4, s % 4);
    std::array::from_fn(|h| {
        let ql = load(&b.ql, 64 * half + (g & 1) * 32 + 16 * h);
        let qh = load(&b.qh, 32 * half + 16 * h);
        let lo = v128_and(u8x16_shr(ql, 4 * (g as u32 >> 1)), u8x16_splat(0x0F));
        let hi = v128_and(u8x16_shr(qh, 2 * g as u32), u8x16_splat(3));
        i8x16_sub(v128_or(lo, i8x16_shl(hi, 4)), i8x16_splat(32))
    })
}

/// The integer sum of a sub-block of 32 whose halves of 16 have scales of their own
/// (Q2_K, Q3_K, Q6_K): `halves` are the halves' four partial sums.
#[inline(always)]
fn scaled(halves: [v128; 2], scales: [i32; 2]) -> v128 {
    let sc = |h: usize| i32x4_splat(scales[h]);
    i32x4_add(i32x4_mul(halves[0], sc(0)), i32x4_mul(halves[1], sc(1)))
}

/// Q6_K's scales of sub-block `s`'s halves.
#[inline(always)]
fn q6_scales(b: &BlockQ6K, s: usize) -> [i32; 2] {
    std::array::from_fn(|h| i32::from(b.scales[2 * s + h] as i8))
}

/// The 2-bit fields of values `32s..32s + 32` (sub-block `s`) of a Q2_K or Q3_K
/// super-block as two vectors of 16 (0..=3): bits `2j..2j + 2` of the half's 32
/// bytes for its sub-block `j`.
#[inline(always)]
fn low_bits(qs: &[u8], s: usize) -> [v128; 2] {
    let (half, j) = (s / 4, s % 4);
    std::array::from_fn(|h| {
        let q = load(qs, 32 * half + 16 * h);
        v128_and(u8x16_shr(q, 2 * j as u32), u8x16_splat(3))
    })
}

/// Sub-block `s` of a Q2_K super-block: its values (0..=3), its halves' scales and
/// their mins.
#[inline(always)]
fn q2_sub_block(b: &BlockQ2K, s: usize) -> ([v128; 2], [i32; 2], [i32; 2]) {
    let sm = |h: usize| b.scales[2 * s + h];
    (
        low_bits(&b.qs, s),
        std::array::from_fn(|h| i32::from(sm(h) & 0xF)),
        std::array::from_fn(|h| i32::from(sm(h) >> 4)),
    )
}

/// Sub-block `s` of a Q3_K super-block: its signed values (−4..=3: the low bits,
/// less 4 where the third bit, bit `s` of `hmask`, is clear) and its halves' scales.
#[inline(always)]
fn q3_sub_block(b: &BlockQ3K, s: usize) -> ([v128; 2], [i32; 2]) {
    let low = low_bits(&b.qs, s);
    let values = std::array::from_fn(|h| {
        let bit = v128_and(u8x16_shr(load(&b.hmask, 16 * h), s as u32), u8x16_splat(1));
        i8x16_sub(v128_or(low[h], i8x16_shl(bit, 2)), i8x16_splat(4))
    });
    (
        values,
        std::array::from_fn(|h| i32::from(b.scale(2 * s + h))),
    )
}

/// A Q2_K sub-block's mins term against activation block `xb`.
#[inline(always)]
fn q2_mins(mins: [i32; 2], xb: &BlockQ8) -> f32 {
    (mins[0] * i32::from(xb.sums[0]) + mins[1] * i32::from(xb.sums[1])) as f32
}

/// A Q5 block's fifth bits as 16 in the bytes of the values whose bit is set: the
/// 16 values of each half (bytes `2h`, `2h + 1` of `qh`).
#[inline(always)]
fn fifth_bits(qh: [u8; 4]) -> [v128; 2] {
    let bits = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    std::array::from_fn(|h| {
        let (a, b) = (qh[2 * h], qh[2 * h + 1]);
        let bytes = u8x16(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        let set = i8x16_eq(v128_and(bytes, bits), bits);
        v128_and(set, u8x16_splat(16))
    })
}

/// An IQ4 block's 32 values (its 16 bytes of indices `qs`, low nibbles first) from
/// the table, as two vectors of 16 signed bytes.
#[inline(always)]
fn iq4_values(qs: &[u8]) -> [v128; 2] {
    let t = IQ4_VALUES.map(|v| v as u8);
    let table = load(&t, 0);
    let q = load(qs, 0);
    [
        i8x16_swizzle(table, v128_and(q, u8x16_splat(0x0F))),
        i8x16_swizzle(table, u8x16_shr(q, 4)),
    ]
}

/// A Q4 or Q5 block's 32 values (0..=31) as two vectors of 16: low nibbles, then
/// high, each with its fifth bit where the block has them.
#[inline(always)]
fn nibble_values<B: Q4Block>(b: &B) -> [v128; 2] {
    let q = load(b.parts().1, 0);
    let w = [v128_and(q, u8x16_splat(0x0F)), u8x16_shr(q, 4)];
    match b.fifth_bits() {
        Some(qh) => {
            let f = fifth_bits(qh);
            [v128_or(w[0], f[0]), v128_or(w[1], f[1])]
        }
        None => w,
    }
}

/// One weight row of `ty` against `x`, for Q8_0, Q4_0, Q4_1 and the K-quants Q4_K,
/// Q5_K and Q6_K; `None` for the other formats (the portable code serves them).
pub(crate) fn dot(ty: GgmlType, row: &[u8], x: &[BlockQ8]) -> Option<f32> {
    let t = f16_table();
    // `extra`: the per-block terms outside the integer dot (a Q4 block's offset or min).
    let (acc, extra) = match ty {
        GgmlType::Q8_0 => {
            let mut acc = f32x4_splat(0.0);
            for (b, xb) in blocks::<BlockQ8_0>(row).iter().zip(x) {
                let i = i32x4_add(
                    dot16(load(&b.qs, 0), load_x(xb, 0)),
                    dot16(load(&b.qs, 16), load_x(xb, 1)),
                );
                acc = add_scaled(acc, i, le_f16(t, b.d) * xb.d);
            }
            (acc, 0.0)
        }
        GgmlType::Q4_0 => q4_dot(blocks::<BlockQ4_0>(row), x, t),
        GgmlType::Q4_1 => q4_dot(blocks::<BlockQ4_1>(row), x, t),
        GgmlType::Q5_0 => q4_dot(blocks::<BlockQ5_0>(row), x, t),
        GgmlType::Q5_1 => q4_dot(blocks::<BlockQ5_1>(row), x, t),
        GgmlType::IQ4_NL => {
            let mut acc = f32x4_splat(0.0);
            for (b, xb) in blocks::<BlockIq4Nl>(row).iter().zip(x) {
                let w = iq4_values(&b.qs);
                let i = i32x4_add(dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1)));
                acc = add_scaled(acc, i, le_f16(t, b.d) * xb.d);
            }
            (acc, 0.0)
        }
        GgmlType::IQ4_XS => {
            let mut acc = f32x4_splat(0.0);
            for (b, xs) in blocks::<BlockIq4Xs>(row).iter().zip(x.chunks_exact(8)) {
                let d = le_f16(t, b.d);
                for (j, xb) in xs.iter().enumerate() {
                    let w = iq4_values(&b.qs[16 * j..]);
                    let i = i32x4_add(dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1)));
                    acc = add_scaled(acc, i, d * b.scale(j) as f32 * xb.d);
                }
            }
            (acc, 0.0)
        }
        GgmlType::Q2_K => {
            let (mut acc, mut extra) = (f32x4_splat(0.0), 0f32);
            for (b, xs) in blocks::<BlockQ2K>(row).iter().zip(x.chunks_exact(8)) {
                let (d, dmin) = (le_f16(t, b.d), le_f16(t, b.dmin));
                for (s, xb) in xs.iter().enumerate() {
                    let (w, sc, mn) = q2_sub_block(b, s);
                    let halves = [dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1))];
                    acc = add_scaled(acc, scaled(halves, sc), d * xb.d);
                    extra -= dmin * xb.d * q2_mins(mn, xb);
                }
            }
            (acc, extra)
        }
        GgmlType::Q3_K => {
            let mut acc = f32x4_splat(0.0);
            for (b, xs) in blocks::<BlockQ3K>(row).iter().zip(x.chunks_exact(8)) {
                let d = le_f16(t, b.d);
                for (s, xb) in xs.iter().enumerate() {
                    let (w, sc) = q3_sub_block(b, s);
                    let halves = [dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1))];
                    acc = add_scaled(acc, scaled(halves, sc), d * xb.d);
                }
            }
            (acc, 0.0)
        }
        GgmlType::Q4_K => k4_dot(blocks::<BlockQ4K>(row), x, t),
        GgmlType::Q5_K => k4_dot(blocks::<BlockQ5K>(row), x, t),
        GgmlType::Q6_K => {
            let mut acc = f32x4_splat(0.0);
            for (b, xs) in blocks::<BlockQ6K>(row).iter().zip(x.chunks_exact(8)) {
                let d = le_f16(t, b.d);
                for (s, xb) in xs.iter().enumerate() {
                    let w = q6_values(b, s);
                    let halves = [dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1))];
                    acc = add_scaled(acc, scaled(halves, q6_scales(b, s)), d * xb.d);
                }
            }
            (acc, 0.0)
        }
        _ => return None,
    };
    Some(finish([acc], [extra])[0])
}

/// [`dot`] of a Q4_0 (value `d·(nibble − 8)`), Q4_1 (value `d·nibble + m`), Q5_0 or
/// Q5_1 row: the lanes' scaled integer sums and the blocks' offset terms.
#[inline(always)]
fn q4_dot<B: Q4Block>(row: &[B], x: &[BlockQ8], t: &[f32]) -> (v128, f32) {
    let (mut acc, mut extra) = (f32x4_splat(0.0), 0f32);
    for (b, xb) in row.iter().zip(x) {
        // Values 0..=31 are valid signed bytes: the low nibbles are values 0..16,
        // the high ones 16..32.
        let w = nibble_values(b);
        let i = i32x4_add(dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1)));
        let d = le_f16(t, b.parts().0);
        acc = add_scaled(acc, i, d * xb.d);
        extra += b.min(d, |h| le_f16(t, h)) * xb.s;
    }
    (acc, extra)
}

/// [`dot`] of a Q4_K or Q5_K row: the lanes' scaled integer sums and the mins' terms.
#[inline(always)]
fn k4_dot<B: KBlock>(row: &[B], x: &[BlockQ8], t: &[f32]) -> (v128, f32) {
    let (mut acc, mut extra) = (f32x4_splat(0.0), 0f32);
    for (b, xs) in row.iter().zip(x.chunks_exact(8)) {
        let (scales, qh, qs) = b.parts();
        let (d, dmin) = (le_f16(t, scales.d), le_f16(t, scales.dmin));
        let (sc, mn) = unpack_scales_k4(&scales.packed);
        let qh = qh.map(|h| &h[..]);
        for (s, xb) in xs.iter().enumerate() {
            let w = k4_values(qs, qh, s);
            let i = i32x4_add(dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1)));
            acc = add_scaled(acc, i, d * f32::from(sc[s]) * xb.d);
            extra -= dmin * f32::from(mn[s]) * xb.s;
        }
    }
    (acc, extra)
}

/// Values `8k..8k + 8` of a block's widened activations.
#[inline(always)]
fn load_wide(x: &[i16; QK], k: usize) -> v128 {
    let s: &[i16; 8] = x[8 * k..8 * k + 8].try_into().expect("8 values");
    // SAFETY: `s` is 16 readable bytes, and `v128_load` needs no alignment.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// A block's 32 weights (two vectors of 16 signed bytes) widened to 16 bits:
/// values `8k..8k + 8` in vector `k`, as [`load_wide`] reads the activations.
#[inline(always)]
fn widen(a: v128, b: v128) -> [v128; 4] {
    [
        i16x8_extend_low_i8x16(a),
        i16x8_extend_high_i8x16(a),
        i16x8_extend_low_i8x16(b),
        i16x8_extend_high_i8x16(b),
    ]
}

/// Four partial sums of a block's 32 widened weights times its 32 activations.
#[inline(always)]
fn dot32(w: &[v128; 4], x: &[i16; QK]) -> v128 {
    let d = |k: usize| i32x4_dot_i16x8(w[k], load_wide(x, k));
    i32x4_add(i32x4_add(d(0), d(1)), i32x4_add(d(2), d(3)))
}

/// Four partial sums of 16 widened weights times widened activations `8k..8k + 16`.
#[inline(always)]
fn dot16_wide(w: &[v128; 4], x: &[i16; QK], k: usize) -> v128 {
    i32x4_add(
        i32x4_dot_i16x8(w[k], load_wide(x, k)),
        i32x4_dot_i16x8(w[k + 1], load_wide(x, k + 1)),
    )
}

/// Whether [`tile`] serves `ty`: the formats [`dot`] serves (the portable code
/// serves the others).
fn has_kernel(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
}

/// One weight row of a format that [`has_kernel`] serves against vectors
/// `g..g + V` of `qx`: each block's weights are loaded, unpacked and widened once
/// for all of them, and the activations come widened already. Each vector sees
/// the float operations of [`dot`], in its order (the integer sums are exact in
/// any order), so batched and single results agree exactly.
#[inline(always)]
fn tile<const V: usize>(ty: GgmlType, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V] {
    let nb = qx.nb;
    let x = Batch {
        blocks: std::array::from_fn(|v| qx.vector(g + v)),
        wide: std::array::from_fn(|v| &qx.wide[(g + v) * nb..][..nb]),
        t: f16_table(),
    };
    let mut acc = [f32x4_splat(0.0); V];
    // The per-block terms outside the integer dot (a Q4 block's offset or min).
    let mut extra = [0f32; V];
    match ty {
        GgmlType::Q4_K => k4_tile(blocks::<BlockQ4K>(row), &x, &mut acc, &mut extra),
        GgmlType::Q5_K => k4_tile(blocks::<BlockQ5K>(row), &x, &mut acc, &mut extra),
        GgmlType::Q6_K => {
            for (i, b) in blocks::<BlockQ6K>(row).iter().enumerate() {
                let d = le_f16(x.t, b.d);
                for s in 0..8 {
                    let [w0, w1] = q6_values(b, s);
                    let w = widen(w0, w1);
                    for ((acc, x), xw) in acc.iter_mut().zip(x.blocks).zip(x.wide) {
                        let (xb, xw) = (&x[8 * i + s], &xw[8 * i + s]);
                        let halves = [dot16_wide(&w, xw, 0), dot16_wide(&w, xw, 2)];
                        *acc = add_scaled(*acc, scaled(halves, q6_scales(b, s)), d * xb.d);
                    }
                }
            }
        }
        GgmlType::Q2_K => {
            for (i, b) in blocks::<BlockQ2K>(row).iter().enumerate() {
                let (d, dmin) = (le_f16(x.t, b.d), le_f16(x.t, b.dmin));
                for s in 0..8 {
                    let ([w0, w1], sc, mn) = q2_sub_block(b, s);
                    let w = widen(w0, w1);
                    for (((acc, extra), x), xw) in
                        acc.iter_mut().zip(&mut extra).zip(x.blocks).zip(x.wide)
                    {
                        let (xb, xw) = (&x[8 * i + s], &xw[8 * i + s]);
                        let halves = [dot16_wide(&w, xw, 0), dot16_wide(&w, xw, 2)];
                        *acc = add_scaled(*acc, scaled(halves, sc), d * xb.d);
                        *extra -= dmin * xb.d * q2_mins(mn, xb);
                    }
                }
            }
        }
        GgmlType::IQ4_NL => {
            for (i, b) in blocks::<BlockIq4Nl>(row).iter().enumerate() {
                let [w0, w1] = iq4_values(&b.qs);
                let w = widen(w0, w1);
                let d = le_f16(x.t, b.d);
                for ((acc, x), xw) in acc.iter_mut().zip(x.blocks).zip(x.wide) {
                    *acc = add_scaled(*acc, dot32(&w, &xw[i]), d * x[i].d);
                }
            }
        }
        GgmlType::IQ4_XS => {
            for (i, b) in blocks::<BlockIq4Xs>(row).iter().enumerate() {
                let d = le_f16(x.t, b.d);
                for j in 0..8 {
                    let [w0, w1] = iq4_values(&b.qs[16 * j..]);
                    let w = widen(w0, w1);
                    let ds = d * b.scale(j) as f32;
                    for ((acc, x), xw) in acc.iter_mut().zip(x.blocks).zip(x.wide) {
                        let (xb, xw) = (&x[8 * i + j], &xw[8 * i + j]);
                        *acc = add_scaled(*acc, dot32(&w, xw), ds * xb.d);
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            for (i, b) in blocks::<BlockQ3K>(row).iter().enumerate() {
                let d = le_f16(x.t, b.d);
                for s in 0..8 {
                    let ([w0, w1], sc) = q3_sub_block(b, s);
                    let w = widen(w0, w1);
                    for ((acc, x), xw) in acc.iter_mut().zip(x.blocks).zip(x.wide) {
                        let (xb, xw) = (&x[8 * i + s], &xw[8 * i + s]);
                        let halves = [dot16_wide(&w, xw, 0), dot16_wide(&w, xw, 2)];
                        *acc = add_scaled(*acc, scaled(halves, sc), d * xb.d);
                    }
                }
            }
        }
        GgmlType::Q8_0 => {
            for (i, b) in blocks::<BlockQ8_0>(row).iter().enumerate() {
                let w = widen(load(&b.qs, 0), load(&b.qs, 16));
                let d = le_f16(x.t, b.d);
                for ((acc, x), xw) in acc.iter_mut().zip(x.blocks).zip(x.wide) {
                    *acc = add_scaled(*acc, dot32(&w, &xw[i]), d * x[i].d);
                }
            }
        }
        GgmlType::Q4_0 => q4_tile(blocks::<BlockQ4_0>(row), &x, &mut acc, &mut extra),
        GgmlType::Q5_0 => q4_tile(blocks::<BlockQ5_0>(row), &x, &mut acc, &mut extra),
        GgmlType::Q5_1 => q4_tile(blocks::<BlockQ5_1>(row), &x, &mut acc, &mut extra),
        _ => q4_tile(blocks::<BlockQ4_1>(row), &x, &mut acc, &mut extra),
    }
    finish(acc, extra)
}

/// The vectors of a [`tile`]: their blocks, their widened values, and the f16 table.
struct Batch<'a, const V: usize> {
    blocks: [&'a [BlockQ8]; V],
    wide: [&'a [[i16; QK]]; V],
    t: &'a [f32],
}

/// [`tile`]'s Q4_K or Q5_K rows.
#[inline(always)]
fn k4_tile<B: KBlock, const V: usize>(
    row: &[B],
    x: &Batch<'_, V>,
    acc: &mut [v128; V],
    extra: &mut [f32; V],
) {
    for (i, b) in row.iter().enumerate() {
        let (scales, qh, qs) = b.parts();
        let (d, dmin) = (le_f16(x.t, scales.d), le_f16(x.t, scales.dmin));
        let (sc, mn) = unpack_scales_k4(&scales.packed);
        let qh = qh.map(|h| &h[..]);
        for s in 0..8 {
            let [w0, w1] = k4_values(qs, qh, s);
            let w = widen(w0, w1);
            for (((acc, extra), x), xw) in acc.iter_mut().zip(&mut *extra).zip(x.blocks).zip(x.wide)
            {
                let xb = &x[8 * i + s];
                *acc = add_scaled(*acc, dot32(&w, &xw[8 * i + s]), d * f32::from(sc[s]) * xb.d);
                *extra -= dmin * f32::from(mn[s]) * xb.s;
            }
        }
    }
}

/// [`tile`]'s Q4_0, Q4_1, Q5_0 or Q5_1 rows.
#[inline(always)]
fn q4_tile<B: Q4Block, const V: usize>(
    row: &[B],
    x: &Batch<'_, V>,
    acc: &mut [v128; V],
    extra: &mut [f32; V],
) {
    for (i, b) in row.iter().enumerate() {
        // As in `q4_dot`.
        let [w0, w1] = nibble_values(b);
        let w = widen(w0, w1);
        let d = le_f16(x.t, b.parts().0);
        let m = b.min(d, |h| le_f16(x.t, h));
        for (((acc, extra), x), xw) in acc.iter_mut().zip(&mut *extra).zip(x.blocks).zip(x.wide) {
            let xb = &x[i];
            *acc = add_scaled(*acc, dot32(&w, &xw[i]), d * xb.d);
            *extra += m * xb.s;
        }
    }
}

/// Each vector's lanes summed as [`dot`] sums them, plus its scalar terms.
#[inline(always)]
fn finish<const V: usize>(acc: [v128; V], extra: [f32; V]) -> [f32; V] {
    std::array::from_fn(|v| {
        let a = acc[v];
        let lanes = f32x4_extract_lane::<0>(a)
            + f32x4_extract_lane::<1>(a)
            + f32x4_extract_lane::<2>(a)
            + f32x4_extract_lane::<3>(a);
        lanes + extra[v]
    })
}

/// [`tile`] for a format that [`has_kernel`] serves.
struct Tile(GgmlType);

impl RowKernel for Tile {
    #[inline(always)]
    fn row<const V: usize>(&self, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V] {
        tile(self.0, row, qx, g)
    }
}

/// Rows `rows` against every vector of a batch (two or more), up to four vectors
/// per pass over a row (more would not fit the 16 SIMD registers that V8 maps
/// wasm's onto on x86); `false` for the formats [`tile`] does not serve and for a
/// lone vector, which [`dot`] serves: a single vector gains nothing from the
/// widened activations, a batch does (the `kernel_bench` test of acs-web measures
/// both in headless Chromium).
pub(crate) fn matmul_rows(
    ty: GgmlType,
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    qx: &QuantizedActivations,
    put: &mut impl FnMut(usize, usize, f32),
) -> bool {
    if !has_kernel(ty) || qx.count < 2 {
        return false;
    }
    rows_by_four(&Tile(ty), weights, rb, rows, qx, put);
    true
}
