//! Why the WebGPU backend could not load or run a model.

use crate::error::ModelError;
use crate::gguf::GgufError;
use crate::quant::GgmlType;

/// Why the WebGPU backend could not load or run a model.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter, or only software ones when those are not allowed.
    #[error("no WebGPU adapter found{}", if *allow_software { "" } else { " (software adapters excluded)" })]
    NoAdapter {
        /// Whether CPU (software) adapters such as lavapipe were acceptable.
        allow_software: bool,
    },
    /// The adapter refused to open a device.
    #[error("cannot open the WebGPU device: {0}")]
    RequestDevice(String),
    /// The device went away (driver reset, tab backgrounded, …); load the model again.
    #[error("the WebGPU device was lost: {0}")]
    DeviceLost(String),
    /// The device ran out of memory.
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    /// The device rejected work it was given: a bug in this backend.
    #[error("WebGPU rejected the work: {0}")]
    Validation(String),
    /// A weight in a format without a WGSL kernel.
    #[error("tensor {name}: ggml type {ty:?} has no WebGPU kernel")]
    Unsupported {
        /// The tensor.
        name: String,
        /// Its format.
        ty: GgmlType,
    },
    /// Something larger than the device's limits allow.
    #[error("{what} needs {needed} bytes; the device allows {limit}")]
    TooLarge {
        /// What did not fit.
        what: String,
        /// Bytes it needs.
        needed: u64,
        /// The device's limit.
        limit: u64,
    },
    /// Results could not be read back.
    #[error("reading results back failed: {0}")]
    Readback(String),
    /// Profiling asked of an adapter without timestamp queries.
    #[error("the adapter {0} has no timestamp queries, which profiling needs")]
    NoTimestamps(String),
    /// The model file or the batch is unusable (same errors as the CPU path).
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl From<GgufError> for GpuError {
    fn from(e: GgufError) -> Self {
        GpuError::Model(ModelError::Gguf(e))
    }
}
