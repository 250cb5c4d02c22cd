//! The completion request: parsing with the contract's errors, and the checks that need
//! the model.
//!
//! Parsing walks the JSON by hand instead of deriving `Deserialize`, so that every
//! error names the field at fault in `param` (serde's errors name no field for a
//! wrong type, and only in prose for an unknown one).

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;

use crate::chat::Shape;
use crate::error::{ApiError, ErrorCode};
use crate::response::ModelInfo;

mod chat;
mod fields;

pub use chat::{ChatMessage, ChatRole, DEFAULT_CHAT_MAX_TOKENS, MAX_MESSAGES, MAX_TOP_LOGPROBS};
use fields::{Fields, missing, reject_unknown, wrong_type};
pub use fields::{canonical_json, parse_json_object};

/// Most choices per prompt.
pub const MAX_N: u32 = 128;
/// Most prompts in one request.
pub const MAX_PROMPTS: usize = 256;
/// Most stop sequences.
pub const MAX_STOP: usize = 4;
/// Longest stop sequence, in characters: a stop sequence is matched against every
/// choice's text as it grows, so its length is work per token; real ones are a few
/// words.
pub const MAX_STOP_CHARS: usize = 256;
/// Most alternatives per token in `logprobs`.
pub const MAX_LOGPROBS: u8 = 5;
/// Most steering entries in one request.
pub const MAX_STEERING: usize = 16;
/// Largest |scale| of a steering entry; past it the residual stream is noise.
pub const MAX_STEERING_SCALE: f32 = 1000.0;
/// Largest |value| of a steering vector, before and after its scale: far past any
/// residual stream (whose values run to the hundreds), and small enough that the
/// forward pass's sums of squares stay finite in f32 (16 entries of 65,536 such
/// values, squared and summed, come to about 1.7e19). A finite vector times a finite
/// scale could otherwise overflow to infinity and turn the logits into NaN.
pub const MAX_STEERING_VALUE: f32 = 1e6;

