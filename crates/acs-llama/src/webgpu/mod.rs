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

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use wgpu::util::DeviceExt;

/// The wgpu this backend is built on, for callers that hold its adapters.
pub use wgpu;

use crate::arch::KV_VALUE_BYTES;
use crate::arch::llama::{BlockTensors, EMBED, LlamaConfig, OUTPUT, OUTPUT_NORM, rope_inv_freq};
use crate::gguf::{GgufError, GgufFile, GgufHeader, TensorInfo};
use crate::model::{Logits, ModelError, SeqInput, SeqOutput, check_dims};
use crate::quant::{self, GgmlType};

/// The weight formats with a WGSL kernel here (`dequant.wgsl`).
pub const SUPPORTED: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Threads per workgroup of every kernel (the WGSL files hard-code it too).
const WG: u32 = 64;
/// Vectors per matmul workgroup (`TILE` in matmul.wgsl).
const TILE: u32 = 8;
/// The most workgroups WebGPU guarantees along one dispatch dimension.
const MAX_GROUPS: u32 = 65_535;
/// Cache capacity grows in steps of this many positions, which keeps each layer's
/// slice of a cache buffer at a multiple of 256 bytes, the largest storage-binding
/// offset alignment WebGPU allows.
const CACHE_STEP: usize = 64;
/// The widest head whose attention output the attention kernel rounds itself
/// (`MAX_HEAD` in attention.wgsl).
const MAX_HEAD: usize = 256;
/// Bytes of one kernel's parameters in the step's uniform buffer (all fit in 16 words).
const PARAM_BYTES: u64 = 64;

/// What one dispatch of a step computes, as [`GpuModel::profile`] names it.
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
    /// [`GpuModel::weight_bytes_per_step`] counts them (0 for the other kernels).
    pub weight_bytes: u64,
}

/// A step timed dispatch by dispatch on the device's clock ([`GpuModel::profile`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepProfile {
    /// Every dispatch, in the order the step ran them.
    pub kernels: Vec<KernelTime>,
    /// From the first dispatch's start to the last one's end: the kernels' time and
    /// the gaps between them (barriers, launches).
    pub span: f64,
}

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

/// Finds an adapter: the best hardware one (discrete, then integrated, then virtual),
/// else a software one (lavapipe, SwiftShader) if `allow_software`. Report its
/// `get_info()` (name, backend, device type) so a slow software fallback is visible.
pub async fn pick_adapter(allow_software: bool) -> Result<wgpu::Adapter, GpuError> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let usable =
        |a: &wgpu::Adapter| allow_software || a.get_info().device_type != wgpu::DeviceType::Cpu;
    let mut adapters: Vec<wgpu::Adapter> = instance
        .enumerate_adapters(wgpu::Backends::all())
        .await
        .into_iter()
        .filter(usable)
        .collect();
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    if let Some(a) = adapters.into_iter().next() {
        return Ok(a);
    }
    // The browser lists no adapters; it hands out one on request.
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    match instance.request_adapter(&options).await {
        Ok(a) if usable(&a) => Ok(a),
        _ => Err(GpuError::NoAdapter { allow_software }),
    }
}

/// One weight buffer of a tensor: rows `row0 .. row0 + rows`.
#[derive(Debug, Clone)]
struct Chunk {
    buf: wgpu::Buffer,
    row0: usize,
    rows: usize,
}

/// A weight matrix on the device, in its ggml format, split by rows into buffers that
/// each fit the device's binding limit.
#[derive(Debug, Clone)]
struct GpuTensor {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    chunks: Vec<Chunk>,
}

/// A block's weights and norms on the device. The matrices that read the same input
/// come as a list whose rows, in order, are the outputs' rows side by side: one
/// tensor where the loader stacked them (see [`GpuLoader::new`]), one matmul
/// dispatch for all; each on its own where their formats differ (as llama.cpp's mixed
/// quantizations make the value projection), a dispatch each into the same rows.
#[derive(Debug)]
struct GpuBlock {
    attn_norm: wgpu::Buffer,
    /// Query, key and value projections.
    qkv: Vec<GpuTensor>,
    wo: GpuTensor,
    ffn_norm: wgpu::Buffer,
    /// Gate and up projections.
    gate_up: Vec<GpuTensor>,
    down: GpuTensor,
}

/// Matrices stored as one tensor, their rows end to end: the loader writes each
/// part's bytes at its place as they arrive.
#[derive(Debug)]
struct Stack {
    tensor: GpuTensor,
    /// Parts not yet whole.
    waiting: Vec<String>,
}

/// One tensor for the matrices `parts` (which read the same input), where they can
/// share one: the same format and row length, rows of whole words (each part's
/// bytes then start on a word, as WebGPU writes them), and room for all in one
/// buffer. The matmul over them is then one dispatch. Returns it with each part's
/// first row in it.
fn stack(
    device: &wgpu::Device,
    limits: &wgpu::Limits,
    header: &GgufHeader,
    needs: &HashMap<String, Need>,
    parts: &[String],
) -> Result<Option<(GpuTensor, Vec<usize>)>, GpuError> {
    let mut shape = None;
    let mut starts = Vec::with_capacity(parts.len());
    let mut rows = 0;
    for name in parts {
        let ty = header.require_tensor(name)?.ty;
        let Some(&Need::Matrix { cols, rows: r }) = needs.get(name) else {
            return Ok(None);
        };
        if *shape.get_or_insert((ty, cols)) != (ty, cols) {
            return Ok(None);
        }
        starts.push(rows);
        rows += r;
    }
    let Some((ty, cols)) = shape else {
        return Ok(None);
    };
    let row_bytes = ty.row_bytes(cols).map_err(ModelError::from)?;
    if !row_bytes.is_multiple_of(4) || rows > rows_per_buffer(limits, row_bytes) {
        return Ok(None);
    }
    let label = format!("{} and the rest of its stack", parts[0]);
    let tensor = GpuModel::create_tensor(device, limits, &label, ty, cols, rows)?;
    Ok(Some((tensor, starts)))
}

/// The largest buffer a kernel can bind.
fn bind_limit(limits: &wgpu::Limits) -> u64 {
    limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size)
}

/// Rows of `row_bytes` a weight buffer holds: whole rows within the binding limit,
/// less a word of padding slack, and an even number of them, so that a pair of rows
/// RoPE rotates together is never split between buffers.
fn rows_per_buffer(limits: &wgpu::Limits, row_bytes: usize) -> usize {
    ((bind_limit(limits) - 4) / row_bytes as u64) as usize & !1
}

/// The compiled kernels; the weight-reading ones once per format the model uses.
#[derive(Debug)]
struct Pipelines {
    /// Per format, and whether it applies RoPE (the query and key projections' own).
    matmul: HashMap<(GgmlType, bool), wgpu::ComputePipeline>,
    /// Weight rows per matmul workgroup, and the threads that share each row.
    matmul_rows: u32,
    embed: wgpu::ComputePipeline,
    rms_norm: wgpu::ComputePipeline,
    quantize: wgpu::ComputePipeline,
    add: wgpu::ComputePipeline,
    attention: wgpu::ComputePipeline,
}

/// A Llama model whose weights live on a WebGPU device.
#[derive(Debug)]
pub struct GpuModel {
    /// Hyper-parameters.
    pub config: LlamaConfig,
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
    pipes: Pipelines,
    /// Why the device was lost, once it is.
    lost: Arc<Mutex<Option<String>>>,
    /// The step buffers, between steps (taken by a step while it runs).
    arena: Mutex<Option<Arena>>,
}

