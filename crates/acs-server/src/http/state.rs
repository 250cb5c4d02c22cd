//! What every handler shares: the [`Service`], and how the HTTP face was configured.

use std::path::PathBuf;
use std::sync::Arc;

use crate::service::Service;

/// How the HTTP face was configured.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Longest a request's body may take to arrive, from its handler's first read.
    pub body_timeout: std::time::Duration,
    /// The secret of a trusted edge, which may call the `/edge` routes.
    pub edge_secret: Option<String>,
    /// The served model's GGUF file, offered at `/model.gguf` (when the operator asks)
    /// so that the playground can run the same model in the visitor's browser; a split
    /// model's files (`NAME-00001-of-0000N.gguf`, ...), offered at
    /// `/model-00001-of-0000N.gguf` and so on; empty when not offered.
    pub model_files: Vec<PathBuf>,
}

/// The state of the router.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The store, the engine and the served model.
    pub service: Service,
    /// Configuration of the HTTP face.
    pub config: Arc<Config>,
    /// Requests answered, for `/metrics`.
    pub metrics: Arc<super::Metrics>,
}
