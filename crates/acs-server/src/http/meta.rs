//! The server's own routes: its health, and the OpenAPI document of the contract as
//! this server implements it.

use acs_core::ApiError;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::Failure;
use super::state::AppState;

/// `GET /health`: `ok` while every model's engine runs, 500 once one's thread has
/// stopped.
pub async fn health(State(state): State<AppState>) -> Result<&'static str, Failure> {
    if state.service.models.iter().all(|m| m.engine.is_running()) {
        Ok("ok")
    } else {
        Err(Failure(ApiError::internal(
            "the engine thread has stopped; restart the server",
        )))
    }
}

/// `GET /openapi.json`.
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../../openapi.json"),
    )
        .into_response()
}
