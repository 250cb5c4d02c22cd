//! RoPE on its own, in place on the queries and keys (`shaders/rope.wgsl`), for the
//! families whose query and key projections cannot fold it into their matmul.

use crate::arch::{ModelConfig, RopeStyle};
use crate::webgpu::arena::whole;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;

use super::{compile, groups_1d, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/rope.wgsl");

params! {
    /// The rows to rotate and the shape of their heads.
    struct RopeParams {
        /// Rows of the step.
        rows: u32,
        /// Floats from one row to the next.
        stride: u32,
        /// Values of a row that are heads to rotate (the queries and keys).
        width: u32,
        /// Values of a head.
        head_dim: u32,
        /// Values of a head that RoPE rotates.
        rope_dims: u32,
        /// Whether a pair is a value and the one `rope_dims / 2` on (1) or neighbours (0).
        halves: u32,
    }
}

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    compile(device, "rope", &source::<RopeParams>("", &[], SOURCE))
}

/// Rotates the queries and keys of `rows` rows of `qkv` (queries, keys and values
/// side by side) by the angles `cs` ((cos, sin) per row and pair).
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipe: &wgpu::ComputePipeline,
    c: &ModelConfig,
    (qkv, cs): (&wgpu::Buffer, &wgpu::Buffer),
    rows: usize,
) {
    let width = c.q_dim() + c.kv_dim();
    let p = RopeParams {
        rows: rows as u32,
        stride: (width + c.kv_dim()) as u32,
        width: width as u32,
        head_dim: c.head_dim as u32,
        rope_dims: c.rope_dims as u32,
        halves: u32::from(c.recipe().rope == RopeStyle::Halves),
    };
    let pairs = rows * (width / c.head_dim) * (c.rope_dims / 2);
    let bindings = [whole(qkv), whole(cs)];
    rec.dispatch(Kernel::Rope, pipe, bindings, &p, groups_1d(pairs as u32));
}
