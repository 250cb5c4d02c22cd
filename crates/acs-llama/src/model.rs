//! The forward pass on the CPU, for a batch of sequences of different lengths.
//!
//! One call of [`Model::forward`] advances every sequence of the batch by its new
//! tokens (a whole prompt for a prefill, one token for a decode step). All new tokens
//! of all sequences go through each weight matrix together, so a weight row is read
//! once per step however many sequences run: that is what makes batching pay.
//!
//! Per block, as the family's [`Recipe`] has it: RMSNorm → Q, K, V (plus their biases)
//! → RoPE → append K, V to the sequence's cache →
//! causal grouped-query attention → output projection → residual add → RMSNorm →
//! SwiGLU MLP → residual add → (steering add, activation capture).

use std::sync::Arc;

pub use crate::arch::KV_VALUE_BYTES;
pub use crate::arch::{Activation, Family, ModelConfig, Recipe, RopeStyle, SlidingWindow};
use crate::arch::{BlockTensors, EMBED, OUTPUT, OUTPUT_NORM, ROPE_FREQS};
use crate::attention;
use crate::chat_template::ChatTemplate;
use crate::cpu::F32Ops;
use crate::cpu::team::for_each_chunk_mut;
pub use crate::error::ModelError;
use crate::gguf::{GgufError, GgufFile, GgufHeader, Metadata, TensorInfo};
pub use crate::kv_cache::KvCache;
use crate::quant::{self, GgmlType, QuantizedActivations};
use crate::tokenizer::{Tokenizer, TokenizerSpec};
pub use crate::weights::WeightSource;
use crate::weights::Weights;

/// A loaded model: weights, tokenizer and hyper-parameters.
#[derive(Debug)]
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// The model's own tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template, if its file has one.
    pub chat_template: Option<ChatTemplate>,
    /// `None` for a model loaded from its header alone ([`Model::from_header`]).
    weights: Option<Weights>,
}

/// The `tokenizer.ggml.*` keys of a GGUF file; absent optional keys stay `None`.
pub fn tokenizer_spec(meta: &Metadata) -> Result<TokenizerSpec, GgufError> {
    let id = |k: &str| meta.get_u32(&format!("tokenizer.ggml.{k}")).ok();
    let flag = |k: &str| meta.get_bool(&format!("tokenizer.ggml.{k}")).ok();
    let has = |k: &str| meta.get(&format!("tokenizer.ggml.{k}")).is_some();
    Ok(TokenizerSpec {
        model: meta.get_str("tokenizer.ggml.model")?.to_owned(),
        pre: meta.get_str("tokenizer.ggml.pre").ok().map(str::to_owned),
        tokens: meta.get_str_array("tokenizer.ggml.tokens")?.to_vec(),
        token_types: if has("token_type") {
            meta.get_i32_array("tokenizer.ggml.token_type")?.to_vec()
        } else {
            Vec::new()
        },
        scores: if has("scores") {
            meta.get_f32_array("tokenizer.ggml.scores")?.to_vec()
        } else {
            Vec::new()
        },
        merges: if has("merges") {
            meta.get_str_array("tokenizer.ggml.merges")?.to_vec()
        } else {
            Vec::new()
        },
        bos: id("bos_token_id"),
        eos: id("eos_token_id"),
        unk: id("unknown_token_id"),
        pad: id("padding_token_id"),
        add_bos: flag("add_bos_token"),
        add_eos: flag("add_eos_token"),
        add_space_prefix: flag("add_space_prefix"),
    })
}

/// Checks that tensor `info` is `rows × cols`.
pub(crate) fn check_dims(info: &TensorInfo, cols: usize, rows: usize) -> Result<(), ModelError> {
    if info.row_len() != cols as u64 || info.n_rows() != rows as u64 {
        return Err(ModelError::TensorShape {
            name: info.name.clone(),
            dims: info.dims.clone(),
            cols,
            rows,
        });
    }
    Ok(())
}

