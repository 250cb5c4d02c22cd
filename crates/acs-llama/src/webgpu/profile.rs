//! Timing a step dispatch by dispatch on the device's clock ([`super::GpuModel::profile`]).

use crate::quant::GgmlType;

/// What one dispatch of a step computes, as [`super::GpuModel::profile`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// The embedding rows of the step's tokens.
    Embed,
    /// RMSNorm, rounding its output to 8-bit blocks where the matmuls read those.
    RmsNorm,
    /// Rounding a matmul's input to 8-bit blocks.
    Quantize,
    /// SwiGLU of the gate and up projections, rounded where the down projection reads
    /// 8-bit blocks.
    SwiGlu,
    /// A matrix of `rows` × `cols` weights in format `ty` (matrices stacked in one
    /// tensor count as one) times the step's vectors.
    Matmul {
        /// The weights' format.
        ty: GgmlType,
        /// Output rows.
        rows: usize,
        /// Input columns.
        cols: usize,
    },
    /// One sequence's attention over its cache, storing its new keys and values.
    Attention,
    /// A steering vector added to the residual stream.
    Steer,
    /// The query, key and value biases added to the projections.
    Bias,
    /// RoPE applied to the queries and keys on their own (where no matmul folds it in).
    Rope,
    /// RMSNorm of each query and key head.
    HeadNorm,
    /// A normed block output added to the residual stream.
    Residual,
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernel::Embed => f.write_str("embed"),
            Kernel::RmsNorm => f.write_str("rms_norm"),
            Kernel::Quantize => f.write_str("quantize"),
            Kernel::SwiGlu => f.write_str("swiglu"),
            Kernel::Matmul { ty, rows, cols } => write!(f, "matmul {ty:?} {rows}x{cols}"),
            Kernel::Attention => f.write_str("attention"),
            Kernel::Steer => f.write_str("steer"),
            Kernel::Bias => f.write_str("bias"),
            Kernel::HeadNorm => f.write_str("head_norm"),
            Kernel::Residual => f.write_str("residual"),
            Kernel::Rope => f.write_str("rope"),
        }
    }
}

/// One dispatch of a profiled step.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// What it computed.
    pub kernel: Kernel,
    /// From its start to its end on the device's clock.
    pub seconds: f64,
    /// Bytes of weight matrices it multiplied, as
    /// [`super::GpuModel::weight_bytes_per_step`] counts them (0 for the other kernels).
    pub weight_bytes: u64,
}

/// A step timed dispatch by dispatch on the device's clock ([`super::GpuModel::profile`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepProfile {
    /// Every dispatch, in the order the step ran them.
    pub kernels: Vec<KernelTime>,
    /// From the first dispatch's start to the last one's end: the kernels' time and
    /// the gaps between them (barriers, launches).
    pub span: f64,
}

/// What a dispatch computes, and the weight bytes it multiplies (as
/// [`super::GpuModel::weight_bytes_per_step`] counts them), for profiles.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    pub(crate) kernel: Kernel,
    pub(crate) weight_bytes: u64,
}

impl From<Kernel> for Work {
    fn from(kernel: Kernel) -> Self {
        Work {
            kernel,
            weight_bytes: 0,
        }
    }
}

/// Dispatches whose two timestamps fit one query set of WebGPU's largest size.
const PER_SET: usize = (wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;

/// The timestamp queries of a profiled step: two per dispatch, written as each
/// dispatch's pass starts and ends, resolved into the read-back buffer after the
/// floats.
#[derive(Debug)]
pub(crate) struct Timestamps {
    /// The dispatches, in order.
    work: Vec<Work>,
    sets: Vec<wgpu::QuerySet>,
    /// Where the stamps go in the read-back buffer.
    at: u64,
}

impl Timestamps {
    /// Query sets for the dispatches `work`, to be resolved at byte `at` of the
    /// read-back buffer.
    pub(crate) fn new(device: &wgpu::Device, work: Vec<Work>, at: u64) -> Self {
        let sets = work
            .chunks(PER_SET)
            .map(|c| {
                device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2 * c.len() as u32,
                })
            })
            .collect();
        Timestamps { work, sets, at }
    }

    /// Bytes of the resolved stamps.
    pub(crate) fn bytes(&self) -> u64 {
        16 * self.work.len() as u64
    }

    /// The stamps of dispatch `k`, for its pass.
    pub(crate) fn writes(&self, k: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        self.sets.get(k / PER_SET).map(|set| {
            let at = 2 * (k % PER_SET) as u32;
            wgpu::ComputePassTimestampWrites {
                query_set: set,
                beginning_of_pass_write_index: Some(at),
                end_of_pass_write_index: Some(at + 1),
            }
        })
    }

    /// Resolves the stamps into `readback`, after the step's commands in `enc`.
    pub(crate) fn resolve(
        &self,
        device: &wgpu::Device,
        enc: &mut wgpu::CommandEncoder,
        readback: &wgpu::Buffer,
    ) {
        let bytes = self.bytes();
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        for (s, (set, part)) in self.sets.iter().zip(self.work.chunks(PER_SET)).enumerate() {
            let at = (16 * s * PER_SET) as u64;
            enc.resolve_query_set(set, 0..2 * part.len() as u32, &resolved, at);
        }
        enc.copy_buffer_to_buffer(&resolved, 0, readback, self.at, bytes);
    }

    /// The profile from the mapped read-back buffer `view`, whose ticks last
    /// `period` nanoseconds.
    pub(crate) fn profile(&self, view: &[u8], period: f32) -> StepProfile {
        let at = self.at as usize;
        let ticks: Vec<u64> = view[at..at + self.bytes() as usize]
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        let tick = f64::from(period) * 1e-9;
        let seconds = |from: u64, to: u64| to.saturating_sub(from) as f64 * tick;
        let kernels = self
            .work
            .iter()
            .zip(ticks.chunks_exact(2))
            .map(|(w, t)| KernelTime {
                kernel: w.kernel,
                seconds: seconds(t[0], t[1]),
                weight_bytes: w.weight_bytes,
            })
            .collect();
        let first = ticks.iter().step_by(2).min().copied().unwrap_or(0);
        let last = ticks.iter().skip(1).step_by(2).max().copied().unwrap_or(0);
        StepProfile {
            kernels,
            span: seconds(first, last),
        }
    }
}
