//! The CPU's weights. Each matrix is read where the model's file lies (mapped natively,
//! owned bytes in a browser) or, for a model larger than the process can address (a
//! browser's wasm32 memory holds 4 GiB), kept outside by a [`WeightSource`] and
//! staged into one buffer a block at a time, as the forward pass reaches the block.
//!
//! Staging reads every weight once per step, as the kernels do anyway, so it adds a
//! copy of the weights to each step, not a second copy to memory: the buffer holds
//! the largest block (or the output matrix) and nothing else.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::arch::{
    BlockTensors, EMBED, MatrixRef, ModelConfig, OUTPUT, OUTPUT_NORM, ROPE_FREQS, rope_inv_freq,
    rope_inv_freq_local,
};
use crate::gguf::{GgufFile, GgufHeader};
use crate::model::{ModelError, check_dims, check_format};
use crate::quant::{self, GgmlType, MatJob, PackedMatrix};

/// A model's file bytes kept outside the process's memory (a browser's JS memory):
/// what the forward pass reads its weights from when they are staged.
pub trait WeightSource: Send + Sync + std::fmt::Debug {
    /// Copies `dst.len()` bytes from `offset` of file `part` (0 unless the model is
    /// split) into `dst`; an error says why it could not.
    fn read(&self, part: u16, offset: u64, dst: &mut [u8]) -> Result<(), String>;
}

/// Where a matrix's bytes are.
#[derive(Debug, Clone)]
enum Bytes {
    /// In the file, which the process holds: which of a split model's files, and
    /// where in it.
    File {
        file: Arc<GgufFile>,
        part: u16,
        start: usize,
    },
    /// With a source: where in which file, and where the stage holds them once
    /// brought in (`at`, from the buffer's start).
    Staged {
        source: Arc<dyn WeightSource>,
        part: u16,
        offset: u64,
        at: usize,
    },
}

/// A weight matrix of `rows × cols` values in a ggml format.
#[derive(Debug, Clone)]
pub(crate) struct Tensor {
    /// Its format.
    pub(crate) ty: GgmlType,
    /// Rows (outputs of a matmul).
    pub(crate) rows: usize,
    /// Values per row (inputs of a matmul).
    pub(crate) cols: usize,
    bytes: Bytes,
    len: usize,
    /// The weights rearranged for this CPU's fastest kernel, where it has one.
    packed: Option<Arc<PackedMatrix>>,
}

impl Tensor {
    /// The raw bytes: in the file, or in `stage` once [`Stage::bring`] brought them.
    fn bytes<'a>(&'a self, stage: &'a [u8]) -> &'a [u8] {
        match &self.bytes {
            Bytes::File { file, part, start } => &file.part_bytes(*part)[*start..*start + self.len],
            Bytes::Staged { at, .. } => &stage[*at..*at + self.len],
        }
    }

    /// This matrix as one job of a [`quant::matmul_many`] call writing into `out`
    /// (`out[b * rows + r] = W[r] · xs[b]`), its bytes in the file or in `stage`.
    pub(crate) fn job<'a>(&'a self, stage: &'a [u8], out: &'a mut [f32]) -> MatJob<'a> {
        MatJob {
            ty: self.ty,
            weights: self.bytes(stage),
            packed: self.packed.as_deref(),
            n_rows: self.rows,
            out,
        }
    }

    /// Row `r` as f32 (embedding lookups), read from the source if it is staged.
    pub(crate) fn row(&self, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        let rb = self.ty.row_bytes(self.cols)?;
        let at = r * rb;
        match &self.bytes {
            Bytes::File { .. } => {
                quant::dequantize_row(self.ty, &self.bytes(&[])[at..at + rb], out)?
            }
            Bytes::Staged {
                source,
                part,
                offset,
                ..
            } => {
                let mut bytes = vec![0u8; rb];
                source
                    .read(*part, offset + at as u64, &mut bytes)
                    .map_err(ModelError::WeightSource)?;
                quant::dequantize_row(self.ty, &bytes, out)?;
            }
        }
        Ok(())
    }

    /// Lets the file's copy of a repacked matrix leave resident memory: the kernels
    /// read the panels alone, so the process would otherwise hold the matrix twice.
    fn release_source(&self) {
        if let (Some(_), Bytes::File { file, part, start }) = (&self.packed, &self.bytes) {
            file.release(*part, *start..*start + self.len);
        }
    }

    /// Bytes a matmul over this tensor reads: its repacked panels where it has them.
    fn read_bytes(&self) -> usize {
        self.packed.as_ref().map_or(self.len, |p| p.data.len())
    }

    /// The whole tensor as f32 (small vectors such as norms).
    fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, dst) in out.chunks_exact_mut(self.cols).enumerate() {
            self.row(r, dst)?;
        }
        Ok(out)
    }
}

