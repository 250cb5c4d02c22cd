//! Model families: what a family's GGUF metadata, tensors and layers look like,
//! written once for every backend.
//!
//! Every family here runs the same decoder block (a pre-norm attention and a gated
//! MLP, each added to the residual stream); a family file says where its block departs
//! from that (its [`Recipe`]), and both forward passes (`model.rs` on the CPU,
//! `webgpu/step.rs`) follow the recipe. A new family is a file here and a row of
//! [`Family`]; a new kind of departure is a field of [`Recipe`] and its step in each
//! backend.

mod config;
mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod tensors;

pub use config::{ModelConfig, SlidingWindow};
pub(crate) use config::{rope_inv_freq, rope_inv_freq_local};
pub(crate) use tensors::{BlockTensors, EMBED, MatrixRef, OUTPUT, OUTPUT_NORM, ROPE_FREQS};

use crate::error::ModelError;

/// Bytes per cached key or value: caches hold IEEE half floats, on the CPU and on
/// the GPU alike (see [`KvCache`](crate::model::KvCache)).
pub const KV_VALUE_BYTES: usize = 2;

/// The model families ACS runs, by their GGUF `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2 and 3, Mistral, SmolLM, TinyLlama.
    Llama,
    /// Qwen2 and Qwen2.5.
    Qwen2,
    /// Qwen3 (dense).
    Qwen3,
    /// Gemma 3 (text).
    Gemma3,
    /// Phi-3 and Phi-3.5 (mini, medium; not the 128k LongRoPE files).
    Phi3,
}

impl Family {
    /// Every family, in the order error messages list them.
    pub const ALL: [Family; 5] = [
        Family::Llama,
        Family::Qwen2,
        Family::Qwen3,
        Family::Gemma3,
        Family::Phi3,
    ];

    /// The family's `general.architecture`, also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
            Family::Phi3 => "phi3",
        }
    }

    /// The family of `general.architecture` `name`, or an error that lists the ones
    /// ACS runs.
    pub fn from_name(name: &str) -> Result<Family, ModelError> {
        Family::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| ModelError::Architecture {
                found: name.to_owned(),
                supported: Family::ALL.map(Family::name).join(", "),
            })
    }

    /// How the family's block departs from the common one.
    pub fn recipe(self) -> Recipe {
        match self {
            Family::Llama => llama::RECIPE,
            Family::Qwen2 => qwen2::RECIPE,
            Family::Qwen3 => qwen3::RECIPE,
            Family::Gemma3 => gemma3::RECIPE,
            Family::Phi3 => phi3::RECIPE,
        }
    }
}

/// Where a family's block departs from the common decoder block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    /// The query, key and value projections add a bias.
    pub qkv_bias: bool,
    /// Which values of a head RoPE rotates together.
    pub rope: RopeStyle,
    /// Each query and key head is RMS-normalised (`attn_q_norm`, `attn_k_norm`, one
    /// weight per value of a head) before RoPE.
    pub qk_norm: bool,
    /// The attention and MLP outputs are RMS-normalised (`post_attention_norm`,
    /// `post_ffw_norm`) before they join the residual stream.
    pub post_norms: bool,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// The token embeddings are multiplied by sqrt(d_model) as they are read.
    pub scaled_embedding: bool,
    /// The query, key and value projections are one tensor (`attn_qkv`), and the
    /// gate and up ones another (`ffn_up`, the gate's rows first).
    pub fused: bool,
}

/// The function of the MLP's gate, multiplied by its up projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// x·sigmoid(x) (SwiGLU).
    Silu,
    /// GELU in its tanh approximation (GeGLU), as Gemma is trained and ggml runs it.
    Gelu,
}

/// Which values of a head RoPE rotates as a pair: what the GGUF converter of the
/// family arranged the query and key rows for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Neighbours (2i, 2i + 1): ggml's "normal" mode, for which the Llama converter
    /// permutes the rows.
    Adjacent,
    /// Value i with value i + rope_dims/2: ggml's "NeoX" mode, the layout of the
    /// Hugging Face weights as they are.
    Halves,
}
