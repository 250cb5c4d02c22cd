//! Q3_K: super-blocks of 256 signed 3-bit values in sixteen groups of 16, each with a
//! 6-bit scale (stored + 32) against the super-block's f16 `d`: value `d·(sc − 32)·q`,
//! q in −4..=3. The two low bits lie as Q2_K's ([`low_bits`]); the third is bit
//! `4·half + j` of byte `l` of `hmask` for value `l` of group of 32 `j`, set for
//! q ≥ 0 (q = low − 4 where it is clear). The sixteen scales are packed in 12 bytes
//! ([`BlockQ3K::scale`]).

use bytemuck::{Pod, Zeroable};

use super::groups_of_16;
use super::q2_k::{low_bits, set_low_bits};
use crate::quant::GgmlType;
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};

/// Values per super-block.
const QK_K: usize = 256;

/// The Q3_K format.
#[derive(Debug)]
pub(crate) struct Q3K;

/// One Q3_K super-block: 256 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ3K {
    /// Each value's third bit.
    pub(crate) hmask: [u8; QK_K / 8],
    /// The two low bits of each value.
    pub(crate) qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales, packed.
    pub(crate) scales: [u8; 12],
    /// The scales' scale.
    pub(crate) d: Half,
}

impl BlockQ3K {
    /// Group `k`'s signed scale (values `16k..16k + 16`): its low four bits are a
    /// nibble of bytes 0..8 (low nibbles for groups 0..8, high for 8..16), its two
    /// high bits a pair of bytes 8..12 (bits `2·(k / 4)` of byte `8 + k % 4`).
    #[inline(always)]
    pub(crate) fn scale(&self, k: usize) -> i8 {
        let s = &self.scales;
        let low = (s[k % 8] >> (4 * (k / 8))) & 0xF;
        let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    }

    /// Sets group `k`'s scale to `sc` (−32..=31) in bits that must be clear.
    fn set_scale(&mut self, k: usize, sc: i8) {
        let u = (sc + 32) as u8;
        self.scales[k % 8] |= (u & 0xF) << (4 * (k / 8));
        self.scales[8 + k % 4] |= (u >> 4) << (2 * (k / 4));
    }

    /// The signed 3-bit value of element `e` (0..256).
    #[inline(always)]
    pub(crate) fn value(&self, e: usize) -> i8 {
        let (half, p) = (e / 128, e % 128);
        let (j, l) = (p / 32, p % 32);
        let high = (self.hmask[l] >> (4 * half + j)) & 1;
        low_bits(&self.qs, e) as i8 - if high == 0 { 4 } else { 0 }
    }
}

impl Format for Q3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    type Block = BlockQ3K;

    fn dequantize(b: &BlockQ3K, y: &mut [f32]) {
        let d = b.d.get();
        for (e, v) in y.iter_mut().enumerate() {
            *v = d * f32::from(b.scale(e / 16)) * f32::from(b.value(e));
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ3K) {
        let scales: Vec<f32> = v.chunks_exact(16).map(|c| super::amax(c) / 4.0).collect();
        *b = BlockQ3K::zeroed();
        b.d.set(scales.iter().fold(0f32, |m, &s| m.max(s)) / 31.0);
        let dh = b.d.get();
        for (g, &scale) in scales.iter().enumerate() {
            let sc = (scale * super::inverse(dh)).round().clamp(0.0, 31.0) as i8;
            b.set_scale(g, sc);
            let step = dh * f32::from(sc);
            for (i, &x) in v[16 * g..16 * g + 16].iter().enumerate() {
                let e = 16 * g + i;
                let q = (x * super::inverse(step)).round().clamp(-4.0, 3.0) as i8;
                let u = (q + 4) as u8;
                set_low_bits(&mut b.qs, e, u & 3);
                let (half, p) = (e / 128, e % 128);
                b.hmask[p % 32] |= (u >> 2) << (4 * half + p / 32);
            }
        }
    }

    fn dot_q8(row: &[BlockQ3K], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x.chunks_exact(8))
            .map(|(b, xs)| {
                let d = b.d.get();
                let value = |e| i32::from(b.value(e));
                groups_of_16(xs, value, |g| i32::from(b.scale(g)))
                    .map(|(_, xb, isum)| d * xb.d * isum as f32)
                    .sum::<f32>()
            })
            .sum()
    }
}
