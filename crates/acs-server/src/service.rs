//! What the HTTP handlers and the job dispatcher share: the store, the served models
//! with their engines, and the jobs that run. Nothing here knows HTTP, so the
//! dispatcher runs requests without it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use acs_core::{ApiError, ErrorCode, JobId, ModelInfo, Timestamp};
use acs_engine::control::ControlVectors;
use acs_engine::{Engine, Ticket};
use tokio::sync::Notify;

use crate::clock;
use crate::db::Db;

/// The tutorial's model id, served as an alias of the first model.
pub const TUTORIAL_ALIAS: &str = "llama-8b";

/// One served model: its id, its engine, and the control vectors that fit it.
#[derive(Debug)]
pub struct ServedModel {
    /// The id requests name.
    pub id: String,
    /// Other ids that name it (the first model's is [`TUTORIAL_ALIAS`]).
    pub aliases: Vec<String>,
    /// Its GGUF file.
    pub path: PathBuf,
    /// The engine thread that runs it.
    pub engine: Engine,
    /// Control vectors requests may name on it.
    pub controls: Arc<ControlVectors>,
}

impl ServedModel {
    /// Whether `id` names this model.
    pub fn is_named(&self, id: &str) -> bool {
        self.id == id || self.aliases.iter().any(|a| a == id)
    }
}

/// How the server and its jobs were configured.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long job results and idempotency keys are kept.
    pub retention_ms: i64,
    /// Whether all keys share prefills and kept prompts (`--share-prompt-cache`); by
    /// default each key shares only its own.
    pub share_prompt_cache: bool,
    /// Most jobs one key may have queued (`--max-queued-jobs`).
    pub max_queued_jobs: u64,
}

/// The server's shared parts; cloning shares them.
#[derive(Clone)]
pub struct Service {
    /// The store.
    pub db: Db,
    /// The served models, the first the default (never empty).
    pub models: Arc<Vec<ServedModel>>,
    /// Configuration.
    pub config: Arc<Config>,
    /// Tickets of running jobs, so that a cancel reaches the engine at once.
    pub running_jobs: Arc<Mutex<HashMap<JobId, Ticket>>>,
    /// Wakes the job dispatcher when work may have become possible.
    pub wake: Arc<Notify>,
    /// When the process started (the `created` of models).
    pub started: i64,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Now.
    pub fn now(&self) -> Timestamp {
        clock::now()
    }

    /// The engine's sharing scope ([`acs_engine::Generation::scope`]) of a request
    /// made for `who` (a key's id, or what an edge names): `who`'s own, unless the
    /// operator shares the prompt cache among all.
    pub fn scope(&self, who: &str) -> String {
        if self.config.share_prompt_cache {
            String::new()
        } else {
            who.to_owned()
        }
    }

    /// The model facts of `served` under `id`.
    pub fn model_info(&self, served: &ServedModel, id: &str) -> ModelInfo {
        acs_engine::generation::model_info(served.engine.model(), id, self.started)
    }

    /// The served model a request's `model` names.
    pub fn served(&self, id: &str) -> Result<&ServedModel, ApiError> {
        self.models.iter().find(|m| m.is_named(id)).ok_or_else(|| {
            let ids: Vec<&str> = self
                .models
                .iter()
                .flat_map(|m| {
                    std::iter::once(m.id.as_str()).chain(m.aliases.iter().map(String::as_str))
                })
                .collect();
            ApiError::param(
                ErrorCode::ModelNotFound,
                "model",
                format!("The model {id:?} does not exist. This server serves {ids:?}."),
            )
        })
    }
}
