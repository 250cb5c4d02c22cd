//! The ACS edge: a Cloudflare Worker that serves the contract of `acs serve` (same
//! routes, JSON, statuses and headers), keeps each API key's Budget, Holds and jobs in
//! a Durable Object of its own ([`account::Account`]), and proxies inference to the
//! `acs` servers listed in `ACS_UPSTREAMS`.
//!
//! The entry worker below only routes: it answers what needs no key (models, health,
//! CORS preflights, unknown routes), checks the admin secret of the key routes, and
//! hands every keyed request to its key's object.

mod account;
mod admin;
mod auth;
mod directory;
mod http;
mod objects;
mod policy;
mod run;
mod store;
mod upstream;
mod usage_log;

use acs_core::{ApiError, ErrorCode};
use worker::{Context, Env, Method, Request, Response, event};

pub use account::Account;
use upstream::Upstreams;

/// The OpenAPI document of the contract (the edge serves the server's).
const OPENAPI: &str = include_str!("../../crates/acs-server/openapi.json");

#[event(fetch)]
async fn fetch(mut req: Request, env: Env, _ctx: Context) -> worker::Result<Response> {
    let resp = match route(&mut req, &env).await {
        Ok(r) => r,
        Err(e) => http::error(&e),
    };
    Ok(http::finish(resp))
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "This route does not take that method.",
    )
}

/// The methods a path takes, or `None` for an unknown path.
fn allowed(segments: &[&str]) -> Option<&'static [Method]> {
    Some(match segments {
        ["health"] | ["openapi.json"] | ["v1", "models"] | ["v1", "budget"] => &[Method::Get],
        ["v1", "completions"] | ["v1", "chat", "completions"] => &[Method::Post],
        ["v1", "completion-jobs"] => &[Method::Get, Method::Post],
        ["v1", "completion-jobs", _] | ["v1", "completion-jobs", _, "result"] => &[Method::Get],
        ["v1", "completion-jobs", _, "cancel"] => &[Method::Post],
        ["admin", "keys"] => &[Method::Get, Method::Post],
        ["admin", "keys", _, "top-up" | "revoke" | "policy"] => &[Method::Post],
        ["admin", "keys", _] | ["admin", "keys", _, "usage"] => &[Method::Get],
        _ => return None,
    })
}

async fn route(req: &mut Request, env: &Env) -> Result<Response, ApiError> {
    let method = req.method();
    if method == Method::Options {
        return Ok(http::preflight(req));
    }
    let path = req.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let Some(methods) = allowed(&segments) else {
        return Err(ApiError::new(
            ErrorCode::UnknownRoute,
            format!("No route {method} {path}."),
        ));
    };
    if !methods.contains(&method) {
        return Err(method_not_allowed());
    }
    match segments.as_slice() {
        ["health"] => Ok(http::text_response(200, "text/plain", "ok".into())),
        ["openapi.json"] => Ok(http::text_response(200, "application/json", OPENAPI.into())),
        ["v1", "models"] => {
            let list = Upstreams::from_env(env)?.models().await?;
            Ok(http::json(200, &list))
        }
        ["admin", "keys", rest @ ..] => admin::route(req, env, rest).await,
        _ => {
            let secret = auth::bearer(req)?;
            let incorrect = || auth::unauthorized("Incorrect API key provided.");
            // Checked here, before any object is addressed: see `auth`.
            if !auth::is_signed(&secret, &admin::secret(env)) {
                return Err(incorrect());
            }
            let id = auth::key_id_of(&secret).ok_or_else(incorrect)?;
            objects::forward(env, &id, req).await
        }
    }
}
