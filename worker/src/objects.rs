//! Addressing the Durable Objects: each key's object by the key's id, and the
//! directory by its name, all of one class in the `ACCOUNTS` namespace.

use acs_core::ApiError;
use worker::{Env, Method, Request, Response};

/// The Durable Object namespace of the accounts (and the directory).
const ACCOUNTS: &str = "ACCOUNTS";

/// Hands a request to the object named `name`.
pub async fn forward(env: &Env, name: &str, req: &Request) -> Result<Response, ApiError> {
    let stub = env
        .durable_object(ACCOUNTS)
        .and_then(|ns| ns.id_from_name(name)?.get_stub())
        .map_err(|e| ApiError::internal(format!("account object: {e}")))?;
    let req = req
        .clone()
        .map_err(|e| ApiError::internal(format!("request: {e}")))?;
    stub.fetch_with_request(req)
        .await
        .map_err(|e| ApiError::internal(format!("account object: {e}")))
}

/// Sends the entry worker's call `what` (an `/internal/` route) to the object named
/// `name`.
pub async fn call(
    env: &Env,
    name: &str,
    what: &str,
    body: &impl serde::Serialize,
) -> Result<Response, ApiError> {
    let mut init = worker::RequestInit::new();
    init.with_method(Method::Post).with_body(Some(
        serde_json::to_string(body)
            .expect("internal bodies serialise")
            .into(),
    ));
    let req = Request::new_with_init(&format!("https://account/internal/{what}"), &init)
        .map_err(|e| ApiError::internal(format!("request: {e}")))?;
    forward(env, name, &req).await
}
