//! The model behind ACS: GGUF weights, the model's own tokenizer and the forward pass
//! of each model family.
//!
//! - [`gguf`]: the file format, parsed from untrusted bytes, mapped or streamed;
//! - [`tokenizer`]: the model's own tokenizer, from GGUF metadata; [`chat_template`]:
//!   its chat template, rendered as `transformers` renders it;
//! - [`arch`]: model families as GGUF describes them (config, tensor names and shapes,
//!   where each family's layers depart from the common block);
//! - [`model`]: the batched CPU forward pass and its KV cache; `attention`: its
//!   attention, shared out over the cores; `weights`: its weights, in the file or
//!   staged from a [`model::WeightSource`] block by block;
//! - [`quant`]: the weight formats, one file per family, and the matmuls over them;
//! - [`cpu`]: instruction-set detection, the thread team, attention's f32 kernels;
//! - `webgpu` (feature `webgpu`): the forward pass in WGSL compute shaders;
//! - [`sample`]: sampling; [`testgen`]: random-weight GGUFs for tests;
//!   [`model_cache`]: where the default model is kept.

pub mod arch;
mod attention;
pub mod chat_template;
pub mod cpu;
mod error;
mod exp;
pub mod gguf;
mod kv_cache;
mod lanes;
pub mod model;
pub mod model_cache;
pub mod quant;
pub mod sample;
#[cfg(test)]
mod test_values;
pub mod testgen;
pub mod tokenizer;
#[cfg(feature = "webgpu")]
pub mod webgpu;
mod weights;

#[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
pub use cpu::team::{join as join_team, plan_helpers};
pub use cpu::team::{session, threads};
