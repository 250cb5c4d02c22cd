//! The matmuls of the forward pass: weight matrices in any supported format against a
//! batch of activation vectors, their rows spread over the cores (`runner.rs`).

use super::activations::QuantizedActivations;
use super::packed::PackedMatrix;
use super::runner::{dot_q8_dispatch, run_jobs};
use super::{GgmlType, QuantError, check_len};
use crate::cpu::isa::Isa;

/// `out[b * n_rows + r] = W[r] · xs[b * n_cols ..][..n_cols]` for a row-major weight
/// matrix `W` of `n_rows × n_cols` values of type `ty`, for a batch of activation
/// vectors laid end to end in `xs`.
///
/// Block formats round each activation vector to 8 bits first (as llama.cpp does);
/// each weight row is read once for the whole batch, which is what makes batched
/// decoding cheaper per token than one vector at a time.
pub fn matmul(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    xs: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let mut job = [MatJob {
        ty,
        weights,
        packed: None,
        n_rows,
        out,
    }];
    matmul_many(&mut job, n_cols, xs, &mut QuantizedActivations::default())
}

/// One weight matrix of a [`matmul_many`] call and where its results go
/// (`out[b * n_rows + r]`, as in [`matmul`]).
#[derive(Debug)]
pub struct MatJob<'a> {
    /// The weights' format.
    pub ty: GgmlType,
    /// Row-major `n_rows × n_cols` weights.
    pub weights: &'a [u8],
    /// The same weights rearranged by [`PackedMatrix::new`], used instead of
    /// `weights` when present.
    pub packed: Option<&'a PackedMatrix>,
    /// Rows (outputs per vector).
    pub n_rows: usize,
    /// `batch × n_rows` results.
    pub out: &'a mut [f32],
}

/// Several matrices against the same activations in one parallel pass: the vectors
/// are rounded to 8 bits once (into `scratch`, reused across calls) and the rows of
/// all matrices are shared out to the cores together, so Q, K and V (or gate and up)
/// cost one fork-join instead of three.
pub fn matmul_many(
    jobs: &mut [MatJob<'_>],
    n_cols: usize,
    xs: &[f32],
    scratch: &mut QuantizedActivations,
) -> Result<(), QuantError> {
    if n_cols == 0 || !xs.len().is_multiple_of(n_cols) {
        return Err(QuantError::Length {
            what: "activations",
            expected: n_cols,
            actual: xs.len(),
        });
    }
    let batch = xs.len() / n_cols;
    for j in jobs.iter() {
        if !j.ty.is_supported() {
            return Err(QuantError::Unsupported(j.ty));
        }
        check_matrix(j.ty, j.weights, j.n_rows, n_cols, batch, j.out.len())?;
        if let Some(p) = j.packed
            && (p.n_rows, p.n_cols) != (j.n_rows, n_cols)
        {
            return Err(QuantError::Length {
                what: "packed matrix rows",
                expected: j.n_rows,
                actual: p.n_rows,
            });
        }
    }
    if jobs.iter().any(|j| j.ty.uses_q8_activations()) {
        scratch.quantize_from(xs, n_cols)?;
        #[cfg(target_arch = "x86_64")]
        if jobs
            .iter()
            .any(|j| j.packed.is_some_and(super::x86::packed::reads_flipped))
        {
            scratch.hold_flipped();
        }
    } else {
        *scratch = QuantizedActivations::default();
    }
    run_jobs(jobs, n_cols, batch, xs, scratch);
    Ok(())
}

/// [`matmul`] with activations already quantized (by [`QuantizedActivations::quantize_from`]),
/// so that one rounding can serve many calls. Block formats only.
pub fn matmul_q8(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    qx: &QuantizedActivations,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if !ty.is_supported() || !ty.uses_q8_activations() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("quantized activations", n_cols, qx.len)?;
    check_matrix(ty, weights, n_rows, n_cols, qx.count, out.len())?;
    let mut job = [MatJob {
        ty,
        weights,
        packed: None,
        n_rows,
        out,
    }];
    run_jobs(&mut job, n_cols, qx.count, &[], qx);
    Ok(())
}

/// Validates a matmul's shapes and returns the bytes per weight row.
fn check_matrix(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    batch: usize,
    out_len: usize,
) -> Result<usize, QuantError> {
    let rb = ty.row_bytes(n_cols)?;
    let total = rb.checked_mul(n_rows).ok_or(QuantError::Overflow)?;
    check_len("weights", total, weights.len())?;
    let out_total = n_rows.checked_mul(batch).ok_or(QuantError::Overflow)?;
    check_len("output", out_total, out_len)?;
    Ok(rb)
}

/// Fast dot product of one quantized weight row with quantized activations (the
/// first vector of `qx`).
///
/// Float weight types (F32, F16, BF16) are accepted too, against the 8-bit values, but
/// [`matmul`] keeps f32 activations for them.
pub fn dot_row_q8(ty: GgmlType, row: &[u8], qx: &QuantizedActivations) -> Result<f32, QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("row bytes", ty.row_bytes(qx.len)?, row.len())?;
    if qx.count == 0 {
        return Ok(0.0);
    }
    Ok(dot_q8_dispatch(Isa::detect(), ty, row, qx, 0))
}
