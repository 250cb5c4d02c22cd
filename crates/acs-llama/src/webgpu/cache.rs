//! Each sequence's KV cache on the device: growing it, forking and copying it.

use super::GpuModel;
use super::arena::GroupMap;
use super::device::STORAGE;
use super::error::GpuError;
use super::recorder::Recorder;
use crate::arch::KV_VALUE_BYTES;

/// Cache capacity grows in steps of this many positions, which keeps each layer's
/// slice of a cache buffer at a multiple of 256 bytes, the largest storage-binding
/// offset alignment WebGPU allows.
const CACHE_STEP: usize = 64;

/// One sequence's keys and values on the device.
#[derive(Debug, Default)]
pub struct GpuCache {
    /// `[layer][cap][kv_dim]` keys and values, half floats two to a word (as the CPU's
    /// [`crate::model::KvCache`] holds them); `None` until the first token.
    pub(crate) kv: Option<(wgpu::Buffer, wgpu::Buffer)>,
    pub(crate) len: usize,
    cap: usize,
    /// Positions to allocate at once when the cache first needs more than `cap` (see
    /// [`GpuCache::reserve`]).
    room: usize,
    pub(crate) layer_bytes: u64,
    /// The bind groups of the last step's kernels that bound this cache, kept with
    /// it so that they end with the sequence: kept in the step's
    /// [`super::arena::Arena`], they would keep its buffers alive after it ended,
    /// beside the next batch's new caches (twice the KV memory at once) or through
    /// an idle spell.
    pub(crate) groups: GroupMap,
}

impl GpuCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes the cache take room for `positions` positions in all when it next needs
    /// more than it holds (at the next step), rather than doubling as it grows: a
    /// doubled cache can take twice the device memory its sequence ever uses, and each
    /// doubling copies it.
    pub fn reserve(&mut self, positions: usize) {
        self.room = self.room.max(positions);
    }

    /// Device bytes this cache holds (its capacity), for memory accounting.
    pub fn bytes(&self) -> u64 {
        match &self.kv {
            Some((k, v)) => k.size() + v.size(),
            None => 0,
        }
    }
}

impl GpuModel {
    /// An empty KV cache for one sequence; it takes device memory at its first step.
    pub fn new_cache(&self) -> GpuCache {
        GpuCache::default()
    }

    /// A copy of `cache` with room for `positions` positions (at least the ones it
    /// holds), made on the device (no readback): how the n choices of a prompt branch
    /// from its prefill. See [`GpuModel::copy_cache`].
    pub fn fork_cache(&self, cache: &GpuCache, positions: usize) -> Result<GpuCache, GpuError> {
        self.copy_cache(cache, cache.len, positions)
    }

    /// A cache of its own holding the first `prefix` positions of `cache` (at most
    /// all of them), copied on the device, with room for `positions` positions: a
    /// prompt that begins like a kept one starts from it. The copy is allocated at its
    /// final size once (in whole [`CACHE_STEP`]s), so a branch does not double at its
    /// first token, and a kept prompt takes about its own positions, not the room its
    /// request had.
    pub fn copy_cache(
        &self,
        cache: &GpuCache,
        prefix: usize,
        positions: usize,
    ) -> Result<GpuCache, GpuError> {
        self.check_lost()?;
        let prefix = prefix.min(cache.len);
        let room = positions.max(prefix);
        let (Some((k, v)), true) = (&cache.kv, prefix > 0) else {
            return Ok(GpuCache {
                room,
                ..GpuCache::default()
            });
        };
        // Room for `positions` where the device can hold that many (else for the
        // positions copied; the cache grows, or fails, at its step).
        let cap = self
            .reserved_capacity(room)
            .or_else(|| self.reserved_capacity(prefix))
            .unwrap_or(cache.cap);
        let (nk, nv, layer_bytes) = self.kv_buffers(cap);
        let mut enc = self.device.create_command_encoder(&Default::default());
        for (src_off, dst_off, size) in self.layer_copies(cache, prefix, layer_bytes) {
            for (old, new) in [(k, &nk), (v, &nv)] {
                enc.copy_buffer_to_buffer(old, src_off, new, dst_off, size);
            }
        }
        self.queue.submit([enc.finish()]);
        Ok(GpuCache {
            kv: Some((nk, nv)),
            len: prefix,
            cap,
            room,
            layer_bytes,
            groups: GroupMap::new(),
        })
    }

