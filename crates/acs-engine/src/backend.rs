//! Where the forward pass runs. The scheduler needs four things of a backend: empty
//! KV caches and copies of one (a prompt's n choices branch from its prefill), each
//! allocated for the positions the scheduler reserved for its sequence, the memory a
//! cache takes, and a batched step. The CPU [`Model`] is one; with the `webgpu`
//! feature, the same weights on a WebGPU device ([`acs_llama::webgpu::GpuModel`]) are
//! another.
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

    /// An empty cache for a sequence of at most `positions` positions, the room the
    /// scheduler reserved for it: a cache that grew by doubling could take twice that
    /// memory, beyond the bound the scheduler keeps.
    fn new_cache(&self, positions: usize) -> Self::Cache;

    /// A branch of `cache` with room for `positions` positions, for a choice
    /// branching from its prompt: a copy, or, where [`Backend::forks_share_prompt`],
    /// a cache that shares the positions `cache` holds (which may reorganise it).
    fn fork(&self, cache: &mut Self::Cache, positions: usize) -> Result<Self::Cache, Self::Error>;

    /// Whether a [`Backend::fork`] shares the positions it branched from instead of
    /// copying them: the scheduler then reserves a prompt's positions once for all of
    /// its choices rather than once per choice.
    fn forks_share_prompt(&self) -> bool {
        false
    }

    /// A cache of its own holding the first `prefix` positions of `cache`, with room
    /// for `positions`: a prompt that begins with another's tokens prefills only the
    /// rest.
    fn copy_prefix(
        &self,
        cache: &Self::Cache,
        prefix: usize,
        positions: usize,
    ) -> Result<Self::Cache, Self::Error>;

    /// Memory `cache` takes, in bytes (its capacity).
    fn cache_bytes(&self, cache: &Self::Cache) -> usize;

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

    fn new_cache(&self, positions: usize) -> KvCache {
        let mut cache = Model::new_cache(self);
        cache.reserve(positions.min(self.config.context));
        cache
    }

    fn fork(&self, cache: &mut KvCache, positions: usize) -> Result<KvCache, ModelError> {
        Ok(cache.fork(positions.min(self.config.context)))
    }

    fn forks_share_prompt(&self) -> bool {
        true
    }

    fn copy_prefix(
        &self,
        cache: &KvCache,
        prefix: usize,
        positions: usize,
    ) -> Result<KvCache, ModelError> {
        Ok(cache.copy_prefix(prefix, positions.min(self.config.context)))
    }

    fn cache_bytes(&self, cache: &KvCache) -> usize {
        cache.bytes()
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

        fn new_cache(&self, positions: usize) -> GpuCache {
            let mut cache = GpuModel::new_cache(self);
            cache.reserve(positions);
            cache
        }

        fn fork(&self, cache: &mut GpuCache, positions: usize) -> Result<GpuCache, GpuError> {
            self.fork_cache(cache, positions)
        }

        fn copy_prefix(
            &self,
            cache: &GpuCache,
            prefix: usize,
            positions: usize,
        ) -> Result<GpuCache, GpuError> {
            self.copy_cache(cache, prefix, positions)
        }

        fn cache_bytes(&self, cache: &GpuCache) -> usize {
            cache.bytes() as usize
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
