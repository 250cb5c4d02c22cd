//! From a contract request to the engine's unit of work: prompts as token ids, each
//! choice's sampling, steering vectors resolved, activation read-outs named.

use acs_core::request::{
    MAX_STEERING_VALUE, Positions, PromptItem, SteeringSource, steering_value_in_range,
};
use acs_core::{ApiError, CompletionRequest, ErrorCode, ModelInfo};
use acs_llama::model::{LayerAdd, Logits, Model, SeqInput};
use acs_llama::sample::SamplingParams;

use crate::backend::Backend;
use crate::control::ControlVectors;

/// Largest activation read-out a request may ask for, in f32 values (64 MiB).
pub const MAX_ACTIVATION_VALUES: usize = 16 << 20;

/// One request's work, ready for the scheduler.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Each prompt's token ids.
    pub prompts: Vec<Vec<u32>>,
    /// Each prompt's text, for `echo`.
    pub prompt_texts: Vec<String>,
    /// Choices per prompt.
    pub n: usize,
    /// Most tokens per choice.
    pub max_tokens: usize,
    /// How every choice samples.
    pub sampling: SamplingParams,
    /// The request's seed; choice `i` samples from its own stream of it.
    pub seed: u64,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Put the prompt in front of the text.
    pub echo: bool,
    /// Vectors added to this request's residual stream.
    pub steering: Vec<LayerAdd>,
    /// Activation read-out: blocks and positions.
    pub capture: Option<(Vec<usize>, Positions)>,
}

impl Generation {
    /// Tokens the prompts hold, each prompt once.
    pub fn prompt_lens(&self) -> Vec<usize> {
        self.prompts.iter().map(Vec::len).collect()
    }

    /// Sequence positions this request can occupy at most: each prompt once and
    /// every choice's completion where the choices share their prompt's positions
    /// (`shared_prompts`, see [`crate::Backend::forks_share_prompt`]), or each choice
    /// its own copy of the prompt as well.
    pub fn kv_tokens(&self, shared_prompts: bool) -> usize {
        self.prompts
            .iter()
            .map(|p| {
                if shared_prompts {
                    p.len() + self.n * self.max_tokens
                } else {
                    self.n * (p.len() + self.max_tokens)
                }
            })
            .sum()
    }
}

/// Model facts of the contract's `/v1/models`, for `model` served under `id`.
pub fn model_info(model: &Model, id: &str, created: i64) -> ModelInfo {
    let c = &model.config;
    ModelInfo {
        id: id.to_owned(),
        object: "model".into(),
        created,
        owned_by: "acs".into(),
        context_window: c.context as u32,
        n_layers: c.n_layers as u32,
        d_model: c.d_model as u32,
        vocab_size: c.vocab as u32,
    }
}

/// Tokenizes prompts (control tokens such as `<|im_start|>` are recognised, as chat
/// prompts need), checks the request against the model, and resolves steering
/// (contrast pairs run on the CPU model). `seed` is used when the request names none.
#[cfg(not(target_arch = "wasm32"))]
pub fn prepare(
    req: &CompletionRequest,
    model: &Model,
    info: &ModelInfo,
    controls: &ControlVectors,
    seed: u64,
) -> Result<Generation, ApiError> {
    pollster::block_on(prepare_on(req, model, model, info, controls, seed))
}

