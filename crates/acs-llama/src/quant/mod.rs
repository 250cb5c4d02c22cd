//! ggml weight formats: the block layouts GGUF files store, how to expand them, and the
//! matmuls that make CPU inference fast.
//!
//! The hot loop of a CPU forward pass is "one quantized weight row · one activation
//! vector", repeated for every row of every matrix, every token. Expanding each row to
//! f32 first would triple the memory traffic, so the fast path follows llama.cpp: the
//! activation vector is rounded once per matmul to 8-bit blocks of 32
//! ([`QuantizedActivations`]) and every weight block is dotted against it with integer
//! multiply-adds (AVX2 or AVX-512 where the CPU has it, wasm SIMD128 in browsers,
//! portable code elsewhere).
//!
//! Where things are:
//! - `ggml_type.rs`: [`GgmlType`], every type ggml numbers, with its block geometry.
//! - `format.rs`: the `Format` trait every format with kernels
//!   implements, and the table of those formats; `formats/`: one file per family, with
//!   its `#[repr(C)]` block struct. A new format is a file there and a table row.
//! - `activations.rs`: the 8-bit activation blocks.
//! - `matmul.rs`: the public matmuls; `runner.rs`: how their rows are spread over the
//!   cores and which kernel each task calls.
//! - `packed.rs`: matrices repacked into row panels for the fastest kernels.
//! - `x86/`, `wasm.rs`: the instruction-set kernels.

mod activations;
mod format;
mod formats;
mod ggml_type;
mod matmul;
mod packed;
mod runner;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod wasm;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

pub use activations::{QuantizedActivations, quantize_activations};
pub use ggml_type::GgmlType;
pub use matmul::{MatJob, dot_row_q8, matmul, matmul_many, matmul_q8};
pub use packed::PackedMatrix;

/// Values per activation block (and per block of the 32-wide weight formats).
const QK: usize = 32;

/// Why a quantized-data operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no dequantizer or dot kernel here.
    #[error("ggml type {0:?} is not supported")]
    Unsupported(GgmlType),
    /// A row length that does not split into whole blocks.
    #[error("row length {n_cols} is not a multiple of the {ty:?} block size {block}")]
    RaggedRow {
        /// The weight type.
        ty: GgmlType,
        /// The requested row length.
        n_cols: usize,
        /// The type's block size.
        block: usize,
    },
    /// A buffer whose length does not match the shape.
    #[error("{what} has length {actual}, expected {expected}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A size that does not fit in `usize`.
    #[error("tensor size overflows usize")]
    Overflow,
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::Length {
            what,
            expected,
            actual,
        })
    }
}

/// The row-level operations of `ty`, or why there are none.
fn kernels(ty: GgmlType) -> Result<&'static format::Kernels, QuantError> {
    format::kernels(ty).ok_or(QuantError::Unsupported(ty))
}

/// Expands one row of `ty` (`bytes` = whole blocks) into `out`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let k = kernels(ty)?;
    check_len("row bytes", ty.row_bytes(out.len())?, bytes.len())?;
    (k.dequantize_row)(bytes, out);
    Ok(())
}

/// Dot product of one weight row with an f32 vector, exact up to f32 rounding.
///
/// The row is expanded one block at a time on the stack, never as a whole. This is the
/// reference path (and the path for float weights); [`dot_row_q8`] is the fast one.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let k = kernels(ty)?;
    check_len("row bytes", ty.row_bytes(x.len())?, row.len())?;
    Ok((k.dot_f32)(row, x))
}

/// Rounds one row of f32 values into `ty`'s layout (`out` = the row's bytes).
///
/// Simple round-to-nearest quantizers, not ggml's error-minimising ones: they exist
/// to write test models and to round-trip-test the dequantizers and dot kernels.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let k = kernels(ty)?;
    check_len("row bytes", ty.row_bytes(x.len())?, out.len())?;
    (k.quantize_row)(x, out);
    Ok(())
}