/// Whether `x` may be a value of a steering vector, before or after its scale: finite
/// and within ±[`MAX_STEERING_VALUE`].
pub fn steering_value_in_range(x: f32) -> bool {
    x.is_finite() && x.abs() <= MAX_STEERING_VALUE
}
/// Most layers one activations read-out may name.
pub const MAX_ACTIVATION_LAYERS: usize = 64;
/// Longest steering vector accepted before the model is known.
pub const MAX_VECTOR_LEN: usize = 65_536;
/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Where a request body arrived; jobs and completions differ in a few fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completion-jobs`: a completions body, or a chat body (with
    /// `messages`)
    Jobs,
}

/// The `prompt` field in its four shapes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt as text.
    Text(String),
    /// Several prompts as text.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
    /// One conversation (a chat body's `messages`), rendered into one prompt by the
    /// model's chat template.
    Chat(Vec<ChatMessage>),
}

/// One prompt of a request, text or ids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PromptItem<'a> {
    /// Text to tokenize.
    Text(&'a str),
    /// Ids to use as they are.
    Tokens(&'a [u32]),
    /// A conversation for the model's chat template.
    Chat(&'a [ChatMessage]),
}

impl Prompt {
    /// How many prompts there are.
    pub fn len(&self) -> usize {
        match self {
            Prompt::Text(_) | Prompt::Tokens(_) | Prompt::Chat(_) => 1,
            Prompt::Texts(v) => v.len(),
            Prompt::TokenLists(v) => v.len(),
        }
    }

    /// True when there are no prompts (never after parsing).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The prompts in order.
    pub fn items(&self) -> Vec<PromptItem<'_>> {
        match self {
            Prompt::Text(t) => vec![PromptItem::Text(t)],
            Prompt::Texts(v) => v.iter().map(|t| PromptItem::Text(t)).collect(),
            Prompt::Tokens(ids) => vec![PromptItem::Tokens(ids)],
            Prompt::TokenLists(v) => v.iter().map(|ids| PromptItem::Tokens(ids)).collect(),
            Prompt::Chat(messages) => vec![PromptItem::Chat(messages)],
        }
    }
}

/// Where a steering vector comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SteeringSource {
    /// An explicit vector (from `vector` or `vector_b64`).
    Vector(Vec<f32>),
    /// The mean residual difference of two texts at the entry's layer.
    Contrast {
        /// Text whose direction to add.
        positive: String,
        /// Text whose direction to subtract.
        negative: String,
    },
    /// A control vector the server was configured with (llama.cpp / repeng GGUF):
    /// its direction for every layer it has, or only for `layer` when given.
    ControlVector(String),
}

/// One `steering` entry: add `scale × vector` after block `layer`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Steering {
    /// The block after which the vector is added; always set but for control vectors,
    /// which carry their own layers.
    pub layer: Option<u32>,
    /// The multiplier.
    pub scale: f32,
    /// The vector, or how to compute it.
    pub source: SteeringSource,
}

/// Which positions an activation read-out keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Positions {
    /// The last prompt position only.
    Last,
    /// Every prompt position.
    All,
}

/// The `activations` field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActivationsRequest {
    /// Blocks whose output residual stream to read.
    pub layers: Vec<u32>,
    /// Which positions to keep.
    pub positions: Positions,
}

/// A parsed, shape-checked completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    /// The model id, as sent (aliases are resolved by the server).
    pub model: String,
    /// The prompts.
    pub prompt: Prompt,
    /// Most tokens per choice.
    pub max_tokens: u32,
    /// Whether `max_tokens` is chat's default rather than the client's: it then
    /// shrinks to what the context window leaves after the prompt
    /// ([`CompletionRequest::max_tokens_for`]).
    pub fit_max_tokens: bool,
    /// Choices per prompt.
    pub n: u32,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    pub top_p: f32,
    /// Keep only the k likeliest tokens; 0 keeps all.
    pub top_k: u32,
    /// Seed for reproducible sampling.
    pub seed: Option<u64>,
    /// Stop sequences (at most four, never empty strings).
    pub stop: Vec<String>,
    /// Put the prompt in front of each choice's text.
    pub echo: bool,
    /// Alternatives per token to report, if any.
    pub logprobs: Option<u8>,
    /// Penalty for tokens already present.
    pub presence_penalty: f32,
    /// Penalty per earlier occurrence.
    pub frequency_penalty: f32,
    /// Additive biases on token logits.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Stream chunks as server-sent events.
    pub stream: bool,
    /// With `stream`, end with a chunk that carries `usage`.
    pub stream_include_usage: bool,
    /// The caller's end-user id; recorded, not interpreted.
    pub user: Option<String>,
    /// Steering entries.
    pub steering: Vec<Steering>,
    /// Activation read-out.
    pub activations: Option<ActivationsRequest>,
}

const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "echo",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stream",
    "stream_options",
    "user",
    "steering",
    "activations",
];

impl CompletionRequest {
    /// Parses a body sent to `endpoint`, with the contract's errors.
    pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Self, ApiError> {
        let value = parse_json_object(body)?;
        Self::from_value(&value, endpoint)
    }

    /// Checks an already-parsed JSON object. A job's body is a chat body when it has
    /// `messages`.
    pub fn from_value(value: &Value, endpoint: Endpoint) -> Result<Self, ApiError> {
        let obj = value.as_object().ok_or_else(|| {
            ApiError::new(ErrorCode::InvalidJson, "The body must be a JSON object.")
        })?;
        if endpoint == Endpoint::ChatCompletions
            || (endpoint == Endpoint::Jobs && obj.contains_key("messages"))
        {
            return chat::parse(obj, endpoint);
        }
        reject_unknown(obj, FIELDS, "")?;
        let f = Fields { obj, prefix: "" };
        let model = parse_model(&f)?;
        let prompt = parse_prompt(obj.get("prompt"))?;
        let max_tokens = f
            .int_in("max_tokens", 0, i64::from(u32::MAX))?
            .unwrap_or(16) as u32;
        let shared = Shared::parse(&f, endpoint)?;
        let top_k = f.int_in("top_k", 0, i64::from(u32::MAX))?.unwrap_or(0) as u32;
        let echo = f.bool("echo")?.unwrap_or(false);
        let logprobs = f
            .int_in("logprobs", 0, i64::from(MAX_LOGPROBS))?
            .map(|v| v as u8);
        Ok(shared.into_request(model, prompt, max_tokens, top_k, echo, logprobs))
    }

    /// Whether this is a chat request (its answer is a chat completion).
    pub fn is_chat(&self) -> bool {
        matches!(self.prompt, Prompt::Chat(_))
    }

    /// How the request's answer is shaped.
    pub fn shape(&self) -> Shape {
        if self.is_chat() {
            Shape::Chat {
                top_logprobs: usize::from(self.logprobs.unwrap_or(0)),
            }
        } else {
            Shape::Text
        }
    }

    /// The most tokens a choice of a prompt of `prompt_len` tokens may generate on
    /// `model`: `max_tokens`, or for chat's default what the context window leaves.
    pub fn max_tokens_for(&self, model: &ModelInfo, prompt_len: usize) -> u32 {
        if self.fit_max_tokens {
            let left = u64::from(model.context_window).saturating_sub(prompt_len as u64);
            self.max_tokens.min(u32::try_from(left).unwrap_or(u32::MAX))
        } else {
            self.max_tokens
        }
    }

    /// How many choices the request makes: prompts × n.
    pub fn choice_count(&self) -> usize {
        self.prompt.len() * self.n as usize
    }

    /// The checks that need the model: vocabulary, context window, layers, widths.
    /// `prompt_lens` are the token counts of the prompts, in order.
    pub fn check_against(&self, model: &ModelInfo, prompt_lens: &[usize]) -> Result<(), ApiError> {
        let vocab = model.vocab_size;
        for (p, item) in self.prompt.items().into_iter().enumerate() {
            if let PromptItem::Tokens(ids) = item
                && let Some(bad) = ids.iter().find(|&&id| id >= vocab)
            {
                return Err(ApiError::invalid_value(
                    "prompt",
                    format!(
                        "Prompt {p} has token id {bad}, outside the vocabulary of {vocab} tokens."
                    ),
                ));
            }
        }
        for (p, &len) in prompt_lens.iter().enumerate() {
            if len == 0 {
                return Err(ApiError::invalid_value(
                    "prompt",
                    format!("Prompt {p} is empty: it has no tokens."),
                ));
            }
            let max_tokens = self.max_tokens_for(model, len);
            let need = len as u64 + u64::from(max_tokens);
            if need > u64::from(model.context_window) || (self.fit_max_tokens && max_tokens == 0) {
                let (param, what) = match self.prompt {
                    Prompt::Chat(_) => ("messages", "the rendered conversation".to_owned()),
                    _ => ("prompt", format!("prompt {p}")),
                };
                return Err(ApiError::param(
                    ErrorCode::ContextLengthExceeded,
                    param,
                    format!(
                        "This model's context window is {} tokens; {what} has {len} tokens and max_tokens is {max_tokens} ({need} in all).",
                        model.context_window
                    ),
                ));
            }
        }
        if let Some(bad) = self.logit_bias.keys().find(|&&id| id >= vocab) {
            return Err(ApiError::invalid_value(
                "logit_bias",
                format!("Token id {bad} is outside the vocabulary of {vocab} tokens."),
            ));
        }
        for (i, s) in self.steering.iter().enumerate() {
            if let Some(layer) = s.layer
                && layer >= model.n_layers
            {
                return Err(ApiError::invalid_value(
                    format!("steering[{i}].layer"),
                    format!(
                        "layer must be below the model's {} layers; got {layer}.",
                        model.n_layers
                    ),
                ));
            }
            if let SteeringSource::Vector(v) = &s.source
                && v.len() != model.d_model as usize
            {
                return Err(ApiError::invalid_value(
                    format!("steering[{i}].vector"),
                    format!(
                        "The vector must have d_model = {} values; got {}.",
                        model.d_model,
                        v.len()
                    ),
                ));
            }
        }
        if let Some(a) = &self.activations
            && let Some(bad) = a.layers.iter().find(|&&l| l >= model.n_layers)
        {
            return Err(ApiError::invalid_value(
                "activations.layers",
                format!(
                    "layer must be below the model's {} layers; got {bad}.",
                    model.n_layers
                ),
            ));
        }
        Ok(())
    }
}

/// A request's `model`: 1 to 256 characters.
fn parse_model(f: &Fields<'_>) -> Result<String, ApiError> {
    let model = f
        .string("model")?
        .ok_or_else(|| missing("model", "You must provide a model."))?;
    if model.is_empty() || model.len() > 256 {
        return Err(ApiError::invalid_value(
            "model",
            "model must be 1 to 256 characters.",
        ));
    }
    Ok(model)
}

/// The fields completions and chat bodies share, checked alike.
struct Shared {
    n: u32,
    temperature: f32,
    top_p: f32,
    seed: Option<u64>,
    stop: Vec<String>,
    presence_penalty: f32,
    frequency_penalty: f32,
    logit_bias: BTreeMap<u32, f32>,
    stream: bool,
    stream_include_usage: bool,
    user: Option<String>,
    steering: Vec<Steering>,
    activations: Option<ActivationsRequest>,
}

impl Shared {
    fn parse(f: &Fields<'_>, endpoint: Endpoint) -> Result<Shared, ApiError> {
        let obj = f.obj;
        let n = f.int_in("n", 1, i64::from(MAX_N))?.unwrap_or(1) as u32;
        let temperature = f.number_in("temperature", 0.0, 2.0)?.unwrap_or(1.0);
        let top_p = f.number_in("top_p", 0.0, 1.0)?.unwrap_or(1.0);
        if top_p == 0.0 {
            return Err(ApiError::invalid_value(
                "top_p",
                "top_p must be greater than 0 and at most 1.",
            ));
        }
        let seed = f.seed("seed")?;
        let stop = parse_stop(obj.get("stop"))?;
        let presence_penalty = f.number_in("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0);
        let frequency_penalty = f.number_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0);
        let logit_bias = parse_logit_bias(obj.get("logit_bias"))?;
        let stream = f.bool("stream")?.unwrap_or(false);
        if stream && endpoint == Endpoint::Jobs {
            return Err(ApiError::invalid_value(
                "stream",
                "A job keeps its result; it cannot stream. Send stream: false, or the body to \
                 /v1/completions or /v1/chat/completions.",
            ));
        }
        let stream_include_usage = parse_stream_options(obj.get("stream_options"))?;
        let user = f.string("user")?;
        if user.as_ref().is_some_and(|u| u.len() > 256) {
            return Err(ApiError::invalid_value(
                "user",
                "user must be at most 256 characters.",
            ));
        }
        let steering = parse_steering(obj.get("steering"))?;
        let activations = parse_activations(obj.get("activations"))?;
        if stream && activations.is_some() {
            return Err(ApiError::invalid_value(
                "activations",
                "Activations come with the whole answer, not in a stream: send stream: false.",
            ));
        }
        Ok(Shared {
            n,
            temperature,
            top_p,
            seed,
            stop,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            stream,
            stream_include_usage,
            user,
            steering,
            activations,
        })
    }

    /// The request, with the fields its kind adds.
    fn into_request(
        self,
        model: String,
        prompt: Prompt,
        max_tokens: u32,
        top_k: u32,
        echo: bool,
        logprobs: Option<u8>,
    ) -> CompletionRequest {
        CompletionRequest {
            model,
            prompt,
            max_tokens,
            fit_max_tokens: false,
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k,
            seed: self.seed,
            stop: self.stop,
            echo,
            logprobs,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias,
            stream: self.stream,
            stream_include_usage: self.stream_include_usage,
            user: self.user,
            steering: self.steering,
            activations: self.activations,
        }
    }
}

/// The tokens a request holds while it runs: its prompts' tokens plus
/// `prompts × n × max_tokens`.
pub fn hold_tokens(prompt_lens: &[usize], n: u32, max_tokens: u32) -> u64 {
    let prompt: u64 = prompt_lens.iter().map(|&l| l as u64).sum();
    let completions = (prompt_lens.len() as u64)
        .saturating_mul(u64::from(n))
        .saturating_mul(u64::from(max_tokens));
    prompt.saturating_add(completions)
}

/// Choice `i` of prompt `p` has index `p * n + i`.
pub fn choice_index(prompt: usize, choice: usize, n: u32) -> u32 {
    (prompt * n as usize + choice) as u32
}

fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|u| u32::try_from(u).ok())
}

fn parse_prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    const SHAPES: &str =
        "a string, an array of strings, an array of token ids, or an array of arrays of token ids";
    let v = match v {
        None | Some(Value::Null) => return Err(missing("prompt", "You must provide a prompt.")),
        Some(v) => v,
    };
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(ApiError::invalid_value(
                    "prompt",
                    "The prompt list is empty.",
                ));
            }
            if items.len() > MAX_PROMPTS && !items[0].is_number() {
                return Err(ApiError::invalid_value(
                    "prompt",
                    format!(
                        "At most {MAX_PROMPTS} prompts per request; got {}.",
                        items.len()
                    ),
                ));
            }
            match &items[0] {
                Value::String(_) => items
                    .iter()
                    .map(|x| x.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .map(Prompt::Texts)
                    .ok_or_else(|| wrong_type("prompt", SHAPES)),
                Value::Number(_) => ids_of(items, "prompt").map(Prompt::Tokens),
                Value::Array(_) => {
                    let mut lists = Vec::with_capacity(items.len());
                    for (p, item) in items.iter().enumerate() {
                        let ids = item
                            .as_array()
                            .ok_or_else(|| wrong_type("prompt", SHAPES))?;
                        if ids.is_empty() {
                            return Err(ApiError::invalid_value(
                                "prompt",
                                format!("Prompt {p} is an empty list of token ids."),
                            ));
                        }
                        lists.push(ids_of(ids, "prompt")?);
                    }
                    Ok(Prompt::TokenLists(lists))
                }
                _ => Err(wrong_type("prompt", SHAPES)),
            }
        }
        _ => Err(wrong_type("prompt", SHAPES)),
    }
}

fn ids_of(items: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|x| match x {
            Value::Number(_) => token_id(x).ok_or_else(|| {
                ApiError::invalid_value(
                    param,
                    format!("Token ids are integers from 0 to 4294967295; got {x}."),
                )
            }),
            _ => Err(wrong_type(param, "an array of token ids (integers)")),
        })
        .collect()
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOP {
                return Err(ApiError::invalid_value(
                    "stop",
                    format!("At most {MAX_STOP} stop sequences; got {}.", a.len()),
                ));
            }
            a.iter()
                .map(|x| x.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| wrong_type("stop", "a string or an array of strings"))?
        }
        Some(_) => return Err(wrong_type("stop", "a string or an array of strings")),
    };
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid_value(
            "stop",
            "Stop sequences must not be empty.",
        ));
    }
    if let Some(long) = list.iter().find(|s| s.chars().count() > MAX_STOP_CHARS) {
        return Err(ApiError::invalid_value(
            "stop",
            format!(
                "A stop sequence is at most {MAX_STOP_CHARS} characters; one has {}.",
                long.chars().count()
            ),
        ));
    }
    Ok(list)
}

fn parse_logit_bias(v: Option<&Value>) -> Result<BTreeMap<u32, f32>, ApiError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(wrong_type(
                "logit_bias",
                "an object from token ids to numbers",
            ));
        }
    };
    if obj.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid_value(
            "logit_bias",
            format!("At most {MAX_LOGIT_BIAS} entries; got {}.", obj.len()),
        ));
    }
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        let id: u32 = k.parse().map_err(|_| {
            ApiError::invalid_value(
                "logit_bias",
                format!("Keys are token ids; {k:?} is not one."),
            )
        })?;
        let bias = v
            .as_f64()
            .ok_or_else(|| wrong_type("logit_bias", "an object from token ids to numbers"))?;
        if !(-100.0..=100.0).contains(&bias) {
            return Err(ApiError::invalid_value(
                "logit_bias",
                format!("Biases are from -100 to 100; token {id} has {v}."),
            ));
        }
        out.insert(id, bias as f32);
    }
    Ok(out)
}

fn parse_stream_options(v: Option<&Value>) -> Result<bool, ApiError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong_type("stream_options", "an object")),
    };
    reject_unknown(obj, &["include_usage"], "stream_options.")?;
    let f = Fields {
        obj,
        prefix: "stream_options.",
    };
    Ok(f.bool("include_usage")?.unwrap_or(false))
}

fn parse_steering(v: Option<&Value>) -> Result<Vec<Steering>, ApiError> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong_type("steering", "an array of steering entries")),
    };
    if items.len() > MAX_STEERING {
        return Err(ApiError::invalid_value(
            "steering",
            format!(
                "At most {MAX_STEERING} steering entries; got {}.",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_steering_entry(i, item))
        .collect()
}

fn parse_steering_entry(i: usize, item: &Value) -> Result<Steering, ApiError> {
    let prefix = format!("steering[{i}].");
    let obj = item
        .as_object()
        .ok_or_else(|| wrong_type(&format!("steering[{i}]"), "an object"))?;
    reject_unknown(
        obj,
        &[
            "layer",
            "scale",
            "vector",
            "vector_b64",
            "positive",
            "negative",
            "control_vector",
        ],
        &prefix,
    )?;
    let f = Fields {
        obj,
        prefix: &prefix,
    };
    let layer = f.int_in("layer", 0, i64::from(u32::MAX))?.map(|l| l as u32);
    let scale = f
        .number_in("scale", -MAX_STEERING_SCALE, MAX_STEERING_SCALE)?
        .unwrap_or(1.0);
    let has = |k: &str| f.get(k).is_some();
    let source = match (
        has("vector"),
        has("vector_b64"),
        has("positive") || has("negative"),
        has("control_vector"),
    ) {
        (true, false, false, false) => SteeringSource::Vector(parse_vector(&f)?),
        (false, true, false, false) => SteeringSource::Vector(parse_vector_b64(&f)?),
        (false, false, false, true) => {
            let name = f.string("control_vector")?.unwrap_or_default();
            if name.is_empty() || name.len() > 256 {
                return Err(ApiError::invalid_value(
                    format!("{prefix}control_vector"),
                    "control_vector names one of the server's control vectors.",
                ));
            }
            SteeringSource::ControlVector(name)
        }
        (false, false, true, false) => {
            let positive = f.string("positive")?.ok_or_else(|| {
                missing(&f.param("positive"), "A contrast pair needs positive text.")
            })?;
            let negative = f.string("negative")?.ok_or_else(|| {
                missing(&f.param("negative"), "A contrast pair needs negative text.")
            })?;
            if positive.is_empty() || negative.is_empty() {
                return Err(ApiError::invalid_value(
                    format!("{prefix}positive"),
                    "Contrast texts must not be empty.",
                ));
            }
            SteeringSource::Contrast { positive, negative }
        }
        _ => {
            return Err(ApiError::invalid_value(
                format!("steering[{i}]"),
                "Give exactly one of vector, vector_b64, control_vector, or positive with negative.",
            ));
        }
    };
    if layer.is_none() && !matches!(source, SteeringSource::ControlVector(_)) {
        return Err(missing(
            &f.param("layer"),
            "This steering entry needs a layer.",
        ));
    }
    Ok(Steering {
        layer,
        scale,
        source,
    })
}

fn check_vector(param: &str, v: Vec<f32>) -> Result<Vec<f32>, ApiError> {
    if v.is_empty() || v.len() > MAX_VECTOR_LEN {
        return Err(ApiError::invalid_value(
            param,
            format!(
                "A vector has 1 to {MAX_VECTOR_LEN} values; got {}.",
                v.len()
            ),
        ));
    }
    if !v.iter().all(|&x| steering_value_in_range(x)) {
        return Err(ApiError::invalid_value(
            param,
            format!("Vector values must be finite numbers within ±{MAX_STEERING_VALUE:e}."),
        ));
    }
    Ok(v)
}

fn parse_vector(f: &Fields<'_>) -> Result<Vec<f32>, ApiError> {
    let param = f.param("vector");
    let items = f
        .get("vector")
        .and_then(Value::as_array)
        .ok_or_else(|| wrong_type(&param, "an array of numbers"))?;
    let v = items
        .iter()
        .map(|x| x.as_f64().map(|x| x as f32))
        .collect::<Option<Vec<f32>>>()
        .ok_or_else(|| wrong_type(&param, "an array of numbers"))?;
    check_vector(&param, v)
}

fn parse_vector_b64(f: &Fields<'_>) -> Result<Vec<f32>, ApiError> {
    let param = f.param("vector_b64");
    let text = f
        .string("vector_b64")?
        .ok_or_else(|| wrong_type(&param, "a base64 string"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map_err(|e| ApiError::invalid_value(param.clone(), format!("Not base64: {e}.")))?;
    if bytes.len() % 4 != 0 {
        return Err(ApiError::invalid_value(
            param,
            "vector_b64 must hold little-endian f32 values (a multiple of 4 bytes).",
        ));
    }
    let v = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    check_vector(&param, v)
}

fn parse_activations(v: Option<&Value>) -> Result<Option<ActivationsRequest>, ApiError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong_type("activations", "an object")),
    };
    reject_unknown(obj, &["layers", "positions"], "activations.")?;
    let layers = match obj.get("layers") {
        None | Some(Value::Null) => {
            return Err(missing("activations.layers", "Name the layers to read."));
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(wrong_type(
                "activations.layers",
                "an array of layer numbers",
            ));
        }
    };
    if layers.is_empty() || layers.len() > MAX_ACTIVATION_LAYERS {
        return Err(ApiError::invalid_value(
            "activations.layers",
            format!(
                "Name 1 to {MAX_ACTIVATION_LAYERS} layers; got {}.",
                layers.len()
            ),
        ));
    }
    let layers = layers
        .iter()
        .map(|l| {
            l.as_u64()
                .and_then(|u| u32::try_from(u).ok())
                .ok_or_else(|| wrong_type("activations.layers", "an array of layer numbers"))
        })
        .collect::<Result<Vec<u32>, _>>()?;
    if let Some(l) = layers
        .iter()
        .enumerate()
        .find_map(|(i, l)| layers[..i].contains(l).then_some(l))
    {
        return Err(ApiError::invalid_value(
            "activations.layers",
            format!("Name each layer once; {l} is there twice."),
        ));
    }
    let positions = match obj.get("positions") {
        None | Some(Value::Null) => Positions::Last,
        Some(Value::String(s)) if s == "last" => Positions::Last,
        Some(Value::String(s)) if s == "all" => Positions::All,
        Some(Value::String(s)) => {
            return Err(ApiError::invalid_value(
                "activations.positions",
                format!("positions is \"last\" or \"all\"; got {s:?}."),
            ));
        }
        Some(_) => return Err(wrong_type("activations.positions", "\"last\" or \"all\"")),
    };
    Ok(Some(ActivationsRequest { layers, positions }))
}
