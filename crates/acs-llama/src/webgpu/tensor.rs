//! Weights on the device: matrices in their ggml format, split by rows into buffers
//! that each fit the device's binding limit, and the bytes written to buffers.

use std::borrow::Cow;

use crate::error::ModelError;
use crate::quant::GgmlType;

use super::device::bind_limit;
use super::error::GpuError;
use super::kernels::dequant::SUPPORTED;

/// One weight buffer of a tensor: rows `row0 .. row0 + rows`.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) row0: usize,
    pub(crate) rows: usize,
}

/// A weight matrix on the device, in its ggml format, split by rows into buffers that
/// each fit the device's binding limit.
#[derive(Debug, Clone)]
pub(crate) struct GpuTensor {
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) chunks: Vec<Chunk>,
}

/// A block's weights and norms on the device. The matrices that read the same input
/// come as a list whose rows, in order, are the outputs' rows side by side: one
/// tensor where the loader stacked them (see [`super::GpuLoader::new`]), one matmul
/// dispatch for all; each on its own where their formats differ (as llama.cpp's mixed
/// quantizations make the value projection), a dispatch each into the same rows.
#[derive(Debug)]
pub(crate) struct GpuBlock {
    pub(crate) attn_norm: wgpu::Buffer,
    /// Query, key and value projections.
    pub(crate) qkv: Vec<GpuTensor>,
    /// Their biases side by side, where the family has them.
    pub(crate) qkv_bias: Option<wgpu::Buffer>,
    /// The query and key heads' norms, where the family has them.
    pub(crate) qk_norm: Option<[wgpu::Buffer; 2]>,
    /// The norms of the attention and MLP outputs, where the family has them.
    pub(crate) post_norms: Option<[wgpu::Buffer; 2]>,
    pub(crate) wo: GpuTensor,
    pub(crate) ffn_norm: wgpu::Buffer,
    /// Gate and up projections.
    pub(crate) gate_up: Vec<GpuTensor>,
    pub(crate) down: GpuTensor,
}

impl GpuTensor {
    /// The device buffers of a weight matrix (split by rows under the binding
    /// limit), empty: the loader fills them as the bytes come.
    pub(crate) fn create(
        device: &wgpu::Device,
        limits: &wgpu::Limits,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
    ) -> Result<GpuTensor, GpuError> {
        if !SUPPORTED.contains(&ty) {
            return Err(GpuError::Unsupported {
                name: name.to_owned(),
                ty,
            });
        }
        // The kernels expand 32 values at a time.
        if !cols.is_multiple_of(32) {
            return Err(ModelError::Shape(format!(
                "{name}: row length {cols} is not a multiple of 32"
            ))
            .into());
        }
        let row_bytes = ty.row_bytes(cols).map_err(ModelError::from)?;
        let limit = bind_limit(limits);
        let per = rows_per_buffer(limits, row_bytes);
        if per == 0 {
            return Err(GpuError::TooLarge {
                what: format!("a row of {name}"),
                needed: row_bytes as u64,
                limit,
            });
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = per.min(rows - row0);
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size: ((n * row_bytes).div_ceil(4) * 4) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            chunks.push(Chunk { buf, row0, rows: n });
            row0 += n;
        }
        Ok(GpuTensor {
            ty,
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    /// Bytes of its weights.
    pub(crate) fn bytes(&self) -> u64 {
        (self.rows * self.row_bytes) as u64
    }
}

/// Rows of `row_bytes` a weight buffer holds: whole rows within the binding limit,
/// less a word of padding slack, and an even number of them, so that a pair of rows
/// RoPE rotates together is never split between buffers.
pub(crate) fn rows_per_buffer(limits: &wgpu::Limits, row_bytes: usize) -> usize {
    ((bind_limit(limits) - 4) / row_bytes as u64) as usize & !1
}

/// Bytes `data` padded with zeros to whole words (storage buffers hold `u32`s).
pub(crate) fn padded(data: &[u8]) -> Cow<'_, [u8]> {
    if data.len().is_multiple_of(4) && !data.is_empty() {
        Cow::Borrowed(data)
    } else {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(4).max(1) * 4, 0);
        Cow::Owned(v)
    }
}

/// The bytes of `v`, as the kernels read f32s.
pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
