//! Control vectors: steering directions saved as GGUF files in the format llama.cpp's
//! `cvector-generator` and repeng export (`general.architecture = controlvector`, one
//! tensor `direction.N` of `d_model` values per block N, counted from 1 as llama.cpp
//! does: `direction.N` is added to the output of block N).

use std::collections::{BTreeMap, HashMap};

use acs_llama::gguf::{GgufError, GgufFile};
use acs_llama::quant::{QuantError, dequantize_row};

/// Why a control vector file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlVectorError {
    /// Not a readable GGUF.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A tensor in a format that cannot be read.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// Another architecture than `controlvector`.
    #[error("not a control vector: general.architecture is {0:?}")]
    NotControlVector(String),
    /// A `direction.N` tensor that does not fit the model.
    #[error("{name}: {why}")]
    BadDirection {
        /// The tensor.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// No `direction.N` tensor at all.
    #[error("the file has no direction.N tensors")]
    Empty,
}

/// One control vector: a direction per block it steers.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlVector {
    /// Block index → direction of `d_model` values.
    pub directions: BTreeMap<usize, Vec<f32>>,
}

impl ControlVector {
    /// Reads a control vector GGUF for a model of `n_layers` blocks and width `d_model`.
    pub fn from_gguf(
        file: &GgufFile,
        n_layers: usize,
        d_model: usize,
    ) -> Result<Self, ControlVectorError> {
        let arch = file.metadata().get_str("general.architecture")?;
        if arch != "controlvector" {
            return Err(ControlVectorError::NotControlVector(arch.to_owned()));
        }
        let mut directions = BTreeMap::new();
        for t in file.tensors() {
            let Some(n) = t.name.strip_prefix("direction.") else {
                continue;
            };
            let bad = |why: String| ControlVectorError::BadDirection {
                name: t.name.clone(),
                why,
            };
            let layer: usize = n
                .parse()
                .map_err(|_| bad("the suffix is not a block number".into()))?;
            if layer == 0 || layer >= n_layers {
                return Err(bad(format!(
                    "block {layer} is outside 1..{n_layers} (direction.0 would be the embeddings)"
                )));
            }
            if t.n_elements() != d_model as u64 {
                return Err(bad(format!(
                    "{} values; the model's d_model is {d_model}",
                    t.n_elements()
                )));
            }
            let mut v = vec![0f32; d_model];
            dequantize_row(t.ty, file.tensor_bytes(t)?, &mut v)?;
            if v.iter().any(|x| !x.is_finite()) {
                return Err(bad("non-finite values".into()));
            }
            directions.insert(layer, v);
        }
        if directions.is_empty() {
            return Err(ControlVectorError::Empty);
        }
        Ok(ControlVector { directions })
    }
}

/// The control vectors a server offers, by name.
pub type ControlVectors = HashMap<String, ControlVector>;
