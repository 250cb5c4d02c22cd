//! The K-quant kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): one row against up to four
//! vectors, each super-block's scales and values unpacked once for all of them; and
//! the dispatch of these and of `iq4.rs`'s kernels over a matrix's rows.

use std::arch::x86_64::*;

use super::*;
use crate::cpu::x86::{Avx2Token, hsum_ps};
use crate::quant::GgmlType;
use crate::quant::activations::QuantizedActivations;
use crate::quant::format::blocks;
use crate::quant::formats::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, KScales, unpack_scales_k4,
};
use crate::quant::runner::{RowKernel, rows_by_four};

safe_entry!(dot_q2_k => q2_k);
safe_entry!(dot_q3_k => q3_k);
safe_entry!(dot_q4_k => q4_k);
safe_entry!(dot_q5_k => q5_k);
safe_entry!(dot_q6_k => q6_k);

/// Shared body of Q4_K and Q5_K, one super-block of a row against `V` vectors'
/// eight blocks each (`qh` holds Q5_K's fifth bits): the scales and each group's
/// values are unpacked once for all the vectors. Adds each vector's scaled sums to
/// its `acc` and returns its mins term.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_super_block<const V: usize>(
    scales: &KScales,
    qs: &[u8],
    qh: Option<&[u8]>,
    xs: [&[BlockQ8]; V],
    acc: &mut [__m256; V],
) -> [f32; V] {
    let (d, dmin) = (h2f(scales.d), h2f(scales.dmin));
    let (sc, mn) = unpack_scales_k4(&scales.packed);
    let hbits = qh.map(load32);
    let mask = _mm256_set1_epi8(0xF);
    let mut mins = [0f32; V];
    for j in 0..4 {
        let q = load32(&qs[32 * j..]);
        let lo = _mm256_and_si256(q, mask);
        let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
        for (k, mut w) in [(0, lo), (1, hi)] {
            let s = 2 * j + k;
            if let Some(h) = hbits {
                let bit = _mm256_set1_epi8(1 << s);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
                w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
            }
            for ((acc, mins), x) in acc.iter_mut().zip(&mut mins).zip(xs) {
                let xb = &x[s];
                let p = mul_sum_us8(w, load_x(xb));
                let ds = d * f32::from(sc[s]) * xb.d;
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(p), *acc);
                *mins += dmin * f32::from(mn[s]) * xb.s;
            }
        }
    }
    mins
}

/// The blocks of super-block `i` (eight of 32 values) of each vector.
#[inline(always)]
fn super_blocks<const V: usize>(x: [&[BlockQ8]; V], i: usize) -> [&[BlockQ8]; V] {
    x.map(|x| &x[8 * i..8 * i + 8])
}

/// A Q4_K row against `V` vectors (one vector: its dot product); every vector sees
/// the same operations in the same order whatever `V`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    let mut mins = [0f32; V];
    for (i, b) in blocks::<BlockQ4K>(row).iter().enumerate() {
        let m = k4_super_block(&b.scales, &b.qs, None, super_blocks(x, i), &mut acc);
        for (total, m) in mins.iter_mut().zip(m) {
            *total += m;
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]) - mins[v])
}

/// A Q5_K row against `V` vectors (see [`q4_k`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    let mut mins = [0f32; V];
    for (i, b) in blocks::<BlockQ5K>(row).iter().enumerate() {
        let qh = Some(&b.qh[..]);
        let m = k4_super_block(&b.scales, &b.qs, qh, super_blocks(x, i), &mut acc);
        for (total, m) in mins.iter_mut().zip(m) {
            *total += m;
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]) - mins[v])
}

/// A Q6_K row against `V` vectors (see [`q4_k`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    let mut corr = [0f32; V];
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(0x30);
    for (i, b) in blocks::<BlockQ6K>(row).iter().enumerate() {
        let xs = super_blocks(x, i);
        let d = h2f(b.d);
        let scales = &b.scales;
        for half in 0..2 {
            let ql0 = load32(&b.ql[64 * half..]);
            let ql1 = load32(&b.ql[64 * half + 32..]);
            let qh = load32(&b.qh[32 * half..]);
            // The unsigned 6-bit values (signed value + 32) of the four groups.
            let groups = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(qh, m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                ),
            ];
            for (g, w) in groups.into_iter().enumerate() {
                let s = 4 * half + g;
                let scales = (scales[2 * s] as i8, scales[2 * s + 1] as i8);
                offset_block(w, scales, d, (xs, s), &mut acc, &mut corr);
            }
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]) - 32.0 * corr[v])
}

/// Block `s` of a super-block, its 32 values as unsigned bytes `w` (each a signed
/// value plus an offset) and its halves' signed scales `(sa, sb)`, against each
/// vector's block `s` of `xs`: adds `d·x.d·Σ scale·w·x` to the vector's `acc`, and
/// `d·x.d·(sa·Σx_lo + sb·Σx_hi)` to its `corr`, which the caller takes back times
/// the offset (Q3_K's 4, Q6_K's 32).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn offset_block<const V: usize>(
    w: __m256i,
    (sa, sb): (i8, i8),
    d: f32,
    (xs, s): ([&[BlockQ8]; V], usize),
    acc: &mut [__m256; V],
    corr: &mut [f32; V],
) {
    let sc = group_scales(i16::from(sa), i16::from(sb));
    for ((acc, corr), x) in acc.iter_mut().zip(corr).zip(xs) {
        let xb = &x[s];
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, load_x(xb)), sc);
        let dd = d * xb.d;
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(p), *acc);
        let off = i32::from(sa) * i32::from(xb.sums[0]) + i32::from(sb) * i32::from(xb.sums[1]);
        *corr += dd * off as f32;
    }
}

