//! The CPU's building blocks under the forward pass: which instruction set to use, the
//! thread team that runs a step's parallel loops, the f32 kernels of attention, SwiGLU
//! and the KV cache, and the int8 rate and memory bandwidth `acs bench` measures. The weight formats' own
//! kernels live with the formats, in [`crate::quant`].

mod bandwidth;
pub(crate) mod caches;
pub(crate) mod isa;
mod ops;
mod peak;
pub(crate) mod team;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use bandwidth::read_bandwidth;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) use ops::f16_table;
pub use ops::{F32Ops, to_half};
pub use peak::{Int8Peak, int8_peak};
