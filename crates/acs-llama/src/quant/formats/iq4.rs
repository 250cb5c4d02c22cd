//! IQ4_NL and IQ4_XS: 4-bit indices into one fixed table of 16 signed values spaced
//! for the weights' bell-shaped spread ([`IQ4_VALUES`], ggml's `kvalues_iq4nl`),
//! times a scale. IQ4_NL: blocks of 32 with an f16 `d`, indices packed as Q4_0's
//! nibbles (low nibbles values 0..16, high ones 16..32): value `d·table[q]`. IQ4_XS:
//! super-blocks of 256 with an f16 `d` and eight 6-bit sub-block scales (stored + 32:
//! four low bits in `scales_l`, two high ones in `scales_h`), each sub-block of 32 as
//! an IQ4_NL block's nibbles: value `d·(ls − 32)·table[q]`.

use bytemuck::{Pod, Zeroable};

use super::{idot, inverse};
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};
use crate::quant::{GgmlType, QK};

/// The values the indices pick.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Values per IQ4_XS super-block.
const QK_K: usize = 256;

/// The IQ4_NL format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct IQ4_NL;

/// The IQ4_XS format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct IQ4_XS;

/// One IQ4_NL block: 32 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIq4Nl {
    /// The scale.
    pub(crate) d: Half,
    /// The indices, two a byte.
    pub(crate) qs: [u8; QK / 2],
}

/// One IQ4_XS super-block: 256 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIq4Xs {
    /// The scales' scale.
    pub(crate) d: Half,
    /// The sub-block scales' two high bits, two each, sub-block `j` at bit `2j` of
    /// the little-endian word.
    pub(crate) scales_h: [u8; 2],
    /// Their four low bits, sub-block `j` in nibble `j % 2` of byte `j / 2`.
    pub(crate) scales_l: [u8; QK_K / 64],
    /// The indices, each sub-block's 16 bytes as an IQ4_NL block's.
    pub(crate) qs: [u8; QK_K / 2],
}

impl BlockIq4Xs {
    /// Sub-block `j`'s signed scale.
    #[inline(always)]
    pub(crate) fn scale(&self, j: usize) -> i32 {
        let low = (self.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
        let high = (u16::from_le_bytes(self.scales_h) >> (2 * j)) & 3;
        (i32::from(low) | (i32::from(high) << 4)) - 32
    }
}

/// The 32 values of one block's indices `qs`, in value order.
#[inline(always)]
pub(crate) fn iq4_values(qs: &[u8]) -> [i8; QK] {
    std::array::from_fn(|i| {
        let q = if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 };
        IQ4_VALUES[usize::from(q)]
    })
}

/// The index of the table value nearest `v`.
fn nearest(v: f32) -> u8 {
    (0..16u8)
        .min_by(|&a, &b| {
            let da = (f32::from(IQ4_VALUES[usize::from(a)]) - v).abs();
            let db = (f32::from(IQ4_VALUES[usize::from(b)]) - v).abs();
            da.total_cmp(&db)
        })
        .unwrap_or(0)
}

/// The value of largest magnitude in `v`, with its sign.
fn signed_max(v: &[f32]) -> f32 {
    v.iter()
        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m })
}

/// Indices of `v` against the step `d` into `qs` (16 bytes).
fn pack(v: &[f32], d: f32, qs: &mut [u8]) {
    let id = inverse(d);
    for j in 0..16 {
        qs[j] = nearest(v[j] * id) | (nearest(v[j + 16] * id) << 4);
    }
}

impl Format for IQ4_NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    type Block = BlockIq4Nl;

    fn dequantize(b: &BlockIq4Nl, y: &mut [f32]) {
        let d = b.d.get();
        for (v, q) in y.iter_mut().zip(iq4_values(&b.qs)) {
            *v = d * f32::from(q);
        }
    }

    fn quantize(v: &[f32], b: &mut BlockIq4Nl) {
        // The value of largest magnitude lands on the table's end of its sign.
        b.d.set(signed_max(v) / -127.0);
        pack(v, b.d.get(), &mut b.qs);
    }

    fn dot_q8(row: &[BlockIq4Nl], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, xb)| b.d.get() * xb.d * idot(&iq4_values(&b.qs), &xb.qs) as f32)
            .sum()
    }
}

impl Format for IQ4_XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    type Block = BlockIq4Xs;

    fn dequantize(b: &BlockIq4Xs, y: &mut [f32]) {
        let d = b.d.get();
        for (j, ys) in y.chunks_exact_mut(QK).enumerate() {
            let dl = d * b.scale(j) as f32;
            for (v, q) in ys.iter_mut().zip(iq4_values(&b.qs[16 * j..16 * j + 16])) {
                *v = dl * f32::from(q);
            }
        }
    }

    fn quantize(v: &[f32], b: &mut BlockIq4Xs) {
        *b = BlockIq4Xs::zeroed();
        let steps: Vec<f32> = v.chunks_exact(QK).map(|c| signed_max(c) / -127.0).collect();
        b.d.set(steps.iter().fold(0f32, |m, s| m.max(s.abs())) / 31.0);
        let d = b.d.get();
        let mut high = 0u16;
        for (j, &step) in steps.iter().enumerate() {
            let ls = ((step * inverse(d)).round().clamp(-32.0, 31.0) as i32 + 32) as u8;
            b.scales_l[j / 2] |= (ls & 0xF) << (4 * (j % 2));
            high |= u16::from(ls >> 4) << (2 * j);
            let dl = d * (i32::from(ls) - 32) as f32;
            pack(&v[QK * j..QK * j + QK], dl, &mut b.qs[16 * j..16 * j + 16]);
        }
        b.scales_h = high.to_le_bytes();
    }

    fn dot_q8(row: &[BlockIq4Xs], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x.chunks_exact(8))
            .map(|(b, xs)| {
                let d = b.d.get();
                xs.iter()
                    .enumerate()
                    .map(|(j, xb)| {
                        let w = iq4_values(&b.qs[16 * j..16 * j + 16]);
                        d * b.scale(j) as f32 * xb.d * idot(&w, &xb.qs) as f32
                    })
                    .sum::<f32>()
            })
            .sum()
    }
}
