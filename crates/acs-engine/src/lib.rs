//! The engine: many requests' sequences batched over one model.
//!
//! - [`generation`]: a contract request becomes a [`Generation`] (token ids, sampling,
//!   steering vectors, read-outs), checked against the model;
//! - [`scheduler`]: continuous batching, one step at a time, driven by its owner;
//! - [`backend`]: where the batch steps (the CPU model, or WebGPU);
//! - [`engine`]: the scheduler on its own thread (native);
//! - [`text`]: a choice's text with stop sequences;
//! - [`control`]: control vectors (llama.cpp / repeng GGUF files).

pub mod backend;
pub mod control;
#[cfg(not(target_arch = "wasm32"))]
pub mod engine;
pub mod generation;
pub mod scheduler;
pub mod text;

pub use backend::Backend;
#[cfg(not(target_arch = "wasm32"))]
pub use engine::Engine;
#[cfg(not(target_arch = "wasm32"))]
pub use generation::resolve;
pub use generation::{Generation, prepare, resolve_on};
pub use scheduler::{Event, Finished, Scheduler, SchedulerConfig, Sink, Stats, Ticket};
