//! The model behind ACS: GGUF weights, the model's own tokenizer and a Llama forward pass.

mod exp;
pub mod gguf;
mod lanes;
pub mod model;
pub mod model_cache;
pub mod quant;
pub mod sample;
mod team;
pub mod testgen;
pub mod tokenizer;
#[cfg(feature = "webgpu")]
pub mod webgpu;

pub use team::{session, threads};