/// The two 16-value groups' scales of a block of 32 values as the 16-bit lanes
/// [`_mm256_madd_epi16`] multiplies: `a` for the first 16 values, `b` for the rest.
#[inline]
#[target_feature(enable = "avx2")]
fn group_scales(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// The 2-bit fields of the 32 values of block `j` of a half (bits `2j..2j + 2` of
/// the half's 32 bytes `q`), Q2_K's values and Q3_K's low bits.
#[inline]
#[target_feature(enable = "avx2")]
fn low_bits(q: __m256i, j: i32) -> __m256i {
    let shifted = match j {
        0 => q,
        1 => _mm256_srli_epi16(q, 2),
        2 => _mm256_srli_epi16(q, 4),
        _ => _mm256_srli_epi16(q, 6),
    };
    _mm256_and_si256(shifted, _mm256_set1_epi8(3))
}

/// A Q2_K row against `V` vectors (see [`q4_k`]): the 2-bit values as bytes against
/// the activations, each group's sum times its 4-bit scale; the mins from the
/// activation halves' sums.
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    let mut mins = [0f32; V];
    for (i, b) in blocks::<BlockQ2K>(row).iter().enumerate() {
        let xs = super_blocks(x, i);
        let (d, dmin) = (h2f(b.d), h2f(b.dmin));
        for half in 0..2 {
            let q = load32(&b.qs[32 * half..]);
            for j in 0..4 {
                let s = 4 * half + j;
                let w = low_bits(q, j as i32);
                let (sa, sb) = (b.scales[2 * s], b.scales[2 * s + 1]);
                let sc = group_scales(i16::from(sa & 0xF), i16::from(sb & 0xF));
                for ((acc, mins), x) in acc.iter_mut().zip(&mut mins).zip(xs) {
                    let xb = &x[s];
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, load_x(xb)), sc);
                    let dd = d * xb.d;
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(p), *acc);
                    let m = i32::from(sa >> 4) * i32::from(xb.sums[0])
                        + i32::from(sb >> 4) * i32::from(xb.sums[1]);
                    *mins += dmin * xb.d * m as f32;
                }
            }
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]) - mins[v])
}

/// A Q3_K row against `V` vectors (see [`q4_k`]): each value as low bits plus 4 where
/// its third bit is set (the signed value + 4, 0..=7) against the activations, times
/// the group's signed scale; the offset of 4 taken back from the activation halves'
/// sums.
#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    let mut corr = [0f32; V];
    for (i, b) in blocks::<BlockQ3K>(row).iter().enumerate() {
        let xs = super_blocks(x, i);
        let d = h2f(b.d);
        let hmask = load32(&b.hmask);
        for half in 0..2 {
            let q = load32(&b.qs[32 * half..]);
            for j in 0..4 {
                let s = 4 * half + j;
                let bit = _mm256_set1_epi8(1 << s);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit);
                let four = _mm256_and_si256(set, _mm256_set1_epi8(4));
                let w = _mm256_or_si256(low_bits(q, j as i32), four);
                let scales = (b.scale(2 * s), b.scale(2 * s + 1));
                offset_block(w, scales, d, (xs, s), &mut acc, &mut corr);
            }
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]) - 4.0 * corr[v])
}

/// The one-row kernel of a format (a K-quant, IQ4_NL or IQ4_XS) against `V` vectors;
/// the token proves the kernels' features.
struct OneRow {
    _t: Avx2Token,
    ty: GgmlType,
}

impl RowKernel for OneRow {
    #[inline]
    fn row<const V: usize>(&self, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V] {
        let x = std::array::from_fn(|k| qx.vector(g + k));
        // SAFETY: an `Avx2Token` (`_t`) exists only after runtime detection found
        // AVX2, FMA and F16C, the kernels' features; they read `row` and the
        // blocks only through bounds-checked slicing.
        unsafe {
            match self.ty {
                GgmlType::Q2_K => q2_k(row, x),
                GgmlType::Q3_K => q3_k(row, x),
                GgmlType::Q4_K => q4_k(row, x),
                GgmlType::Q5_K => q5_k(row, x),
                GgmlType::IQ4_NL => iq4::iq4_nl(row, x),
                GgmlType::IQ4_XS => iq4::iq4_xs(row, x),
                _ => q6_k(row, x),
            }
        }
    }
}

/// Rows `rows` of a K-quant, IQ4_NL or IQ4_XS matrix against every vector of `qx`, up
/// to four vectors per pass over a row, so that a batch unpacks each block's scales
/// and values once per four vectors rather than once per vector; `false` (and
/// nothing done) for other formats.
pub(crate) fn one_row_rows(
    t: Avx2Token,
    ty: GgmlType,
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    qx: &QuantizedActivations,
    put: &mut impl FnMut(usize, usize, f32),
) -> bool {
    if !matches!(
        ty,
        GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS
    ) {
        return false;
    }
    rows_by_four(&OneRow { _t: t, ty }, weights, rb, rows, qx, put);
    true
}
