//! The ACS edge: a Cloudflare Worker that serves the contract of `acs serve` (same
//! routes, JSON, statuses and headers), keeps each API key's Budget, Holds and jobs in
//! a Durable Object of its own ([`account::Account`]), and proxies inference to the
//! `acs` servers listed in `ACS_UPSTREAMS`.
//!
//! The entry worker below only routes: it answers what needs no key (models, health,
//! CORS preflights, unknown routes), checks the admin secret of the key routes, and
//! hands every keyed request to its key's object.

mod account;
mod auth;
mod http;
mod store;
mod upstream;

use acs_core::{ApiError, ErrorCode};
use worker::{Context, Env, Method, Request, Response, event};

pub use account::Account;
use account::{NewKey, TopUp};
use upstream::Upstreams;

/// The OpenAPI document of the contract (the edge serves the server's).
const OPENAPI: &str = include_str!("../../crates/acs-server/openapi.json");

/// The Durable Object namespace of the accounts.
const ACCOUNTS: &str = "ACCOUNTS";

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
        ["admin", "keys"] | ["admin", "keys", _, "top-up" | "revoke"] => &[Method::Post],
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
        ["admin", "keys", rest @ ..] => admin(req, env, rest).await,
        _ => {
            let secret = auth::bearer(req)?;
            let incorrect = || auth::unauthorized("Incorrect API key provided.");
            // Checked here, before any object is addressed: see `auth`.
            if !auth::is_signed(&secret, &admin_secret(env)) {
                return Err(incorrect());
            }
            let id = auth::key_id_of(&secret).ok_or_else(incorrect)?;
            forward(env, &id, req).await
        }
    }
}

/// Hands a request to the object of key `id`.
async fn forward(env: &Env, id: &str, req: &Request) -> Result<Response, ApiError> {
    let stub = env
        .durable_object(ACCOUNTS)
        .and_then(|ns| ns.id_from_name(id)?.get_stub())
        .map_err(|e| ApiError::internal(format!("account object: {e}")))?;
    let req = req
        .clone()
        .map_err(|e| ApiError::internal(format!("request: {e}")))?;
    stub.fetch_with_request(req)
        .await
        .map_err(|e| ApiError::internal(format!("account object: {e}")))
}

/// Sends an admin call to the object of key `id`.
async fn to_account(
    env: &Env,
    id: &str,
    what: &str,
    body: &impl serde::Serialize,
) -> Result<Response, ApiError> {
    let mut init = worker::RequestInit::new();
    init.with_method(Method::Post).with_body(Some(
        serde_json::to_string(body)
            .expect("admin bodies serialise")
            .into(),
    ));
    let req = Request::new_with_init(&format!("https://account/internal/{what}"), &init)
        .map_err(|e| ApiError::internal(format!("request: {e}")))?;
    forward(env, id, &req).await
}

/// The body of `POST /admin/keys`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    tokens: u64,
    #[serde(default = "default_max_running")]
    max_running: u32,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    requests_per_minute: Option<u32>,
    #[serde(default)]
    tokens_per_minute: Option<u64>,
}

fn default_max_running() -> u32 {
    8
}

/// `POST /admin/keys` (`{"tokens", "max_running", "name", "requests_per_minute",
/// "tokens_per_minute"}` → the new key, once),
/// `POST /admin/keys/{id}/top-up` (`{"tokens"}`) and `POST /admin/keys/{id}/revoke`,
/// with `Authorization: Bearer <ACS_ADMIN_SECRET>`.
/// The admin secret (`ACS_ADMIN_SECRET`, a secret or a var), empty when unset.
fn admin_secret(env: &Env) -> String {
    env.secret("ACS_ADMIN_SECRET")
        .map(|s| s.to_string())
        .or_else(|_| env.var("ACS_ADMIN_SECRET").map(|v| v.to_string()))
        .unwrap_or_default()
}

async fn admin(req: &mut Request, env: &Env, rest: &[&str]) -> Result<Response, ApiError> {
    let admin = admin_secret(env);
    let given = auth::bearer(req)?;
    if !auth::is_admin(&given, &admin) {
        return Err(auth::unauthorized("Wrong admin secret."));
    }
    let body = http::read_body(req, 64 << 10).await?;
    let bad = |e: serde_json::Error| ApiError::invalid_value("body", format!("{e}."));
    match rest {
        [] => {
            let c: CreateKey = serde_json::from_slice(&body).map_err(bad)?;
            let (id, secret) = auth::new_key(&admin);
            let new = NewKey {
                id: id.clone(),
                hash: acs_core::KeyHash::of(&secret).0,
                name: c.name,
                tokens: c.tokens,
                max_running: c.max_running,
                requests_per_minute: c.requests_per_minute,
                tokens_per_minute: c.tokens_per_minute,
            };
            let mut resp = to_account(env, &id, "create", &new).await?;
            if resp.status_code() != 201 {
                return Ok(resp);
            }
            let view: acs_core::BudgetView = resp
                .json()
                .await
                .map_err(|e| ApiError::internal(format!("create: {e}")))?;
            Ok(http::json(
                201,
                &serde_json::json!({
                    "id": id,
                    "key": secret,
                    "tokens_left": view.tokens_left,
                    "max_running": view.max_running,
                }),
            ))
        }
        [id, "top-up"] => {
            let t: TopUp = serde_json::from_slice(&body).map_err(bad)?;
            to_account(env, id, "top-up", &t).await
        }
        [id, "revoke"] => to_account(env, id, "revoke", &serde_json::json!({})).await,
        _ => Err(ApiError::new(
            ErrorCode::UnknownRoute,
            "No such admin route.",
        )),
    }
}