/// One sequence's keys and values on the device.
#[derive(Debug, Default)]
pub struct GpuCache {
    /// `[layer][cap][kv_dim]` keys and values, half floats two to a word (as the CPU's
    /// [`crate::model::KvCache`] holds them); `None` until the first token.
    kv: Option<(wgpu::Buffer, wgpu::Buffer)>,
    len: usize,
    cap: usize,
    /// Positions to allocate at once when the cache first needs more than `cap` (see
    /// [`GpuCache::reserve`]).
    room: usize,
    layer_bytes: u64,
    /// The bind groups of the last step's kernels that bound this cache, kept with
    /// it (see [`Arena::groups`]) so that they end with the sequence: kept in the
    /// arena, they would keep its buffers alive after it ended, beside the next
    /// batch's new caches (twice the KV memory at once) or through an idle spell.
    groups: HashMap<GroupKey, wgpu::BindGroup>,
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

/// One sequence's part of a batch step: the CPU's input, over a device cache.
pub type GpuSeqInput<'a> = SeqInput<'a, GpuCache>;

/// Bytes `data` padded with zeros to whole words (storage buffers hold `u32`s).
fn padded(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if data.len().is_multiple_of(4) && !data.is_empty() {
        std::borrow::Cow::Borrowed(data)
    } else {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(4).max(1) * 4, 0);
        std::borrow::Cow::Owned(v)
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Where a dispatch's bind group is kept from one step to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// In the arena: it binds the step's own buffers and the weights.
    Step,
    /// With the KV cache of the batch's sequence of this index, which it binds.
    Sequence(usize),
}

/// How a matmul writes its results.
#[derive(Debug, Clone, Copy)]
enum Store<'a> {
    /// Overwrites the output.
    Set,
    /// Adds to the output: the residual stream, so that its add costs no dispatch.
    Add,
    /// Overwrites the output, its queries and keys (each row's first `d + kv_dim`
    /// values) rotated by RoPE with these angles, so that RoPE costs no dispatch.
    Rotated(&'a wgpu::Buffer),
}

/// What the model needs of a tensor.
#[derive(Debug, Clone, Copy)]
enum Need {
    /// A weight matrix of `rows` rows of `cols`, kept in its ggml format.
    Matrix { cols: usize, rows: usize },
    /// A norm's gains, expanded to f32.
    Vector { n: usize },
}

/// A weight matrix whose bytes are arriving in order: its buffers exist and are
/// written piece by piece with `Queue::write_buffer`, which copies from the caller's
/// memory straight to the device (a buffer mapped at creation would stage a copy of
/// the whole tensor in wasm memory).
#[derive(Debug)]
struct Arriving {
    tensor: GpuTensor,
    /// The byte of `tensor` the next write goes to.
    done: u64,
    /// Where this matrix's bytes end in `tensor` (a stack holds others after it).
    end: u64,
    /// Up to 3 bytes held back so that every write is whole words, as WebGPU needs.
    carry: Vec<u8>,
}

impl Arriving {
    /// A matrix of `rows` rows arriving into `tensor` from row `at` on.
    fn new(tensor: GpuTensor, at: usize, rows: usize) -> Self {
        let row_bytes = tensor.row_bytes as u64;
        Arriving {
            done: at as u64 * row_bytes,
            end: (at + rows) as u64 * row_bytes,
            tensor,
            carry: Vec::new(),
        }
    }

    /// Writes the matrix's next `bytes`.
    fn write(&mut self, queue: &wgpu::Queue, bytes: &[u8]) {
        let joined;
        let rest: &[u8] = if self.carry.is_empty() {
            bytes
        } else {
            joined = [std::mem::take(&mut self.carry).as_slice(), bytes].concat();
            &joined
        };
        // More bytes than the matrix holds are dropped: the stream gives exactly its
        // size, and a stack's next part must stay as it is.
        let mut rest = &rest[..rest.len().min(self.end.saturating_sub(self.done) as usize)];
        let mut pos = self.done;
        let row_bytes = self.tensor.row_bytes as u64;
        while !rest.is_empty() {
            let Some(chunk) = self
                .tensor
                .chunks
                .iter()
                .find(|c| (c.row0 + c.rows) as u64 * row_bytes > pos)
            else {
                break;
            };
            let start = chunk.row0 as u64 * row_bytes;
            let off = pos - start;
            let room = chunk.rows as u64 * row_bytes - off;
            let n = if rest.len() as u64 >= room {
                // The buffer's last bytes: a partial word is padded with zeros.
                let room = room as usize;
                let whole = room & !3;
                queue.write_buffer(&chunk.buf, off, &rest[..whole]);
                if whole < room {
                    let mut tail = [0u8; 4];
                    tail[..room - whole].copy_from_slice(&rest[whole..room]);
                    queue.write_buffer(&chunk.buf, off + whole as u64, &tail);
                }
                room
            } else {
                let whole = rest.len() & !3;
                if whole > 0 {
                    queue.write_buffer(&chunk.buf, off, &rest[..whole]);
                }
                self.carry = rest[whole..].to_vec();
                rest = &[];
                pos += whole as u64;
                continue;
            };
            pos += n as u64;
            rest = &rest[n..];
        }
        self.done = pos;
    }
}

/// How the matmul kernels spread a weight row over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulLayout {
    /// One thread per row: what adapters running on the CPU (lavapipe, SwiftShader)
    /// vectorise best, since they run threads as SIMD lanes and pay for barriers.
    ThreadPerRow,
    /// 16 threads per row reading its blocks in turn, summed in workgroup memory: a
    /// GPU's coalesced reads, and enough threads for the small matrices of decode.
    LanesPerRow,
}

impl MatmulLayout {
    /// The layout for an adapter: per row on CPU-based adapters, lanes on GPUs.
    pub fn for_adapter(info: &wgpu::AdapterInfo) -> Self {
        if info.device_type == wgpu::DeviceType::Cpu {
            MatmulLayout::ThreadPerRow
        } else {
            MatmulLayout::LanesPerRow
        }
    }

    fn lanes(self) -> u32 {
        match self {
            MatmulLayout::ThreadPerRow => 1,
            MatmulLayout::LanesPerRow => 16,
        }
    }
}

/// Uploads a model's weights to a device tensor by tensor, in whatever order they
/// come: from a whole file ([`GpuModel::load`]), or while a browser streams the file
/// through a [`crate::gguf::TensorStream`], so that the file is never whole in memory.
/// Every tensor the model needs is checked against the header before any upload.
#[derive(Debug)]
pub struct GpuLoader {
    config: LlamaConfig,
    info: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    lost: Arc<Mutex<Option<String>>>,
    scopes: ErrorScopes,
    needs: HashMap<String, Need>,
    matrices: HashMap<String, GpuTensor>,
    vectors: HashMap<String, wgpu::Buffer>,
    /// Matrices partly written.
    arriving: HashMap<String, Arriving>,
    /// Norm vectors partly received (they are small).
    pending: HashMap<String, Vec<u8>>,
    formats: Vec<GgmlType>,
    layout: MatmulLayout,
    /// The tensors that hold several matrices each.
    stacks: Vec<Stack>,
    /// The stacked matrices: their stack and first row in it.
    part_of: HashMap<String, (usize, usize)>,
    /// Matrices whole on the device.
    uploaded: usize,
}

