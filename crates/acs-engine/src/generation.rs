//! From a contract request to the engine's unit of work: prompts as token ids, each
//! choice's sampling, steering vectors resolved, activation read-outs named.

use acs_core::request::{
    ChatMessage, MAX_STEERING_VALUE, Positions, PromptItem, SteeringSource, steering_value_in_range,
};
use acs_core::{ApiError, CompletionRequest, ErrorCode, ModelInfo, Shape};
use acs_llama::chat_template::Message;
use acs_llama::model::{LayerAdd, Logits, Model, SeqInput};
use acs_llama::sample::SamplingParams;

use crate::backend::Backend;
use crate::control::ControlVectors;

/// Largest activation read-out a request may ask for, in f32 values (64 MiB).
pub const MAX_ACTIVATION_VALUES: usize = 16 << 20;

/// Most log-probability values a request that echoes its prompt with `logprobs`
/// returns: every choice repeats its prompt's scores (the token's and the `logprobs`
/// alternatives' at each position), so `n` multiplies them; past this the answer
/// runs to hundreds of megabytes of JSON.
pub const MAX_ECHO_LOGPROB_VALUES: usize = 1 << 20;

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
    /// Contrast pairs of `steering` whose vectors are still to be computed (by
    /// [`resolve_on`], after the request's Hold is taken): the scheduler runs only a
    /// request without any.
    pub contrasts: Vec<Contrast>,
    /// Who may share this request's prefills and kept prompts: only requests of the
    /// same scope do. A shared prompt is visible to its sharers (as
    /// `usage.prompt_tokens_details.cached_tokens`, and as time saved), so a server
    /// gives each API key its own scope unless its operator shares the cache.
    pub scope: String,
    /// How the request's answer is shaped (a completion or a chat completion).
    pub shape: Shape,
}

/// A contrast pair of a request's steering, tokenized. Its vector (the difference of
/// the two texts' mean activations) takes a forward pass of each text, which
/// [`resolve_on`] runs once the request holds its tokens, so that a request refused
/// for its Budget costs no model work.
#[derive(Debug, Clone)]
pub struct Contrast {
    /// Its place in [`Generation::steering`], empty until resolved.
    at: usize,
    /// The request's steering entry it comes from, for errors.
    entry: usize,
    scale: f32,
    positive: Vec<u32>,
    negative: Vec<u32>,
}

impl Generation {
    /// Tokens the prompts hold, each prompt once.
    pub fn prompt_lens(&self) -> Vec<usize> {
        self.prompts.iter().map(Vec::len).collect()
    }

    /// Tokens of the contrast texts still to run through the model.
    pub fn contrast_tokens(&self) -> usize {
        self.contrasts
            .iter()
            .map(|c| c.positive.len() + c.negative.len())
            .sum()
    }

    /// The tokens the request holds while it runs: its prompts, every token it may
    /// generate, and its contrast texts (model work as much as a prompt's).
    pub fn hold_tokens(&self) -> u64 {
        acs_core::request::hold_tokens(&self.prompt_lens(), self.n as u32, self.max_tokens as u32)
            .saturating_add(self.contrast_tokens() as u64)
    }

    /// Sequence positions this request can occupy at most: each prompt once and
    /// every choice's completion where the choices share their prompt's positions
    /// (`shared_prompts`, see [`crate::Backend::forks_share_prompt`]), or each choice
    /// its own copy of the prompt as well.
    pub fn kv_tokens(&self, shared_prompts: bool) -> usize {
        // Saturating: a usize is 32 bits on wasm32, and a sum that wrapped would pass
        // the KV check it is made for.
        let generated = self.n.saturating_mul(self.max_tokens);
        self.prompts
            .iter()
            .map(|p| {
                if shared_prompts {
                    p.len().saturating_add(generated)
                } else {
                    self.n
                        .saturating_mul(p.len().saturating_add(self.max_tokens))
                }
            })
            .fold(0, usize::saturating_add)
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
        family: c.family.name().into(),
        context_window: c.context as u32,
        n_layers: c.n_layers as u32,
        d_model: c.d_model as u32,
        vocab_size: c.vocab as u32,
    }
}

