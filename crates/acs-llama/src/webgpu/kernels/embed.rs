//! The embedding rows of a step's tokens (`shaders/embed.wgsl`).

use crate::quant::GgmlType;
use crate::webgpu::arena::whole;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;
use crate::webgpu::tensor::GpuTensor;

use super::{WG, compile, dequant, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/embed.wgsl");

params! {
    /// One weight buffer's rows and the step's tokens.
    struct EmbedParams {
        /// The buffer's first row.
        row0: u32,
        /// Rows in the buffer.
        rows: u32,
        /// Tokens of the step.
        n_tokens: u32,
        /// Values of a row.
        cols: u32,
        /// Bytes of a row in the weights' format.
        row_bytes: u32,
        /// What the rows are multiplied by (sqrt(d_model) for Gemma, else 1).
        scale: f32,
    }
}

/// The kernel for an embedding in format `ty`.
pub(super) fn pipeline(device: &wgpu::Device, ty: GgmlType) -> wgpu::ComputePipeline {
    let src = source::<EmbedParams>(&dequant::format(ty), &[dequant::SOURCE], SOURCE);
    compile(device, "embed", &src)
}

/// One thread per token and 32 values.
fn groups(cols: usize, tokens: usize) -> (u32, u32, u32) {
    ((cols as u32 / 32).div_ceil(WG), tokens as u32, 1)
}

/// `x` = the rows of `embed` that `tokens` (`n` of them) name, `cols` values each,
/// times `scale`: a dispatch per weight buffer, each writing the tokens whose rows it
/// holds.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipe: &wgpu::ComputePipeline,
    embed: &GpuTensor,
    (tokens, x): (&wgpu::Buffer, &wgpu::Buffer),
    n: usize,
    (cols, scale): (usize, f32),
) {
    for ch in &embed.chunks {
        let p = EmbedParams {
            row0: ch.row0 as u32,
            rows: ch.rows as u32,
            n_tokens: n as u32,
            cols: cols as u32,
            row_bytes: embed.row_bytes as u32,
            scale,
        };
        let bindings = [whole(&ch.buf), whole(tokens), whole(x)];
        rec.dispatch(Kernel::Embed, pipe, bindings, &p, groups(cols, n));
    }
}
