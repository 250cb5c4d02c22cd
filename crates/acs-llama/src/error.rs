//! Why a model could not be loaded or run: one error type for every backend.

use crate::gguf::GgufError;
use crate::quant::{GgmlType, QuantError};
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file is not a readable GGUF.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A weight's format or size is wrong.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// The tokenizer metadata is unusable.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The file holds an architecture ACS does not run.
    #[error("unsupported architecture {found:?}: ACS runs {supported}")]
    Architecture {
        /// The file's `general.architecture`.
        found: String,
        /// The architectures ACS runs, comma-separated.
        supported: String,
    },
    /// A tensor is stored in a ggml format ACS cannot run.
    #[error("tensor {name} is {ty:?}, a format ACS does not run (it runs {supported})")]
    Format {
        /// The tensor.
        name: String,
        /// Its format.
        ty: GgmlType,
        /// The formats ACS runs, comma-separated.
        supported: String,
    },
    /// A feature of the model that ACS does not run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// Hyper-parameters that do not fit together.
    #[error("inconsistent model: {0}")]
    Shape(String),
    /// A tensor has other dimensions than the hyper-parameters imply.
    #[error("tensor {name} has dims {dims:?}; expected [{cols}, {rows}]")]
    TensorShape {
        /// The tensor.
        name: String,
        /// Its dims as stored.
        dims: Vec<u64>,
        /// Expected row length.
        cols: usize,
        /// Expected row count.
        rows: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {0} is outside the vocabulary")]
    TokenOutOfRange(u32),
    /// The sequence would outgrow the context window.
    #[error("sequence of {0} tokens exceeds the context window of {1}")]
    ContextFull(usize, usize),
    /// A model loaded for its tokenizer and shape only (its weights went straight to
    /// a GPU) cannot run on the CPU.
    #[error("this model's weights are on the GPU only; the CPU backend cannot run it")]
    NoWeights,
    /// A model's weights kept outside the process ([`crate::model::WeightSource`])
    /// could not be read.
    #[error("reading the model's weights failed: {0}")]
    WeightSource(String),
}
