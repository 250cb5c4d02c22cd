//! The Phi-3 family (Phi-3 and 3.5 mini and medium): the common block with the query,
//! key and value projections fused into one tensor and the gate and up ones into
//! another, and RoPE on the halves of each head. The files' sliding window is not
//! applied (llama.cpp does not either: the converter's window does not match
//! training); the 128k files' LongRoPE is refused.

use super::{Activation, Recipe, RopeStyle};
use crate::error::ModelError;
use crate::gguf::Metadata;

pub(super) const RECIPE: Recipe = Recipe {
    qkv_bias: false,
    rope: RopeStyle::Halves,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    fused: true,
};

/// Refuses the 128k files, whose RoPE (LongRoPE, with an
/// `rope.scaling.original_context_length`) ACS does not implement.
pub(super) fn check_rope(meta: &Metadata, key: &dyn Fn(&str) -> String) -> Result<(), ModelError> {
    match meta.get_usize(&key("rope.scaling.original_context_length")) {
        Ok(_) => Err(ModelError::Unsupported(
            "LongRoPE (the Phi-3 128k files)".into(),
        )),
        Err(_) => Ok(()),
    }
}
