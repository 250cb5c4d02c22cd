//! The routes a trusted edge (the Cloudflare Worker in `worker/`) calls. The edge keeps
//! keys, Budgets, Holds and jobs itself; here it only needs the model: how many tokens
//! a request would hold, and the run, streamed with its running usage.
//!
//! Both routes exist only with `acs serve --edge-secret`, and take the request only
//! with `x-acs-edge-secret` set to it. `x-acs-endpoint: jobs` validates a body by the
//! rules of `/v1/completion-jobs` (activations allowed, no streaming).

use acs_core::ids::KeyHash;
use acs_core::request::hold_tokens;
use acs_core::{ApiError, CompletionRequest, Endpoint, ErrorCode};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use crate::app::{AppState, Failure, json_response, read_body};
use crate::completions::{Audience, Payer, admit_and_run, prepare_request, sse};

/// The header that carries the shared secret.
pub const SECRET_HEADER: &str = "x-acs-edge-secret";
/// The header that names the endpoint whose rules apply.
pub const ENDPOINT_HEADER: &str = "x-acs-endpoint";

/// Checks the caller is the configured edge, and reads the endpoint it asks for.
fn check(state: &AppState, headers: &HeaderMap) -> Result<Endpoint, ApiError> {
    let Some(secret) = &state.config.edge_secret else {
        return Err(ApiError::new(
            ErrorCode::UnknownRoute,
            "No edge routes: this server was started without --edge-secret.",
        ));
    };
    let given = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // Compared as digests, so that the comparison's time says nothing of the secret.
    if KeyHash::of(given) != KeyHash::of(secret) {
        return Err(ApiError::new(
            ErrorCode::InvalidApiKey,
            "Missing or wrong x-acs-edge-secret.",
        ));
    }
    match headers.get(ENDPOINT_HEADER).and_then(|v| v.to_str().ok()) {
        None | Some("completions") => Ok(Endpoint::Completions),
        Some("jobs") => Ok(Endpoint::Jobs),
        Some(other) => Err(ApiError::param(
            ErrorCode::InvalidValue,
            ENDPOINT_HEADER,
            format!("{ENDPOINT_HEADER} is completions or jobs, not {other:?}."),
        )),
    }
}

async fn parse(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<CompletionRequest, ApiError> {
    // The body is read whatever the check says (see `completions::create`).
    let endpoint = check(state, headers);
    let bytes = read_body(state, body).await;
    let (endpoint, bytes) = (endpoint?, bytes?);
    CompletionRequest::parse(&bytes, endpoint)
}

/// `POST /edge/v1/prepare`: validates the request against the model and answers
/// `{"hold_tokens": N}`, the Hold the edge must take before it runs it.
pub async fn prepare(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let req = parse(&state, &headers, body).await?;
    let g = prepare_request(&state, req).await?;
    let hold = hold_tokens(&g.prompt_lens(), g.n as u32, g.max_tokens as u32);
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "hold_tokens": hold }),
    ))
}

/// `POST /edge/v1/run`: runs the request without a Budget of its own and streams
/// it to the edge ([`Audience::Edge`]). A closed connection cancels the run.
pub async fn run(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let req = parse(&state, &headers, body).await?;
    let model = req.model.clone();
    let audience = Audience::Edge {
        chunks: req.stream,
        include_usage: req.stream_include_usage,
    };
    let g = prepare_request(&state, req).await?;
    let admitted = admit_and_run(&state, Payer::Edge, g)?;
    Ok(sse(admitted, model, audience))
}