/// Tokenizes prompts (control tokens such as `<|im_start|>` are recognised, as chat
/// prompts need), checks the request against the model, and resolves steering but
/// for contrast pairs, which it tokenizes for [`resolve_on`] (no model work runs
/// here). `seed` is used when the request names none.
pub fn prepare(
    req: &CompletionRequest,
    model: &Model,
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
            PromptItem::Chat(messages) => {
                let (ids, text) = render_chat(model, messages)?;
                prompts.push(ids);
                prompt_texts.push(text);
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
    let mut contrasts = Vec::new();
    for (i, s) in req.steering.iter().enumerate() {
        let scaled = |v: &[f32]| v.iter().map(|x| x * s.scale).collect();
        let from = steering.len();
        match (&s.source, s.layer) {
            (SteeringSource::Vector(v), Some(layer)) => steering.push(LayerAdd {
                layer: layer as usize,
                vector: scaled(v),
            }),
            (SteeringSource::Contrast { positive, negative }, Some(layer)) => {
                contrasts.push(Contrast {
                    at: steering.len(),
                    entry: i,
                    scale: s.scale,
                    positive: contrast_ids(model, positive)?,
                    negative: contrast_ids(model, negative)?,
                });
                steering.push(LayerAdd {
                    layer: layer as usize,
                    vector: Vec::new(),
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
    // Saturating arithmetic: on wasm32 a usize is 32 bits, and these products of
    // request fields must not wrap past the limits they are checked against.
    let prompt_tokens = lens.iter().fold(0usize, |a, &l| a.saturating_add(l));
    if let (true, Some(top)) = (req.echo, req.logprobs) {
        let values = prompt_tokens
            .saturating_mul(req.n as usize)
            .saturating_mul(1 + usize::from(top));
        if values > MAX_ECHO_LOGPROB_VALUES {
            return Err(ApiError::invalid_value(
                "logprobs",
                format!(
                    "Echoing the prompts with logprobs would return {values} log-probabilities (prompt tokens × n × (1 + logprobs)); the limit is {MAX_ECHO_LOGPROB_VALUES}. Ask for fewer choices, fewer alternatives, or shorter prompts."
                ),
            ));
        }
    }
    let capture = match &req.activations {
        None => None,
        Some(a) => {
            let positions: usize = match a.positions {
                Positions::Last => lens.len(),
                Positions::All => prompt_tokens,
            };
            let values = positions
                .saturating_mul(a.layers.len())
                .saturating_mul(model.config.d_model);
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
        max_tokens: req.max_tokens_for(info, lens[0]) as usize,
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
        contrasts,
        scope: String::new(),
        shape: req.shape(),
    })
}

/// A conversation as the model's chat template renders it, with the generation
/// prompt, and its tokens. The rendered text spells the template's control tokens
/// (`<|im_start|>`, `<start_of_turn>`), so they are parsed as such, and a template that
/// writes BOS itself gets no second one from the tokenizer.
fn render_chat(model: &Model, messages: &[ChatMessage]) -> Result<(Vec<u32>, String), ApiError> {
    let template = model.chat_template.as_ref().ok_or_else(|| {
        ApiError::param(
            ErrorCode::ChatTemplateMissing,
            "messages",
            "This model's file has no chat template (tokenizer.chat_template); send its prompt to /v1/completions instead.",
        )
    })?;
    let messages: Vec<Message<'_>> = messages
        .iter()
        .map(|m| Message {
            role: m.role.as_str(),
            content: &m.content,
        })
        .collect();
    let text = template
        .render(&messages, true, unix_now())
        .map_err(|e| ApiError::invalid_value("messages", format!("{e}.")))?;
    let bos = template.bos_token();
    let add_special = bos.is_empty() || !text.starts_with(bos);
    let ids = model
        .tokenizer
        .encode(&text, add_special, true)
        .map_err(|e| {
            ApiError::invalid_value(
                "messages",
                format!("The rendered conversation cannot be tokenized: {e}"),
            )
        })?;
    Ok((ids, text))
}

/// Unix seconds now: the date a chat template's `strftime_now` writes.
fn unix_now() -> i64 {
    #[cfg(target_arch = "wasm32")]
    {
        (js_sys::Date::now() / 1000.0) as i64
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    }
}

/// Computes the vectors of `g`'s contrast pairs on the CPU model (see
/// [`resolve_on`]).
#[cfg(not(target_arch = "wasm32"))]
pub fn resolve(g: &mut Generation, model: &Model) -> Result<(), ApiError> {
    pollster::block_on(resolve_on(g, model, model))
}

/// Computes the vectors of `g`'s contrast pairs on `backend` (in the browser its
/// device, where the CPU model may have no weights and the GPU cannot be waited for
/// by blocking), scaled, in their places of its steering; then `g` can run.
pub async fn resolve_on<B: Backend>(
    g: &mut Generation,
    model: &Model,
    backend: &B,
) -> Result<(), ApiError> {
    for c in std::mem::take(&mut g.contrasts) {
        let layer = g.steering[c.at].layer;
        let p = mean_activation_on(backend, model, &c.positive, layer).await?;
        let n = mean_activation_on(backend, model, &c.negative, layer).await?;
        let vector: Vec<f32> = p.iter().zip(&n).map(|(a, b)| (a - b) * c.scale).collect();
        if !vector.iter().all(|&x| steering_value_in_range(x)) {
            return Err(ApiError::invalid_value(
                format!("steering[{}].scale", c.entry),
                format!(
                    "scale × vector must stay finite and within ±{MAX_STEERING_VALUE:e}; \
                     this contrast pair's difference times its scale does not."
                ),
            ));
        }
        g.steering[c.at].vector = vector;
    }
    Ok(())
}

/// A contrast text's tokens: 1 to a context window of them.
fn contrast_ids(model: &Model, text: &str) -> Result<Vec<u32>, ApiError> {
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
    Ok(ids)
}

/// The mean residual stream after block `layer` over the tokens `ids`, run on
/// `backend`.
async fn mean_activation_on<B: Backend>(
    backend: &B,
    model: &Model,
    ids: &[u32],
    layer: usize,
) -> Result<Vec<f32>, ApiError> {
    let mut cache = backend.new_cache(ids.len());
    let mut batch = [SeqInput {
        cache: &mut cache,
        tokens: ids,
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
    let (p, n) = (
        contrast_ids(model, positive)?,
        contrast_ids(model, negative)?,
    );
    let p = pollster::block_on(mean_activation_on(model, model, &p, layer))?;
    let n = pollster::block_on(mean_activation_on(model, model, &n, layer))?;
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
