//! Q6_K: super-blocks of 256 signed 6-bit values in sixteen groups of 16, each with a
//! signed 8-bit scale against the super-block's f16 `d`: value `d·sc·q`. Each half of
//! 128 values keeps its four low bits in 64 bytes of `ql` (groups of 32 values
//! `0` and `2` in the low and high nibbles of the first 32 bytes, `1` and `3` of the
//! next 32) and its two high bits in 32 bytes of `qh` (group `g` at bits `2g..2g + 2`).

use bytemuck::{Pod, Zeroable};

use super::{amax, groups_of_16};
use crate::quant::GgmlType;
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};

/// Values per super-block.
const QK_K: usize = 256;

/// The Q6_K format.
#[derive(Debug)]
pub(crate) struct Q6K;

/// One Q6_K super-block: 256 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ6K {
    /// The four low bits of each value.
    pub(crate) ql: [u8; QK_K / 2],
    /// The two high bits of each value.
    pub(crate) qh: [u8; QK_K / 4],
    /// The sixteen groups' scales, as two's-complement bytes.
    pub(crate) scales: [u8; QK_K / 16],
    /// The scales' scale.
    pub(crate) d: Half,
}

impl BlockQ6K {
    /// The signed 6-bit value of element `e` (0..256).
    #[inline(always)]
    pub(crate) fn value(&self, e: usize) -> i8 {
        let (half, p) = (e / 128, e % 128);
        let (g, l) = (p / 32, p % 32);
        let ql = self.ql[64 * half + (g & 1) * 32 + l];
        let qh = self.qh[32 * half + l];
        let lo = (ql >> (4 * (g >> 1))) & 0xF;
        let hi = (qh >> (2 * g)) & 3;
        (lo | (hi << 4)) as i8 - 32
    }

    /// Group `k`'s scale (values `16k..16k + 16`).
    #[inline(always)]
    fn scale(&self, k: usize) -> i8 {
        self.scales[k] as i8
    }
}

impl Format for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    type Block = BlockQ6K;

    fn dequantize(b: &BlockQ6K, y: &mut [f32]) {
        let d = b.d.get();
        for (e, v) in y.iter_mut().enumerate() {
            *v = d * f32::from(b.scale(e / 16)) * f32::from(b.value(e));
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ6K) {
        let scales: Vec<f32> = v.chunks_exact(16).map(|c| amax(c) / 31.0).collect();
        *b = BlockQ6K::zeroed();
        b.d.set(scales.iter().fold(0f32, |m, &s| m.max(s)) / 127.0);
        let dh = b.d.get();
        for (e, &x) in v.iter().enumerate() {
            let sc = (scales[e / 16] * super::inverse(dh))
                .round()
                .clamp(0.0, 127.0) as i8;
            b.scales[e / 16] = sc as u8;
            let q = ((x * super::inverse(dh * f32::from(sc)))
                .round()
                .clamp(-32.0, 31.0)) as i8;
            let u = (q + 32) as u8;
            let (half, p) = (e / 128, e % 128);
            let (g, l) = (p / 32, p % 32);
            b.ql[64 * half + (g & 1) * 32 + l] |= (u & 0xF) << (4 * (g >> 1));
            b.qh[32 * half + l] |= (u >> 4) << (2 * g);
        }
    }

    fn dot_q8(row: &[BlockQ6K], x: &[BlockQ8]) -> f32 {
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
