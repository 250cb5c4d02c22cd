//! Who is calling, established once for every handler: [`Authenticated`] for a key's
//! routes, [`EdgeCaller`] for the routes of a trusted edge.
//!
//! A handler that reads a body takes these as `Result<_, Failure>` and reads the body
//! whatever they say: answering before the body is read makes hyper close the
//! connection, which a client reusing it sees as a dropped request.

use std::sync::{Arc, OnceLock};

use acs_core::ids::KeyHash;
use acs_core::{ApiError, ApiKey, Endpoint, ErrorCode};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::error::Failure;
use super::state::AppState;

/// The header that carries the edge's shared secret.
pub const SECRET_HEADER: &str = "x-acs-edge-secret";
/// The header that names the endpoint whose rules apply to an edge's request.
pub const ENDPOINT_HEADER: &str = "x-acs-endpoint";
/// The header that names whose request an edge sends (its key): requests of one
/// scope share prompts (see [`acs_engine::Generation::scope`]).
pub const SCOPE_HEADER: &str = "x-acs-cache-scope";

/// The key of `Authorization: Bearer <key>`; 401 without a valid one.
#[derive(Debug)]
pub struct Authenticated(pub ApiKey);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Failure> {
        let key = authenticate(state, &parts.headers)?;
        if let Some(caller) = parts.extensions.get::<Caller>() {
            caller.set(&key.id);
        }
        Ok(Authenticated(key))
    }
}

/// Where authentication leaves the calling key's id for the request's log line
/// (the router's middleware puts one into each request and reads it after).
#[derive(Debug, Clone, Default)]
pub struct Caller(Arc<OnceLock<String>>);

impl Caller {
    fn set(&self, key_id: &str) {
        let _ = self.0.set(key_id.to_owned());
    }

    /// The key's id, once a handler has authenticated one.
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<ApiKey, ApiError> {
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
        .service
        .db
        .tx(|s| Ok(acs_core::Store::key_by_hash(s, &hash)?))?;
    match key {
        Some(k) if !k.revoked => Ok(k),
        Some(_) => Err(unauthorized("This API key was revoked.")),
        None => Err(unauthorized("Incorrect API key provided.")),
    }
}

/// The configured edge (by [`SECRET_HEADER`]), the endpoint whose rules its request
/// follows ([`ENDPOINT_HEADER`]: `completions`, the default, or `jobs`), and whose
/// request it is ([`SCOPE_HEADER`]).
#[derive(Debug)]
pub struct EdgeCaller {
    pub endpoint: Endpoint,
    pub scope: Option<String>,
}

impl FromRequestParts<AppState> for EdgeCaller {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Failure> {
        let endpoint = check_edge(state, &parts.headers)?;
        let scope = parts
            .headers
            .get(SCOPE_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        Ok(EdgeCaller { endpoint, scope })
    }
}

fn check_edge(state: &AppState, headers: &HeaderMap) -> Result<Endpoint, ApiError> {
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
        Some("chat") => Ok(Endpoint::ChatCompletions),
        Some("jobs") => Ok(Endpoint::Jobs),
        Some(other) => Err(ApiError::param(
            ErrorCode::InvalidValue,
            ENDPOINT_HEADER,
            format!("{ENDPOINT_HEADER} is completions, chat or jobs, not {other:?}."),
        )),
    }
}