    /// Positions a cache can hold at most: the context, in whole [`CACHE_STEP`]s.
    fn context_cap(&self) -> usize {
        self.config.context.next_multiple_of(CACHE_STEP)
    }

    /// The capacity `cache` must grow to for `need` positions (`None`: it has room):
    /// the room it reserved, where that covers `need` and the device can hold it;
    /// else twice what it holds. Checked against the device's limits.
    pub(crate) fn grown_capacity(
        &self,
        cache: &GpuCache,
        need: usize,
    ) -> Result<Option<usize>, GpuError> {
        if need <= cache.cap {
            return Ok(None);
        }
        if cache.room >= need
            && let Some(cap) = self.reserved_capacity(cache.room)
        {
            return Ok(Some(cap));
        }
        let cap = need
            .max(2 * cache.cap)
            .next_multiple_of(CACHE_STEP)
            .min(self.context_cap());
        self.fits(cap)?;
        Ok(Some(cap))
    }

    /// The capacity that holds `room` positions (in whole [`CACHE_STEP`]s, at most the
    /// context), if the device can hold it.
    fn reserved_capacity(&self, room: usize) -> Option<usize> {
        let cap = room.next_multiple_of(CACHE_STEP).min(self.context_cap());
        self.fits(cap).is_ok().then_some(cap)
    }

    /// Whether the device can hold a cache of `cap` positions.
    fn fits(&self, cap: usize) -> Result<(), GpuError> {
        let c = &self.config;
        let layer_bytes = (cap * c.kv_dim() * KV_VALUE_BYTES) as u64;
        let total = layer_bytes * c.n_layers as u64;
        let limit = self.limits.max_storage_buffer_binding_size;
        if layer_bytes > limit || total > self.limits.max_buffer_size {
            return Err(GpuError::TooLarge {
                what: format!("a KV cache of {cap} positions"),
                needed: total,
                limit: self.limits.max_buffer_size.min(limit * c.n_layers as u64),
            });
        }
        Ok(())
    }

    /// Gives `cache` room for `cap` positions, copying what it holds into the larger
    /// buffers as the step's first commands.
    pub(crate) fn grow(&self, cache: &mut GpuCache, cap: usize, rec: &mut Recorder<'_>) {
        let (nk, nv, layer_bytes) = self.kv_buffers(cap);
        if let Some((ok, ov)) = &cache.kv {
            for (src_off, dst_off, size) in self.layer_copies(cache, cache.len, layer_bytes) {
                for (old, new) in [(ok, &nk), (ov, &nv)] {
                    rec.copy_bytes(old, src_off, new, dst_off, size);
                }
            }
        }
        cache.kv = Some((nk, nv));
        cache.cap = cap;
        cache.layer_bytes = layer_bytes;
    }

    /// Key and value buffers for a cache of `cap` positions, and the bytes of one
    /// layer's slice of them.
    fn kv_buffers(&self, cap: usize) -> (wgpu::Buffer, wgpu::Buffer, u64) {
        let c = &self.config;
        let layer_bytes = (cap * c.kv_dim() * KV_VALUE_BYTES) as u64;
        let make = |label| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: layer_bytes * c.n_layers as u64,
                usage: STORAGE,
                mapped_at_creation: false,
            })
        };
        (make("kv cache k"), make("kv cache v"), layer_bytes)
    }

    /// The copies (offset in `from`'s buffers, offset in the new ones, bytes) that
    /// move the first `positions` positions of `from` into buffers whose layers lie
    /// `layer_bytes` apart, one per layer; none for no positions.
    fn layer_copies(
        &self,
        from: &GpuCache,
        positions: usize,
        layer_bytes: u64,
    ) -> Vec<(u64, u64, u64)> {
        let c = &self.config;
        let used = (positions * c.kv_dim() * KV_VALUE_BYTES) as u64;
        if used == 0 {
            return Vec::new();
        }
        (0..c.n_layers as u64)
            .map(|l| (l * from.layer_bytes, l * layer_bytes, used))
            .collect()
    }
}
