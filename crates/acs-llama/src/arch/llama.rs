//! The Llama family (Llama 2 and 3, Mistral, SmolLM, TinyLlama): the common block as
//! it is, RoPE on neighbouring values (the converter permutes Q and K for it).

use super::{Activation, Recipe, RopeStyle};

pub(super) const RECIPE: Recipe = Recipe {
    qkv_bias: false,
    rope: RopeStyle::Adjacent,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    fused: false,
};
