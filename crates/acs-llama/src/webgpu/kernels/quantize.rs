//! Rounding a matmul's input to 8-bit blocks, or the feed-forward's SwiGLU rounded
//! on the way (`shaders/quantize.wgsl`).

use crate::arch::Activation;
use crate::webgpu::arena::whole;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;

use super::{ROUND8, compile, groups_1d, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/quantize.wgsl");

params! {
    /// What to round, and whether it is the MLP's gated activation.
    struct QuantizeParams {
        /// Blocks of 32 values.
        n_blocks: u32,
        /// Whether the values are silu(gate) · up (1), gelu(gate) · up (2) or the
        /// input as it is (0).
        gated: u32,
        /// With `gated`, the width of the gate and of the up projection.
        width: u32,
        /// Whether to round (1) or store the values as they are (0).
        round: u32,
    }
}

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    compile(
        device,
        "quantize",
        &source::<QuantizeParams>("", &[ROUND8], SOURCE),
    )
}

/// Rounds `n_blocks` blocks of 32 of `input` to 8 bits into `out`. With `gated`,
/// `input` holds rows of gate and up projections of that width each, and the values
/// are the feed-forward's activation, act(gate) · up, rounded only if `round`.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipe: &wgpu::ComputePipeline,
    (input, out): (&wgpu::Buffer, &wgpu::Buffer),
    gated: Option<(usize, Activation)>,
    round: bool,
    n_blocks: usize,
) {
    let n = n_blocks as u32;
    let p = QuantizeParams {
        n_blocks: n,
        gated: match gated {
            None => 0,
            Some((_, Activation::Silu)) => 1,
            Some((_, Activation::Gelu)) => 2,
        },
        width: gated.map_or(0, |(w, _)| w) as u32,
        round: u32::from(round),
    };
    let kernel = match gated {
        Some(_) => Kernel::SwiGlu,
        None => Kernel::Quantize,
    };
    let bindings = [whole(input), whole(out)];
    rec.dispatch(kernel, pipe, bindings, &p, groups_1d(n));
}