impl GpuLoader {
    /// Opens a device on `adapter` for the model `header` describes.
    pub async fn new(header: &GgufHeader, adapter: wgpu::Adapter) -> Result<Self, GpuError> {
        let config = LlamaConfig::from_metadata(&header.metadata)?;
        let c = &config;
        let mut needs = HashMap::new();
        let matrix = |cols, rows| Need::Matrix { cols, rows };
        needs.insert(EMBED.to_owned(), matrix(c.d_model, c.vocab));
        if header.tensor(OUTPUT).is_some() {
            needs.insert(OUTPUT.to_owned(), matrix(c.d_model, c.vocab));
        }
        needs.insert(OUTPUT_NORM.to_owned(), Need::Vector { n: c.d_model });
        for l in 0..c.n_layers {
            BlockTensors::<(), ()>::load(
                c,
                l,
                &mut needs,
                |needs, name, cols, rows| {
                    needs.insert(name.to_owned(), matrix(cols, rows));
                    Ok::<_, GpuError>(())
                },
                |needs, name, n| {
                    needs.insert(name.to_owned(), Need::Vector { n });
                    Ok(())
                },
            )?;
        }
        // A missing or misshapen tensor fails now, before a byte is uploaded.
        for (name, need) in &needs {
            let info = header.require_tensor(name)?;
            match *need {
                Need::Matrix { cols, rows } => {
                    check_dims(info, cols, rows)?;
                    if !SUPPORTED.contains(&info.ty) {
                        return Err(GpuError::Unsupported {
                            name: name.clone(),
                            ty: info.ty,
                        });
                    }
                }
                Need::Vector { n } => check_dims(info, n, 1)?,
            }
        }
        let info = adapter.get_info();
        let have = adapter.limits();
        // The WebGPU defaults, except as large buffers as the adapter can bind: the
        // embedding of a real model is hundreds of MiB.
        let required_limits = wgpu::Limits {
            max_storage_buffer_binding_size: have.max_storage_buffer_binding_size,
            max_buffer_size: have.max_buffer_size,
            ..wgpu::Limits::default()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("acs-llama"),
                // Only for profiling (GpuModel::profile); a step without it is the same.
                required_features: adapter.features() & wgpu::Features::TIMESTAMP_QUERY,
                required_limits,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_cb.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        let limits = device.limits();
        let scopes = ErrorScopes::push(&device);
        let mut stacks = Vec::new();
        let mut part_of = HashMap::new();
        for l in 0..c.n_layers {
            let n = BlockTensors::<String, ()>::load(
                c,
                l,
                &mut (),
                |_, name, _, _| Ok::<_, GpuError>(name.to_owned()),
                |_, _, _| Ok(()),
            )?;
            for parts in [vec![n.wq, n.wk, n.wv], vec![n.gate, n.up]] {
                if let Some((tensor, starts)) = stack(&device, &limits, header, &needs, &parts)? {
                    for (name, at) in parts.iter().zip(starts) {
                        part_of.insert(name.clone(), (stacks.len(), at));
                    }
                    stacks.push(Stack {
                        tensor,
                        waiting: parts,
                    });
                }
            }
        }
        Ok(GpuLoader {
            config,
            layout: MatmulLayout::for_adapter(&info),
            info,
            device,
            queue,
            limits,
            lost,
            scopes,
            needs,
            matrices: HashMap::new(),
            vectors: HashMap::new(),
            arriving: HashMap::new(),
            stacks,
            part_of,
            uploaded: 0,
            pending: HashMap::new(),
            formats: Vec::new(),
        })
    }

    /// Chooses the matmul kernels' layout instead of [`MatmulLayout::for_adapter`]'s
    /// (tests run both on one adapter).
    pub fn set_matmul_layout(&mut self, layout: MatmulLayout) {
        self.layout = layout;
    }

    /// Tensors the model needs.
    pub fn tensors_needed(&self) -> usize {
        self.needs.len()
    }

    /// Tensors uploaded so far.
    pub fn tensors_uploaded(&self) -> usize {
        self.uploaded + self.vectors.len()
    }

    /// Uploads tensor `info` from its bytes if the model needs it (others are skipped).
    pub fn add(&mut self, info: &TensorInfo, bytes: &[u8]) -> Result<(), GpuError> {
        self.add_piece(info, bytes, true)
    }

    /// Uploads the next piece of tensor `info` (pieces in order, `last` on its final
    /// one), as [`crate::gguf::TensorStream::push_pieces`] hands them over.
    pub fn add_piece(
        &mut self,
        info: &TensorInfo,
        bytes: &[u8],
        last: bool,
    ) -> Result<(), GpuError> {
        match self.needs.get(&info.name).copied() {
            None => Ok(()),
            Some(Need::Matrix { cols, rows }) => {
                let part = self.part_of.get(&info.name).copied();
                let arriving = match self.arriving.entry(info.name.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        check_dims(info, cols, rows)?;
                        let (tensor, at) = match part {
                            Some((s, at)) => (self.stacks[s].tensor.clone(), at),
                            None => (
                                GpuModel::create_tensor(
                                    &self.device,
                                    &self.limits,
                                    &info.name,
                                    info.ty,
                                    cols,
                                    rows,
                                )?,
                                0,
                            ),
                        };
                        e.insert(Arriving::new(tensor, at, rows))
                    }
                };
                arriving.write(&self.queue, bytes);
                if last {
                    let a = self.arriving.remove(&info.name).expect("inserted above");
                    if !self.formats.contains(&a.tensor.ty) {
                        self.formats.push(a.tensor.ty);
                    }
                    self.uploaded += 1;
                    match part {
                        Some((s, _)) => self.stacks[s].waiting.retain(|n| *n != info.name),
                        None => {
                            self.matrices.insert(info.name.clone(), a.tensor);
                        }
                    }
                }
                Ok(())
            }
            Some(Need::Vector { n }) => {
                let mut data = self.pending.remove(&info.name).unwrap_or_default();
                data.extend_from_slice(bytes);
                if last {
                    let b = GpuModel::upload_vector(&self.device, info, &data, n)?;
                    self.vectors.insert(info.name.clone(), b);
                } else {
                    self.pending.insert(info.name.clone(), data);
                }
                Ok(())
            }
        }
    }

    /// The model, once every tensor it needs is uploaded; reports any error the
    /// device raised meanwhile (out of memory, for one).
    pub async fn finish(mut self) -> Result<GpuModel, GpuError> {
        let embed = self.take_matrix(EMBED)?;
        let output = if self.needs.contains_key(OUTPUT) {
            Some(self.take_matrix(OUTPUT)?)
        } else {
            None
        };
        let c = self.config.clone();
        let blocks = (0..c.n_layers)
            .map(|l| {
                let t = BlockTensors::<String, wgpu::Buffer>::load(
                    &c,
                    l,
                    &mut self,
                    |_, name, _, _| Ok(name.to_owned()),
                    |s, name, _| take(&mut s.vectors, name),
                )?;
                Ok(GpuBlock {
                    attn_norm: t.attn_norm,
                    qkv: self.take_matrices(&[&t.wq, &t.wk, &t.wv])?,
                    wo: self.take_matrix(&t.wo)?,
                    ffn_norm: t.ffn_norm,
                    gate_up: self.take_matrices(&[&t.gate, &t.up])?,
                    down: self.take_matrix(&t.down)?,
                })
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
        let out_norm = take(&mut self.vectors, OUTPUT_NORM)?;
        let mut rope_formats: Vec<GgmlType> =
            blocks.iter().flat_map(|b| &b.qkv).map(|w| w.ty).collect();
        rope_formats.sort_by_key(|ty| ty.id());
        rope_formats.dedup();
        let formats = [self.formats.as_slice(), rope_formats.as_slice()];
        let pipes = Pipelines::new(&self.device, formats, embed.ty, self.layout);
        self.scopes.pop().await?;
        let rope_inv_freq = rope_inv_freq(&c);
        Ok(GpuModel {
            config: self.config,
            info: self.info,
            device: self.device,
            queue: self.queue,
            limits: self.limits,
            embed,
            output,
            blocks,
            out_norm,
            rope_inv_freq,
            pipes,
            lost: self.lost,
            arena: Mutex::new(None),
        })
    }

    /// Removes an uploaded matrix, or says it never came.
    fn take_matrix(&mut self, name: &str) -> Result<GpuTensor, GpuError> {
        self.matrices.remove(name).ok_or_else(|| missing(name))
    }

    /// The matrices `names` (which read the same input) as the tensors that hold them:
    /// their stack, or each alone.
    fn take_matrices(&mut self, names: &[&str]) -> Result<Vec<GpuTensor>, GpuError> {
        match self.part_of.get(names[0]) {
            Some(&(s, _)) => match self.stacks[s].waiting.first() {
                Some(name) => Err(missing(name)),
                None => Ok(vec![self.stacks[s].tensor.clone()]),
            },
            None => names.iter().map(|n| self.take_matrix(n)).collect(),
        }
    }
}

/// The error for a tensor that never came.
fn missing(name: &str) -> GpuError {
    ModelError::from(GgufError::MissingTensor(name.to_owned())).into()
}

/// Removes an uploaded vector, or says it never came.
fn take(vectors: &mut HashMap<String, wgpu::Buffer>, name: &str) -> Result<wgpu::Buffer, GpuError> {
    vectors.remove(name).ok_or_else(|| missing(name))
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
        let t = |t: &GpuTensor| (t.rows * t.row_bytes) as u64;
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
            .map(t)
            .sum();
        blocks + t(self.output.as_ref().unwrap_or(&self.embed))
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
    /// The device buffers of a weight matrix (split by rows under the binding
    /// limit), empty: [`Arriving::write`] fills them as the bytes come.
    fn create_tensor(
        device: &wgpu::Device,
        limits: &wgpu::Limits,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
    ) -> Result<GpuTensor, GpuError> {
        if !SUPPORTED.contains(&ty) {
            return Err(GpuError::Unsupported {
                name: name.to_owned(),
                ty,
            });
        }
        // The kernels expand 32 values at a time.
        if !cols.is_multiple_of(32) {
            return Err(ModelError::Shape(format!(
                "{name}: row length {cols} is not a multiple of 32"
            ))
            .into());
        }
        let row_bytes = ty.row_bytes(cols).map_err(ModelError::from)?;
        let limit = bind_limit(limits);
        let per = rows_per_buffer(limits, row_bytes);
        if per == 0 {
            return Err(GpuError::TooLarge {
                what: format!("a row of {name}"),
                needed: row_bytes as u64,
                limit,
            });
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = per.min(rows - row0);
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size: ((n * row_bytes).div_ceil(4) * 4) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            chunks.push(Chunk { buf, row0, rows: n });
            row0 += n;
        }
        Ok(GpuTensor {
            ty,
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    /// A norm's gains, expanded to f32 (they are tiny).
    fn upload_vector(
        device: &wgpu::Device,
        info: &TensorInfo,
        bytes: &[u8],
        n: usize,
    ) -> Result<wgpu::Buffer, GpuError> {
        check_dims(info, n, 1)?;
        let mut v = vec![0f32; n];
        quant::dequantize_row(info.ty, bytes, &mut v).map_err(ModelError::from)?;
        Ok(
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&info.name),
                contents: &f32_bytes(&v),
                usage: wgpu::BufferUsages::STORAGE,
            }),
        )
    }

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
            groups: HashMap::new(),
        })
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

