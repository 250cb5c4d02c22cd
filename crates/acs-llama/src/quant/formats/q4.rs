//! Q4_0 and Q4_1: blocks of 32 four-bit values with an f16 scale `d`, value `d·(q − 8)`
//! (Q4_0), or a scale and a min `m`, value `d·q + m` (Q4_1). Byte `j` holds value `j`
//! in its low nibble and value `16 + j` in its high one.

use bytemuck::{Pod, Zeroable};

use super::{idot_u, inverse};
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};
use crate::quant::{GgmlType, QK};

/// The Q4_0 format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct Q4_0;

/// The Q4_1 format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct Q4_1;

/// One Q4_0 block: 32 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ4_0 {
    /// The scale.
    pub(crate) d: Half,
    /// The nibbles.
    pub(crate) qs: [u8; QK / 2],
}

/// One Q4_1 block: 32 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ4_1 {
    /// The scale.
    pub(crate) d: Half,
    /// The min, added to every value.
    pub(crate) m: Half,
    /// The nibbles.
    pub(crate) qs: [u8; QK / 2],
}

impl Format for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    type Block = BlockQ4_0;

    fn dequantize(b: &BlockQ4_0, y: &mut [f32]) {
        let d = b.d.get();
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = d * f32::from((q & 0xF) as i8 - 8);
            y[j + 16] = d * f32::from((q >> 4) as i8 - 8);
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ4_0) {
        // ggml's choice: the value of largest magnitude maps to −8 exactly.
        let m = v
            .iter()
            .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        b.d.set(m / -8.0);
        let id = inverse(b.d.get());
        let q = |x: f32| ((x * id + 8.0).round().clamp(0.0, 15.0)) as u8;
        for j in 0..16 {
            b.qs[j] = q(v[j]) | (q(v[j + 16]) << 4);
        }
    }

    fn dot_q8(row: &[BlockQ4_0], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, xb)| {
                let w = nibbles(&b.qs);
                b.d.get() * (xb.d * idot_u(&w, &xb.qs) as f32 - 8.0 * xb.s)
            })
            .sum()
    }
}

impl Format for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    type Block = BlockQ4_1;

    fn dequantize(b: &BlockQ4_1, y: &mut [f32]) {
        let (d, m) = (b.d.get(), b.m.get());
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = d * f32::from(q & 0xF) + m;
            y[j + 16] = d * f32::from(q >> 4) + m;
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ4_1) {
        let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        b.d.set((hi - lo) / 15.0);
        b.m.set(lo);
        let (id, lo) = (inverse(b.d.get()), b.m.get());
        let q = |x: f32| (((x - lo) * id).round().clamp(0.0, 15.0)) as u8;
        for j in 0..16 {
            b.qs[j] = q(v[j]) | (q(v[j + 16]) << 4);
        }
    }

    fn dot_q8(row: &[BlockQ4_1], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, xb)| {
                let w = nibbles(&b.qs);
                b.d.get() * xb.d * idot_u(&w, &xb.qs) as f32 + b.m.get() * xb.s
            })
            .sum()
    }
}

/// The 32 nibbles of a block in value order: low nibbles then high.
#[inline(always)]
fn nibbles(q: &[u8; QK / 2]) -> [u8; QK] {
    std::array::from_fn(|i| if i < 16 { q[i] & 0xF } else { q[i - 16] >> 4 })
}

/// The parts of a Q4_0, Q4_1, Q5_0 or Q5_1 block that code shared by all four reads
/// (the wasm kernels, which serve them with one loop).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) trait Q4Block {
    /// The scale and the nibbles.
    fn parts(&self) -> (Half, &[u8; QK / 2]);
    /// The block's min, `d` being its scale as read by `half`.
    fn min(&self, d: f32, half: impl Fn(Half) -> f32) -> f32;
    /// The fifth bits of a Q5 block (value `i` at bit `i` of the little-endian word).
    #[inline(always)]
    fn fifth_bits(&self) -> Option<[u8; 4]> {
        None
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl Q4Block for BlockQ4_0 {
    #[inline(always)]
    fn parts(&self) -> (Half, &[u8; QK / 2]) {
        (self.d, &self.qs)
    }

    #[inline(always)]
    fn min(&self, d: f32, _: impl Fn(Half) -> f32) -> f32 {
        -8.0 * d
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl Q4Block for BlockQ4_1 {
    #[inline(always)]
    fn parts(&self) -> (Half, &[u8; QK / 2]) {
        (self.d, &self.qs)
    }

    #[inline(always)]
    fn min(&self, _: f32, half: impl Fn(Half) -> f32) -> f32 {
        half(self.m)
    }
}