pub(crate) type Block = BlockTensors<Tensor, Vec<f32>>;

impl Block {
    /// The block's matrices, in the order of the forward pass.
    fn matrices(&self) -> [&Tensor; 7] {
        [
            &self.wq, &self.wk, &self.wv, &self.wo, &self.gate, &self.up, &self.down,
        ]
    }
}

/// The CPU's weights.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) embed: Tensor,
    pub(crate) blocks: Vec<Block>,
    pub(crate) out_norm: Vec<f32>,
    pub(crate) output: Tensor,
    /// RoPE's angle per position, one per rotated pair.
    pub(crate) rope_inv_freq: Vec<f32>,
    /// The same for the sliding-window layers, where the family has them.
    pub(crate) rope_inv_freq_local: Option<Vec<f32>>,
    /// The buffer staged matrices are brought into, sized for the largest block (or
    /// the output matrix); `None` when the weights are in the file.
    stage: Option<Mutex<Vec<u8>>>,
}

/// Where the matrices come from while loading: the file, or a source whose matrices
/// are laid out in the stage group by group (a block's, then the output's).
enum Origin<'a> {
    File(&'a Arc<GgufFile>),
    Source {
        header: &'a GgufHeader,
        source: &'a Arc<dyn WeightSource>,
        /// The end of the current group's matrices in the stage, and the largest
        /// group's so far.
        end: usize,
        largest: usize,
    },
}

/// Staged matrices start on a cache line, as in the file (whose alignment is 32 bytes
/// at least), so that the kernels' loads split no more lines than they do there.
const STAGE_ALIGN: usize = 64;

impl Origin<'_> {
    fn header(&self) -> &GgufHeader {
        match self {
            Origin::File(file) => file.header(),
            Origin::Source { header, .. } => header,
        }
    }

    /// The matrix `m`: rows of a tensor of the file (a view of its bytes, no copy), or
    /// of the source's, placed after the current group's others in the stage.
    fn matrix(&mut self, m: MatrixRef<'_>) -> Result<Tensor, ModelError> {
        let info = self.header().require_tensor(m.name)?.clone();
        check_dims(&info, m.cols, m.tensor_rows)?;
        check_format(&info, GgmlType::SUPPORTED)?;
        let row_bytes = info.ty.row_bytes(m.cols)?;
        let (first, len) = (m.first_row * row_bytes, m.rows * row_bytes);
        let (rows, cols, ty) = (m.rows, m.cols, info.ty);
        match self {
            Origin::File(file) => {
                let (_, data) = file.tensor_data(m.name)?;
                let data = &data[first..first + len];
                let start = data.as_ptr() as usize - file.part_bytes(info.part).as_ptr() as usize;
                Ok(Tensor {
                    ty,
                    rows,
                    cols,
                    bytes: Bytes::File {
                        file: Arc::clone(file),
                        part: info.part,
                        start,
                    },
                    len,
                    packed: PackedMatrix::new(ty, data, rows, cols).map(Arc::new),
                })
            }
            Origin::Source {
                header,
                source,
                end,
                largest,
            } => {
                let at = end.next_multiple_of(STAGE_ALIGN);
                *end = at + len;
                *largest = (*largest).max(*end);
                Ok(Tensor {
                    ty,
                    rows,
                    cols,
                    bytes: Bytes::Staged {
                        source: Arc::clone(source),
                        part: info.part,
                        offset: header.tensor_range(&info)?.start + first as u64,
                        at,
                    },
                    len,
                    // The kernels read staged matrices as the file has them: packing
                    // them would be a second pass over the weights every step.
                    packed: None,
                })
            }
        }
    }

    /// The next matrices are a new group, staged together from the buffer's start.
    fn next_group(&mut self) {
        if let Origin::Source { end, .. } = self {
            *end = 0;
        }
    }

    /// A whole tensor of `rows × cols`.
    fn tensor(&mut self, name: &str, cols: usize, rows: usize) -> Result<Tensor, ModelError> {
        self.matrix(MatrixRef::whole(name, cols, rows))
    }

    /// A whole tensor that is never staged (read a row at a time): it takes no room
    /// in the stage.
    fn unstaged(&mut self, name: &str, cols: usize, rows: usize) -> Result<Tensor, ModelError> {
        let layout = match self {
            Origin::Source { end, largest, .. } => Some((*end, *largest)),
            Origin::File(_) => None,
        };
        let t = self.tensor(name, cols, rows);
        if let (Origin::Source { end, largest, .. }, Some(layout)) = (self, layout) {
            (*end, *largest) = layout;
        }
        t
    }

    /// A vector (a norm, a bias) as f32, read once.
    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        self.unstaged(name, n, 1)?.to_f32()
    }
}

