//! Q5_0 and Q5_1: blocks of 32 five-bit values with an f16 scale `d`, value
//! `d·(q − 16)` (Q5_0), or a scale and a min `m`, value `d·q + m` (Q5_1). The low four
//! bits are laid out as Q4's (byte `j` holds value `j` in its low nibble and value
//! `16 + j` in its high one); bit `i` of the little-endian word `qh` is value `i`'s
//! fifth bit. `llama-quantize` writes these for rows that K-quants cannot hold (a
//! width that is not a multiple of 256) and in its Q5_0/Q5_1 files.

use bytemuck::{Pod, Zeroable};

use super::{idot_u, inverse};
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};
use crate::quant::{GgmlType, QK};

/// The Q5_0 format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct Q5_0;

/// The Q5_1 format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct Q5_1;

/// One Q5_0 block: 32 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ5_0 {
    /// The scale.
    pub(crate) d: Half,
    /// The fifth bits, value `i` at bit `i` of the little-endian word.
    pub(crate) qh: [u8; 4],
    /// The low nibbles.
    pub(crate) qs: [u8; QK / 2],
}

/// One Q5_1 block: 32 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ5_1 {
    /// The scale.
    pub(crate) d: Half,
    /// The min, added to every value.
    pub(crate) m: Half,
    /// The fifth bits, value `i` at bit `i` of the little-endian word.
    pub(crate) qh: [u8; 4],
    /// The low nibbles.
    pub(crate) qs: [u8; QK / 2],
}

impl Format for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    type Block = BlockQ5_0;

    fn dequantize(b: &BlockQ5_0, y: &mut [f32]) {
        let d = b.d.get();
        for (v, &q) in y.iter_mut().zip(&values(&b.qh, &b.qs)) {
            *v = d * f32::from(q as i8 - 16);
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ5_0) {
        // ggml's choice: the value of largest magnitude maps to −16 exactly.
        let m = v
            .iter()
            .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        b.d.set(m / -16.0);
        let id = inverse(b.d.get());
        let q: [u8; QK] =
            std::array::from_fn(|i| ((v[i] * id + 16.0).round().clamp(0.0, 31.0)) as u8);
        (b.qh, b.qs) = pack(&q);
    }

    fn dot_q8(row: &[BlockQ5_0], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, xb)| {
                let w = values(&b.qh, &b.qs);
                b.d.get() * (xb.d * idot_u(&w, &xb.qs) as f32 - 16.0 * xb.s)
            })
            .sum()
    }
}

impl Format for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    type Block = BlockQ5_1;

    fn dequantize(b: &BlockQ5_1, y: &mut [f32]) {
        let (d, m) = (b.d.get(), b.m.get());
        for (v, &q) in y.iter_mut().zip(&values(&b.qh, &b.qs)) {
            *v = d * f32::from(q) + m;
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ5_1) {
        let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        b.d.set((hi - lo) / 31.0);
        b.m.set(lo);
        let (id, lo) = (inverse(b.d.get()), b.m.get());
        let q: [u8; QK] =
            std::array::from_fn(|i| (((v[i] - lo) * id).round().clamp(0.0, 31.0)) as u8);
        (b.qh, b.qs) = pack(&q);
    }

    fn dot_q8(row: &[BlockQ5_1], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, xb)| {
                let w = values(&b.qh, &b.qs);
                b.d.get() * xb.d * idot_u(&w, &xb.qs) as f32 + b.m.get() * xb.s
            })
            .sum()
    }
}

/// The 32 five-bit values of a block, in value order.
#[inline(always)]
fn values(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let h = u32::from_le_bytes(*qh);
    std::array::from_fn(|i| {
        let low = if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 };
        low | ((((h >> i) & 1) as u8) << 4)
    })
}

/// Five-bit values into the fifth bits and the nibbles.
fn pack(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let h = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (i, &v)| h | (u32::from(v >> 4) << i));
    let qs = std::array::from_fn(|j| (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    (h.to_le_bytes(), qs)
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl super::q4::Q4Block for BlockQ5_0 {
    #[inline(always)]
    fn parts(&self) -> (Half, &[u8; QK / 2]) {
        (self.d, &self.qs)
    }

    #[inline(always)]
    fn min(&self, d: f32, _: impl Fn(Half) -> f32) -> f32 {
        -16.0 * d
    }

    #[inline(always)]
    fn fifth_bits(&self) -> Option<[u8; 4]> {
        Some(self.qh)
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl super::q4::Q4Block for BlockQ5_1 {
    #[inline(always)]
    fn parts(&self) -> (Half, &[u8; QK / 2]) {
        (self.d, &self.qs)
    }

    #[inline(always)]
    fn min(&self, _: f32, half: impl Fn(Half) -> f32) -> f32 {
        half(self.m)
    }

    #[inline(always)]
    fn fifth_bits(&self) -> Option<[u8; 4]> {
        Some(self.qh)
    }
}
