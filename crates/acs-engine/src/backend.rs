//! Where the forward pass runs. The scheduler needs three things of a backend: empty
//! KV caches, a copy of a cache (a prompt's n choices branch from its prefill), and a
//! batched step. The CPU [`Model`] is one; with the `webgpu` feature, the same
//! weights on a WebGPU device ([`acs_llama::webgpu::GpuModel`]) are another.
//!
//! The CPU model stays the engine's source of the tokenizer and the model's shape
//! whichever backend steps the batch.

use acs_llama::model::{KvCache, Model, ModelError, SeqInput, SeqOutput};

/// A forward pass the scheduler can drive.
///
/// The step is async because the browser cannot block on the GPU: there a step
/// awaits its read-back, while natively the engine thread blocks on the future.
/// The futures need not be `Send`: one thread drives a scheduler's steps (its own
/// thread natively, the page's or Web Worker's in wasm).
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// One sequence's keys and values.
    type Cache;
    /// Why a step failed.
    type Error: std::fmt::Display;

    /// An empty cache.
    fn new_cache(&self) -> Self::Cache;

    /// A copy of `cache`, for a choice branching from its prompt.
    fn fork(&self, cache: &Self::Cache) -> Result<Self::Cache, Self::Error>;

    /// Advances every sequence of `batch` by its new tokens.
    async fn forward(
        &self,
        batch: &mut [SeqInput<'_, Self::Cache>],
    ) -> Result<Vec<SeqOutput>, Self::Error>;

    /// A name for logs and benchmarks (`cpu`, or the adapter).
    fn describe(&self) -> String;
}

impl Backend for Model {
    type Cache = KvCache;
    type Error = ModelError;

    fn new_cache(&self) -> KvCache {
        Model::new_cache(self)
    }

    fn fork(&self, cache: &KvCache) -> Result<KvCache, ModelError> {
        Ok(cache.clone())
    }

    async fn forward(
        &self,
        batch: &mut [SeqInput<'_, KvCache>],
    ) -> Result<Vec<SeqOutput>, ModelError> {
        Model::forward(self, batch)
    }

    fn describe(&self) -> String {
        "cpu".into()
    }
}

#[cfg(feature = "webgpu")]
mod gpu {
    use acs_llama::model::{SeqInput, SeqOutput};
    use acs_llama::webgpu::{GpuCache, GpuError, GpuModel};

    impl super::Backend for GpuModel {
        type Cache = GpuCache;
        type Error = GpuError;

        fn new_cache(&self) -> GpuCache {
            GpuModel::new_cache(self)
        }

        fn fork(&self, cache: &GpuCache) -> Result<GpuCache, GpuError> {
            self.fork_cache(cache)
        }

        async fn forward(
            &self,
            batch: &mut [SeqInput<'_, GpuCache>],
        ) -> Result<Vec<SeqOutput>, GpuError> {
            self.forward_async(batch).await
        }

        fn describe(&self) -> String {
            let i = self.adapter_info();
            format!("webgpu: {} ({:?}, {:?})", i.name, i.backend, i.device_type)
        }
    }
}