    /// One step, its profile too when `profile` (see [`GpuModel::profile_async`]).
    async fn step(
        &self,
        batch: &mut [GpuSeqInput<'_>],
        profile: bool,
    ) -> Result<(Vec<SeqOutput>, Option<StepProfile>), GpuError> {
        self.check_lost()?;
        let c = &self.config;
        let (d, kv) = (c.d_model, c.kv_dim());
        let mut spans = Vec::with_capacity(batch.len());
        let mut total = 0usize;
        for s in batch.iter() {
            let end = s.cache.len + s.tokens.len();
            if end > c.context {
                return Err(ModelError::ContextFull(end, c.context).into());
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::TokenOutOfRange(bad).into());
            }
            for a in s.steering {
                if a.layer >= c.n_layers || a.vector.len() != d {
                    return Err(ModelError::Shape(format!(
                        "steering vector of {} values for layer {}",
                        a.vector.len(),
                        a.layer
                    ))
                    .into());
                }
            }
            spans.push(total..total + s.tokens.len());
            total += s.tokens.len();
        }
        let mut outputs: Vec<SeqOutput> = batch.iter().map(|_| SeqOutput::default()).collect();
        if total == 0 {
            return Ok((outputs, None));
        }
        if total > MAX_GROUPS as usize {
            return Err(GpuError::TooLarge {
                what: format!("a step of {total} tokens"),
                needed: total as u64,
                limit: u64::from(MAX_GROUPS),
            });
        }
        // Every cache's growth is checked before any is replaced, so that a refused
        // step leaves all of them as they were.
        let mut grown = Vec::with_capacity(batch.len());
        for s in batch.iter() {
            grown.push(self.grown_capacity(s.cache, s.cache.len + s.tokens.len())?);
        }
        let score_floats = batch
            .iter()
            .map(|s| s.tokens.len() * c.n_heads * (s.cache.len + s.tokens.len()))
            .max()
            .unwrap_or(0);
        let largest = [
            total * (2 * c.ffn).max(d + 2 * kv),
            score_floats,
            batch.iter().map(logit_count).sum::<usize>() * c.vocab,
        ];
        let limit = self.limits.max_storage_buffer_binding_size;
        if let Some(&n) = largest.iter().find(|&&n| (n * 4) as u64 > limit) {
            return Err(GpuError::TooLarge {
                what: format!("a step of {total} tokens"),
                needed: (n * 4) as u64,
                limit,
            });
        }
        let scopes = ErrorScopes::push(&self.device);
        // A step running at the same time (none does: the engine runs one at a time)
        // would find the arena taken and use fresh buffers.
        let arena = self
            .arena
            .lock()
            .ok()
            .and_then(|mut a| a.take())
            .unwrap_or_default();
        let mut rec = Recorder::new(&self.device, &self.queue, &self.limits, arena);
        for (s, cap) in batch.iter_mut().zip(grown) {
            if let Some(cap) = cap {
                self.grow(s.cache, cap, &mut rec);
            }
        }

        // Inputs of the step: tokens, RoPE angles, steering vectors.
        let tokens: Vec<u8> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().flat_map(|t| t.to_le_bytes()))
            .collect();
        let tok_buf = rec.upload("tokens", &tokens);
        let pairs = c.rope_dims / 2;
        let mut angles = Vec::with_capacity(total * pairs * 2);
        for s in batch.iter() {
            for i in 0..s.tokens.len() {
                let pos = (s.cache.len + i) as f32;
                for &f in &self.rope_inv_freq {
                    let (sin, cos) = (pos * f).sin_cos();
                    angles.extend([cos, sin]);
                }
            }
        }
        let rope_buf = rec.upload("rope", &f32_bytes(&angles));
        let mut steer = Vec::new();
        // (layer, sequence, offset of its vector in `steer`)
        let mut steer_at = Vec::new();
        for (si, s) in batch.iter().enumerate() {
            for a in s.steering {
                steer_at.push((a.layer, si, steer.len()));
                steer.extend_from_slice(&a.vector);
            }
        }
        let steer_buf = rec.upload("steering", &f32_bytes(&steer));

        // Results to read back: captures first, then logits.
        let mut capture_at = Vec::new();
        let mut readback_floats = 0usize;
        for (si, (s, span)) in batch.iter().zip(&spans).enumerate() {
            for &l in s.capture.iter().filter(|&&l| l < c.n_layers) {
                capture_at.push((l, si, readback_floats));
                readback_floats += span.len() * d;
            }
        }
        let logits_at = readback_floats;
        let mut logit_rows = Vec::new();
        for (s, span) in batch.iter().zip(&spans) {
            logit_rows.extend(span.end - logit_count(s)..span.end);
        }
        readback_floats += logit_rows.len() * c.vocab;

        let t = total;
        let x = rec.scratch("x", t * d);
        let xn = rec.scratch("xn", t * d);
        let xq = rec.scratch("xq", t * d);
        // Each row's queries, keys and values side by side, as one matmul writes them.
        let qkv = rec.scratch("qkv", t * (d + 2 * kv));
        let attn = rec.scratch("attn", t * d);
        // Each row's gate and up projections side by side.
        let gate_up = rec.scratch("gate_up", t * 2 * c.ffn);
        let act = rec.scratch("act", t * c.ffn);
        let scores = rec.scratch("scores", score_floats);

        for ch in &self.embed.chunks {
            let p = [
                ch.row0 as u32,
                ch.rows as u32,
                t as u32,
                d as u32,
                self.embed.row_bytes as u32,
            ];
            let groups = ((d as u32 / 32).div_ceil(WG), t as u32, 1);
            rec.dispatch(
                Kernel::Embed,
                &self.pipes.embed,
                [whole(&ch.buf), whole(&tok_buf), whole(&x)],
                &p,
                groups,
            );
        }

