//! What a step's dispatches bind, and what is kept of it from one step to the next:
//! the step's buffers and the bind groups that bind them.

use std::collections::HashMap;

/// Bytes of one kernel's parameters in the step's uniform buffer (all fit in 16 words).
pub(crate) const PARAM_BYTES: u64 = 64;

/// A buffer range bound to a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Binding {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) size: Option<u64>,
}

/// All of `b`, bound.
pub(crate) fn whole(b: &wgpu::Buffer) -> Binding {
    Binding {
        buf: b.clone(),
        offset: 0,
        size: None,
    }
}

/// Where a dispatch's bind group is kept from one step to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// In the arena: it binds the step's own buffers and the weights.
    Step,
    /// With the KV cache of the batch's sequence of this index, which it binds.
    Sequence(usize),
}

/// What a dispatch's bind group holds: its kernel's buffers and its parameters'
/// offset in the step's uniform buffer.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) pipe: wgpu::ComputePipeline,
    pub(crate) bindings: Vec<Binding>,
    pub(crate) uniforms: wgpu::Buffer,
    pub(crate) params: u64,
}

/// Bind groups by what they hold.
pub(crate) type GroupMap = HashMap<GroupKey, wgpu::BindGroup>;

/// The device buffers of a step (activations, uploads, parameters, read-back), kept
/// from step to step by name and replaced only when a step needs a larger one: a
/// steady batch allocates nothing per step, and a larger batch or prefill grows them
/// once (to a power of two, so that a run of growing prefills grows them seldom).
#[derive(Debug, Default)]
pub(crate) struct Arena {
    bufs: HashMap<&'static str, wgpu::Buffer>,
    /// The last step's bind groups, but those that bind a sequence's KV cache
    /// (which [`super::GpuCache`] keeps). A steady batch binds the same buffers at the
    /// same parameter offsets step after step, and making its bind groups (hundreds
    /// a step) is a large part of the host's time to encode and submit one on a
    /// CPU adapter; a group the next step does not use is dropped with the step.
    groups: GroupMap,
}

impl Arena {
    /// The buffer `label` with room for `bytes` (at most `limit` unless that is too
    /// few), made anew only if the one kept is smaller.
    pub(crate) fn get(
        &mut self,
        device: &wgpu::Device,
        label: &'static str,
        bytes: u64,
        usage: wgpu::BufferUsages,
        limit: u64,
    ) -> wgpu::Buffer {
        let bytes = bytes.max(4);
        if let Some(b) = self.bufs.get(label).filter(|b| b.size() >= bytes) {
            return b.clone();
        }
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.next_power_of_two().min(limit).max(bytes),
            usage,
            mapped_at_creation: false,
        });
        self.bufs.insert(label, b.clone());
        b
    }
}

/// A step's bind groups by owner (the arena first, then each sequence): the last
/// step's, which a dispatch that binds the same reuses, and this step's.
#[derive(Debug)]
pub(crate) struct Groups {
    last: Vec<GroupMap>,
    kept: Vec<GroupMap>,
}

impl Groups {
    /// Takes the last step's groups from the arena and from `sequences`, the groups
    /// the batch's caches kept (see [`super::GpuCache`]).
    pub(crate) fn take(arena: &mut Arena, sequences: &mut [GroupMap]) -> Self {
        let last: Vec<GroupMap> = std::iter::once(std::mem::take(&mut arena.groups))
            .chain(sequences.iter_mut().map(std::mem::take))
            .collect();
        let kept = last
            .iter()
            .map(|g| HashMap::with_capacity(g.len()))
            .collect();
        Groups { last, kept }
    }

    /// The bind group `key` describes, kept by `owner`: the last step's if it had
    /// it, else a new one.
    pub(crate) fn get(
        &mut self,
        device: &wgpu::Device,
        owner: Owner,
        key: GroupKey,
    ) -> wgpu::BindGroup {
        let o = match owner {
            Owner::Step => 0,
            Owner::Sequence(i) => 1 + i,
        };
        let g = match self.last[o].remove(&key) {
            Some(g) => g,
            None => make(device, &key),
        };
        self.kept[o].insert(key, g.clone());
        g
    }

    /// Gives this step's groups to their owners; the last step's that it did not
    /// use are dropped.
    pub(crate) fn put_back(self, arena: &mut Arena, sequences: &mut [GroupMap]) {
        drop(self.last);
        let mut kept = self.kept.into_iter();
        arena.groups = kept.next().expect("the arena's groups");
        for (mine, groups) in sequences.iter_mut().zip(kept) {
            *mine = groups;
        }
    }
}

/// A new bind group: the kernel's buffers in order, then its parameters.
fn make(device: &wgpu::Device, key: &GroupKey) -> wgpu::BindGroup {
    let mut entries: Vec<wgpu::BindGroupEntry<'_>> = key
        .bindings
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &b.buf,
                offset: b.offset,
                size: b.size.and_then(wgpu::BufferSize::new),
            }),
        })
        .collect();
    entries.push(wgpu::BindGroupEntry {
        binding: key.bindings.len() as u32,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &key.uniforms,
            offset: key.params,
            size: wgpu::BufferSize::new(PARAM_BYTES),
        }),
    });
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &key.pipe.get_bind_group_layout(0),
        entries: &entries,
    })
}
