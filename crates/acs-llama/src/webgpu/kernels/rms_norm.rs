//! RMSNorm, rounding its output to 8-bit blocks as well where the matmuls that read
//! it take those (`shaders/rms_norm.wgsl`).

use crate::webgpu::arena::whole;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;

use super::{ROUND8, compile, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/rms_norm.wgsl");

params! {
    /// The rows' width and the norm's epsilon.
    struct RmsNormParams {
        /// Values of a row.
        d: u32,
        /// Added to the mean square.
        eps: f32,
        /// Whether to write the rounded rows too (1) or not (0).
        round: u32,
    }
}

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    compile(
        device,
        "rms_norm",
        &source::<RmsNormParams>("", &[ROUND8], SOURCE),
    )
}

/// `out` = `x` normalized with gain `g` for `rows` rows of `d`, and rounded to 8-bit
/// blocks into `xq` as well if `round`; `bufs` = `x`, `g`, `out`, `xq`.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipe: &wgpu::ComputePipeline,
    bufs: [&wgpu::Buffer; 4],
    rows: usize,
    (d, eps): (usize, f32),
    round: bool,
) {
    let p = RmsNormParams {
        d: d as u32,
        eps,
        round: u32::from(round),
    };
    // One workgroup per row.
    let groups = (rows as u32, 1, 1);
    rec.dispatch(Kernel::RmsNorm, pipe, bufs.map(whole), &p, groups);
}
