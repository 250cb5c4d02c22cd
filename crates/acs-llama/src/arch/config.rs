//! The hyper-parameters every family here has, read from the `<architecture>.*` keys
//! of GGUF metadata, and RoPE's frequencies.

use super::{Family, KV_VALUE_BYTES, Recipe};
use crate::error::ModelError;
use crate::gguf::Metadata;

/// The hyper-parameters of a model, from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model family (`general.architecture`).
    pub family: Family,
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
    /// What positions are multiplied by before they turn RoPE's angles: 1 but where
    /// the file asks for linear scaling (`rope.scaling.type` "linear", 1/factor).
    pub rope_freq_scale: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
}

impl ModelConfig {
    /// Reads `general.architecture` and that family's keys; a family ACS does not
    /// run is refused here, before any weight is read.
    pub fn from_metadata(meta: &Metadata) -> Result<Self, ModelError> {
        let family = Family::from_name(meta.get_str("general.architecture")?)?;
        let key = |k: &str| format!("{}.{k}", family.name());
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
        let rope_freq_scale = match meta.get_str(&key("rope.scaling.type")) {
            Err(_) | Ok("none") => 1.0,
            Ok("linear") => match meta.get_f32(&key("rope.scaling.factor")) {
                Ok(f) if f.is_finite() && f >= 1.0 => 1.0 / f,
                _ => {
                    return Err(ModelError::Shape(
                        "RoPE linear scaling without a factor >= 1".into(),
                    ));
                }
            },
            Ok(other) => {
                return Err(ModelError::Unsupported(format!(
                    "RoPE scaling {other:?} (ACS runs none, linear, and per-pair frequency factors)"
                )));
            }
        };
        let cfg = ModelConfig {
            family,
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
            rope_freq_scale,
            rms_eps: meta
                .get_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
        };
        if cfg.n_layers == 0 || cfg.ffn == 0 || cfg.vocab == 0 || cfg.context == 0 {
            return Err(ModelError::Shape(format!("{cfg:?}")));
        }
        Ok(cfg)
    }

    /// The family's choices within the block.
    pub fn recipe(&self) -> Recipe {
        self.family.recipe()
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

/// RoPE's angle per position for each rotated pair: base^(-2i/dims), times the
/// linear scale, divided by the pair's factor where the file has them (the
/// `rope_freqs.weight` of Llama 3.1 and 3.2, which turn the low frequencies slower).
pub(crate) fn rope_inv_freq(c: &ModelConfig, factors: Option<&[f32]>) -> Vec<f32> {
    (0..c.rope_dims / 2)
        .map(|i| {
            let f = c.rope_base.powf(-(2.0 * i as f32) / c.rope_dims as f32) * c.rope_freq_scale;
            factors.map_or(f, |fs| f / fs[i])
        })
        .collect()
}