        for (l, b) in self.blocks.iter().enumerate() {
            let mut quantized = self.rms_norm(&mut rec, &x, &b.attn_norm, (&xn, &xq), t, &b.qkv);
            self.matmul(
                &mut rec,
                &b.qkv,
                &xn,
                &xq,
                &mut quantized,
                (&qkv, Store::Rotated(&rope_buf)),
                t,
            );
            // Attention rounds its output where the output projection reads 8-bit
            // blocks and a head is whole blocks.
            let mut rounded = b.wo.ty.uses_q8_activations()
                && c.head_dim.is_multiple_of(32)
                && c.head_dim <= MAX_HEAD;
            for (si, (s, span)) in batch.iter().zip(&spans).enumerate() {
                self.attend(&mut rec, l, (si, s), span, rounded, [&qkv, &scores, &attn]);
            }
            let wo = std::slice::from_ref(&b.wo);
            let attn_q = if rounded { &attn } else { &xq };
            self.matmul(
                &mut rec,
                wo,
                &attn,
                attn_q,
                &mut rounded,
                (&x, Store::Add),
                t,
            );

            let mut quantized = self.rms_norm(&mut rec, &x, &b.ffn_norm, (&xn, &xq), t, &b.gate_up);
            let gu = (&gate_up, Store::Set);
            self.matmul(&mut rec, &b.gate_up, &xn, &xq, &mut quantized, gu, t);
            // SwiGLU, rounded on the way where the down projection reads 8-bit blocks:
            // `act` is then its input either way.
            let round = b.down.ty.uses_q8_activations();
            self.quantize(&mut rec, &gate_up, Some(c.ffn), round, &act, t * c.ffn / 32);
            let down = std::slice::from_ref(&b.down);
            self.matmul(&mut rec, down, &act, &act, &mut true, (&x, Store::Add), t);

            for &(_, si, at) in steer_at.iter().filter(|e| e.0 == l) {
                let span = &spans[si];
                self.add(
                    &mut rec,
                    &x,
                    span.start * d,
                    &steer_buf,
                    at,
                    span.len() * d,
                    d,
                );
            }
            for &(_, si, at) in capture_at.iter().filter(|e| e.0 == l) {
                let span = &spans[si];
                rec.copy(&x, span.start * d, Dest::Readback(at), span.len() * d);
            }
        }

        if !logit_rows.is_empty() {
            let r = logit_rows.len();
            let h = rec.scratch("h", r * d);
            let hn = rec.scratch("hn", r * d);
            let logits = rec.scratch("logits", r * c.vocab);
            for (i, &row) in logit_rows.iter().enumerate() {
                rec.copy(&x, row * d, Dest::Buffer(&h, i * d), d);
            }
            let out = self.output.as_ref().unwrap_or(&self.embed);
            let out = std::slice::from_ref(out);
            let mut quantized = self.rms_norm(&mut rec, &h, &self.out_norm, (&hn, &xq), r, out);
            self.matmul(
                &mut rec,
                out,
                &hn,
                &xq,
                &mut quantized,
                (&logits, Store::Set),
                r,
            );
            rec.copy(&logits, 0, Dest::Readback(logits_at), r * c.vocab);
        }

