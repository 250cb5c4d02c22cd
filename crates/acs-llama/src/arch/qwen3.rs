//! The Qwen3 family (dense): Qwen2's block without the biases, with each query and
//! key head RMS-normalised before RoPE, and a head width of its own
//! (`attention.key_length`, 128 where d_model/heads is 64 for the 0.6B).

use super::{Activation, Recipe, RopeStyle};

pub(super) const RECIPE: Recipe = Recipe {
    qkv_bias: false,
    rope: RopeStyle::Halves,
    qk_norm: true,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    fused: false,
};
