//! `GET /v1/models`: the served model under its id and each alias.

use acs_core::response::List;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::response::json_response;
use super::state::AppState;

/// The handler.
pub async fn list(State(state): State<AppState>) -> Response {
    let service = &state.service;
    let mut data = vec![service.model_info(&service.config.model_id)];
    data.extend(service.config.aliases.iter().map(|a| service.model_info(a)));
    json_response(
        StatusCode::OK,
        &List {
            object: "list".into(),
            data,
            first_id: None,
            last_id: None,
            has_more: false,
        },
    )
}
