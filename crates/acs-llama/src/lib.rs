//! The model behind ACS: GGUF weights, the model's own tokenizer and a Llama forward pass.

pub mod arch;
pub mod cpu;
mod error;
mod exp;
pub mod gguf;
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

pub use cpu::team::{session, threads};
