//! What the HTTP handlers and the job dispatcher share: the store, the engine, the
//! served model and the jobs that run. Nothing here knows HTTP, so the dispatcher
//! runs requests without it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use acs_core::{ApiError, ErrorCode, JobId, ModelInfo, Timestamp};
use acs_engine::control::ControlVectors;
use acs_engine::{Engine, Ticket};
use tokio::sync::Notify;

use crate::clock;
use crate::db::Db;

/// The tutorial's model id, served as an alias of the default model.
pub const TUTORIAL_ALIAS: &str = "llama-8b";

/// How the served model and its jobs were configured.
#[derive(Debug, Clone)]
pub struct Config {
    /// The model id requests name.
    pub model_id: String,
    /// Other ids that name the same model.
    pub aliases: Vec<String>,
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
    /// The engine thread.
    pub engine: Engine,
    /// Control vectors requests may name.
    pub controls: Arc<ControlVectors>,
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

    /// The model facts under `id`.
    pub fn model_info(&self, id: &str) -> ModelInfo {
        acs_engine::generation::model_info(self.engine.model(), id, self.started)
    }

    /// Checks the request's `model` names the served model.
    pub fn check_model(&self, id: &str) -> Result<ModelInfo, ApiError> {
        if id == self.config.model_id || self.config.aliases.iter().any(|a| a == id) {
            Ok(self.model_info(id))
        } else {
            Err(ApiError::param(
                ErrorCode::ModelNotFound,
                "model",
                format!(
                    "The model {id:?} does not exist. This server serves {:?} (also as {:?}).",
                    self.config.model_id, self.config.aliases
                ),
            ))
        }
    }
}
