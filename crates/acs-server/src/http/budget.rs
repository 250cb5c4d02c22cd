//! `GET /v1/budget`: where the caller's key stands.

use acs_core::ledger;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::auth::Authenticated;
use super::error::Failure;
use super::response::{budget_headers, json_response};
use super::state::AppState;

/// The handler.
pub async fn get(
    State(state): State<AppState>,
    Authenticated(key): Authenticated,
) -> Result<Response, Failure> {
    let view = state.service.db.tx(|s| ledger::view(s, &key.id))?;
    let mut resp = json_response(StatusCode::OK, &view);
    budget_headers(resp.headers_mut(), &view);
    Ok(resp)
}
