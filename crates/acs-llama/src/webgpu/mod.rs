//! The Llama forward pass in WGSL compute shaders, on any WebGPU device (wgpu natively,
//! the browser's WebGPU on wasm).
//!
//! [`GpuModel::forward`] computes what [`crate::model::Model::forward`] computes, for
//! the same batch of sequences, with every weight kept on the device in its ggml
//! format (raw bytes in storage buffers; the kernels expand blocks as they read them).
//! Block-format matmuls round their inputs to 8-bit blocks first, as the CPU path and
//! llama.cpp do, so the two backends agree to float rounding, not just roughly.
//!
//! A step is recorded as a list of dispatches and buffer copies and submitted once;
//! only the logits of the rows that sample (and any captured activations) come back.
//! Each sequence's KV cache lives on the device ([`GpuCache`]), one buffer for keys
//! and one for values, laid out `[layer][position][kv_dim]` in half floats (stored by
//! the attention kernel with the CPU cache's rounding, `half.wgsl`), grown by doubling.

mod arena;
mod cache;
mod device;
mod error;
mod kernels;
mod loader;
mod profile;
mod recorder;
mod step;
mod tensor;
#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;

use std::sync::Mutex;

/// The wgpu this backend is built on, for callers that hold its adapters.
pub use wgpu;

pub use cache::GpuCache;
pub use device::pick_adapter;
pub use error::GpuError;
pub use kernels::dequant::SUPPORTED;
pub use kernels::matmul::MatmulLayout;
pub use loader::GpuLoader;
pub use profile::{Kernel, KernelTime, StepProfile};

use crate::arch::{ModelConfig, RopeStyle};
use crate::gguf::GgufFile;
use crate::model::{SeqInput, SeqOutput};
use arena::Arena;
use device::Lost;
use kernels::Pipelines;
use tensor::{GpuBlock, GpuTensor};

/// One sequence's part of a batch step: the CPU's input, over a device cache.
pub type GpuSeqInput<'a> = SeqInput<'a, GpuCache>;

/// A Llama model whose weights live on a WebGPU device.
#[derive(Debug)]
pub struct GpuModel {
    /// Hyper-parameters.
    pub config: ModelConfig,
    info: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    embed: GpuTensor,
    /// `None` when the output layer reuses the embedding.
    output: Option<GpuTensor>,
    blocks: Vec<GpuBlock>,
    out_norm: wgpu::Buffer,
    rope_inv_freq: Vec<f32>,
    /// The sliding-window layers' own, where the family has them.
    rope_inv_freq_local: Option<Vec<f32>>,
    pipes: Pipelines,
    /// Why the device was lost, once it is.
    lost: Lost,
    /// The step buffers, between steps (taken by a step while it runs).
    arena: Mutex<Option<Arena>>,
}