/// Checks that every tensor a model of `c` needs is in `header`, with its shape, and
/// each matrix in a format the CPU runs.
fn check_tensors(header: &GgufHeader, c: &ModelConfig) -> Result<(), ModelError> {
    let matrix = |name: &str, cols: usize, rows: usize| -> Result<(), ModelError> {
        let info = header.require_tensor(name)?;
        check_dims(info, cols, rows)?;
        check_format(info, GgmlType::SUPPORTED)
    };
    let vector = |name: &str, n: usize| -> Result<(), ModelError> {
        check_dims(header.require_tensor(name)?, n, 1)
    };
    matrix(EMBED, c.d_model, c.vocab)?;
    if header.tensor(OUTPUT).is_some() {
        matrix(OUTPUT, c.d_model, c.vocab)?;
    }
    vector(OUTPUT_NORM, c.d_model)?;
    if header.tensor(ROPE_FREQS).is_some() {
        vector(ROPE_FREQS, c.rope_dims / 2)?;
    }
    for l in 0..c.n_layers {
        BlockTensors::<(), ()>::load(
            c,
            l,
            &mut (),
            |_, m| matrix(m.name, m.cols, m.tensor_rows),
            |_, name, n| vector(name, n),
        )?;
    }
    Ok(())
}

/// Checks that tensor `info` is in one of the formats a backend runs (`supported`).
pub(crate) fn check_format(info: &TensorInfo, supported: &[GgmlType]) -> Result<(), ModelError> {
    if supported.contains(&info.ty) {
        return Ok(());
    }
    let names: Vec<String> = supported.iter().map(|t| format!("{t:?}")).collect();
    Err(ModelError::Format {
        name: info.name.clone(),
        ty: info.ty,
        supported: names.join(", "),
    })
}

/// The file's chat template, with its BOS and EOS tokens' texts.
fn chat_template(meta: &Metadata, tokenizer: &Tokenizer) -> Option<ChatTemplate> {
    ChatTemplate::from_metadata(meta, tokenizer.bos(), tokenizer.eos(), |id| {
        String::from_utf8_lossy(tokenizer.token_bytes(id)).into_owned()
    })
}

