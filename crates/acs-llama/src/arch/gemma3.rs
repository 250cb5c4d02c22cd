//! The Gemma 3 family (text): query and key heads RMS-normalised before RoPE, the
//! attention and MLP outputs normalised again before they join the residual stream,
//! a GELU-gated MLP, embeddings scaled by sqrt(d_model), a head width of its own, and
//! layers that attend to a sliding window of positions with a RoPE base of their own
//! but every `sliding_window_pattern`-th one (see [`ModelConfig`](super::ModelConfig)).
//!
//! The GGUF converter already adds Gemma's 1 to every norm weight, so the norms are
//! the common RMSNorm.

use super::config::SlidingWindow;
use super::{Activation, Recipe, RopeStyle};
use crate::gguf::Metadata;

pub(super) const RECIPE: Recipe = Recipe {
    qkv_bias: false,
    rope: RopeStyle::Halves,
    qk_norm: true,
    post_norms: true,
    activation: Activation::Gelu,
    scaled_embedding: true,
    fused: false,
};

/// Layers in a period of the local/global pattern where the file does not say
/// (`gemma3.attention.sliding_window_pattern`): five sliding-window layers, then one
/// global.
const SLIDING_WINDOW_PATTERN: usize = 6;

/// RoPE base of the sliding-window layers where the file does not say
/// (`gemma3.rope.freq_base_swa`).
const LOCAL_ROPE_BASE: f32 = 10_000.0;

/// Block count of Gemma 3 27B, the one size trained with its queries scaled by
/// 1/sqrt(d_model/heads) rather than 1/sqrt(head width) (its
/// `query_pre_attn_scalar`), which its GGUF does not carry.
const LAYERS_27B: usize = 62;

/// What the attention scores are multiplied by.
pub(super) fn attention_scale(
    d_model: usize,
    n_heads: usize,
    head_dim: usize,
    n_layers: usize,
) -> f32 {
    let width = if n_layers == LAYERS_27B {
        d_model / n_heads
    } else {
        head_dim
    };
    1.0 / (width as f32).sqrt()
}

/// The sliding-window layers of a file with a window (`key` makes a metadata key of
/// the family's).
pub(super) fn sliding_window(
    meta: &Metadata,
    key: &dyn Fn(&str) -> String,
    n_layers: usize,
) -> Option<SlidingWindow> {
    let size = meta
        .get_usize(&key("attention.sliding_window"))
        .ok()
        .filter(|&w| w > 0)?;
    let period = meta
        .get_usize(&key("attention.sliding_window_pattern"))
        .unwrap_or(SLIDING_WINDOW_PATTERN)
        .max(1);
    Some(SlidingWindow {
        size,
        local: (0..n_layers).map(|l| l % period < period - 1).collect(),
        rope_base: meta
            .get_f32(&key("rope.freq_base_swa"))
            .unwrap_or(LOCAL_ROPE_BASE),
    })
}
