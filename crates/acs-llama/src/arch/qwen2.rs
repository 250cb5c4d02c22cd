//! The Qwen2 family (Qwen2, Qwen2.5): biases on the query, key and value projections,
//! and RoPE on the halves of each head (the converter keeps the weights as trained).

use super::{Activation, Recipe, RopeStyle};

pub(super) const RECIPE: Recipe = Recipe {
    qkv_bias: true,
    rope: RopeStyle::Halves,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    fused: false,
};