impl Model {
    /// Loads a model from a GGUF file held by `file` (mapped natively).
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let meta = file.metadata();
        let config = ModelConfig::from_metadata(meta)?;
        let tokenizer = Tokenizer::from_spec(tokenizer_spec(meta)?)?;
        let chat_template = chat_template(meta, &tokenizer);
        let weights = Weights::from_file(&file, &config)?;
        Ok(Model {
            config,
            tokenizer,
            chat_template,
            weights: Some(weights),
        })
    }

    /// Loads a model whose weights `source` keeps outside this process's memory (a
    /// browser's JS memory, for a model larger than wasm32 addresses), from its
    /// files' header (`header`, merged for a split model): each step stages one
    /// block's matrices at a time into a buffer of the largest block's size.
    pub fn from_source(
        header: &GgufHeader,
        source: Arc<dyn WeightSource>,
    ) -> Result<Self, ModelError> {
        let config = ModelConfig::from_metadata(&header.metadata)?;
        let tokenizer = Tokenizer::from_spec(tokenizer_spec(&header.metadata)?)?;
        let chat_template = chat_template(&header.metadata, &tokenizer);
        let weights = Weights::from_source(header, source, &config)?;
        Ok(Model {
            config,
            tokenizer,
            chat_template,
            weights: Some(weights),
        })
    }

    /// The tokenizer and shape of a model from its GGUF header alone, without
    /// weights: what a browser keeps while the weights stream to the GPU, so that the
    /// file is never whole in memory. [`Model::forward`] refuses to run it.
    ///
    /// Every tensor the model needs must be listed with its shape and a format the
    /// CPU runs: a file ACS cannot run is refused here, before a weight is read.
    pub fn from_header(header: &GgufHeader) -> Result<Self, ModelError> {
        let config = ModelConfig::from_metadata(&header.metadata)?;
        let tokenizer = Tokenizer::from_spec(tokenizer_spec(&header.metadata)?)?;
        check_tensors(header, &config)?;
        let chat_template = chat_template(&header.metadata, &tokenizer);
        Ok(Model {
            config,
            tokenizer,
            chat_template,
            weights: None,
        })
    }

    /// Bytes of weights one decode step reads: every block's matrices and the output
    /// layer, as the kernels read them (repacked panels where a matrix has them); 0
    /// for a model without weights.
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.weights
            .as_ref()
            .map_or(0, |w| w.read_bytes_per_token() as u64)
    }

    /// Bytes of the buffer a model loaded [`Model::from_source`] stages its matrices
    /// in (0 for one whose weights are in its file).
    pub fn stage_bytes(&self) -> usize {
        self.weights.as_ref().map_or(0, Weights::stage_bytes)
    }

    /// Whether the CPU can run this model (it was loaded with its weights).
    pub fn has_weights(&self) -> bool {
        self.weights.is_some()
    }

    /// Opens and loads a GGUF file.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self, ModelError> {
        Self::from_gguf(Arc::new(GgufFile::open(path)?))
    }

    /// An empty KV cache for one sequence.
    pub fn new_cache(&self) -> KvCache {
        let c = &self.config;
        KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim)
    }

    /// The `n` tokens greedy decoding picks after `prompt`, one step per token (the
    /// highest logit, the lowest id of a tie): what llama.cpp's greedy sampler picks,
    /// for comparing the two on a file.
    pub fn greedy(&self, prompt: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        let mut cache = self.new_cache();
        let mut next = prompt.to_vec();
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let mut batch = [SeqInput {
                cache: &mut cache,
                tokens: &next,
                steering: &[],
                capture: &[],
                logits: Logits::Last,
            }];
            let logits = self.forward(&mut batch)?.remove(0).logits;
            let best = crate::sample::argmax(&logits);
            out.push(best);
            next = vec![best];
        }
        Ok(out)
    }

    /// Advances each sequence of `batch` by its new tokens; returns, per sequence, the
    /// logits it asked for and the activations it captured.
    pub fn forward(&self, batch: &mut [SeqInput<'_>]) -> Result<Vec<SeqOutput>, ModelError> {
        crate::cpu::team::session(|| self.forward_in_session(batch))
    }

    fn forward_in_session(&self, batch: &mut [SeqInput<'_>]) -> Result<Vec<SeqOutput>, ModelError> {
        let w = self.weights.as_ref().ok_or(ModelError::NoWeights)?;
        let c = &self.config;
        let recipe = c.recipe();
        let (d, qd) = (c.d_model, c.q_dim());
        // Row ranges of each sequence's new tokens in the batch matrix.
        let mut spans = Vec::with_capacity(batch.len());
        let mut total = 0usize;
        for s in batch.iter() {
            let end = s.cache.len() + s.tokens.len();
            if end > c.context {
                return Err(ModelError::ContextFull(end, c.context));
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::TokenOutOfRange(bad));
            }
            spans.push(total..total + s.tokens.len());
            total += s.tokens.len();
        }
        let mut outputs: Vec<SeqOutput> = batch.iter().map(|_| SeqOutput::default()).collect();
        if total == 0 {
            return Ok(outputs);
        }

        let mut x = vec![0f32; total * d];
        for (s, span) in batch.iter().zip(&spans) {
            for (i, &t) in s.tokens.iter().enumerate() {
                let row = &mut x[(span.start + i) * d..(span.start + i + 1) * d];
                w.embed.row(t as usize, row)?;
            }
        }
        if recipe.scaled_embedding {
            let scale = (d as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }
        // Position and sequence of each row, for RoPE and the causal mask.
        let positions: Vec<usize> = batch
            .iter()
            .flat_map(|s| (0..s.tokens.len()).map(move |i| s.cache.len() + i))
            .collect();
        let mut owner = vec![0usize; total];
        for (si, span) in spans.iter().enumerate() {
            owner[span.clone()].fill(si);
        }
        // RoPE's (cos, sin) per row and rotated pair, once per step rather than per
        // layer and head: for the global layers, and the sliding-window ones where
        // they turn at another base.
        let angles_for = |inv_freq: &[f32]| -> Vec<(f32, f32)> {
            positions
                .iter()
                .flat_map(|&pos| {
                    inv_freq.iter().map(move |&f| {
                        let (sin, cos) = (pos as f32 * f).sin_cos();
                        (cos, sin)
                    })
                })
                .collect()
        };
        let angles = angles_for(&w.rope_inv_freq);
        let angles_local = w.rope_inv_freq_local.as_deref().map(angles_for);

        // Scratch for the whole step: every layer reuses the same buffers, and `qx`
        // holds each matmul input rounded to 8 bits once for all the matrices it feeds.
        let kv = c.kv_dim();
        let mut xn = vec![0f32; total * d];
        let mut q = vec![0f32; total * qd];
        let mut k = vec![0f32; total * kv];
        let mut v = vec![0f32; total * kv];
        let mut attn = vec![0f32; total * qd];
        let mut proj = vec![0f32; total * d];
        let mut gate = vec![0f32; total * c.ffn];
        let mut up = vec![0f32; total * c.ffn];
        let mut qx = QuantizedActivations::default();
        let ops = F32Ops::detect();

        let mut stage = w.stage();
        for (l, b) in w.blocks.iter().enumerate() {
            let staged = stage.block(b)?;
            rms_norm(&x, &b.attn_norm, c.rms_eps, &mut xn);
            quant::matmul_many(
                &mut [
                    b.wq.job(staged, &mut q),
                    b.wk.job(staged, &mut k),
                    b.wv.job(staged, &mut v),
                ],
                d,
                &xn,
                &mut qx,
            )?;
            if let Some([bq, bk, bv]) = &b.qkv_bias {
                add_rows(&mut q, bq);
                add_rows(&mut k, bk);
                add_rows(&mut v, bv);
            }
            if let Some([qn, kn]) = &b.qk_norm {
                rms_norm_in_place(&mut q, qn, c.rms_eps);
                rms_norm_in_place(&mut k, kn, c.rms_eps);
            }
            let layer_angles = match &angles_local {
                Some(local) if c.is_local(l) => local,
                _ => &angles,
            };
            self.rotate_and_append(l, batch, layer_angles, &mut q, &mut k, &v);
            let caches: Vec<&KvCache> = batch.iter().map(|s| &*s.cache).collect();
            let layer = attention::Layer {
                layer: l,
                head_dim: c.head_dim,
                n_kv_heads: c.n_kv_heads,
                group: c.n_heads / c.n_kv_heads,
                scale: c.attention_scale,
                window: c.window(l),
                caches: &caches,
                owner: &owner,
                positions: &positions,
            };
            attention::attend(ops, &layer, &q, &mut attn);
            quant::matmul_many(&mut [b.wo.job(staged, &mut proj)], qd, &attn, &mut qx)?;
            if let Some([post_attn, _]) = &b.post_norms {
                rms_norm_in_place(&mut proj, post_attn, c.rms_eps);
            }
            add_residual(&mut x, &proj, d);

            rms_norm(&x, &b.ffn_norm, c.rms_eps, &mut xn);
            quant::matmul_many(
                &mut [b.gate.job(staged, &mut gate), b.up.job(staged, &mut up)],
                d,
                &xn,
                &mut qx,
            )?;
            for_each_chunk_mut(&mut gate, SWIGLU_CHUNK, |i, g| {
                let up = &up[i * SWIGLU_CHUNK..][..g.len()];
                match recipe.activation {
                    Activation::Silu => ops.swiglu(g, up),
                    Activation::Gelu => ops.geglu(g, up),
                }
            });
            quant::matmul_many(&mut [b.down.job(staged, &mut proj)], c.ffn, &gate, &mut qx)?;
            if let Some([_, post_ffn]) = &b.post_norms {
                rms_norm_in_place(&mut proj, post_ffn, c.rms_eps);
            }
            add_residual(&mut x, &proj, d);

            for ((s, span), out) in batch.iter().zip(&spans).zip(&mut outputs) {
                let rows = &mut x[span.start * d..span.end * d];
                for add_vec in s.steering.iter().filter(|a| a.layer == l) {
                    for row in rows.chunks_exact_mut(d) {
                        add(row, &add_vec.vector);
                    }
                }
                if s.capture.contains(&l) {
                    out.captured.push((l, rows.to_vec()));
                }
            }
        }
        for s in batch.iter_mut() {
            s.cache.advance(s.tokens.len());
        }

        // Logits only for the rows that sample (or score): a vocab-wide matmul per
        // row is the most expensive single step of a decode.
        let mut rows = Vec::new();
        for (s, span) in batch.iter().zip(&spans) {
            match s.logits {
                Logits::None => {}
                Logits::Last => rows.push(span.end - 1),
                Logits::All => rows.extend(span.clone()),
            }
        }
        if !rows.is_empty() {
            let mut h = vec![0f32; rows.len() * d];
            for (dst, &r) in h.chunks_exact_mut(d).zip(&rows) {
                dst.copy_from_slice(&x[r * d..(r + 1) * d]);
            }
            let mut hn = vec![0f32; h.len()];
            rms_norm(&h, &w.out_norm, c.rms_eps, &mut hn);
            let mut logits = vec![0f32; rows.len() * c.vocab];
            let staged = stage.bring(&[&w.output])?;
            quant::matmul_many(&mut [w.output.job(staged, &mut logits)], d, &hn, &mut qx)?;
            let mut chunks = logits.chunks_exact(c.vocab);
            for (s, out) in batch.iter().zip(&mut outputs) {
                let n = match s.logits {
                    Logits::None => 0,
                    Logits::Last => 1,
                    Logits::All => s.tokens.len(),
                };
                for _ in 0..n {
                    out.logits
                        .extend_from_slice(chunks.next().expect("one chunk per row"));
                }
            }
        }
        Ok(outputs)
    }

    /// Rotates the new rows' queries and keys by their positions' `angles`, rows
    /// shared out over the team, and appends the keys and values to layer `layer` of
    /// their sequences' caches, one task per sequence (`q`, `k`, `v` and `angles` hold
    /// the batch's rows in order): on one thread a step of several sequences would
    /// wait here, with the other cores idle, mostly on the cache lines the appends
    /// write (every head's end in a layer, last touched a step before).
    fn rotate_and_append(
        &self,
        layer: usize,
        batch: &mut [SeqInput<'_>],
        angles: &[(f32, f32)],
        q: &mut [f32],
        k: &mut [f32],
        v: &[f32],
    ) {
        let c = &self.config;
        let (qd, kv, pairs) = (c.q_dim(), c.kv_dim(), c.rope_dims / 2);
        let ops = F32Ops::detect();
        // Each row by its own position's angles, the rows shared out over the team
        // (a prefill's are one sequence's).
        for (x, width) in [(&mut *q, qd), (&mut *k, kv)] {
            let rows_a_task = row_task(width) / width;
            for_each_chunk_mut(x, rows_a_task * width, |i, rows| {
                for (r, row) in rows.chunks_exact_mut(width).enumerate() {
                    let at = (i * rows_a_task + r) * pairs;
                    self.rope(row, &angles[at..at + pairs]);
                }
            });
        }
        // Each sequence's cache and its rows of `k` and `v`.
        let mut work = Vec::with_capacity(batch.len());
        let (mut k, mut v) = (&*k, v);
        for s in batch.iter_mut() {
            let n = s.tokens.len();
            let (ks, k_rest) = k.split_at(n * kv);
            let (vs, v_rest) = v.split_at(n * kv);
            (k, v) = (k_rest, v_rest);
            work.push((&mut *s.cache, ks, vs));
        }
        for_each_chunk_mut(&mut work, 1, |_, w| {
            for (cache, k, v) in w {
                cache.append(ops, layer, k, v);
            }
        });
    }

    /// Rotates each head of `x` by its position's angles `rot` (cos, sin), its
    /// pairs as the family's [`RopeStyle`] makes them.
    fn rope(&self, x: &mut [f32], rot: &[(f32, f32)]) {
        let c = &self.config;
        let (half, style) = (c.rope_dims / 2, c.recipe().rope);
        for head in x.chunks_exact_mut(c.head_dim) {
            for (i, &(cos, sin)) in rot.iter().enumerate() {
                let (ia, ib) = match style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::Halves => (i, i + half),
                };
                let (a, b) = (head[ia], head[ib]);
                head[ia] = a * cos - b * sin;
                head[ib] = a * sin + b * cos;
            }
        }
    }
}

/// `scale × vector` to add to the residual stream after block `layer`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerAdd {
    /// The block after which it is added.
    pub layer: usize,
    /// The vector, already multiplied by its scale.
    pub vector: Vec<f32>,
}

