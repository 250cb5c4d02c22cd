//! What every weight format with kernels here provides, and the table that lists them.
//!
//! A format is a file in `formats/`: its block struct as GGUF stores it, and a
//! [`Format`] impl (expand, round, portable dot). Adding one is that file plus one row
//! of [`formats!`] below; the trait's required items are the compiler's list of what a
//! new format still lacks. Instruction-set kernels (`x86/`, `wasm.rs`) are optional:
//! the matmul runner falls back to the portable dot for a format they do not serve.

use bytemuck::Pod;
use half::f16;

use super::activations::BlockQ8;
use super::formats::{
    Bf16, F16, F32, IQ4_NL, IQ4_XS, Q2K, Q3K, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0,
};
use super::{GgmlType, QK};

/// A weight format with kernels here.
pub(crate) trait Format {
    /// The ggml type whose blocks this reads.
    const TYPE: GgmlType;
    /// One block as GGUF stores it: `#[repr(C)]`, byte fields only (alignment 1, any
    /// bits valid), exactly [`GgmlType::block_bytes`] long (checked by [`formats!`]).
    type Block: Pod;

    /// Expands one block into `out` ([`GgmlType::block_size`] values).
    fn dequantize(block: &Self::Block, out: &mut [f32]);

    /// Rounds [`GgmlType::block_size`] values into one block, to nearest: simple
    /// quantizers, not ggml's error-minimising ones, for writing test models and for
    /// round trips through the dequantizer and the dot kernels.
    fn quantize(values: &[f32], block: &mut Self::Block);

    /// `row · x` against 8-bit activation blocks of [`QK`] values, in portable code:
    /// the path on targets without SIMD kernels for the format, and the reference the
    /// SIMD kernels are tested against.
    fn dot_q8(row: &[Self::Block], x: &[BlockQ8]) -> f32;

    /// `row · x` against f32 values, exact up to f32 rounding: the row is expanded a
    /// block (256 values for the one-value float formats) at a time on the stack, so
    /// the multiply-add loop runs over a slice the compiler vectorises.
    fn dot_f32(row: &[Self::Block], x: &[f32]) -> f32 {
        let bs = Self::TYPE.block_size();
        let per = if bs == 1 { 256 } else { bs };
        let mut buf = [0f32; 256];
        let mut acc = 0f32;
        for (b, xs) in row.chunks(per / bs).zip(x.chunks(per)) {
            let y = &mut buf[..xs.len()];
            for (blk, yv) in b.iter().zip(y.chunks_exact_mut(bs)) {
                Self::dequantize(blk, yv);
            }
            acc += y.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
        }
        acc
    }
}

/// A format's operations on rows of raw bytes, as the dispatchers call them (ggml's
/// type traits): `bytes` hold whole blocks, and the slices' lengths were checked
/// against each other by the caller.
#[derive(Debug)]
pub(crate) struct Kernels {
    /// Expands a row into `out`.
    pub(crate) dequantize_row: fn(bytes: &[u8], out: &mut [f32]),
    /// Rounds `values` into a row.
    pub(crate) quantize_row: fn(values: &[f32], bytes: &mut [u8]),
    /// The portable dot of a row with 8-bit activation blocks.
    pub(crate) dot_q8: fn(bytes: &[u8], x: &[BlockQ8]) -> f32,
    /// The dot of a row with f32 values.
    pub(crate) dot_f32: fn(bytes: &[u8], x: &[f32]) -> f32,
}

impl Kernels {
    const fn of<F: Format>() -> Kernels {
        Kernels {
            dequantize_row: |bytes, out| {
                let bs = F::TYPE.block_size();
                for (b, y) in blocks::<F::Block>(bytes)
                    .iter()
                    .zip(out.chunks_exact_mut(bs))
                {
                    F::dequantize(b, y);
                }
            },
            quantize_row: |values, bytes| {
                let bs = F::TYPE.block_size();
                let out = bytemuck::cast_slice_mut::<u8, F::Block>(bytes);
                for (v, b) in values.chunks_exact(bs).zip(out) {
                    F::quantize(v, b);
                }
            },
            dot_q8: |bytes, x| F::dot_q8(blocks(bytes), x),
            dot_f32: |bytes, x| F::dot_f32(blocks(bytes), x),
        }
    }
}

/// `bytes` (whole blocks) as blocks.
#[inline(always)]
pub(crate) fn blocks<B: Pod>(bytes: &[u8]) -> &[B] {
    bytemuck::cast_slice(bytes)
}

/// The format table: every type with kernels here and the file that holds its format.
/// Each row is checked at compile time against ggml's block geometry.
macro_rules! formats {
    ($($ty:ident => $format:ty),* $(,)?) => {
        /// The types with kernels here, in the table's order.
        pub(crate) const SUPPORTED: &[GgmlType] = &[$(GgmlType::$ty),*];

        /// The row-level operations of `ty`'s format; `None` for a type without kernels.
        pub(crate) fn kernels(ty: GgmlType) -> Option<&'static Kernels> {
            match ty {
                $(GgmlType::$ty => Some(const { &Kernels::of::<$format>() }),)*
                _ => None,
            }
        }

        $(const _: () = {
            assert!(matches!(<$format as Format>::TYPE, GgmlType::$ty));
            type B = <$format as Format>::Block;
            assert!(size_of::<B>() == GgmlType::$ty.block_bytes());
            assert!(align_of::<B>() == 1);
        };)*
    };
}

formats! {
    F32 => F32,
    F16 => F16,
    BF16 => Bf16,
    Q8_0 => Q8_0,
    Q4_0 => Q4_0,
    Q4_1 => Q4_1,
    Q5_0 => Q5_0,
    Q5_1 => Q5_1,
    Q2_K => Q2K,
    Q3_K => Q3K,
    Q4_K => Q4K,
    Q5_K => Q5K,
    Q6_K => Q6K,
    IQ4_NL => IQ4_NL,
    IQ4_XS => IQ4_XS,
}

/// A little-endian IEEE half float as blocks store it (two bytes, alignment 1).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Half(pub(crate) [u8; 2]);

impl Half {
    /// The value, exactly.
    #[inline(always)]
    pub(crate) fn get(self) -> f32 {
        f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }

    /// `v` rounded to the nearest half float.
    pub(crate) fn set(&mut self, v: f32) {
        self.0 = f16::from_f32(v).to_le_bytes();
    }
}

/// The dot of float weights (any [`Format`] of one value per block) with 8-bit
/// activations: each activation block's 32 weights are expanded, dotted with its
/// rounded values and scaled.
pub(crate) fn float_dot_q8<F: Format>(row: &[F::Block], x: &[BlockQ8]) -> f32 {
    row.chunks(QK)
        .zip(x)
        .map(|(b, xb)| {
            let mut y = [0f32; QK];
            for (blk, v) in b.iter().zip(&mut y) {
                F::dequantize(blk, std::slice::from_mut(v));
            }
            let s: f32 = y.iter().zip(&xb.qs).map(|(a, &q)| a * f32::from(q)).sum();
            s * xb.d
        })
        .sum()
}
