//! Q4_K and Q5_K: super-blocks of 256 values in eight sub-blocks of 32, each with a
//! 6-bit scale and a 6-bit min against the super-block's f16 `d` and `dmin`: value
//! `d·sc·q − dmin·m`. Sub-blocks `2j` and `2j + 1` share bytes `32j..32j + 32` of the
//! quants, low nibbles and high; Q5_K adds each value's fifth bit (bit `s` of byte `l`
//! for value `l` of sub-block `s`).

use bytemuck::{Pod, Zeroable};

use super::idot_u;
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};
use crate::quant::{GgmlType, QK};

/// Values per super-block.
const QK_K: usize = 256;

/// The Q4_K format.
#[derive(Debug)]
pub(crate) struct Q4K;

/// The Q5_K format.
#[derive(Debug)]
pub(crate) struct Q5K;

/// The scales every Q4_K and Q5_K super-block starts with.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct KScales {
    /// The scales' scale.
    pub(crate) d: Half,
    /// The mins' scale.
    pub(crate) dmin: Half,
    /// Eight 6-bit scales and eight 6-bit mins, packed (see [`unpack_scales_k4`]).
    pub(crate) packed: [u8; 12],
}

/// One Q4_K super-block: 256 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ4K {
    /// The scales.
    pub(crate) scales: KScales,
    /// The nibbles.
    pub(crate) qs: [u8; QK_K / 2],
}

/// One Q5_K super-block: 256 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ5K {
    /// The scales.
    pub(crate) scales: KScales,
    /// The values' fifth bits.
    pub(crate) qh: [u8; QK_K / 8],
    /// The low four bits.
    pub(crate) qs: [u8; QK_K / 2],
}

/// A Q4_K or Q5_K super-block as code shared by both reads it: the scales, Q5_K's
/// fifth bits and the nibbles.
pub(crate) type KParts<'a> = (&'a KScales, Option<&'a [u8; QK_K / 8]>, &'a [u8; QK_K / 2]);

/// The Q4_K and Q5_K super-blocks, seen alike.
pub(crate) trait KBlock {
    /// Whether the block has fifth bits (Q5_K).
    const FIFTH_BITS: bool;

    /// The block's parts.
    fn parts(&self) -> KParts<'_>;
}

impl KBlock for BlockQ4K {
    const FIFTH_BITS: bool = false;

    #[inline(always)]
    fn parts(&self) -> KParts<'_> {
        (&self.scales, None, &self.qs)
    }
}

impl KBlock for BlockQ5K {
    const FIFTH_BITS: bool = true;

    #[inline(always)]
    fn parts(&self) -> KParts<'_> {
        (&self.scales, Some(&self.qh), &self.qs)
    }
}

impl Format for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    type Block = BlockQ4K;

    fn dequantize(b: &BlockQ4K, y: &mut [f32]) {
        dequantize(b, y);
    }

    fn quantize(v: &[f32], b: &mut BlockQ4K) {
        let (sc, mn) = quantize_scales(15.0, v, &mut b.scales);
        b.qs = [0; QK_K / 2];
        quantize_values(15.0, v, &b.scales, (&sc, &mn), &mut b.qs, None);
    }

    fn dot_q8(row: &[BlockQ4K], x: &[BlockQ8]) -> f32 {
        dot_q8(row, x)
    }
}

impl Format for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    type Block = BlockQ5K;

    fn dequantize(b: &BlockQ5K, y: &mut [f32]) {
        dequantize(b, y);
    }

    fn quantize(v: &[f32], b: &mut BlockQ5K) {
        let (sc, mn) = quantize_scales(31.0, v, &mut b.scales);
        (b.qs, b.qh) = ([0; QK_K / 2], [0; QK_K / 8]);
        let qh = Some(&mut b.qh);
        quantize_values(31.0, v, &b.scales, (&sc, &mn), &mut b.qs, qh);
    }

    fn dot_q8(row: &[BlockQ5K], x: &[BlockQ8]) -> f32 {
        dot_q8(row, x)
    }
}

/// The 6-bit scale and min of sub-block `j` from a packed scale array (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The eight scales and eight mins of a packed scale array.
#[inline(always)]
pub(crate) fn unpack_scales_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, q);
    }
    (sc, mn)
}

/// Sub-block `s`'s 32 values, unsigned (0..16, or 0..32 with the fifth bits).
#[inline(always)]
fn sub_block(qs: &[u8; QK_K / 2], qh: Option<&[u8; QK_K / 8]>, s: usize) -> [u8; QK] {
    let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
    let shift = 4 * (s % 2);
    std::array::from_fn(|l| {
        let h = qh.map_or(0, |h| ((h[l] >> s) & 1) << 4);
        ((q[l] >> shift) & 0xF) | h
    })
}

