//! Where the browser's batches step: the visitor's GPU through WebGPU, or the CPU
//! backend compiled to wasm where the browser has no WebGPU. One type for both, so
//! that the rest of the package is not generic over the choice made at load time.

use std::sync::Arc;

use acs_engine::Backend;
use acs_llama::model::{KvCache, Model, ModelError, SeqInput, SeqOutput};
use acs_llama::webgpu::{GpuCache, GpuError, GpuModel};

/// The backend chosen at load time, and a gate that lets one step at a time run on
/// it (the scheduler's, or a contrast pair's read-out for steering).
#[derive(Debug)]
pub struct Device {
    kind: Kind,
    gate: futures_util::lock::Mutex<()>,
}

#[derive(Debug)]
enum Kind {
    /// The CPU model, whole in wasm memory.
    Cpu(Arc<Model>),
    /// The weights on a WebGPU device.
    Gpu(Box<GpuModel>),
}

impl Device {
    /// The CPU backend over `model` (which must have its weights).
    pub fn cpu(model: Arc<Model>) -> Device {
        Device::new(Kind::Cpu(model))
    }

    /// The WebGPU backend.
    pub fn gpu(model: GpuModel) -> Device {
        Device::new(Kind::Gpu(Box::new(model)))
    }

    /// Why the GPU device was lost, once it is (never for the CPU backend).
    pub fn lost(&self) -> Option<String> {
        match &self.kind {
            Kind::Cpu(_) => None,
            Kind::Gpu(g) => g.lost(),
        }
    }

    fn new(kind: Kind) -> Device {
        Device {
            kind,
            gate: futures_util::lock::Mutex::new(()),
        }
    }
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

impl DeviceCache {
    fn cpu(&mut self) -> Option<&mut KvCache> {
        match self {
            DeviceCache::Cpu(c) => Some(c),
            DeviceCache::Gpu(_) => None,
        }
    }

    fn gpu(&mut self) -> Option<&mut GpuCache> {
        match self {
            DeviceCache::Gpu(c) => Some(c),
            DeviceCache::Cpu(_) => None,
        }
    }
}

/// The batch over the caches of one backend, taken out of the device caches by
/// `pick`; a cache of the other backend is an error.
fn rebind<'a, C>(
    batch: &'a mut [SeqInput<'_, DeviceCache>],
    pick: impl Fn(&mut DeviceCache) -> Option<&mut C>,
) -> Result<Vec<SeqInput<'a, C>>, DeviceError> {
    batch
        .iter_mut()
        .map(|s| {
            Ok(SeqInput {
                cache: pick(&mut *s.cache).ok_or(DeviceError::Mixed)?,
                tokens: s.tokens,
                steering: s.steering,
                capture: s.capture,
                logits: s.logits,
            })
        })
        .collect()
}

impl Backend for Device {
    type Cache = DeviceCache;
    type Error = DeviceError;

    fn new_cache(&self, positions: usize) -> DeviceCache {
        match &self.kind {
            Kind::Cpu(m) => DeviceCache::Cpu(Backend::new_cache(&**m, positions)),
            Kind::Gpu(g) => DeviceCache::Gpu(Backend::new_cache(&**g, positions)),
        }
    }

    fn fork(&self, cache: &mut DeviceCache, positions: usize) -> Result<DeviceCache, DeviceError> {
        match (&self.kind, cache) {
            (Kind::Cpu(m), DeviceCache::Cpu(c)) => {
                Ok(DeviceCache::Cpu(Backend::fork(&**m, c, positions)?))
            }
            (Kind::Gpu(g), DeviceCache::Gpu(c)) => {
                Ok(DeviceCache::Gpu(Backend::fork(&**g, c, positions)?))
            }
            _ => Err(DeviceError::Mixed),
        }
    }

    fn forks_share_prompt(&self) -> bool {
        match &self.kind {
            Kind::Cpu(m) => Backend::forks_share_prompt(&**m),
            Kind::Gpu(g) => Backend::forks_share_prompt(&**g),
        }
    }

    fn copy_prefix(
        &self,
        cache: &DeviceCache,
        prefix: usize,
        positions: usize,
    ) -> Result<DeviceCache, DeviceError> {
        match (&self.kind, cache) {
            (Kind::Cpu(m), DeviceCache::Cpu(c)) => Ok(DeviceCache::Cpu(Backend::copy_prefix(
                &**m, c, prefix, positions,
            )?)),
            (Kind::Gpu(g), DeviceCache::Gpu(c)) => Ok(DeviceCache::Gpu(Backend::copy_prefix(
                &**g, c, prefix, positions,
            )?)),
            _ => Err(DeviceError::Mixed),
        }
    }

    fn cache_bytes(&self, cache: &DeviceCache) -> usize {
        match cache {
            DeviceCache::Cpu(c) => c.bytes(),
            DeviceCache::Gpu(c) => c.bytes() as usize,
        }
    }

    async fn forward(
        &self,
        batch: &mut [SeqInput<'_, DeviceCache>],
    ) -> Result<Vec<SeqOutput>, DeviceError> {
        // A GPU step awaits its read-back; another step must not start meanwhile.
        let _turn = self.gate.lock().await;
        match &self.kind {
            Kind::Cpu(m) => Ok(m.forward(&mut rebind(batch, DeviceCache::cpu)?)?),
            Kind::Gpu(g) => Ok(g
                .forward_async(&mut rebind(batch, DeviceCache::gpu)?)
                .await?),
        }
    }

    fn describe(&self) -> String {
        match &self.kind {
            Kind::Cpu(m) => {
                let mut notes = Vec::new();
                if acs_llama::threads() > 1 {
                    notes.push(format!("{} threads", acs_llama::threads()));
                }
                // Weights kept in JS memory cost a copy into wasm memory each step.
                if m.stage_bytes() > 0 {
                    notes.push("weights in JS memory".to_owned());
                }
                if notes.is_empty() {
                    "cpu".into()
                } else {
                    format!("cpu ({})", notes.join(", "))
                }
            }
            Kind::Gpu(g) => {
                let i = g.adapter_info();
                let name = if i.name.is_empty() {
                    "adapter"
                } else {
                    &i.name
                };
                format!("webgpu: {name} ({:?})", i.device_type)
            }
        }
    }
}
