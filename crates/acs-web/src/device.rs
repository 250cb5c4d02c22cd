//! Where the browser's batches step: the visitor's GPU through WebGPU, or the CPU
//! backend compiled to wasm where the browser has no WebGPU. One type for both, so
//! that the rest of the package is not generic over the choice made at load time.

use std::sync::Arc;

use acs_engine::Backend;
use acs_llama::model::{KvCache, Model, ModelError, SeqInput, SeqOutput};
use acs_llama::webgpu::{GpuCache, GpuError, GpuModel};

/// The backend chosen at load time.
#[derive(Debug)]
pub enum Device {
    /// The CPU model (wasm SIMD128 where the browser has it).
    Cpu(Arc<Model>),
    /// The same weights on a WebGPU device.
    Gpu(Box<GpuModel>),
}

/// One sequence's keys and values on its device.
#[derive(Debug)]
pub enum DeviceCache {
    /// In wasm memory.
    Cpu(KvCache),
    /// In GPU buffers.
    Gpu(GpuCache),
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// On the CPU.
    #[error(transparent)]
    Cpu(#[from] ModelError),
    /// On the GPU.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A cache made by the other backend: a bug, as one device serves a page.
    #[error("a KV cache of the other backend was passed")]
    Mixed,
}

impl Backend for Device {
    type Cache = DeviceCache;
    type Error = DeviceError;

    fn new_cache(&self) -> DeviceCache {
        match self {
            Device::Cpu(m) => DeviceCache::Cpu(m.new_cache()),
            Device::Gpu(g) => DeviceCache::Gpu(g.new_cache()),
        }
    }

    fn fork(&self, cache: &DeviceCache) -> Result<DeviceCache, DeviceError> {
        match (self, cache) {
            (Device::Cpu(_), DeviceCache::Cpu(c)) => Ok(DeviceCache::Cpu(c.clone())),
            (Device::Gpu(g), DeviceCache::Gpu(c)) => Ok(DeviceCache::Gpu(g.fork_cache(c)?)),
            _ => Err(DeviceError::Mixed),
        }
    }

    async fn forward(
        &self,
        batch: &mut [SeqInput<'_, DeviceCache>],
    ) -> Result<Vec<SeqOutput>, DeviceError> {
        match self {
            Device::Cpu(m) => {
                let mut inner = Vec::with_capacity(batch.len());
                for s in batch.iter_mut() {
                    let DeviceCache::Cpu(cache) = &mut *s.cache else {
                        return Err(DeviceError::Mixed);
                    };
                    inner.push(SeqInput {
                        cache,
                        tokens: s.tokens,
                        steering: s.steering,
                        capture: s.capture,
                        logits: s.logits,
                    });
                }
                Ok(m.forward(&mut inner)?)
            }
            Device::Gpu(g) => {
                let mut inner = Vec::with_capacity(batch.len());
                for s in batch.iter_mut() {
                    let DeviceCache::Gpu(cache) = &mut *s.cache else {
                        return Err(DeviceError::Mixed);
                    };
                    inner.push(SeqInput {
                        cache,
                        tokens: s.tokens,
                        steering: s.steering,
                        capture: s.capture,
                        logits: s.logits,
                    });
                }
                Ok(g.forward_async(&mut inner).await?)
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Device::Cpu(_) => "cpu".into(),
            Device::Gpu(g) => {
                let i = g.adapter_info();
                format!("webgpu: {} ({:?})", i.name, i.device_type)
            }
        }
    }
}
