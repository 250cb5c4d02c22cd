//! Q8_0: blocks of 32 signed bytes with an f16 scale, value = d·q.

use bytemuck::{Pod, Zeroable};

use super::{amax, idot, inverse};
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half};
use crate::quant::{GgmlType, QK};

/// The Q8_0 format.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub(crate) struct Q8_0;

/// One Q8_0 block: 32 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ8_0 {
    /// The scale.
    pub(crate) d: Half,
    /// The values, as two's-complement bytes.
    pub(crate) qs: [u8; QK],
}

impl Format for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    type Block = BlockQ8_0;

    fn dequantize(b: &BlockQ8_0, y: &mut [f32]) {
        let d = b.d.get();
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = d * f32::from(q as i8);
        }
    }

    fn quantize(v: &[f32], b: &mut BlockQ8_0) {
        b.d.set(amax(v) / 127.0);
        let id = inverse(b.d.get());
        for (q, &x) in b.qs.iter_mut().zip(v) {
            *q = (x * id).round().clamp(-127.0, 127.0) as i8 as u8;
        }
    }

    fn dot_q8(row: &[BlockQ8_0], x: &[BlockQ8]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, xb)| {
                let w: &[i8; QK] = &b.qs.map(|q| q as i8);
                b.d.get() * xb.d * idot(w, &xb.qs) as f32
            })
            .sum()
    }
}