        let mut groups: Vec<_> = batch
            .iter_mut()
            .map(|s| std::mem::take(&mut s.cache.groups))
            .collect();
        let data = rec.finish(readback_floats, &mut groups, profile).await;
        for (s, g) in batch.iter_mut().zip(groups) {
            s.cache.groups = g;
        }
        scopes.pop().await?;
        self.check_lost()?;
        let (data, arena, timed) = data?;
        if let Ok(mut a) = self.arena.lock() {
            *a = Some(arena);
        }
        for s in batch.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        for &(l, si, at) in &capture_at {
            let n = spans[si].len() * d;
            outputs[si].captured.push((l, data[at..at + n].to_vec()));
        }
        let mut at = logits_at;
        for (s, out) in batch.iter().zip(&mut outputs) {
            let n = logit_count(s) * c.vocab;
            out.logits = data[at..at + n].to_vec();
            at += n;
        }
        Ok((outputs, timed))
    }

    fn check_lost(&self) -> Result<(), GpuError> {
        match self.lost.lock() {
            Ok(l) => match &*l {
                Some(why) => Err(GpuError::DeviceLost(why.clone())),
                None => Ok(()),
            },
            Err(_) => Err(GpuError::DeviceLost("lost-device state poisoned".into())),
        }
    }

    /// Positions a cache can hold at most: the context, in whole [`CACHE_STEP`]s.
    fn context_cap(&self) -> usize {
        self.config.context.next_multiple_of(CACHE_STEP)
    }

    /// The capacity `cache` must grow to for `need` positions (`None`: it has room):
    /// the room it reserved, where that covers `need` and the device can hold it;
    /// else twice what it holds. Checked against the device's limits.
    fn grown_capacity(&self, cache: &GpuCache, need: usize) -> Result<Option<usize>, GpuError> {
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
    fn grow(&self, cache: &mut GpuCache, cap: usize, rec: &mut Recorder<'_>) {
        let (nk, nv, layer_bytes) = self.kv_buffers(cap);
        if let Some((ok, ov)) = &cache.kv {
            for (src_off, dst_off, size) in self.layer_copies(cache, cache.len, layer_bytes) {
                for (old, new) in [(ok, &nk), (ov, &nv)] {
                    rec.ops.push(Op::Copy {
                        src: old.clone(),
                        src_off,
                        dst: new.clone(),
                        dst_off,
                        size,
                    });
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

    /// `out` = `x` normalized (RMSNorm with gain `g`) for `rows` rows, and `out`
    /// rounded to 8 bits into `xq` as well when a matmul of `readers` takes rounded
    /// activations: returns whether it did (what [`Self::matmul`]'s `quantized`
    /// starts from).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm(
        &self,
        rec: &mut Recorder<'_>,
        x: &wgpu::Buffer,
        g: &wgpu::Buffer,
        (out, xq): (&wgpu::Buffer, &wgpu::Buffer),
        rows: usize,
        readers: &[GpuTensor],
    ) -> bool {
        let c = &self.config;
        let round = readers.iter().any(|w| w.ty.uses_q8_activations());
        rec.dispatch(
            Kernel::RmsNorm,
            &self.pipes.rms_norm,
            [whole(x), whole(g), whole(out), whole(xq)],
            &[c.d_model as u32, c.rms_eps.to_bits(), u32::from(round)],
            (rows as u32, 1, 1),
        );
        round
    }

    /// Rounds `n_blocks` blocks of 32 of `input` to 8 bits into `out`. With
    /// `swiglu`, `input` holds rows of gate and up projections of that width each,
    /// and the values are the feed-forward's activation, silu(gate) · up, rounded
    /// only if `round`.
    fn quantize(
        &self,
        rec: &mut Recorder<'_>,
        input: &wgpu::Buffer,
        swiglu: Option<usize>,
        round: bool,
        out: &wgpu::Buffer,
        n_blocks: usize,
    ) {
        let n = n_blocks as u32;
        let p = [
            n,
            u32::from(swiglu.is_some()),
            swiglu.unwrap_or(0) as u32,
            u32::from(round),
        ];
        let kernel = match swiglu {
            Some(_) => Kernel::SwiGlu,
            None => Kernel::Quantize,
        };
        rec.dispatch(
            kernel,
            &self.pipes.quantize,
            [whole(input), whole(out)],
            &p,
            groups_1d(n),
        );
    }

    /// `out = W · input` (or `out += W · input`, the residual adds, when `store` is
    /// [`Store::Add`]; RoPE applied to the queries and keys when it is
    /// [`Store::Rotated`]) for `batch` vectors, where W is the rows of `ws` in turn (a
    /// row of `out` holds each one's results side by side); block formats read
    /// `input` rounded to 8 bits, into `xq` unless `quantized` says an earlier
    /// matmul (or the kernel that wrote `xq`) already did.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        rec: &mut Recorder<'_>,
        ws: &[GpuTensor],
        input: &wgpu::Buffer,
        xq: &wgpu::Buffer,
        quantized: &mut bool,
        (out, store): (&wgpu::Buffer, Store),
        batch: usize,
    ) {
        let stride: usize = ws.iter().map(|w| w.rows).sum();
        let mut at = 0;
        for w in ws {
            let x = if w.ty.uses_q8_activations() {
                if !*quantized {
                    self.quantize(rec, input, None, true, xq, batch * w.cols / 32);
                    *quantized = true;
                }
                xq
            } else {
                input
            };
            let c = &self.config;
            let (angles, rope_end) = match store {
                Store::Rotated(angles) => (angles, c.d_model + c.kv_dim()),
                Store::Set | Store::Add => (x, 0),
            };
            let pipe = &self.pipes.matmul[&(w.ty, rope_end > 0)];
            for ch in &w.chunks {
                let p = [
                    ch.rows as u32,
                    (at + ch.row0) as u32,
                    stride as u32,
                    w.cols as u32,
                    batch as u32,
                    w.row_bytes as u32,
                    u32::from(matches!(store, Store::Add)),
                    rope_end as u32,
                    c.head_dim as u32,
                    c.rope_dims as u32,
                ];
                let groups = (
                    (ch.rows as u32).div_ceil(self.pipes.matmul_rows),
                    (batch as u32).div_ceil(TILE),
                    1,
                );
                let bindings = [whole(&ch.buf), whole(x), whole(out), whole(angles)];
                let work = Work {
                    kernel: Kernel::Matmul {
                        ty: w.ty,
                        rows: w.rows,
                        cols: w.cols,
                    },
                    weight_bytes: (ch.rows * w.row_bytes) as u64,
                };
                rec.dispatch(work, pipe, bindings, &p, groups);
            }
            at += w.rows;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        rec: &mut Recorder<'_>,
        x: &wgpu::Buffer,
        x_off: usize,
        y: &wgpu::Buffer,
        y_off: usize,
        n: usize,
        period: usize,
    ) {
        let p = [n as u32, x_off as u32, y_off as u32, period as u32];
        rec.dispatch(
            Kernel::Steer,
            &self.pipes.add,
            [whole(x), whole(y)],
            &p,
            groups_1d(n as u32),
        );
    }

    /// Attends one sequence's new rows over its cache and themselves, and appends
    /// their keys and values to the cache, in one dispatch; with `round`, the output
    /// is rounded to 8-bit blocks for the output projection. `bufs` = the step's queries, keys and values, scores,
    /// output.
    fn attend(
        &self,
        rec: &mut Recorder<'_>,
        layer: usize,
        (si, s): (usize, &GpuSeqInput<'_>),
        span: &Range<usize>,
        round: bool,
        bufs: [&wgpu::Buffer; 3],
    ) {
        if span.is_empty() {
            return;
        }
        let [qkv, scores, out] = bufs;
        let c = &self.config;
        let (d, kv) = (c.d_model, c.kv_dim());
        let stride = (d + 2 * kv) as u32;
        let cache = &*s.cache;
        let Some((ck, cv)) = &cache.kv else {
            return;
        };
        let base = layer as u64 * cache.layer_bytes;
        let slice = |b: &wgpu::Buffer| Binding {
            buf: b.clone(),
            offset: base,
            size: Some(cache.layer_bytes),
        };
        let p = [
            span.start as u32,
            cache.len as u32,
            c.n_heads as u32,
            (c.n_heads / c.n_kv_heads) as u32,
            c.head_dim as u32,
            d as u32,
            kv as u32,
            stride,
            (cache.len + span.len()) as u32,
            (1.0 / (c.head_dim as f32).sqrt()).to_bits(),
            u32::from(round),
        ];
        rec.dispatch_for(
            Owner::Sequence(si),
            Kernel::Attention,
            &self.pipes.attention,
            [whole(qkv), slice(ck), slice(cv), whole(scores), whole(out)],
            &p,
            (span.len() as u32, c.n_heads as u32, 1),
        );
    }
}

impl Pipelines {
    /// Compiles the kernels: a matmul for each of `formats`, and one that applies
    /// RoPE for each of `rope_formats` (the query and key projections').
    fn new(
        device: &wgpu::Device,
        [formats, rope_formats]: [&[GgmlType]; 2],
        embed_ty: GgmlType,
        layout: MatmulLayout,
    ) -> Pipelines {
        let lanes = layout.lanes();
        let matmul_rows = WG / lanes;
        let make = |label: &str, src: &str| {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let with_format = |ty: GgmlType, src: &str| {
            format!(
                "const FORMAT: u32 = {}u;\n{}\n{}",
                ty.id(),
                include_str!("dequant.wgsl"),
                src
            )
        };
        Pipelines {
            matmul: formats
                .iter()
                .map(|&ty| (ty, false))
                .chain(rope_formats.iter().map(|&ty| (ty, true)))
                .map(|(ty, rope)| {
                    let consts = format!(
                        "const ROWS: u32 = {matmul_rows}u;\nconst LANES: u32 = {lanes}u;\n\
                         const ROPE: bool = {rope};\n"
                    );
                    let src = with_format(ty, &(consts + include_str!("matmul.wgsl")));
                    ((ty, rope), make("matmul", &src))
                })
                .collect(),
            matmul_rows,
            embed: make("embed", &with_format(embed_ty, include_str!("embed.wgsl"))),
            rms_norm: make(
                "rms_norm",
                &[include_str!("round8.wgsl"), include_str!("rms_norm.wgsl")].concat(),
            ),
            quantize: make(
                "quantize",
                &[include_str!("round8.wgsl"), include_str!("quantize.wgsl")].concat(),
            ),
            add: make("add", include_str!("add.wgsl")),
            attention: make(
                "attention",
                &[
                    include_str!("half.wgsl"),
                    include_str!("round8.wgsl"),
                    include_str!("attention.wgsl"),
                ]
                .concat(),
            ),
        }
    }
}

/// How many of a sequence's new positions want logits (a sequence without new
/// tokens has no last position).
fn logit_count(s: &GpuSeqInput<'_>) -> usize {
    match s.logits {
        Logits::None => 0,
        Logits::Last => usize::from(!s.tokens.is_empty()),
        Logits::All => s.tokens.len(),
    }
}

/// Workgroups for `n` threads of a 1-D kernel, folded into two dimensions when one
/// would exceed the per-dimension limit (the kernels unfold them with num_workgroups).
fn groups_1d(n: u32) -> (u32, u32, u32) {
    let g = n.div_ceil(WG).max(1);
    (g.min(MAX_GROUPS), g.div_ceil(MAX_GROUPS), 1)
}

/// A buffer range bound to a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Binding {
    buf: wgpu::Buffer,
    offset: u64,
    size: Option<u64>,
}

fn whole(b: &wgpu::Buffer) -> Binding {
    Binding {
        buf: b.clone(),
        offset: 0,
        size: None,
    }
}

/// Where a recorded copy goes.
#[derive(Debug)]
enum Dest<'b> {
    /// A device buffer, at a float offset.
    Buffer(&'b wgpu::Buffer, usize),
    /// The step's read-back buffer, at a float offset.
    Readback(usize),
}

/// What a dispatch computes, and the weight bytes it multiplies (as
/// [`GpuModel::weight_bytes_per_step`] counts them), for profiles.
#[derive(Debug, Clone, Copy)]
struct Work {
    kernel: Kernel,
    weight_bytes: u64,
}

impl From<Kernel> for Work {
    fn from(kernel: Kernel) -> Self {
        Work {
            kernel,
            weight_bytes: 0,
        }
    }
}

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

/// The device buffers of a step (activations, uploads, parameters, read-back), kept
/// from step to step by name and replaced only when a step needs a larger one: a
/// steady batch allocates nothing per step, and a larger batch or prefill grows them
/// once (to a power of two, so that a run of growing prefills grows them seldom).
#[derive(Debug, Default)]
struct Arena {
    bufs: HashMap<&'static str, wgpu::Buffer>,
    /// The last step's bind groups, but those that bind a sequence's KV cache
    /// (which [`GpuCache::groups`] keeps). A
    /// steady batch binds the same buffers at the same parameter offsets step after
    /// step, and making its bind groups (hundreds a step) took about 40% of the
    /// host's time to encode and submit one on lavapipe; a group the next step does
    /// not use is dropped with the step.
    groups: HashMap<GroupKey, wgpu::BindGroup>,
}

/// What a dispatch's bind group holds: its kernel's buffers and its parameters'
/// offset in the step's uniform buffer.
#[derive(Debug, PartialEq, Eq, Hash)]
struct GroupKey {
    pipe: wgpu::ComputePipeline,
    bindings: Vec<Binding>,
    uniforms: wgpu::Buffer,
    params: u64,
}

impl Arena {
    fn get(
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

/// One step's commands, collected first so that all kernel parameters go up in one
/// uniform buffer and the whole step in one submission.
#[derive(Debug)]
struct Recorder<'d> {
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
    fn new(
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
    fn scratch(&mut self, label: &'static str, floats: usize) -> wgpu::Buffer {
        let bytes = (floats * 4) as u64;
        self.arena
            .get(self.device, label, bytes, STORAGE, self.binding_limit)
    }

    /// A device buffer holding `bytes`, written through the queue (which orders the
    /// write after the steps already submitted and before this one).
    fn upload(&mut self, label: &'static str, bytes: &[u8]) -> wgpu::Buffer {
        let buf = self.scratch(label, bytes.len().div_ceil(4));
        if !bytes.is_empty() {
            self.queue.write_buffer(&buf, 0, &padded(bytes));
        }
        buf
    }

    fn dispatch<const N: usize>(
        &mut self,
        work: impl Into<Work>,
        pipe: &wgpu::ComputePipeline,
        bindings: [Binding; N],
        params: &[u32],
        groups: (u32, u32, u32),
    ) {
        self.dispatch_for(Owner::Step, work, pipe, bindings, params, groups);
    }

    /// [`Recorder::dispatch`], its bind group kept by `owner`.
    fn dispatch_for<const N: usize>(
        &mut self,
        owner: Owner,
        work: impl Into<Work>,
        pipe: &wgpu::ComputePipeline,
        bindings: [Binding; N],
        params: &[u32],
        groups: (u32, u32, u32),
    ) {
        debug_assert!(params.len() * 4 <= PARAM_BYTES as usize);
        let at = self.params.len() as u64;
        self.params
            .extend(params.iter().flat_map(|p| p.to_le_bytes()));
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
    fn copy(&mut self, src: &wgpu::Buffer, src_at: usize, dst: Dest<'_>, floats: usize) {
        let (src_off, size) = ((src_at * 4) as u64, (floats * 4) as u64);
        self.ops.push(match dst {
            Dest::Buffer(dst, at) => Op::Copy {
                src: src.clone(),
                src_off,
                dst: dst.clone(),
                dst_off: (at * 4) as u64,
                size,
            },
            Dest::Readback(at) => Op::Readback {
                src: src.clone(),
                src_off,
                dst_off: (at * 4) as u64,
                size,
            },
        });
    }

    /// Encodes and submits the step, then reads back `readback_floats` f32s.
    /// Gives the arena back with the data: a step that failed drops its arena, whose
    /// read-back buffer may still be mapped.
    // wgpu hashes and compares its resource handles by identity, which the handles'
    // interior state (what the lint sees on wasm32) never changes.
    #[allow(clippy::mutable_key_type)]
    /// `sequences` are the bind groups the batch's caches kept from their last step
    /// (see [`GpuCache::groups`]); each comes back with this step's. With `timing`,
    /// each dispatch is timestamped (see [`GpuModel::profile_async`]).
    async fn finish(
        mut self,
        readback_floats: usize,
        sequences: &mut [HashMap<GroupKey, wgpu::BindGroup>],
        timing: bool,
    ) -> Result<(Vec<f32>, Arena, Option<StepProfile>), GpuError> {
        let device = self.device;
        // Two timestamps per dispatch, in query sets of WebGPU's largest size, resolved
        // into the read-back buffer after the floats.
        let timed: Vec<Work> = if timing {
            self.ops
                .iter()
                .filter_map(|op| match op {
                    Op::Dispatch { work, .. } => Some(*work),
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        let per_set = (wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;
        let sets: Vec<wgpu::QuerySet> = timed
            .chunks(per_set)
            .map(|c| {
                device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2 * c.len() as u32,
                })
            })
            .collect();
        let stamps_at = ((readback_floats * 4) as u64).next_multiple_of(8);
        let stamp_bytes = 16 * timed.len() as u64;
        let uniforms = self.arena.get(
            device,
            "params",
            self.params.len() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            u64::MAX,
        );
        self.queue.write_buffer(&uniforms, 0, &padded(&self.params));
        let readback = self.arena.get(
            device,
            "readback",
            stamps_at + stamp_bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            u64::MAX,
        );
        // The last step's groups, and this step's, by owner: the arena's first,
        // then each sequence's.
        let mut last: Vec<HashMap<GroupKey, wgpu::BindGroup>> =
            std::iter::once(std::mem::take(&mut self.arena.groups))
                .chain(sequences.iter_mut().map(std::mem::take))
                .collect();
        let mut kept: Vec<HashMap<GroupKey, wgpu::BindGroup>> = last
            .iter()
            .map(|g| HashMap::with_capacity(g.len()))
            .collect();
        let groups: Vec<Option<wgpu::BindGroup>> = self
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
                    let o = match owner {
                        Owner::Step => 0,
                        Owner::Sequence(i) => 1 + i,
                    };
                    if let Some(g) = last[o].remove(&key) {
                        kept[o].insert(key, g.clone());
                        return Some(g);
                    }
                    let mut entries: Vec<wgpu::BindGroupEntry<'_>> = bindings
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
                        binding: bindings.len() as u32,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &uniforms,
                            offset: *params,
                            size: wgpu::BufferSize::new(PARAM_BYTES),
                        }),
                    });
                    let g = device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &pipe.get_bind_group_layout(0),
                        entries: &entries,
                    });
                    kept[o].insert(key, g.clone());
                    Some(g)
                }
                _ => None,
            })
            .collect();
        drop(last);
        let mut kept = kept.into_iter();
        self.arena.groups = kept.next().expect("the arena's groups");
        for (mine, groups) in sequences.iter_mut().zip(kept) {
            *mine = groups;
        }

        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
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
                    enc.copy_buffer_to_buffer(src, *src_off, &readback, *dst_off, *size);
                    i += 1;
                }
                Op::Dispatch { .. } => {
                    // Timed, each dispatch is a pass of its own, stamped as it starts
                    // and ends.
                    let timestamp_writes = sets.get(k / per_set).map(|set| {
                        let at = 2 * (k % per_set) as u32;
                        wgpu::ComputePassTimestampWrites {
                            query_set: set,
                            beginning_of_pass_write_index: Some(at),
                            end_of_pass_write_index: Some(at + 1),
                        }
                    });
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes,
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
                        if timing {
                            break;
                        }
                    }
                }
            }
        }
        if timing {
            let resolved = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps"),
                size: stamp_bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            for (s, (set, part)) in sets.iter().zip(timed.chunks(per_set)).enumerate() {
                let at = (16 * s * per_set) as u64;
                enc.resolve_query_set(set, 0..2 * part.len() as u32, &resolved, at);
            }
            enc.copy_buffer_to_buffer(&resolved, 0, &readback, stamps_at, stamp_bytes);
        }
        self.queue.submit([enc.finish()]);
        if readback_floats == 0 && !timing {
            return Ok((Vec::new(), self.arena, None));
        }
        let mapped = map_read(device, &readback).await;
        mapped?;
        let view = readback
            .get_mapped_range(..)
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let out = view[..readback_floats * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let profile = timing.then(|| {
            let at = stamps_at as usize;
            let ticks: Vec<u64> = view[at..at + stamp_bytes as usize]
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect();
            let tick = f64::from(self.queue.get_timestamp_period()) * 1e-9;
            let seconds = |from: u64, to: u64| to.saturating_sub(from) as f64 * tick;
            let kernels = timed
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
        });
        drop(view);
        readback.unmap();
        Ok((out, self.arena, profile))
    }
}

