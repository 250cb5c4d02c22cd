//! The hyper-parameters every family here has, read from the `<architecture>.*` keys
//! of GGUF metadata, and RoPE's frequencies.

use super::{Family, KV_VALUE_BYTES, Recipe, gemma3, phi3};
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
    /// Width of one head (`attention.key_length`, else d_model/heads); the queries
    /// of a position are `n_heads · head_dim` wide, which need not be d_model.
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
    /// What the attention scores are multiplied by before their softmax.
    pub attention_scale: f32,
    /// The layers that attend to the last positions only, where the family has them.
    pub sliding_window: Option<SlidingWindow>,
}

/// Layers that attend to a window of the last positions only (Gemma 3's local
/// layers), and turn RoPE at a base of their own.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer attends to, its own included.
    pub size: usize,
    /// Which layers are local.
    pub local: Vec<bool>,
    /// Their RoPE frequency base.
    pub rope_base: f32,
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
        if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(ModelError::Shape(format!(
                "{n_heads} heads, {n_kv_heads} kv heads"
            )));
        }
        let head_dim = match meta.get_usize(&key("attention.key_length")) {
            Ok(k) => k,
            Err(_) if d_model.is_multiple_of(n_heads) => d_model / n_heads,
            Err(_) => {
                return Err(ModelError::Shape(format!(
                    "d_model {d_model} is not a multiple of {n_heads} heads and the file has no key_length"
                )));
            }
        };
        if let Ok(v) = meta.get_usize(&key("attention.value_length"))
            && v != head_dim
        {
            return Err(ModelError::Unsupported(format!(
                "value heads {v} wide with key heads {head_dim} wide"
            )));
        }
        let rope_dims = meta
            .get_usize(&key("rope.dimension_count"))
            .unwrap_or(head_dim);
        if head_dim == 0 || rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
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
        let n_layers = meta.get_usize(&key("block_count"))?;
        if meta
            .get_f32(&key("final_logit_softcapping"))
            .is_ok_and(|c| c != 0.0)
        {
            return Err(ModelError::Unsupported(
                "final logit soft-capping (Gemma 2)".into(),
            ));
        }
        if family == Family::Phi3 {
            phi3::check_rope(meta, &key)?;
        }
        let (attention_scale, sliding_window) = match family {
            Family::Gemma3 => (
                gemma3::attention_scale(d_model, n_heads, head_dim, n_layers),
                gemma3::sliding_window(meta, &key, n_layers),
            ),
            _ => (1.0 / (head_dim as f32).sqrt(), None),
        };
        let cfg = ModelConfig {
            family,
            d_model,
            n_layers,
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
            attention_scale,
            sliding_window,
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

    /// Width of the queries (and attention outputs) of one position.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Whether layer `l` attends to the sliding window only.
    pub fn is_local(&self, l: usize) -> bool {
        self.window(l).is_some()
    }

    /// The positions layer `l` attends to, its own included, where it is local.
    pub fn window(&self, l: usize) -> Option<usize> {
        let w = self.sliding_window.as_ref()?;
        w.local.get(l).copied().unwrap_or(false).then_some(w.size)
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
        let (d, q, kv, ffn) = (
            self.d_model as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.ffn as u64,
        );
        let block = 2 * d * q + 2 * d * kv + 3 * d * ffn;
        self.n_layers as u64 * block + d * self.vocab as u64
    }
}

/// RoPE's angle per position for each rotated pair of the global layers:
/// base^(-2i/dims), times the linear scale, divided by the pair's factor where the
/// file has them (the `rope_freqs.weight` of Llama 3.1 and 3.2, which turn the low
/// frequencies slower).
pub(crate) fn rope_inv_freq(c: &ModelConfig, factors: Option<&[f32]>) -> Vec<f32> {
    (0..c.rope_dims / 2)
        .map(|i| {
            let f = c.rope_base.powf(-(2.0 * i as f32) / c.rope_dims as f32) * c.rope_freq_scale;
            factors.map_or(f, |fs| f / fs[i])
        })
        .collect()
}

/// The same for the sliding-window layers, where the model has them: their own
/// base, unscaled (Gemma 3 stretches the global layers' positions only).
pub(crate) fn rope_inv_freq_local(c: &ModelConfig) -> Option<Vec<f32>> {
    let base = c.sliding_window.as_ref()?.rope_base;
    Some(
        (0..c.rope_dims / 2)
            .map(|i| base.powf(-(2.0 * i as f32) / c.rope_dims as f32))
            .collect(),
    )
}
