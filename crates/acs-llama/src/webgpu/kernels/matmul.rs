//! A weight matrix in its ggml format times the step's vectors, with the residual
//! add or RoPE folded in (`shaders/matmul.wgsl`).

use std::collections::HashMap;

use crate::arch::ModelConfig;
use crate::quant::GgmlType;
use crate::webgpu::arena::whole;
use crate::webgpu::profile::{Kernel, Work};
use crate::webgpu::recorder::Recorder;
use crate::webgpu::tensor::GpuTensor;

use super::{WG, compile, const_u32, dequant, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/matmul.wgsl");

/// Vectors per workgroup (`TILE` in the shader).
const TILE: u32 = 8;

/// How the matmul kernels spread a weight row over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulLayout {
    /// One thread per row: what adapters running on the CPU (lavapipe, SwiftShader)
    /// vectorise best, since they run threads as SIMD lanes and pay for barriers.
    ThreadPerRow,
    /// 16 threads per row reading its blocks in turn, summed in workgroup memory: a
    /// GPU's coalesced reads, and enough threads for the small matrices of decode.
    LanesPerRow,
}

impl MatmulLayout {
    /// The layout for an adapter: per row on CPU-based adapters, lanes on GPUs.
    pub fn for_adapter(info: &wgpu::AdapterInfo) -> Self {
        if info.device_type == wgpu::DeviceType::Cpu {
            MatmulLayout::ThreadPerRow
        } else {
            MatmulLayout::LanesPerRow
        }
    }

    /// Threads that share a row (`LANES` in the shader).
    fn lanes(self) -> u32 {
        match self {
            MatmulLayout::ThreadPerRow => 1,
            MatmulLayout::LanesPerRow => 16,
        }
    }
}

params! {
    /// The rows of one weight buffer, the batch, and where and how results go.
    struct MatmulParams {
        /// Rows in the weight buffer.
        rows: u32,
        /// The output column of its first row.
        row0: u32,
        /// Floats of an output row.
        out_stride: u32,
        /// Values of a weight row.
        cols: u32,
        /// Vectors multiplied.
        batch: u32,
        /// Bytes of a weight row in its format.
        row_bytes: u32,
        /// Whether to add to the output (1) or overwrite it (0).
        accumulate: u32,
        /// Output columns below this one (the queries and keys) are rotated by RoPE.
        rope_end: u32,
        /// Values of a head.
        head_dim: u32,
        /// Values of a head that RoPE rotates.
        rope_dims: u32,
    }
}

/// The matmul kernels: one per weight format, and per whether it applies RoPE.
#[derive(Debug)]
pub(crate) struct Pipelines {
    by_format: HashMap<(GgmlType, bool), wgpu::ComputePipeline>,
    /// Weight rows per workgroup.
    rows: u32,
}

impl Pipelines {
    /// A kernel for each of `formats`, and one that applies RoPE for each of
    /// `rope_formats` (the query and key projections').
    pub(super) fn new(
        device: &wgpu::Device,
        [formats, rope_formats]: [&[GgmlType]; 2],
        layout: MatmulLayout,
    ) -> Self {
        let lanes = layout.lanes();
        let rows = WG / lanes;
        let by_format = formats
            .iter()
            .map(|&ty| (ty, false))
            .chain(rope_formats.iter().map(|&ty| (ty, true)))
            .map(|(ty, rope)| {
                let consts = [
                    dequant::format(ty),
                    const_u32("ROWS", rows),
                    const_u32("LANES", lanes),
                    const_u32("TILE", TILE),
                    format!("const ROPE: bool = {rope};\n"),
                ]
                .concat();
                let src = source::<MatmulParams>(&consts, &[dequant::SOURCE], SOURCE);
                ((ty, rope), compile(device, "matmul", &src))
            })
            .collect();
        Pipelines { by_format, rows }
    }
}

/// How a matmul writes its results.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Store<'a> {
    /// Overwrites the output.
    Set,
    /// Adds to the output: the residual stream, so that its add costs no dispatch.
    Add,
    /// Overwrites the output, its queries and keys (each row's first `d + kv_dim`
    /// values) rotated by RoPE with these angles, so that RoPE costs no dispatch.
    Rotated(&'a wgpu::Buffer),
}

/// Where a matrix's results go: `out`'s rows of `stride` floats, from column `at`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) out: &'a wgpu::Buffer,
    pub(crate) store: Store<'a>,
    pub(crate) stride: usize,
    pub(crate) at: usize,
}

/// `target` = `w` · `x` for `batch` vectors (`x` rounded to 8-bit blocks where `w`
/// reads those), a dispatch per weight buffer.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipes: &Pipelines,
    c: &ModelConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    target: Target<'_>,
    batch: usize,
) {
    let (angles, rope_end) = match target.store {
        Store::Rotated(angles) => (angles, c.q_dim() + c.kv_dim()),
        Store::Set | Store::Add => (x, 0),
    };
    let pipe = &pipes.by_format[&(w.ty, rope_end > 0)];
    for ch in &w.chunks {
        let p = MatmulParams {
            rows: ch.rows as u32,
            row0: (target.at + ch.row0) as u32,
            out_stride: target.stride as u32,
            cols: w.cols as u32,
            batch: batch as u32,
            row_bytes: w.row_bytes as u32,
            accumulate: u32::from(matches!(target.store, Store::Add)),
            rope_end: rope_end as u32,
            head_dim: c.head_dim as u32,
            rope_dims: c.rope_dims as u32,
        };
        // ROWS rows and TILE vectors per workgroup.
        let groups = (
            (ch.rows as u32).div_ceil(pipes.rows),
            (batch as u32).div_ceil(TILE),
            1,
        );
        let bindings = [whole(&ch.buf), whole(x), whole(target.out), whole(angles)];
        let work = Work {
            kernel: Kernel::Matmul {
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
            },
            weight_bytes: (ch.rows * w.row_bytes) as u64,
        };
        rec.dispatch(work, pipe, bindings, &p, groups);
    }
}
