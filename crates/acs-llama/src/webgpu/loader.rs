//! Uploading a model's weights to the device, tensor by tensor as they arrive.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;

use wgpu::util::DeviceExt;

use crate::arch::{
    BlockTensors, EMBED, ModelConfig, OUTPUT, OUTPUT_NORM, ROPE_FREQS, rope_inv_freq,
    rope_inv_freq_local,
};
use crate::error::ModelError;
use crate::gguf::{GgufError, GgufHeader, TensorInfo};
use crate::model::check_dims;
use crate::quant::{self, GgmlType};

use super::device::{self, ErrorScopes, Lost};
use super::error::GpuError;
use super::kernels::Pipelines;
use super::kernels::dequant::SUPPORTED;
use super::kernels::matmul::MatmulLayout;
use super::tensor::{GpuBlock, GpuTensor, f32_bytes, rows_per_buffer};
use super::{GpuModel, fused_rope};

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

/// Uploads a model's weights to a device tensor by tensor, in whatever order they
/// come: from a whole file ([`GpuModel::load`]), or while a browser streams the file
/// through a [`crate::gguf::TensorStream`], so that the file is never whole in memory.
/// Every tensor the model needs is checked against the header before any upload.
#[derive(Debug)]
pub struct GpuLoader {
    config: ModelConfig,
    info: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    lost: Lost,
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
    /// RoPE's frequency factors, kept on the host (the angles are computed there).
    rope_factors: Option<Vec<f32>>,
}

