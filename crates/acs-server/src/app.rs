//! The HTTP face: routes, shared state, authentication, errors as responses, and the
//! headers every response carries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acs_core::ids::{KeyHash, request_id};
use acs_core::response::{BudgetView, List};
use acs_core::{ApiError, ApiKey, Clock, ErrorCode, JobId, ModelInfo, Timestamp, jobs, ledger};
use acs_engine::control::ControlVectors;
use acs_engine::{Engine, Ticket};
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use tokio::sync::Notify;
use tower_http::cors::{AllowHeaders, Any, CorsLayer};
use tower_http::services::{ServeDir, ServeFile};

use crate::cli::random;
use crate::db::Db;
use crate::{completions, edge, jobs_http};

/// The tutorial's model id, served as an alias of the default model.
pub const TUTORIAL_ALIAS: &str = "llama-8b";

/// How the server was configured.
#[derive(Debug, Clone)]
pub struct Config {
    /// The model id requests name.
    pub model_id: String,
    /// Other ids that name the same model.
    pub aliases: Vec<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// How long job results and idempotency keys are kept.
    pub retention_ms: i64,
    /// The secret of a trusted edge, which may call the `/edge` routes.
    pub edge_secret: Option<String>,
    /// The served GGUF file, offered at `/model.gguf` so that the playground can run
    /// the same model in the visitor's browser.
    pub model_file: Option<std::path::PathBuf>,
}

/// A real clock.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
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

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// Now.
    pub fn now(&self) -> Timestamp {
        SystemClock.now()
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

/// An error answered in the contract's shape.
#[derive(Debug)]
pub struct Failure(pub ApiError);

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let e = self.0;
        if e.code == ErrorCode::Internal {
            tracing::error!(message = %e.message, "internal error");
        }
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            e.to_json(),
        )
            .into_response();
        if let Some(s) = e.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// A JSON response with a status.
pub fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let text = serde_json::to_string(body).expect("responses serialise");
    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// Sets a header from a string known to be a valid header value.
pub fn set_header(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

/// The traffic headers of a key's responses.
pub fn budget_headers(h: &mut HeaderMap, v: &BudgetView) {
    for (name, value) in v.headers() {
        set_header(h, name, &value);
    }
}

/// `resp` with the traffic headers of key `key_id`, which every answer to a key
/// carries (refusals too: they tell the client where its key stands).
pub fn with_budget(state: &AppState, key_id: &str, mut resp: Response) -> Response {
    if let Ok(v) = state.db.tx(|s| ledger::view(s, key_id)) {
        budget_headers(resp.headers_mut(), &v);
    }
    resp
}

/// The key of `Authorization: Bearer <key>`, or 401.
pub fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<ApiKey, ApiError> {
    let unauthorized = |m: &str| ApiError::new(ErrorCode::InvalidApiKey, m);
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        unauthorized("Missing Authorization header: send Authorization: Bearer <key>.")
    })?;
    let text = value
        .to_str()
        .map_err(|_| unauthorized("The Authorization header is not text."))?;
    let secret = acs_core::ids::bearer_secret(text)
        .ok_or_else(|| unauthorized("The Authorization header must be Bearer <key>."))?;
    let hash = KeyHash::of(secret);
    let key = state
        .db
        .tx(|s| Ok(acs_core::Store::key_by_hash(s, &hash)?))?;
    match key {
        Some(k) if !k.revoked => Ok(k),
        Some(_) => Err(unauthorized("This API key was revoked.")),
        None => Err(unauthorized("Incorrect API key provided.")),
    }
}

/// A job id from the path; anything that is not one (not even UTF-8) is 404.
pub fn job_id(path: Result<Path<String>, PathRejection>) -> Result<JobId, ApiError> {
    match path {
        Ok(Path(id)) => jobs::parse_id(&id),
        Err(_) => Err(ApiError::new(ErrorCode::NotFound, "No job with that id.")),
    }
}

/// Reads a request body up to the size limit: 413 past it, 400 when it ends before
/// its `Content-Length` (the client sent part of it and stopped).
pub async fn read_body(state: &AppState, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = source {
            if s.is::<http_body_util::LengthLimitError>() {
                return ApiError::new(
                    ErrorCode::RequestTooLarge,
                    format!("The request body is over the limit of {limit} bytes."),
                );
            }
            source = s.source();
        }
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("The request body could not be read whole ({e}); send it again."),
        )
    })
}

async fn models(State(state): State<AppState>) -> Response {
    let mut data = vec![state.model_info(&state.config.model_id)];
    data.extend(state.config.aliases.iter().map(|a| state.model_info(a)));
    json_response(
        StatusCode::OK,
        &List {
            object: "list".into(),
            data,
            first_id: None,
            last_id: None,
            has_more: false,
        },
    )
}

async fn budget(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, Failure> {
    let key = authenticate(&state, &headers)?;
    let view = state.db.tx(|s| ledger::view(s, &key.id))?;
    let mut resp = json_response(StatusCode::OK, &view);
    budget_headers(resp.headers_mut(), &view);
    Ok(resp)
}

async fn health() -> &'static str {
    "ok"
}

/// The OpenAPI document of the contract, as this server implements it.
async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../openapi.json"),
    )
        .into_response()
}

async fn unknown_route(method: Method, uri: axum::http::Uri) -> Failure {
    Failure(ApiError::new(
        ErrorCode::UnknownRoute,
        format!("No route {method} {}.", uri.path()),
    ))
}

async fn method_not_allowed() -> Failure {
    Failure(ApiError::new(
        ErrorCode::MethodNotAllowed,
        "This route does not take that method.",
    ))
}

/// Gives every response an `x-request-id` (handlers of jobs set their own).
async fn request_ids(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if !resp.headers().contains_key("x-request-id") {
        set_header(resp.headers_mut(), "x-request-id", &request_id(random()));
    }
    resp
}

/// The router of the whole API, plus the playground at `/` when `web` is given.
pub fn router(state: AppState, web: Option<std::path::PathBuf>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models).fallback(method_not_allowed))
        .route("/v1/budget", get(budget).fallback(method_not_allowed))
        .route(
            "/v1/completions",
            post(completions::create).fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs",
            post(jobs_http::submit)
                .get(jobs_http::list)
                .fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs/{id}",
            get(jobs_http::get).fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs/{id}/result",
            get(jobs_http::result).fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs/{id}/cancel",
            post(jobs_http::cancel).fallback(method_not_allowed),
        )
        .route(
            "/edge/v1/prepare",
            post(edge::prepare).fallback(method_not_allowed),
        )
        .route("/edge/v1/run", post(edge::run).fallback(method_not_allowed))
        .route("/health", get(health))
        .route("/openapi.json", get(openapi));
    let api = match &state.config.model_file {
        Some(file) => api.route_service("/model.gguf", ServeFile::new(file)),
        None => api,
    };
    let api = api.with_state(state);
    let app = match web {
        Some(dir) => api.fallback_service(
            ServeDir::new(dir)
                .call_fallback_on_method_not_allowed(true)
                .fallback(any(unknown_route)),
        ),
        None => api.fallback(unknown_route),
    };
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        // Browsers never let `*` cover Authorization: name what was asked for.
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers(Any)
        .max_age(Duration::from_secs(3600));
    // Request ids outermost, so that CORS preflight answers carry one too.
    app.layer(cors).layer(middleware::from_fn(request_ids))
}
