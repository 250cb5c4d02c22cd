//! The router of the whole API: its routes, the answers to routes and methods it does
//! not have, CORS, request ids, and the playground's static files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acs_core::ids::request_id;
use acs_core::{ApiError, ErrorCode};
use acs_llama::gguf::part_name;
use axum::Router;
use axum::extract::Request;
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{Redirect, Response};
use axum::routing::{any, get, post};
use tower_http::cors::{AllowHeaders, Any, CorsLayer};
use tower_http::services::{ServeDir, ServeFile};

use super::auth::Caller;
use super::error::{Failure, log_internal};
use super::response::set_header;
use super::state::AppState;
use super::{budget, completions, edge, jobs, meta, metrics, models};
use crate::random::random;

async fn unknown_route(method: Method, uri: Uri) -> Failure {
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

/// Gives every response an `x-request-id` (handlers of jobs and completions set
/// their own) and logs one line per request under it: method, path, status, the
/// calling key's id and the time to the response's head.
async fn request_ids(mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let caller = Caller::default();
    req.extensions_mut().insert(caller.clone());
    let mut resp = next.run(req).await;
    if !resp.headers().contains_key("x-request-id") {
        set_header(resp.headers_mut(), "x-request-id", &request_id(random()));
    }
    let id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    tracing::info!(
        target: "acs::access",
        request_id = id,
        %method,
        path,
        status = resp.status().as_u16(),
        key = caller.get().unwrap_or("-"),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "request"
    );
    resp
}

/// Makes the playground's pages cross-origin isolated (COOP `same-origin`, COEP
/// `require-corp`): browsers lend shared memory (`SharedArrayBuffer`, wasm threads)
/// only to such pages, and the in-browser engine's CPU backend runs its threads on it.
async fn isolated(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    set_header(h, "cross-origin-opener-policy", "same-origin");
    set_header(h, "cross-origin-embedder-policy", "require-corp");
    resp
}

/// The router of the whole API, plus the playground at `/` when `web` is given.
pub fn router(state: AppState, web: Option<PathBuf>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models::list).fallback(method_not_allowed))
        .route("/v1/budget", get(budget::get).fallback(method_not_allowed))
        .route(
            "/v1/chat/completions",
            post(completions::create_chat).fallback(method_not_allowed),
        )
        .route(
            "/v1/completions",
            post(completions::create).fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs",
            post(jobs::submit)
                .get(jobs::list)
                .fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs/{id}",
            get(jobs::get).fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs/{id}/result",
            get(jobs::result).fallback(method_not_allowed),
        )
        .route(
            "/v1/completion-jobs/{id}/cancel",
            post(jobs::cancel).fallback(method_not_allowed),
        )
        .route(
            "/edge/v1/prepare",
            post(edge::prepare).fallback(method_not_allowed),
        )
        .route("/edge/v1/run", post(edge::run).fallback(method_not_allowed))
        .route("/health", get(meta::health))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(meta::openapi))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state.metrics),
            metrics::count,
        ));
    let api = match state.config.model_files.as_slice() {
        [] => api,
        [file] => api.route_service("/model.gguf", ServeFile::new(file)),
        // A split model's files under their own names, and `/model.gguf` sends the
        // playground to the first, whose name brings the others.
        files => {
            let count = files.len() as u16;
            let first = format!("/{}", part_name("model", 0, count));
            let mut api = api.route(
                "/model.gguf",
                get(move || async move { Redirect::temporary(&first) }),
            );
            for (no, file) in (0u16..).zip(files) {
                let at = format!("/{}", part_name("model", no, count));
                api = api.route_service(&at, ServeFile::new(file));
            }
            api
        }
    };
    let api = api.with_state(state);
    let app = match web {
        Some(dir) => api.fallback_service(
            Router::new()
                .fallback_service(
                    ServeDir::new(dir)
                        .call_fallback_on_method_not_allowed(true)
                        .fallback(any(unknown_route)),
                )
                .layer(middleware::from_fn(isolated)),
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
    // Request ids outside CORS, so that preflight answers carry one too.
    app.layer(cors)
        .layer(middleware::from_fn(request_ids))
        .layer(middleware::from_fn(log_internal))
}
