//! The admin routes of the entry worker, with `Authorization: Bearer
//! <ACS_ADMIN_SECRET>`:
//!
//! - `POST /admin/keys` (`{"tokens", "max_running", "name", "requests_per_minute",
//!   "tokens_per_minute", "expires_at", "models"}`) makes a key and answers its
//!   secret, once; `GET /admin/keys?limit=N&after=ID` lists the keys by id.
//! - `GET /admin/keys/{id}`: the key's record, Budget, limits and policy.
//! - `POST /admin/keys/{id}/top-up` (`{"tokens"}`), `POST /admin/keys/{id}/revoke`.
//! - `POST /admin/keys/{id}/policy` (`{"expires_at", "models"}`, each optional,
//!   `null` lifting that limit).
//! - `GET /admin/keys/{id}/usage?limit=N`: the newest rows of the key's usage log.

use acs_core::response::page_limit;
use acs_core::{ApiError, ErrorCode};
use worker::{Env, Method, Request, Response};

use crate::account::{NewKey, TopUp, UsageQuery};
use crate::directory::{self, Listed, PageQuery};
use crate::http::{self, now};
use crate::objects::call;
use crate::policy::Policy;
use crate::{auth, usage_log};

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
    #[serde(default)]
    expires_at: Option<i64>,
    #[serde(default)]
    models: Option<Vec<String>>,
}

fn default_max_running() -> u32 {
    8
}

/// The admin secret (`ACS_ADMIN_SECRET`, a secret or a var), empty when unset.
pub fn secret(env: &Env) -> String {
    env.secret("ACS_ADMIN_SECRET")
        .map(|s| s.to_string())
        .or_else(|_| env.var("ACS_ADMIN_SECRET").map(|v| v.to_string()))
        .unwrap_or_default()
}

/// `/admin/keys` and below (`rest`: the path after it); the caller checked the
/// method against the path.
pub async fn route(req: &mut Request, env: &Env, rest: &[&str]) -> Result<Response, ApiError> {
    let admin = secret(env);
    let given = auth::bearer(req)?;
    if !auth::is_admin(&given, &admin) {
        return Err(auth::unauthorized("Wrong admin secret."));
    }
    let body = http::read_body(req, 64 << 10).await?;
    let bad = |e: serde_json::Error| ApiError::invalid_value("body", format!("{e}."));
    if let [id, ..] = rest
        && !auth::is_key_id(id)
    {
        return Err(ApiError::new(ErrorCode::NotFound, "No key with that id."));
    }
    match rest {
        [] if req.method() == Method::Get => {
            let q = query(req)?;
            let limit = page_limit(param(&q, "limit"), 100, directory::MAX_LIMIT)?;
            let after = param(&q, "after").map(str::to_owned);
            let page = PageQuery { limit, after };
            call(env, directory::NAME, "directory-list", &page).await
        }
        [] => {
            let c: CreateKey = serde_json::from_slice(&body).map_err(bad)?;
            create(env, &admin, c).await
        }
        [id, "top-up"] => {
            let t: TopUp = serde_json::from_slice(&body).map_err(bad)?;
            call(env, id, "top-up", &t).await
        }
        [id, "revoke"] => call(env, id, "revoke", &serde_json::json!({})).await,
        [id] => call(env, id, "info", &serde_json::json!({})).await,
        [id, "policy"] => {
            let change: serde_json::Value = serde_json::from_slice(&body).map_err(bad)?;
            call(env, id, "policy", &change).await
        }
        [id, "usage"] => {
            let limit = page_limit(param(&query(req)?, "limit"), 100, usage_log::MAX_LIMIT)?;
            call(env, id, "usage", &UsageQuery { limit }).await
        }
        _ => Err(ApiError::new(
            ErrorCode::UnknownRoute,
            "No such admin route.",
        )),
    }
}

/// `POST /admin/keys`: the key's object stores the key, then the directory lists it.
async fn create(env: &Env, admin: &str, c: CreateKey) -> Result<Response, ApiError> {
    let (id, secret) = auth::new_key(admin);
    let name = c.name.clone();
    let new = NewKey {
        id: id.clone(),
        hash: acs_core::KeyHash::of(&secret).0,
        name: c.name,
        tokens: c.tokens,
        max_running: c.max_running,
        requests_per_minute: c.requests_per_minute,
        tokens_per_minute: c.tokens_per_minute,
        policy: Policy {
            expires_at: c.expires_at,
            models: c.models,
        },
    };
    let mut resp = call(env, &id, "create", &new).await?;
    if resp.status_code() != 201 {
        return Ok(resp);
    }
    let view: acs_core::BudgetView = resp
        .json()
        .await
        .map_err(|e| ApiError::internal(format!("create: {e}")))?;
    let listed = Listed {
        id: id.clone(),
        name,
        created_at: now().0.div_euclid(1000),
    };
    // The key works without its row in the list; a failure here is only logged.
    match call(env, directory::NAME, "directory-add", &listed).await {
        Ok(r) if r.status_code() == 200 => {}
        Ok(r) => worker::console_error!("listing key {id}: status {}", r.status_code()),
        Err(e) => worker::console_error!("listing key {id}: {e}"),
    }
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

/// The request's query parameters, in order.
fn query(req: &Request) -> Result<Vec<(String, String)>, ApiError> {
    let url = req.url().map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(url.query_pairs().into_owned().collect())
}

/// The first value of query parameter `name`, if given.
fn param<'q>(query: &'q [(String, String)], name: &str) -> Option<&'q str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
