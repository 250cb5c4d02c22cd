//! A step's commands, recorded first and then encoded and submitted at once, with
//! the read-back of its results.

use super::arena::{Arena, Binding, GroupKey, GroupMap, Groups, Owner, PARAM_BYTES};
use super::device::{STORAGE, map_read};
use super::error::GpuError;
use super::profile::{StepProfile, Timestamps, Work};
use super::tensor::padded;

/// Where a recorded copy goes.
#[derive(Debug)]
pub(crate) enum Dest<'b> {
    /// A device buffer, at a float offset.
    Buffer(&'b wgpu::Buffer, usize),
    /// The step's read-back buffer, at a float offset.
    Readback(usize),
}

/// One recorded command.
#[derive(Debug)]
enum Op {
    Dispatch {
        pipe: wgpu::ComputePipeline,
        bindings: Vec<Binding>,
        /// Offset of its parameters in the uniform buffer.
        params: u64,
        groups: (u32, u32, u32),
        /// Where its bind group is kept for the next step.
        owner: Owner,
        /// What it computes, for profiles.
        work: Work,
    },
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
        size: u64,
    },
    /// A copy into the read-back buffer (which exists only once the step is known).
    Readback {
        src: wgpu::Buffer,
        src_off: u64,
        dst_off: u64,
        size: u64,
    },
}

/// One step's commands, collected first so that all kernel parameters go up in one
/// uniform buffer and the whole step in one submission.
#[derive(Debug)]
pub(crate) struct Recorder<'d> {
    device: &'d wgpu::Device,
    queue: &'d wgpu::Queue,
    arena: Arena,
    /// The largest buffer a kernel may bind.
    binding_limit: u64,
    ops: Vec<Op>,
    params: Vec<u8>,
    align: u64,
}

impl<'d> Recorder<'d> {
    pub(crate) fn new(
        device: &'d wgpu::Device,
        queue: &'d wgpu::Queue,
        limits: &wgpu::Limits,
        arena: Arena,
    ) -> Self {
        Recorder {
            device,
            queue,
            arena,
            binding_limit: limits.max_storage_buffer_binding_size,
            ops: Vec::new(),
            params: Vec::new(),
            align: u64::from(limits.min_uniform_buffer_offset_alignment).max(PARAM_BYTES),
        }
    }

    /// A device buffer of at least `floats` f32s (one word at least: WebGPU binds no
    /// empty ones).
    pub(crate) fn scratch(&mut self, label: &'static str, floats: usize) -> wgpu::Buffer {
        let bytes = (floats * 4) as u64;
        self.arena
            .get(self.device, label, bytes, STORAGE, self.binding_limit)
    }

    /// A device buffer holding `bytes`, written through the queue (which orders the
    /// write after the steps already submitted and before this one).
    pub(crate) fn upload(&mut self, label: &'static str, bytes: &[u8]) -> wgpu::Buffer {
        let buf = self.scratch(label, bytes.len().div_ceil(4));
        if !bytes.is_empty() {
            self.queue.write_buffer(&buf, 0, &padded(bytes));
        }
        buf
    }

    /// Records a dispatch of `pipe` over `bindings` (in binding order, the
    /// parameters bound after them), its bind group kept in the arena.
    pub(crate) fn dispatch<const N: usize, P: bytemuck::Pod>(
        &mut self,
        work: impl Into<Work>,
        pipe: &wgpu::ComputePipeline,
        bindings: [Binding; N],
        params: &P,
        groups: (u32, u32, u32),
    ) {
        self.dispatch_for(Owner::Step, work, pipe, bindings, params, groups);
    }

    /// [`Recorder::dispatch`], its bind group kept by `owner`.
    pub(crate) fn dispatch_for<const N: usize, P: bytemuck::Pod>(
        &mut self,
        owner: Owner,
        work: impl Into<Work>,
        pipe: &wgpu::ComputePipeline,
        bindings: [Binding; N],
        params: &P,
        groups: (u32, u32, u32),
    ) {
        debug_assert!(size_of::<P>() as u64 <= PARAM_BYTES);
        let at = self.params.len() as u64;
        self.params.extend_from_slice(bytemuck::bytes_of(params));
        self.params.resize((at + self.align) as usize, 0);
        self.ops.push(Op::Dispatch {
            pipe: pipe.clone(),
            bindings: bindings.into(),
            params: at,
            groups,
            owner,
            work: work.into(),
        });
    }

    /// Copies `floats` f32s from `src` at float offset `src_at`.
    pub(crate) fn copy(&mut self, src: &wgpu::Buffer, src_at: usize, dst: Dest<'_>, floats: usize) {
        let (src_off, size) = ((src_at * 4) as u64, (floats * 4) as u64);
        match dst {
            Dest::Buffer(dst, at) => self.copy_bytes(src, src_off, dst, (at * 4) as u64, size),
            Dest::Readback(at) => self.ops.push(Op::Readback {
                src: src.clone(),
                src_off,
                dst_off: (at * 4) as u64,
                size,
            }),
        }
    }

    /// Copies `size` bytes from `src` at `src_off` to `dst` at `dst_off`.
    pub(crate) fn copy_bytes(
        &mut self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        size: u64,
    ) {
        self.ops.push(Op::Copy {
            src: src.clone(),
            src_off,
            dst: dst.clone(),
            dst_off,
            size,
        });
    }