/// Maps `buf` for reading: natively by waiting on the device, in the browser by
/// awaiting the map callback.
async fn map_read(device: &wgpu::Device, buf: &wgpu::Buffer) -> Result<(), GpuError> {
    #[derive(Default)]
    struct State {
        done: Option<Result<(), wgpu::BufferAsyncError>>,
        waker: Option<Waker>,
    }
    let state = Arc::new(Mutex::new(State::default()));
    let cb_state = Arc::clone(&state);
    buf.map_async(wgpu::MapMode::Read, .., move |r| {
        if let Ok(mut s) = cb_state.lock() {
            s.done = Some(r);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    });
    // On the web this returns at once and the callback comes from the event loop.
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
    std::future::poll_fn(|cx| match state.lock() {
        Ok(mut s) => match s.done.take() {
            Some(r) => Poll::Ready(r.map_err(|e| GpuError::Readback(e.to_string()))),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        },
        Err(_) => Poll::Ready(Err(GpuError::Readback("map state poisoned".into()))),
    })
    .await
}

/// Error scopes around a load or a step, so that an out-of-memory or a rejected
/// command becomes a [`GpuError`] instead of wgpu's default panic.
///
/// The fields drop in declaration order, which pops the scopes innermost first when a
/// step returns early.
struct ErrorScopes {
    internal: wgpu::ErrorScopeGuard,
    validation: wgpu::ErrorScopeGuard,
    oom: wgpu::ErrorScopeGuard,
}

impl std::fmt::Debug for ErrorScopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErrorScopes")
    }
}

