//! `GET /v1/models`: each served model under its id and each alias.

use acs_core::response::List;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::response::json_response;
use super::state::AppState;

/// The handler.
pub async fn list(State(state): State<AppState>) -> Response {
    let service = &state.service;
    let data = service
        .models
        .iter()
        .flat_map(|m| {
            std::iter::once(&m.id)
                .chain(&m.aliases)
                .map(|id| service.model_info(m, id))
        })
        .collect();
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