    /// Encodes and submits the step, then reads back `readback_floats` f32s.
    /// Gives the arena back with the data: a step that failed drops its arena, whose
    /// read-back buffer may still be mapped.
    ///
    /// `sequences` are the bind groups the batch's caches kept from their last step
    /// (see [`super::GpuCache`]); each comes back with this step's. With `timing`,
    /// each dispatch is timestamped (see [`super::GpuModel::profile_async`]).
    pub(crate) async fn finish(
        mut self,
        readback_floats: usize,
        sequences: &mut [GroupMap],
        timing: bool,
    ) -> Result<(Vec<f32>, Arena, Option<StepProfile>), GpuError> {
        let stamps_at = ((readback_floats * 4) as u64).next_multiple_of(8);
        let stamps = timing.then(|| Timestamps::new(self.device, self.works(), stamps_at));
        let uniforms = self.upload_params();
        let readback = self.arena.get(
            self.device,
            "readback",
            stamps_at + stamps.as_ref().map_or(0, Timestamps::bytes),
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            u64::MAX,
        );
        let groups = self.bind_groups(&uniforms, sequences);
        let mut enc = self.encode(&groups, &readback, stamps.as_ref());
        if let Some(stamps) = &stamps {
            stamps.resolve(self.device, &mut enc, &readback);
        }
        self.queue.submit([enc.finish()]);
        if readback_floats == 0 && stamps.is_none() {
            return Ok((Vec::new(), self.arena, None));
        }
        let period = self.queue.get_timestamp_period();
        let (data, profile) = read_back(
            self.device,
            &readback,
            readback_floats,
            stamps.map(|s| (s, period)),
        )
        .await?;
        Ok((data, self.arena, profile))
    }

    /// What each dispatch computes, in order.
    fn works(&self) -> Vec<Work> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Dispatch { work, .. } => Some(*work),
                _ => None,
            })
            .collect()
    }

    /// The uniform buffer, holding every dispatch's parameters.
    fn upload_params(&mut self) -> wgpu::Buffer {
        let uniforms = self.arena.get(
            self.device,
            "params",
            self.params.len() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            u64::MAX,
        );
        self.queue.write_buffer(&uniforms, 0, &padded(&self.params));
        uniforms
    }

    /// Each op's bind group (`None` for copies): the last step's where it binds the
    /// same, else new; this step's are kept by their owners for the next.
    fn bind_groups(
        &mut self,
        uniforms: &wgpu::Buffer,
        sequences: &mut [GroupMap],
    ) -> Vec<Option<wgpu::BindGroup>> {
        let mut groups = Groups::take(&mut self.arena, sequences);
        let bound = self
            .ops
            .iter()
            .map(|op| match op {
                Op::Dispatch {
                    pipe,
                    bindings,
                    params,
                    owner,
                    ..
                } => {
                    let key = GroupKey {
                        pipe: pipe.clone(),
                        bindings: bindings.clone(),
                        uniforms: uniforms.clone(),
                        params: *params,
                    };
                    Some(groups.get(self.device, *owner, key))
                }
                _ => None,
            })
            .collect();
        groups.put_back(&mut self.arena, sequences);
        bound
    }

    /// The step's commands: copies as they come, and each run of dispatches in one
    /// compute pass, or with `stamps` each dispatch in a pass of its own, stamped as
    /// it starts and ends.
    fn encode(
        &self,
        groups: &[Option<wgpu::BindGroup>],
        readback: &wgpu::Buffer,
        stamps: Option<&Timestamps>,
    ) -> wgpu::CommandEncoder {
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        let mut i = 0;
        // Dispatches encoded so far.
        let mut k = 0;
        while i < self.ops.len() {
            match &self.ops[i] {
                Op::Copy {
                    src,
                    src_off,
                    dst,
                    dst_off,
                    size,
                } => {
                    enc.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *size);
                    i += 1;
                }
                Op::Readback {
                    src,
                    src_off,
                    dst_off,
                    size,
                } => {
                    enc.copy_buffer_to_buffer(src, *src_off, readback, *dst_off, *size);
                    i += 1;
                }
                Op::Dispatch { .. } => {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: stamps.and_then(|s| s.writes(k)),
                    });
                    while let Some(Op::Dispatch {
                        pipe, groups: g, ..
                    }) = self.ops.get(i)
                    {
                        pass.set_pipeline(pipe);
                        pass.set_bind_group(0, groups[i].as_ref(), &[]);
                        pass.dispatch_workgroups(g.0, g.1, g.2);
                        i += 1;
                        k += 1;
                        if stamps.is_some() {
                            break;
                        }
                    }
                }
            }
        }
        enc
    }
}

/// Maps `readback` and reads its first `floats` f32s, and the profile from the
/// stamps after them when timed (with the timestamp period).
async fn read_back(
    device: &wgpu::Device,
    readback: &wgpu::Buffer,
    floats: usize,
    stamps: Option<(Timestamps, f32)>,
) -> Result<(Vec<f32>, Option<StepProfile>), GpuError> {
    map_read(device, readback).await?;
    let view = readback
        .get_mapped_range(..)
        .map_err(|e| GpuError::Readback(e.to_string()))?;
    let data = view[..floats * 4]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let profile = stamps.map(|(s, period)| s.profile(&view, period));
    drop(view);
    readback.unmap();
    Ok((data, profile))
}
