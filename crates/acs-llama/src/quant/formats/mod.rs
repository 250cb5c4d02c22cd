//! One file per family of weight formats: each block as GGUF stores it (ggml's
//! `ggml-common.h` layouts, multi-byte fields little-endian, scales IEEE half floats)
//! and its [`Format`](super::format::Format) impl.

mod float;
mod iq4;
mod k4;
mod q2_k;
mod q3_k;
mod q4;
mod q5;
mod q6_k;
mod q8_0;

pub(crate) use float::{Bf16, F16, F32};
pub(crate) use iq4::{BlockIq4Nl, BlockIq4Xs, IQ4_NL, IQ4_VALUES, IQ4_XS};
#[cfg(target_arch = "x86_64")]
pub(crate) use k4::KScales;
pub(crate) use k4::{BlockQ4K, BlockQ5K, KBlock, Q4K, Q5K, unpack_scales_k4};
pub(crate) use q2_k::{BlockQ2K, Q2K, low_bits};
pub(crate) use q3_k::{BlockQ3K, Q3K};
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) use q4::Q4Block;
pub(crate) use q4::{BlockQ4_0, BlockQ4_1, Q4_0, Q4_1};
pub(crate) use q5::{BlockQ5_0, BlockQ5_1, Q5_0, Q5_1};
pub(crate) use q6_k::{BlockQ6K, Q6K};
pub(crate) use q8_0::{BlockQ8_0, Q8_0};

use super::QK;
use super::activations::BlockQ8;

/// Σ w·x over a block of signed weights.
#[inline(always)]
fn idot(w: &[i8; QK], x: &[i8; QK]) -> i32 {
    w.iter()
        .zip(x)
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum()
}

/// Σ w·x over a block of unsigned weights.
#[inline(always)]
fn idot_u(w: &[u8; QK], x: &[i8; QK]) -> i32 {
    w.iter()
        .zip(x)
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum()
}

/// A super-block of 256 values in sixteen groups of 16 with a scale each (Q2_K,
/// Q3_K, Q6_K) against its eight activation blocks: per block `s`, the block and the
/// integer sum over its two groups of `scale(g) · Σ value(e) · x(e)` (elements `e`
/// and groups `g` numbered within the super-block).
fn groups_of_16<'a>(
    xs: &'a [BlockQ8],
    value: impl Fn(usize) -> i32 + 'a,
    scale: impl Fn(usize) -> i32 + 'a,
) -> impl Iterator<Item = (usize, &'a BlockQ8, i32)> + 'a {
    xs.iter().enumerate().map(move |(s, xb)| {
        let isum = xb
            .qs
            .chunks_exact(16)
            .enumerate()
            .map(|(h, xh)| {
                let e0 = 32 * s + 16 * h;
                let part: i32 = xh
                    .iter()
                    .enumerate()
                    .map(|(i, &q)| value(e0 + i) * i32::from(q))
                    .sum();
                scale(e0 / 16) * part
            })
            .sum();
        (s, xb, isum)
    })
}

/// The largest magnitude of `v`.
fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// `1 / d`, or 0 for a zero scale (an all-zero block).
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}