impl GpuModel {
    /// Loads a model onto the best adapter [`pick_adapter`] finds, software included,
    /// blocking until the weights are uploaded.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(file: &GgufFile) -> Result<Self, GpuError> {
        Self::open(file, true)
    }

    /// Loads a model onto the best adapter [`pick_adapter`] finds, software ones only
    /// if `allow_software`, blocking until the weights are uploaded.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(file: &GgufFile, allow_software: bool) -> Result<Self, GpuError> {
        let adapter = pollster::block_on(pick_adapter(allow_software))?;
        pollster::block_on(Self::load(file, adapter))
    }

    /// Opens a device on `adapter` and uploads the model's weights, tensor by tensor.
    pub async fn load(file: &GgufFile, adapter: wgpu::Adapter) -> Result<Self, GpuError> {
        Self::load_with_layout(file, adapter, None).await
    }

    /// [`GpuModel::load`] with the matmul layout given instead of the adapter's
    /// choice (`None`: [`MatmulLayout::for_adapter`]); tests run both on one adapter.
    pub async fn load_with_layout(
        file: &GgufFile,
        adapter: wgpu::Adapter,
        layout: Option<MatmulLayout>,
    ) -> Result<Self, GpuError> {
        let mut loader = GpuLoader::new(file.header(), adapter).await?;
        if let Some(layout) = layout {
            loader.set_matmul_layout(layout);
        }
        for t in &file.header().tensors {
            loader.add(t, file.tensor_bytes(t)?)?;
        }
        loader.finish().await
    }

    /// The adapter the model runs on (name, backend, device type).
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// Weight bytes one decode step reads: every matrix of every block and the output
    /// layer, once (the roofline's numerator).
    pub fn weight_bytes_per_step(&self) -> u64 {
        let blocks: u64 = self
            .blocks
            .iter()
            .flat_map(|b| {
                b.qkv
                    .iter()
                    .chain([&b.wo])
                    .chain(&b.gate_up)
                    .chain([&b.down])
            })
            .map(GpuTensor::bytes)
            .sum();
        blocks + self.output.as_ref().unwrap_or(&self.embed).bytes()
    }

    /// The device's memory bandwidth as a buffer-to-buffer copy measures it: bytes
    /// read plus bytes written per second, median of `repeat` copies of `bytes` (kept
    /// within the device's buffer limit). The roofline's denominator: a decode step
    /// that reads its weights at this rate is as fast as this device can be.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn copy_bandwidth(&self, bytes: u64, repeat: usize) -> Result<f64, GpuError> {
        let bytes = bytes.min(self.limits.max_buffer_size) / 4 * 4;
        let buffer = |label| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let (src, dst) = (buffer("copy source"), buffer("copy target"));
        let wait = || {
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map(|_| ())
                .map_err(|e| GpuError::DeviceLost(e.to_string()))
        };
        let copy = || {
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes);
            self.queue.submit([enc.finish()]);
            wait()
        };
        copy()?; // first touch: allocation, not bandwidth
        let mut secs = Vec::with_capacity(repeat);
        for _ in 0..repeat.max(1) {
            let t = std::time::Instant::now();
            copy()?;
            secs.push(t.elapsed().as_secs_f64());
        }
        secs.sort_by(f64::total_cmp);
        self.check_lost()?;
        Ok(2.0 * bytes as f64 / secs[secs.len() / 2])
    }

    /// Advances each sequence of `batch` by its new tokens (blocking); see
    /// [`GpuModel::forward_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward(&self, batch: &mut [GpuSeqInput<'_>]) -> Result<Vec<SeqOutput>, GpuError> {
        pollster::block_on(self.forward_async(batch))
    }

    /// Advances each sequence of `batch` by its new tokens in one submission; returns,
    /// per sequence, the logits it asked for and the activations it captured (as
    /// [`crate::model::Model::forward`]).
    pub async fn forward_async(
        &self,
        batch: &mut [GpuSeqInput<'_>],
    ) -> Result<Vec<SeqOutput>, GpuError> {
        Ok(self.step(batch, false).await?.0)
    }

    /// [`GpuModel::forward`], timing each dispatch (blocking); see
    /// [`GpuModel::profile_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn profile(
        &self,
        batch: &mut [GpuSeqInput<'_>],
    ) -> Result<(Vec<SeqOutput>, StepProfile), GpuError> {
        pollster::block_on(self.profile_async(batch))
    }

    /// [`GpuModel::forward_async`], with each dispatch in a compute pass of its own
    /// that writes timestamps at its start and end: where a step's time goes, kernel by
    /// kernel, and how much of it is gaps between them. The results are the same; the
    /// step as a whole may be slower than an unprofiled one (a pass per dispatch).
    /// Needs an adapter with timestamp queries.
    pub async fn profile_async(
        &self,
        batch: &mut [GpuSeqInput<'_>],
    ) -> Result<(Vec<SeqOutput>, StepProfile), GpuError> {
        if !self
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Err(GpuError::NoTimestamps(self.info.name.clone()));
        }
        let (outputs, profile) = self.step(batch, true).await?;
        Ok((outputs, profile.unwrap_or_default()))
    }

    /// Why the device was lost (the browser's reason and message), once it is: every
    /// step fails from then on, and the model must be loaded again.
    pub fn lost(&self) -> Option<String> {
        self.lost.why()
    }

    /// An error if the device was lost.
    fn check_lost(&self) -> Result<(), GpuError> {
        self.lost.check()
    }

    /// Whether the query and key projections apply RoPE as they store (what
    /// [`GpuLoader::finish`] compiled them for): where nothing comes between the
    /// matmul and RoPE, and each pair is two neighbouring rows of one workgroup.
    fn fused_rope(&self) -> bool {
        fused_rope(&self.config)
    }
}

/// See [`GpuModel::fused_rope`].
fn fused_rope(c: &ModelConfig) -> bool {
    let r = c.recipe();
    !r.qkv_bias && r.rope == RopeStyle::Adjacent
}
