//! Model families: what a family's GGUF metadata and tensors look like, written once
//! for every backend. A new family is a file here (its config from metadata, its
//! tensor names and shapes), then its layer recipe in each backend's forward pass.

pub mod llama;

/// Bytes per cached key or value: caches hold IEEE half floats, on the CPU and on
/// the GPU alike (see [`KvCache`](crate::model::KvCache)).
pub const KV_VALUE_BYTES: usize = 2;