impl GpuLoader {
    /// Opens a device on `adapter` for the model `header` describes.
    pub async fn new(header: &GgufHeader, adapter: wgpu::Adapter) -> Result<Self, GpuError> {
        let config = ModelConfig::from_metadata(&header.metadata)?;
        let c = &config;
        let mut needs = HashMap::new();
        let matrix = |cols, rows| Need::Matrix { cols, rows };
        needs.insert(EMBED.to_owned(), matrix(c.d_model, c.vocab));
        if header.tensor(OUTPUT).is_some() {
            needs.insert(OUTPUT.to_owned(), matrix(c.d_model, c.vocab));
        }
        needs.insert(OUTPUT_NORM.to_owned(), Need::Vector { n: c.d_model });
        if header.tensor(ROPE_FREQS).is_some() {
            needs.insert(ROPE_FREQS.to_owned(), Need::Vector { n: c.rope_dims / 2 });
        }
        for l in 0..c.n_layers {
            BlockTensors::<(), ()>::load(
                c,
                l,
                &mut needs,
                |needs, m| {
                    needs.insert(m.name.to_owned(), matrix(m.cols, m.tensor_rows));
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
        let (device, queue, lost) = device::open(&adapter).await?;
        let limits = device.limits();
        let scopes = ErrorScopes::push(&device);
        let mut stacks = Vec::new();
        let mut part_of = HashMap::new();
        for l in 0..c.n_layers {
            let n = BlockTensors::<String, ()>::load(
                c,
                l,
                &mut (),
                |_, m| Ok::<_, GpuError>(m.name.to_owned()),
                |_, _, _| Ok(()),
            )?;
            for parts in [vec![n.wq, n.wk, n.wv], vec![n.gate, n.up]] {
                // Matrices fused in the file are one tensor already.
                if parts.iter().all(|p| *p == parts[0]) {
                    continue;
                }
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
            rope_factors: None,
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
        self.uploaded + self.vectors.len() + usize::from(self.rope_factors.is_some())
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
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => {
                        check_dims(info, cols, rows)?;
                        let (tensor, at) = match part {
                            Some((s, at)) => (self.stacks[s].tensor.clone(), at),
                            None => (
                                GpuTensor::create(
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
                if last && info.name == ROPE_FREQS {
                    self.rope_factors = Some(host_vector(info, &data, n)?);
                } else if last {
                    let b = upload_vector(&self.device, info, &data, n)?;
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
                    |_, m| Ok(m.name.to_owned()),
                    |s, name, _| take(&mut s.vectors, name),
                )?;
                let qkv_bias = t.qkv_bias.map(|parts| self.concat(&parts));
                Ok(GpuBlock {
                    attn_norm: t.attn_norm,
                    qkv: self.take_matrices(&[&t.wq, &t.wk, &t.wv])?,
                    qkv_bias,
                    qk_norm: t.qk_norm,
                    post_norms: t.post_norms,
                    wo: self.take_matrix(&t.wo)?,
                    ffn_norm: t.ffn_norm,
                    gate_up: self.take_matrices(&[&t.gate, &t.up])?,
                    down: self.take_matrix(&t.down)?,
                })
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
        let out_norm = take(&mut self.vectors, OUTPUT_NORM)?;
        let mut rope_formats: Vec<GgmlType> = match fused_rope(&c) {
            true => blocks.iter().flat_map(|b| &b.qkv).map(|w| w.ty).collect(),
            false => Vec::new(),
        };
        rope_formats.sort_by_key(|ty| ty.id());
        rope_formats.dedup();
        let formats = [self.formats.as_slice(), rope_formats.as_slice()];
        let pipes = Pipelines::new(&self.device, formats, embed.ty, self.layout);
        self.scopes.pop().await?;
        let factors = match self.needs.contains_key(ROPE_FREQS) {
            true => Some(
                self.rope_factors
                    .take()
                    .ok_or_else(|| missing(ROPE_FREQS))?,
            ),
            false => None,
        };
        let rope_inv_freq = rope_inv_freq(&c, factors.as_deref());
        let rope_inv_freq_local = rope_inv_freq_local(&c);
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
            rope_inv_freq_local,
            pipes,
            lost: self.lost,
            arena: Mutex::new(None),
        })
    }

    /// One buffer of the vectors `parts` end to end (copied on the device).
    fn concat(&self, parts: &[wgpu::Buffer]) -> wgpu::Buffer {
        let size = parts.iter().map(wgpu::Buffer::size).sum();
        let out = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("biases"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        let mut at = 0;
        for p in parts {
            enc.copy_buffer_to_buffer(p, 0, &out, at, p.size());
            at += p.size();
        }
        self.queue.submit([enc.finish()]);
        out
    }

    /// Removes an uploaded matrix, or says it never came.
    fn take_matrix(&mut self, name: &str) -> Result<GpuTensor, GpuError> {
        self.matrices.remove(name).ok_or_else(|| missing(name))
    }

    /// The matrices `names` (which read the same input) as the tensors that hold them:
    /// their stack, the one tensor the file fused them in, or each alone.
    fn take_matrices(&mut self, names: &[&str]) -> Result<Vec<GpuTensor>, GpuError> {
        if names.iter().all(|n| *n == names[0]) {
            return Ok(vec![self.take_matrix(names[0])?]);
        }
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
    let tensor = GpuTensor::create(device, limits, &label, ty, cols, rows)?;
    Ok(Some((tensor, starts)))
}

/// A vector of `n` values of tensor `info`, from its `bytes`, as f32.
fn host_vector(info: &TensorInfo, bytes: &[u8], n: usize) -> Result<Vec<f32>, GpuError> {
    check_dims(info, n, 1)?;
    let mut v = vec![0f32; n];
    quant::dequantize_row(info.ty, bytes, &mut v).map_err(ModelError::from)?;
    Ok(v)
}

/// A norm's gains (or biases), expanded to f32 (they are tiny).
fn upload_vector(
    device: &wgpu::Device,
    info: &TensorInfo,
    bytes: &[u8],
    n: usize,
) -> Result<wgpu::Buffer, GpuError> {
    let v = host_vector(info, bytes, n)?;
    Ok(
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(&info.name),
            contents: &f32_bytes(&v),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        }),
    )
}