impl ErrorScopes {
    fn push(device: &wgpu::Device) -> Self {
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        ErrorScopes {
            internal,
            validation,
            oom,
        }
    }

    /// Pops the scopes (innermost first) and reports the first error caught.
    fn pop(self) -> impl Future<Output = Result<(), GpuError>> {
        let internal = self.internal.pop();
        let validation = self.validation.pop();
        let oom = self.oom.pop();
        async move {
            if let Some(e) = oom.await {
                return Err(GpuError::OutOfMemory(e.to_string()));
            }
            if let Some(e) = validation.await {
                return Err(GpuError::Validation(e.to_string()));
            }
            if let Some(e) = internal.await {
                return Err(GpuError::Validation(e.to_string()));
            }
            Ok(())
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::cpu::to_half;

    /// Which matrices the loader stacks: those that read the same input and share a
    /// format, and only those. Needs an adapter (lavapipe counts).
    #[test]
    fn matrices_of_one_format_share_a_tensor() {
        use crate::testgen::{TestModelSpec, test_model_bytes};
        let load = |spec: &TestModelSpec| {
            let file = GgufFile::from_vec(test_model_bytes(spec).unwrap()).unwrap();
            GpuModel::new(&file).unwrap()
        };
        let same = load(&TestModelSpec::tiny());
        let (d, kv) = (same.config.d_model, same.config.kv_dim());
        for b in &same.blocks {
            assert_eq!(b.qkv.len(), 1);
            assert_eq!(b.qkv[0].rows, d + 2 * kv);
            assert_eq!(b.gate_up.len(), 1);
            assert_eq!(b.gate_up[0].rows, 2 * same.config.ffn);
        }
        let mixed = load(&TestModelSpec {
            value_down_type: Some(GgmlType::F16),
            ..TestModelSpec::tiny()
        });
        for b in &mixed.blocks {
            let rows: Vec<_> = b.qkv.iter().map(|w| (w.ty, w.rows)).collect();
            let q8 = GgmlType::Q8_0;
            assert_eq!(rows, [(q8, d), (q8, kv), (GgmlType::F16, kv)]);
            assert_eq!(b.gate_up.len(), 1);
        }
        // Both load every tensor they need.
        assert_eq!(
            same.weight_bytes_per_step(),
            mixed.weight_bytes_per_step() - {
                let f16 = |rows: usize, cols: usize| (rows * cols * 2) as u64;
                let q8 = |rows: usize, cols: usize| (rows * cols / 32 * 34) as u64;
                let c = &same.config;
                (f16(kv, d) - q8(kv, d) + f16(d, c.ffn) - q8(d, c.ffn)) * c.n_layers as u64
            }
        );
    }

    /// half.wgsl's rounding against the CPU cache's, bit for bit, on the values
    /// where conversions differ: ties, subnormals, the edge of the finite range,
    /// infinities and NaN. Needs an adapter (lavapipe counts).
    #[test]
    fn the_gpu_cache_rounds_as_the_cpu_cache() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            1.0 / 3.0,
            65504.0,
            65519.0,
            65520.0,
            1e6,
            7e4,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
            6.1035156e-5,
            6.0e-5,
            5.9604645e-8,
            2.9802322e-8,
            2.9802326e-8,
            8.940697e-8,
            1.0009766,
            f32::from_bits(0x3f80_1000), // 1 + 2^-11: a tie
            f32::from_bits(0x3f80_3000), // 1 + 3 * 2^-11: a tie
            2048.5,
            2049.0,
            2051.0,
        ];
        // A spread over every exponent a half reaches and beyond, with odd mantissas.
        let mut s = 0x9e37_79b9u32;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let exp = 100 + (s >> 8) % 45; // 2^-27 .. 2^17
            xs.push(f32::from_bits(
                (s & 0x8000_0000) | (exp << 23) | (s & 0x7f_ffff),
            ));
        }
        if xs.len() % 2 == 1 {
            xs.push(0.5);
        }
        let gpu = pollster::block_on(run_half(&xs));
        for (i, &x) in xs.iter().enumerate() {
            let want = to_half(x).to_bits();
            let got = (gpu[i / 2] >> (16 * (i % 2))) as u16;
            if x.is_nan() {
                assert!(half::f16::from_bits(got).is_nan(), "{x}: {got:#06x}");
            } else {
                assert_eq!(got, want, "{x:e} ({:#010x})", x.to_bits());
            }
        }
    }

    /// `xs` in pairs through half.wgsl's `half_pair`, as words.
    async fn run_half(xs: &[f32]) -> Vec<u32> {
        let adapter = pick_adapter(true).await.expect("an adapter");
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor::default())
            .await
            .expect("a device");
        let src = [
            include_str!("half.wgsl"),
            "@group(0) @binding(0) var<storage, read> X: array<f32>;
            @group(0) @binding(1) var<storage, read_write> Y: array<u32>;
            @compute @workgroup_size(64)
            fn main(@builtin(global_invocation_id) gid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
                let i = gid.x + gid.y * nwg.x * 64u;
                if i < arrayLength(&Y) {
                    Y[i] = half_pair(X[2u * i], X[2u * i + 1u]);
                }
            }",
        ]
        .concat();
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("half"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("half"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let input = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: &bytes,
            usage: STORAGE,
        });
        let size = (xs.len() * 2) as u64;
        let halves = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("halves"),
            size,
            usage: STORAGE,
            mapped_at_creation: false,
        });
        let entries: Vec<wgpu::BindGroupEntry<'_>> = [&input, &halves]
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &entries,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &group, &[]);
            let (x, y, z) = groups_1d((xs.len() / 2) as u32);
            pass.dispatch_workgroups(x, y, z);
        }
        enc.copy_buffer_to_buffer(&halves, 0, &readback, 0, size);
        queue.submit([enc.finish()]);
        map_read(&device, &readback).await.expect("read back");
        let view = readback.get_mapped_range(..).expect("mapped");
        view.chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}
