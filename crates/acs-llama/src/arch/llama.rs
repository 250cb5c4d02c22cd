//! The Llama family as GGUF describes it: hyper-parameters from the `llama.*` keys, the
//! tensors' names and shapes, and RoPE's frequencies. Both backends (the CPU pass in
//! `model.rs`, the WGSL pass in `webgpu/`) build their weights from these.

use super::KV_VALUE_BYTES;
use crate::error::ModelError;
use crate::gguf::Metadata;

/// The hyper-parameters of a Llama model, from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Hidden width of the MLP.
    pub ffn: usize,
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// The context window.
    pub context: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// How many dimensions of each head RoPE rotates.
    pub rope_dims: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// Reads the `llama.*` keys.
    pub fn from_metadata(meta: &Metadata) -> Result<Self, ModelError> {
        let arch = meta.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Architecture(arch.to_owned()));
        }
        let key = |k: &str| format!("llama.{k}");
        let d_model = meta.get_usize(&key("embedding_length"))?;
        let n_heads = meta.get_usize(&key("attention.head_count"))?;
        let n_kv_heads = meta
            .get_usize(&key("attention.head_count_kv"))
            .unwrap_or(n_heads);
        if n_heads == 0
            || n_kv_heads == 0
            || !d_model.is_multiple_of(n_heads)
            || !n_heads.is_multiple_of(n_kv_heads)
        {
            return Err(ModelError::Shape(format!(
                "d_model {d_model}, {n_heads} heads, {n_kv_heads} kv heads"
            )));
        }
        let head_dim = d_model / n_heads;
        let rope_dims = meta
            .get_usize(&key("rope.dimension_count"))
            .unwrap_or(head_dim);
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(ModelError::Shape(format!(
                "rope dimension count {rope_dims} for head dim {head_dim}"
            )));
        }
        let vocab = match meta.get_usize(&key("vocab_size")) {
            Ok(v) => v,
            Err(_) => meta.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let cfg = LlamaConfig {
            d_model,
            n_layers: meta.get_usize(&key("block_count"))?,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: meta.get_usize(&key("feed_forward_length"))?,
            vocab,
            context: meta.get_usize(&key("context_length"))?,
            rope_base: meta.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_dims,
            rms_eps: meta
                .get_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
        };
        if cfg.n_layers == 0 || cfg.ffn == 0 || cfg.vocab == 0 || cfg.context == 0 {
            return Err(ModelError::Shape(format!("{cfg:?}")));
        }
        Ok(cfg)
    }

    /// Width of the keys (and values) of one position.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Bytes of KV cache one position takes in every layer: keys and values, as half
    /// floats on either backend ([`KV_VALUE_BYTES`] each).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.kv_dim() * KV_VALUE_BYTES
    }

    /// Multiply-adds of one token's matmuls (every block's projections and MLP, then
    /// the output): a decode step's work per sequence, attention aside.
    pub fn matmul_macs_per_token(&self) -> u64 {
        let (d, kv, ffn) = (self.d_model as u64, self.kv_dim() as u64, self.ffn as u64);
        let block = 2 * d * d + 2 * d * kv + 3 * d * ffn;
        self.n_layers as u64 * block + d * self.vocab as u64
    }
}

/// The GGUF names of the tensors outside the blocks.
pub(crate) const EMBED: &str = "token_embd.weight";
/// The output projection; absent when it is tied to [`EMBED`].
pub(crate) const OUTPUT: &str = "output.weight";
/// The final norm.
pub(crate) const OUTPUT_NORM: &str = "output_norm.weight";

/// One block's tensors, a matrix `M` or a norm vector `V` each: the CPU's mapped
/// tensors and f32 norms, the WebGPU backend's device buffers, or nothing while the
/// loader lists what it needs. Their GGUF names and shapes are written once, in
/// [`BlockTensors::load`].
#[derive(Debug)]
pub(crate) struct BlockTensors<M, V> {
    pub(crate) attn_norm: V,
    pub(crate) wq: M,
    pub(crate) wk: M,
    pub(crate) wv: M,
    pub(crate) wo: M,
    pub(crate) ffn_norm: V,
    pub(crate) gate: M,
    pub(crate) up: M,
    pub(crate) down: M,
}

impl<M, V> BlockTensors<M, V> {
    /// Block `l`'s tensors: `matrix(state, name, cols, rows)` and
    /// `vector(state, name, len)` provide each one.
    pub(crate) fn load<S, E>(
        c: &LlamaConfig,
        l: usize,
        state: &mut S,
        matrix: impl Fn(&mut S, &str, usize, usize) -> Result<M, E>,
        vector: impl Fn(&mut S, &str, usize) -> Result<V, E>,
    ) -> Result<Self, E> {
        let n = |part: &str| format!("blk.{l}.{part}.weight");
        let (d, kv) = (c.d_model, c.kv_dim());
        Ok(BlockTensors {
            attn_norm: vector(state, &n("attn_norm"), d)?,
            wq: matrix(state, &n("attn_q"), d, d)?,
            wk: matrix(state, &n("attn_k"), d, kv)?,
            wv: matrix(state, &n("attn_v"), d, kv)?,
            wo: matrix(state, &n("attn_output"), d, d)?,
            ffn_norm: vector(state, &n("ffn_norm"), d)?,
            gate: matrix(state, &n("ffn_gate"), d, c.ffn)?,
            up: matrix(state, &n("ffn_up"), d, c.ffn)?,
            down: matrix(state, &n("ffn_down"), c.ffn, d)?,
        })
    }
}

/// Inverse frequencies of RoPE, one per rotated pair.
pub(crate) fn rope_inv_freq(c: &LlamaConfig) -> Vec<f32> {
    (0..c.rope_dims / 2)
        .map(|i| c.rope_base.powf(-(2.0 * i as f32) / c.rope_dims as f32))
        .collect()
}