/// Which logits a sequence wants from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill whose last token is sampled elsewhere, or a read-out).
    None,
    /// The last new position's (the one to sample from).
    Last,
    /// Every new position's (scoring an echoed prompt).
    All,
}

/// One sequence's part of a batch step. `C` is the backend's cache (the CPU's
/// [`KvCache`] here; the WebGPU backend's `GpuCache`), so both take the same input.
#[derive(Debug)]
pub struct SeqInput<'a, C = KvCache> {
    /// Its cache; the new tokens are appended.
    pub cache: &'a mut C,
    /// The new tokens.
    pub tokens: &'a [u32],
    /// Vectors to add after given blocks, for this sequence only.
    pub steering: &'a [LayerAdd],
    /// Blocks after which to copy out the residual stream of the new tokens.
    pub capture: &'a [usize],
    /// Which logits to return.
    pub logits: Logits,
}

/// What one sequence got from a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeqOutput {
    /// `vocab` logits per returned position, end to end.
    pub logits: Vec<f32>,
    /// `(layer, rows × d_model)` residual stream after that block, new tokens only.
    pub captured: Vec<(usize, Vec<f32>)>,
}

/// RMSNorm of each row of `x` (rows as long as `w`) in place: the per-head norms of
/// queries and keys, and the norms of a block's outputs.
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    for_each_chunk_mut(x, row_task(w.len()), |_, rows| {
        for row in rows.chunks_exact_mut(w.len()) {
            let inv = inverse_rms(row, eps);
            for (v, &g) in row.iter_mut().zip(w) {
                *v = *v * inv * g;
            }
        }
    });
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    let task = row_task(d);
    for_each_chunk_mut(out, task, |i, dst| {
        let src = &x[i * task..][..dst.len()];
        for (row, dst) in src.chunks_exact(d).zip(dst.chunks_exact_mut(d)) {
            let inv = inverse_rms(row, eps);
            for ((o, &v), &g) in dst.iter_mut().zip(row).zip(w) {
                *o = v * inv * g;
            }
        }
    });
}

