//! One sequence's attention over its cache, storing its new keys and values there
//! (`shaders/attention.wgsl`).

use std::ops::Range;

use crate::arch::ModelConfig;
use crate::quant::GgmlType;
use crate::webgpu::arena::{Binding, Owner, whole};
use crate::webgpu::cache::GpuCache;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;

use super::{HALF, ROUND8, compile, const_u32, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/attention.wgsl");

/// The widest head whose output the kernel rounds itself (`MAX_HEAD` in the shader,
/// the size of its workgroup array for a head).
const MAX_HEAD: usize = 256;

params! {
    /// Where the sequence's rows are, its cache, and the heads' shape.
    struct AttentionParams {
        /// The sequence's first row in the step.
        row0: u32,
        /// Positions in its cache before this step.
        pos0: u32,
        /// Query heads.
        n_heads: u32,
        /// Query heads per key/value head.
        group: u32,
        /// Values of a head.
        head_dim: u32,
        /// Values of a row's queries (heads × head width).
        d: u32,
        /// Values of a row's keys, and of its values.
        kv: u32,
        /// Floats of a row of the step's queries, keys and values.
        stride: u32,
        /// Scores of a (row, head): the positions after this step.
        s_stride: u32,
        /// What the scores are multiplied by (1/sqrt(head_dim) for most families).
        scale: f32,
        /// Whether to round the output to 8-bit blocks (1) or not (0).
        round: u32,
        /// Positions a row attends to, its own included, in a sliding-window layer;
        /// 0 for all of them.
        window: u32,
    }
}

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    let consts = const_u32("MAX_HEAD", MAX_HEAD as u32);
    let src = source::<AttentionParams>(&consts, &[HALF, ROUND8], SOURCE);
    compile(device, "attention", &src)
}

/// Whether the kernel rounds its output for a reader of format `reader`: where that
/// reads 8-bit blocks and a head is whole blocks, at most [`MAX_HEAD`] wide.
pub(crate) fn rounds_for(c: &ModelConfig, reader: GgmlType) -> bool {
    reader.uses_q8_activations() && c.head_dim.is_multiple_of(32) && c.head_dim <= MAX_HEAD
}

/// Attends the new rows of the batch's sequence `si` (rows `span` of the step's) over
/// its `cache` and themselves at `layer`, and appends their keys and values to the cache, in one
/// dispatch; with `round`, the output is rounded to 8-bit blocks for the output
/// projection. `bufs` = the step's queries, keys and values, scores, output.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    pipe: &wgpu::ComputePipeline,
    c: &ModelConfig,
    layer: usize,
    (si, cache, span): (usize, &GpuCache, &Range<usize>),
    round: bool,
    [qkv, scores, out]: [&wgpu::Buffer; 3],
) {
    if span.is_empty() {
        return;
    }
    let Some((ck, cv)) = &cache.kv else {
        return;
    };
    let (d, kv) = (c.q_dim(), c.kv_dim());
    let base = layer as u64 * cache.layer_bytes;
    let slice = |b: &wgpu::Buffer| Binding {
        buf: b.clone(),
        offset: base,
        size: Some(cache.layer_bytes),
    };
    let p = AttentionParams {
        row0: span.start as u32,
        pos0: cache.len as u32,
        n_heads: c.n_heads as u32,
        group: (c.n_heads / c.n_kv_heads) as u32,
        head_dim: c.head_dim as u32,
        d: d as u32,
        kv: kv as u32,
        stride: (d + 2 * kv) as u32,
        s_stride: (cache.len + span.len()) as u32,
        scale: c.attention_scale,
        round: u32::from(round),
        window: c.window(layer).unwrap_or(0) as u32,
    };
    let bindings = [whole(qkv), slice(ck), slice(cv), whole(scores), whole(out)];
    // One workgroup per (new row, head).
    let groups = (span.len() as u32, c.n_heads as u32, 1);
    rec.dispatch_for(
        Owner::Sequence(si),
        Kernel::Attention,
        pipe,
        bindings,
        &p,
        groups,
    );
}