impl Weights {
    /// The weights of the model in `file`, read where the file holds them.
    pub(crate) fn from_file(file: &Arc<GgufFile>, c: &ModelConfig) -> Result<Weights, ModelError> {
        Self::load(Origin::File(file), c)
    }

    /// The weights of the model whose header is `header` and whose files' bytes
    /// `source` holds, staged as each step needs them.
    pub(crate) fn from_source(
        header: &GgufHeader,
        source: Arc<dyn WeightSource>,
        c: &ModelConfig,
    ) -> Result<Weights, ModelError> {
        let origin = Origin::Source {
            header,
            source: &source,
            end: 0,
            largest: 0,
        };
        Self::load(origin, c)
    }

    fn load(mut origin: Origin<'_>, c: &ModelConfig) -> Result<Weights, ModelError> {
        // The embedding is read a row at a time; it is staged only as the output
        // matrix, where the two are tied. Each is a group of its own.
        let output = if origin.header().tensor(OUTPUT).is_some() {
            let embed = origin.unstaged(EMBED, c.d_model, c.vocab)?;
            let output = origin.tensor(OUTPUT, c.d_model, c.vocab)?;
            output.release_source();
            (embed, output)
        } else {
            let embed = origin.tensor(EMBED, c.d_model, c.vocab)?;
            (embed.clone(), embed)
        };
        let (embed, output) = output;
        let mut blocks = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            origin.next_group();
            blocks.push(Block::load(
                c,
                l,
                &mut origin,
                // A block's repacked matrices are read from their panels alone:
                // each lets its file copy go once repacked, so that the load never
                // holds the weights twice.
                |origin, m| {
                    let t = origin.matrix(m)?;
                    t.release_source();
                    Ok(t)
                },
                |origin, name, n| origin.vector(name, n),
            )?);
        }
        let out_norm = origin.vector(OUTPUT_NORM, c.d_model)?;
        let factors = match origin.header().tensor(ROPE_FREQS) {
            Some(_) => Some(origin.vector(ROPE_FREQS, c.rope_dims / 2)?),
            None => None,
        };
        let stage = match origin {
            Origin::File(_) => None,
            // The stage is filled before each group's matrices are read; zeroes
            // until then, never uninitialised.
            Origin::Source { largest, .. } => Some(Mutex::new(vec![0u8; largest])),
        };
        Ok(Weights {
            embed,
            blocks,
            out_norm,
            output,
            rope_inv_freq: rope_inv_freq(c, factors.as_deref()),
            rope_inv_freq_local: rope_inv_freq_local(c),
            stage,
        })
    }

    /// Bytes of weights one decode step reads: every block's matrices and the output
    /// matrix, as the kernels read them (repacked panels where a matrix has them).
    pub(crate) fn read_bytes_per_token(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .flat_map(Block::matrices)
            .map(Tensor::read_bytes)
            .sum();
        blocks + self.output.read_bytes()
    }

    /// Bytes of the buffer staged matrices are brought into (0 when the weights are
    /// in the file).
    pub(crate) fn stage_bytes(&self) -> usize {
        self.stage
            .as_ref()
            .map_or(0, |s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
    }

    /// The stage for one step: held until the step ends, so that steps that overlap
    /// (two threads stepping one model) take turns rather than overwrite each other's
    /// matrices.
    pub(crate) fn stage(&self) -> Stage<'_> {
        Stage {
            buf: self
                .stage
                .as_ref()
                // A step that panicked left at worst a stage half brought in, which
                // the next `bring` overwrites whole.
                .map(|s| s.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }
}

/// The stage of one step (see [`Weights::stage`]).
pub(crate) struct Stage<'w> {
    buf: Option<MutexGuard<'w, Vec<u8>>>,
}

impl Stage<'_> {
    /// Brings block `b`'s matrices in; the bytes their jobs read from.
    pub(crate) fn block(&mut self, b: &Block) -> Result<&[u8], ModelError> {
        self.bring(&b.matrices())
    }

    /// Brings `matrices` (a group that [`Weights`] laid out together) into the stage;
    /// the bytes their jobs read from (empty when they are in the file).
    pub(crate) fn bring(&mut self, matrices: &[&Tensor]) -> Result<&[u8], ModelError> {
        let Some(buf) = &mut self.buf else {
            return Ok(&[]);
        };
        for t in matrices {
            if let Bytes::Staged {
                source,
                part,
                offset,
                at,
            } = &t.bytes
            {
                source
                    .read(*part, *offset, &mut buf[*at..*at + t.len])
                    .map_err(ModelError::WeightSource)?;
            }
        }
        Ok(&buf[..])
    }
}
