//! The server's own routes: its health, and the OpenAPI document of the contract as
//! this server implements it.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// `GET /health`.
pub async fn health() -> &'static str {
    "ok"
}

/// `GET /openapi.json`.
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../../openapi.json"),
    )
        .into_response()
}
