//! The routes a trusted edge (the Cloudflare Worker in `worker/`) calls. The edge keeps
//! keys, Budgets, Holds and jobs itself; here it only needs the model: how many tokens
//! a request would hold, and the run, streamed with its running usage.
//!
//! Both routes exist only with `acs serve --edge-secret`, and take the request only
//! from the edge ([`EdgeCaller`]). `x-acs-endpoint: jobs` validates a body by the
//! rules of `/v1/completion-jobs` (activations allowed, no streaming), `chat` by those
//! of `/v1/chat/completions` (its stream and result are then chat's);
//! `x-acs-cache-scope` names the edge's key, whose requests alone share their prompts.
//! Both answers carry [`LOAD_HEADER`], this server's load over every caller, so that
//! each of the edge's objects, which counts only its own key's runs, picks upstreams
//! by the load of all keys.

use acs_core::CompletionRequest;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

use super::auth::EdgeCaller;
use super::body::LimitedBody;
use super::error::Failure;
use super::response::json_response;
use super::sse::{Audience, sse};
use super::state::AppState;
use crate::run::{self, Payer};

/// The header with the requests running and waiting in this server's engines after
/// their last steps, for every caller together.
pub const LOAD_HEADER: &str = "x-acs-load";

/// `resp` with this server's load ([`LOAD_HEADER`]).
fn with_load(state: &AppState, mut resp: Response) -> Response {
    let load: u64 = state
        .service
        .models
        .iter()
        .map(|m| {
            let s = m.engine.stats();
            s.running + s.waiting
        })
        .sum();
    resp.headers_mut()
        .insert(LOAD_HEADER, HeaderValue::from(load));
    resp
}

/// The request, parsed by the rules of the endpoint the edge names.
fn parse(
    edge: Result<EdgeCaller, Failure>,
    body: Result<LimitedBody, Failure>,
) -> Result<(CompletionRequest, Option<String>), Failure> {
    let (EdgeCaller { endpoint, scope }, LimitedBody(bytes)) = (edge?, body?);
    Ok((CompletionRequest::parse(&bytes, endpoint)?, scope))
}

/// `POST /edge/v1/prepare`: validates the request against the model and answers
/// `{"hold_tokens": N}`, the Hold the edge must take before it runs it.
pub async fn prepare(
    State(state): State<AppState>,
    edge: Result<EdgeCaller, Failure>,
    body: Result<LimitedBody, Failure>,
) -> Result<Response, Failure> {
    let (req, _) = parse(edge, body)?;
    let g = run::prepare(&state.service, req).await?;
    let resp = json_response(
        StatusCode::OK,
        &serde_json::json!({ "hold_tokens": run::hold(&g) }),
    );
    Ok(with_load(&state, resp))
}

/// `POST /edge/v1/run`: runs the request without a Budget of its own and streams
/// it to the edge ([`Audience::Edge`]). A closed connection cancels the run.
pub async fn run(
    State(state): State<AppState>,
    edge: Result<EdgeCaller, Failure>,
    body: Result<LimitedBody, Failure>,
) -> Result<Response, Failure> {
    let (req, scope) = parse(edge, body)?;
    let model = req.model.clone();
    let audience = Audience::Edge {
        chunks: req.stream,
        include_usage: req.stream_include_usage,
    };
    let mut g = run::prepare(&state.service, req).await?;
    // The edge's key (SCOPE_HEADER), or, from an edge that names none, no sharing.
    let who = scope.unwrap_or_else(|| acs_core::ids::request_id(crate::random::random()));
    g.scope = state.service.scope(&format!("edge:{who}"));
    let admitted = run::admit_and_run(&state.service, Payer::Edge, &model, g).await?;
    Ok(with_load(&state, sse(admitted, model, audience)))
}