fn dequantize(b: &impl KBlock, y: &mut [f32]) {
    let (scales, qh, qs) = b.parts();
    let (d, dmin) = (scales.d.get(), scales.dmin.get());
    let (sc, mn) = unpack_scales_k4(&scales.packed);
    for j in 0..4 {
        let q = &qs[32 * j..32 * j + 32];
        let (d1, m1) = (d * f32::from(sc[2 * j]), dmin * f32::from(mn[2 * j]));
        let (d2, m2) = (
            d * f32::from(sc[2 * j + 1]),
            dmin * f32::from(mn[2 * j + 1]),
        );
        for l in 0..32 {
            let (h1, h2) = qh.map_or((0, 0), |qh| {
                (
                    ((qh[l] >> (2 * j)) & 1) << 4,
                    ((qh[l] >> (2 * j + 1)) & 1) << 4,
                )
            });
            y[64 * j + l] = d1 * f32::from((q[l] & 0xF) | h1) - m1;
            y[64 * j + 32 + l] = d2 * f32::from((q[l] >> 4) | h2) - m2;
        }
    }
}

fn dot_q8<B: KBlock>(row: &[B], x: &[BlockQ8]) -> f32 {
    row.iter()
        .zip(x.chunks_exact(8))
        .map(|(b, xs)| {
            let (scales, qh, qs) = b.parts();
            let (d, dmin) = (scales.d.get(), scales.dmin.get());
            let (sc, mn) = unpack_scales_k4(&scales.packed);
            let mut acc = 0f32;
            for (s, xb) in xs.iter().enumerate() {
                let w = sub_block(qs, qh, s);
                acc += xb.d * d * f32::from(sc[s]) * idot_u(&w, &xb.qs) as f32
                    - dmin * f32::from(mn[s]) * xb.s;
            }
            acc
        })
        .sum()
}

/// Per sub-block of 32 an affine map `x ≈ d·sc·q − dmin·m` with 6-bit `sc` and `m`:
/// writes `d`, `dmin` and the packed scales, and returns the unpacked ones.
fn quantize_scales(levels: f32, v: &[f32], out: &mut KScales) -> ([u8; 8], [u8; 8]) {
    let mut scale = [0f32; 8];
    let mut minv = [0f32; 8];
    for (s, c) in v.chunks_exact(32).enumerate() {
        let lo = c.iter().copied().fold(0f32, f32::min);
        let hi = c.iter().copied().fold(f32::NEG_INFINITY, f32::max).max(lo);
        scale[s] = (hi - lo) / levels;
        minv[s] = -lo;
    }
    out.d.set(scale.iter().fold(0f32, |m, &s| m.max(s)) / 63.0);
    out.dmin
        .set(minv.iter().fold(0f32, |m, &s| m.max(s)) / 63.0);
    let (dh, dminh) = (out.d.get(), out.dmin.get());
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for s in 0..8 {
        sc[s] = (scale[s] * super::inverse(dh)).round().clamp(0.0, 63.0) as u8;
        mn[s] = (minv[s] * super::inverse(dminh)).round().clamp(0.0, 63.0) as u8;
    }
    let packed = &mut out.packed;
    *packed = [0; 12];
    for j in 0..8 {
        if j < 4 {
            packed[j] |= sc[j];
            packed[j + 4] |= mn[j];
        } else {
            packed[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            packed[j - 4] |= (sc[j] >> 4) << 6;
            packed[j] |= (mn[j] >> 4) << 6;
        }
    }
    (sc, mn)
}

/// Rounds each value against its sub-block's step and offset into `qs` (and its fifth
/// bit into `qh` for Q5_K); both start zeroed.
fn quantize_values(
    levels: f32,
    v: &[f32],
    scales: &KScales,
    (sc, mn): (&[u8; 8], &[u8; 8]),
    qs: &mut [u8; QK_K / 2],
    mut qh: Option<&mut [u8; QK_K / 8]>,
) {
    let (dh, dminh) = (scales.d.get(), scales.dmin.get());
    for (s, c) in v.chunks_exact(32).enumerate() {
        let step = dh * f32::from(sc[s]);
        let off = dminh * f32::from(mn[s]);
        for (l, &x) in c.iter().enumerate() {
            let q = ((x + off) * super::inverse(step))
                .round()
                .clamp(0.0, levels) as u8;
            qs[32 * (s / 2) + l] |= (q & 0xF) << (4 * (s % 2));
            if let Some(qh) = qh.as_mut() {
                qh[l] |= (q >> 4) << s;
            }
        }
    }
}
