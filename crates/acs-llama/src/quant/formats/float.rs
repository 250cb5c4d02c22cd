//! The plain number formats: F32, F16 and BF16, one value per "block".

use bytemuck::{Pod, Zeroable};
use half::bf16;

use crate::quant::GgmlType;
use crate::quant::activations::BlockQ8;
use crate::quant::format::{Format, Half, float_dot_q8};

/// IEEE single precision.
#[derive(Debug)]
pub(crate) struct F32;

/// IEEE half precision.
#[derive(Debug)]
pub(crate) struct F16;

/// bfloat16: the high half of an f32.
#[derive(Debug)]
pub(crate) struct Bf16;

/// A bfloat16 as stored (two bytes, little-endian).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockBf16([u8; 2]);

impl Format for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    type Block = [u8; 4];

    fn dequantize(b: &[u8; 4], y: &mut [f32]) {
        y[0] = f32::from_le_bytes(*b);
    }

    fn quantize(v: &[f32], b: &mut [u8; 4]) {
        *b = v[0].to_le_bytes();
    }

    fn dot_q8(row: &[[u8; 4]], x: &[BlockQ8]) -> f32 {
        float_dot_q8::<Self>(row, x)
    }

    /// One running sum over the whole row: nothing to expand.
    fn dot_f32(row: &[[u8; 4]], x: &[f32]) -> f32 {
        row.iter()
            .zip(x)
            .map(|(b, &x)| f32::from_le_bytes(*b) * x)
            .sum()
    }
}

impl Format for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    type Block = Half;

    fn dequantize(b: &Half, y: &mut [f32]) {
        y[0] = b.get();
    }

    fn quantize(v: &[f32], b: &mut Half) {
        b.set(v[0]);
    }

    fn dot_q8(row: &[Half], x: &[BlockQ8]) -> f32 {
        float_dot_q8::<Self>(row, x)
    }
}

impl Format for Bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    type Block = BlockBf16;

    fn dequantize(b: &BlockBf16, y: &mut [f32]) {
        y[0] = bf16::from_bits(u16::from_le_bytes(b.0)).to_f32();
    }

    fn quantize(v: &[f32], b: &mut BlockBf16) {
        b.0 = bf16::from_f32(v[0]).to_le_bytes();
    }

    fn dot_q8(row: &[BlockBf16], x: &[BlockQ8]) -> f32 {
        float_dot_q8::<Self>(row, x)
    }
}
