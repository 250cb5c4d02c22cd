//! The Phi-3 family (Phi-3 and 3.5 mini and medium): the common block with the query,
//! key and value projections fused into one tensor and the gate and up ones into
//! another, and RoPE on the halves of each head. The files' sliding window is not
//! applied (llama.cpp does not either: the converter's window does not match
//! training); the 128k files' LongRoPE is refused.

use super::{Activation, Recipe, RopeStyle};

pub(super) const RECIPE: Recipe = Recipe {
    qkv_bias: false,
    rope: RopeStyle::Halves,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    fused: true,
};