/// 1 / sqrt(mean(row²) + eps). Eight running sums: one would be a chain of dependent
/// adds (the compiler keeps their order), a visible share of a decode step's serial
/// work once both norms of every block are counted.
fn inverse_rms(row: &[f32], eps: f32) -> f32 {
    let ms = crate::lanes::sum_map(row, |v| v * v) / row.len() as f32;
    1.0 / (ms + eps).sqrt()
}

/// Adds `bias` to each row of `x` (rows of its length).
fn add_rows(x: &mut [f32], bias: &[f32]) {
    for_each_chunk_mut(x, row_task(bias.len()), |_, rows| {
        for row in rows.chunks_exact_mut(bias.len()) {
            add(row, bias);
        }
    });
}

/// `x += y` for the residual stream, shared out over the team as [`row_task`] says
/// for rows of `width`.
fn add_residual(x: &mut [f32], y: &[f32], width: usize) {
    let task = row_task(width);
    for_each_chunk_mut(x, task, |i, xs| add(xs, &y[i * task..][..xs.len()]));
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Values per task of the norms and the residual's additions (whole rows of
/// `width`): a prefill's rows go to every core, where one core alone would keep the
/// others waiting between matmuls, while a decode step's few rows stay on the calling
/// thread, as handing them out would cost more than it saves.
fn row_task(width: usize) -> usize {
    const VALUES: usize = 1 << 15;
    (VALUES / width.max(1)).max(1) * width.max(1)
}

/// Values per task of the gated activation: a decode step of one sequence (an MLP
/// width of 1,536 for the default model) still splits over a few cores.
const SWIGLU_CHUNK: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::{TestModelSpec, test_model_bytes};

    fn model(spec: &TestModelSpec) -> Model {
        let bytes = test_model_bytes(spec).expect("test model");
        Model::from_gguf(Arc::new(GgufFile::from_vec(bytes).expect("parses"))).expect("loads")
    }

    /// One step of `caches`, each fed its `tokens`; every row's logits.
    fn step(model: &Model, caches: &mut [KvCache], tokens: &[Vec<u32>]) -> Vec<Vec<f32>> {
        let mut batch: Vec<SeqInput<'_>> = caches
            .iter_mut()
            .zip(tokens)
            .map(|(cache, tokens)| SeqInput {
                cache,
                tokens,
                steering: &[],
                capture: &[],
                logits: Logits::All,
            })
            .collect();
        let out = model.forward(&mut batch).expect("step");
        out.into_iter().map(|o| o.logits).collect()
    }

    /// Branches that share their prompt's positions give, bit for bit, the logits of
    /// caches that hold their own copies, in steps of several tokens and of one, and
    /// for a branch of a branch (two shared segments); the prompt's memory is held
    /// once. Run with heads of 16 values (the portable attention) and of 64 (AVX2's).
    #[test]
    fn forked_caches_share_the_prompt_and_match_copies() {
        let wide = TestModelSpec {
            d_model: 256,
            ffn: 128,
            ..TestModelSpec::tiny()
        };
        for spec in [TestModelSpec::tiny(), wide] {
            let m = model(&spec);
            let prompt: Vec<u32> = (1..=40).map(|i| i * 7 % 300).collect();
            let prefilled = || {
                let mut c = [m.new_cache()];
                step(&m, &mut c, std::slice::from_ref(&prompt));
                let [c] = c;
                c
            };
            let mut prompt_cache = prefilled();
            let copy_bytes = prompt_cache.bytes();
            let mut shared = vec![prompt_cache.fork(64), prompt_cache.fork(64)];
            shared.push(prompt_cache);
            let mut copies = vec![prefilled(), prefilled(), prefilled()];
            let held: usize = shared.iter().map(KvCache::bytes).sum();
            assert!(
                held < copy_bytes + 3 * (64 - 40) * m.config.kv_bytes_per_token(),
                "{held} bytes held for a prompt of {copy_bytes}"
            );
            for s in 0..6u32 {
                if s == 3 {
                    // A branch of a branch: its own positions become a second segment.
                    let twig = shared[0].fork(64);
                    shared.push(twig);
                    copies.push(copies[0].clone());
                }
                // Three tokens each in the first step (a prefill on shared positions),
                // one afterwards.
                let len = if s == 0 { 3 } else { 1 };
                let feed: Vec<Vec<u32>> = (0..shared.len() as u32)
                    .map(|i| (0..len).map(|j| 5 + 11 * i + 3 * s + j).collect())
                    .collect();
                let got = step(&m, &mut shared, &feed);
                let want = step(&m, &mut copies, &feed);
                assert_eq!(
                    got,
                    want,
                    "head dim {}, step {s}",
                    spec.d_model / spec.n_heads
                );
            }
            for (a, b) in shared.iter().zip(&copies) {
                assert_eq!(a.len(), b.len());
            }
        }
    }

    /// A long prefill, whose rows the norms, residual additions and rotations share
    /// out over the team in several tasks, gives every row's logits bit for bit as
    /// the same prompt fed in steps of a few dozen tokens does (one task each).
    #[test]
    fn a_long_prefill_matches_short_steps() {
        let wide = TestModelSpec {
            d_model: 256,
            ffn: 128,
            ctx: 512,
            ..TestModelSpec::tiny()
        };
        let k_quants = TestModelSpec {
            ctx: 512,
            value_down_type: Some(GgmlType::Q6_K),
            ..TestModelSpec::tiny_k(GgmlType::Q5_K)
        };
        for spec in [wide, k_quants] {
            let m = model(&spec);
            let tokens: Vec<u32> = (0..300).map(|i| (i * 13 + 5) % 300).collect();
            let (d, kv) = (spec.d_model, m.config.kv_dim());
            assert!(
                tokens.len() * d > row_task(d),
                "the prefill's rows make several tasks"
            );
            // The wide model's keys too (two key/value heads of 64).
            assert!(spec.n_kv_heads == 1 || tokens.len() * kv > row_task(kv));
            let mut whole = [m.new_cache()];
            let want = step(&m, &mut whole, std::slice::from_ref(&tokens)).remove(0);
            let mut steps = [m.new_cache()];
            let mut got = Vec::new();
            for part in tokens.chunks(40) {
                got.extend(step(&m, &mut steps, &[part.to_vec()]).remove(0));
            }
            assert_eq!(
                got, want,
                "d_model {}, {:?}",
                spec.d_model, spec.weight_type
            );
        }
    }

    /// A cache that copies the first positions of another (here one in two parts: a
    /// shared segment and its own positions after it) and prefills the rest of the
    /// tokens gives the logits of prefilling them all, bit for bit: at a prefix
    /// inside the segment and at one that takes some of the own positions too.
    #[test]
    fn a_copied_prefix_continues_as_the_whole_prompt() {
        let m = model(&TestModelSpec::tiny());
        let tokens: Vec<u32> = (1..=43).map(|i| i * 5 % 300).collect();
        let mut prompt = [m.new_cache()];
        step(&m, &mut prompt, &[tokens[..40].to_vec()]);
        let [mut prompt] = prompt;
        let mut branch = [prompt.fork(64)];
        step(&m, &mut branch, &[tokens[40..].to_vec()]);
        let mut whole = [m.new_cache()];
        let want = step(&m, &mut whole, std::slice::from_ref(&tokens));
        let vocab = m.config.vocab;
        for prefix in [25, 42] {
            let mut copy = [branch[0].copy_prefix(prefix, 64)];
            assert!(copy[0].bytes() >= 64 * m.config.kv_bytes_per_token());
            let got = step(&m, &mut copy, &[tokens[prefix..].to_vec()]);
            assert_eq!(got[0][..], want[0][prefix * vocab..], "prefix {prefix}");
        }
    }
}
