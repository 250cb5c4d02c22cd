//! RMSNorm of each query or key head in place (`shaders/head_norm.wgsl`), for the
//! families that norm them before RoPE.

use crate::webgpu::arena::whole;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;

use super::{compile, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/head_norm.wgsl");

params! {
    /// Where the heads lie in the step's rows.
    struct HeadNormParams {
        /// Floats from one row to the next.
        stride: u32,
        /// Where a row's first normed head starts.
        offset: u32,
        /// Values of a head.
        head_dim: u32,
        /// Added to the mean square.
        eps: f32,
    }
}

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    compile(
        device,
        "head_norm",
        &source::<HeadNormParams>("", &[], SOURCE),
    )
}

/// Norms `heads` heads of `head_dim` from value `offset` of each of `rows` rows of
/// `x` (rows `stride` apart) with gain `g`.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipe: &wgpu::ComputePipeline,
    (x, g): (&wgpu::Buffer, &wgpu::Buffer),
    (rows, stride): (usize, usize),
    (offset, heads, head_dim): (usize, usize, usize),
    eps: f32,
) {
    let p = HeadNormParams {
        stride: stride as u32,
        offset: offset as u32,
        head_dim: head_dim as u32,
        eps,
    };
    let groups = (rows as u32, heads as u32, 1);
    rec.dispatch(Kernel::HeadNorm, pipe, [whole(x), whole(g)], &p, groups);
}
