//! Q2_K: super-blocks of 256 unsigned 2-bit values in sixteen groups of 16, each with
//! a 4-bit scale and a 4-bit min (low and high nibble of one byte) against the
//! super-block's f16 `d` and `dmin`: value `d·sc·q − dmin·m`. Each half of 128 values
//! keeps its 2-bit values in 32 bytes: value `l` of group of 32 `j` at bits `2j..2j + 2`
//! of byte `l` (the layout Q3_K's low bits share, [`low_bits`]).

use bytemuck::{Pod, Zeroable};

use super::{amax, groups_of_16};
use crate::quant::GgmlType;
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};

/// Values per super-block.
const QK_K: usize = 256;

/// The Q2_K format.
#[derive(Debug)]
pub(crate) struct Q2K;

/// One Q2_K super-block: 256 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ2K {
    /// Each group's scale (low nibble) and min (high nibble).
    pub(crate) scales: [u8; QK_K / 16],
    /// The 2-bit values.
    pub(crate) qs: [u8; QK_K / 4],
    /// The scales' scale.
    pub(crate) d: Half,
    /// The mins' scale.
    pub(crate) dmin: Half,
}

/// The 2-bit field of element `e` (0..256) in `qs` as Q2_K and Q3_K lay it out.
#[inline(always)]
pub(crate) fn low_bits(qs: &[u8; QK_K / 4], e: usize) -> u8 {
    let (half, p) = (e / 128, e % 128);
    let (j, l) = (p / 32, p % 32);
    (qs[32 * half + l] >> (2 * j)) & 3
}

/// Sets element `e`'s 2-bit field (which must be clear) to `q`.
pub(crate) fn set_low_bits(qs: &mut [u8; QK_K / 4], e: usize, q: u8) {
    let (half, p) = (e / 128, e % 128);
    let (j, l) = (p / 32, p % 32);
    qs[32 * half + l] |= (q & 3) << (2 * j);
}

impl Format for Q2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    type Block = BlockQ2K;

    fn dequantize(b: &BlockQ2K, y: &mut [f32]) {
        let (d, dmin) = (b.d.get(), b.dmin.get());
        for (e, v) in y.iter_mut().enumerate() {
            let sm = b.scales[e / 16];
            let q = f32::from(low_bits(&b.qs, e));
            *v = d * f32::from(sm & 0xF) * q - dmin * f32::from(sm >> 4);
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ2K) {
        // Per group: min m = -min(v) (at least 0), scale (max - min) / 3; both then
        // rounded to 4 bits against the largest.
        let groups: Vec<(f32, f32)> = v
            .chunks_exact(16)
            .map(|c| {
                let lo = c.iter().fold(0f32, |m, &x| m.min(x));
                let hi = c.iter().fold(lo, |m, &x| m.max(x));
                ((hi - lo) / 3.0, -lo)
            })
            .collect();
        *b = BlockQ2K::zeroed();
        let max_scale = groups.iter().fold(0f32, |m, g| m.max(g.0));
        let max_min = groups.iter().fold(0f32, |m, g| m.max(g.1));
        b.d.set(max_scale / 15.0);
        b.dmin.set(max_min / 15.0);
        let (d, dmin) = (b.d.get(), b.dmin.get());
        for (g, &(scale, min)) in groups.iter().enumerate() {
            let sc = (scale * super::inverse(d)).round().clamp(0.0, 15.0) as u8;
            let m = (min * super::inverse(dmin)).round().clamp(0.0, 15.0) as u8;
            b.scales[g] = sc | (m << 4);
            let (ds, dm) = (d * f32::from(sc), dmin * f32::from(m));
            for (i, &x) in v[16 * g..16 * g + 16].iter().enumerate() {
                let q = ((x + dm) * super::inverse(ds)).round().clamp(0.0, 3.0) as u8;
                set_low_bits(&mut b.qs, 16 * g + i, q);
            }
        }
        debug_assert!(amax(v).is_finite());
    }

    fn dot_q8(row: &[BlockQ2K], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x.chunks_exact(8))
            .map(|(b, xs)| {
                let (d, dmin) = (b.d.get(), b.dmin.get());
                let value = |e| i32::from(low_bits(&b.qs, e));
                groups_of_16(xs, value, |g| i32::from(b.scales[g] & 0xF))
                    .map(|(s, xb, isum)| {
                        let min = |h: usize| i32::from(b.scales[2 * s + h] >> 4);
                        let msum = min(0) * i32::from(xb.sums[0]) + min(1) * i32::from(xb.sums[1]);
                        xb.d * (d * isum as f32 - dmin * msum as f32)
                    })
                    .sum::<f32>()
            })
            .sum()
    }
}