/// [`prepare`], with contrast pairs run on `backend`: the browser's, where the CPU
/// model may have no weights (they went straight to the GPU) and the GPU cannot be
/// waited for by blocking.
pub async fn prepare_on<B: Backend>(
    req: &CompletionRequest,
    model: &Model,
    backend: &B,
    info: &ModelInfo,
    controls: &ControlVectors,
    seed: u64,
) -> Result<Generation, ApiError> {
    let tok = &model.tokenizer;
    let mut prompts = Vec::with_capacity(req.prompt.len());
    let mut prompt_texts = Vec::with_capacity(req.prompt.len());
    for item in req.prompt.items() {
        match item {
            PromptItem::Text(t) => {
                let ids = tok.encode(t, true, true).map_err(|e| {
                    ApiError::invalid_value(
                        "prompt",
                        format!("The prompt cannot be tokenized: {e}"),
                    )
                })?;
                prompts.push(ids);
                prompt_texts.push(t.to_owned());
            }
            PromptItem::Tokens(ids) => {
                prompts.push(ids.to_vec());
                prompt_texts.push(String::new());
            }
        }
    }
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    req.check_against(info, &lens)?;
    // Token prompts are checked against the vocabulary now, so decoding them is safe.
    for (text, ids) in prompt_texts.iter_mut().zip(&prompts) {
        if text.is_empty() {
            *text = tok.decode(ids);
        }
    }
    let mut steering = Vec::with_capacity(req.steering.len());
    for (i, s) in req.steering.iter().enumerate() {
        let scaled = |v: &[f32]| v.iter().map(|x| x * s.scale).collect();
        let from = steering.len();
        match (&s.source, s.layer) {
            (SteeringSource::Vector(v), Some(layer)) => steering.push(LayerAdd {
                layer: layer as usize,
                vector: scaled(v),
            }),
            (SteeringSource::Contrast { positive, negative }, Some(layer)) => {
                let v =
                    contrast_vector_on(backend, model, positive, negative, layer as usize).await?;
                steering.push(LayerAdd {
                    layer: layer as usize,
                    vector: scaled(&v),
                });
            }
            (SteeringSource::ControlVector(name), only) => {
                let cv = controls.get(name).ok_or_else(|| {
                    let mut known: Vec<&str> = controls.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    ApiError::invalid_value(
                        format!("steering[{i}].control_vector"),
                        format!("No control vector {name:?}; this server has {known:?}."),
                    )
                })?;
                for (&layer, v) in &cv.directions {
                    if only.is_none_or(|l| l as usize == layer) {
                        steering.push(LayerAdd {
                            layer,
                            vector: scaled(v),
                        });
                    }
                }
            }
            (_, None) => {
                return Err(ApiError::param(
                    ErrorCode::MissingParameter,
                    format!("steering[{i}].layer"),
                    "This steering entry needs a layer.",
                ));
            }
        }
        if !steering[from..]
            .iter()
            .all(|a| a.vector.iter().all(|&x| steering_value_in_range(x)))
        {
            return Err(ApiError::invalid_value(
                format!("steering[{i}].scale"),
                format!(
                    "scale × vector must stay finite and within ±{MAX_STEERING_VALUE:e}; \
                     this scale takes it past that."
                ),
            ));
        }
    }
    let capture = match &req.activations {
        None => None,
        Some(a) => {
            let positions: usize = match a.positions {
                Positions::Last => lens.len(),
                Positions::All => lens.iter().sum(),
            };
            let values = positions * a.layers.len() * model.config.d_model;
            if values > MAX_ACTIVATION_VALUES {
                return Err(ApiError::invalid_value(
                    "activations",
                    format!(
                        "This read-out would hold {values} values; the limit is {MAX_ACTIVATION_VALUES}. Ask for fewer layers, \"last\" positions, or shorter prompts."
                    ),
                ));
            }
            Some((a.layers.iter().map(|&l| l as usize).collect(), a.positions))
        }
    };
    Ok(Generation {
        prompts,
        prompt_texts,
        n: req.n as usize,
        max_tokens: req.max_tokens as usize,
        sampling: SamplingParams {
            temperature: req.temperature,
            top_k: req.top_k,
            top_p: req.top_p,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            logit_bias: req.logit_bias.iter().map(|(&k, &v)| (k, v)).collect(),
            logprobs: req.logprobs,
        },
        seed: req.seed.unwrap_or(seed),
        stop: req.stop.clone(),
        echo: req.echo,
        steering,
        capture,
    })
}

/// The mean residual stream after block `layer` over the tokens of `text`.
#[cfg(not(target_arch = "wasm32"))]
pub fn mean_activation(model: &Model, text: &str, layer: usize) -> Result<Vec<f32>, ApiError> {
    pollster::block_on(mean_activation_on(model, model, text, layer))
}

/// [`mean_activation`] run on `backend`.
pub async fn mean_activation_on<B: Backend>(
    backend: &B,
    model: &Model,
    text: &str,
    layer: usize,
) -> Result<Vec<f32>, ApiError> {
    let ids = model
        .tokenizer
        .encode(text, true, true)
        .map_err(|e| ApiError::invalid_value("steering", format!("Cannot tokenize: {e}")))?;
    if ids.is_empty() || ids.len() > model.config.context {
        return Err(ApiError::invalid_value(
            "steering",
            "Contrast texts must have 1 to context-window tokens.",
        ));
    }
    let mut cache = backend.new_cache(ids.len());
    let mut batch = [SeqInput {
        cache: &mut cache,
        tokens: &ids,
        steering: &[],
        capture: &[layer],
        logits: Logits::None,
    }];
    let out = backend
        .forward(&mut batch)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let (_, rows) = out
        .into_iter()
        .next()
        .and_then(|o| o.captured.into_iter().next())
        .ok_or_else(|| ApiError::internal("no activation captured"))?;
    let d = model.config.d_model;
    let mut mean = vec![0f32; d];
    for row in rows.chunks_exact(d) {
        for (m, v) in mean.iter_mut().zip(row) {
            *m += v;
        }
    }
    let n = (rows.len() / d) as f32;
    mean.iter_mut().for_each(|m| *m /= n);
    Ok(mean)
}

/// The steering direction of a contrast pair: mean activation of `positive` minus
/// that of `negative`, after block `layer` (activation addition).
#[cfg(not(target_arch = "wasm32"))]
pub fn contrast_vector(
    model: &Model,
    positive: &str,
    negative: &str,
    layer: usize,
) -> Result<Vec<f32>, ApiError> {
    pollster::block_on(contrast_vector_on(model, model, positive, negative, layer))
}

/// [`contrast_vector`] run on `backend`.
pub async fn contrast_vector_on<B: Backend>(
    backend: &B,
    model: &Model,
    positive: &str,
    negative: &str,
    layer: usize,
) -> Result<Vec<f32>, ApiError> {
    let p = mean_activation_on(backend, model, positive, layer).await?;
    let n = mean_activation_on(backend, model, negative, layer).await?;
    Ok(p.iter().zip(&n).map(|(a, b)| a - b).collect())
}

/// Builds the contract error for a request that cannot fit the engine's KV memory.
pub fn too_big_for_memory(need_bytes: usize, have_bytes: usize) -> ApiError {
    ApiError::param(
        ErrorCode::InvalidValue,
        "max_tokens",
        format!(
            "This request needs {} of KV cache at most; the engine has {}. Ask for fewer choices or tokens.",
            mib(need_bytes),
            mib(have_bytes)
        ),
    )
}

/// `bytes` in MiB, to a tenth (a whole number alone rounds a small engine to 0).
fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}
