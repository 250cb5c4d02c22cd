//! `/v1/completion-jobs`: submit (with idempotency), status, list, cancel, result.

use acs_core::ids::body_digest;
use acs_core::jobs::{self, Begin};
use acs_core::request::canonical_json;
use acs_core::{ApiError, CompletionRequest, Endpoint, Job, JobId, JobStatus};
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use crate::app::{
    AppState, Failure, authenticate, job_id, json_response, read_body, set_header, with_budget,
};
use crate::cli::random;
use crate::completions::prepare_request;

fn job_response(state: &AppState, status: StatusCode, job: &Job) -> Response {
    let mut resp = json_response(status, &job.view(state.now()));
    set_header(resp.headers_mut(), "x-request-id", &job.id.request_id());
    with_budget(state, &job.key_id, resp)
}

/// The `Idempotency-Key` header, if sent. Several fields of the name are one key,
/// their values joined with ", " (HTTP's rule for repeated fields, and what the
/// edge's Fetch `Headers` give it), so both faces read the same key from a request.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let values: Result<Vec<&str>, _> = headers
        .get_all("idempotency-key")
        .iter()
        .map(|v| v.to_str())
        .collect();
    let values = values.map_err(|_| jobs::invalid_idempotency_key())?;
    Ok((!values.is_empty()).then(|| values.join(", ")))
}

/// `POST /v1/completion-jobs`.
pub async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    // The body is read whatever the key (see `completions::create`).
    let key = authenticate(&state, &headers);
    let bytes = read_body(&state, body).await;
    let key = key?;
    let idem = idempotency_key(&headers)?;
    let bytes = bytes?;
    let value = acs_core::request::parse_json_object(&bytes)?;
    let req = CompletionRequest::from_value(&value, Endpoint::Jobs)?;
    let canonical = canonical_json(&value);
    let digest = body_digest(&canonical);
    let now = state.now();
    let retention = state.config.retention_ms;
    match state
        .db
        .tx(|s| jobs::begin(s, &key.id, idem.as_deref(), &digest, now, retention))?
    {
        Begin::Replay(job) => {
            let mut resp = job_response(&state, StatusCode::OK, &job);
            set_header(resp.headers_mut(), "idempotent-replayed", "true");
            return Ok(resp);
        }
        Begin::New => {}
    }
    // Refuse what can never run now, rather than fail the job later.
    if let Err(e) = prepare_request(&state, req.clone()).await {
        let _ = state.db.tx(|s| jobs::abandon(s, &key.id, idem.as_deref()));
        return Err(Failure(e));
    }
    let now = state.now();
    let job = Job::new(
        JobId::new_v7(now, random()),
        &key.id,
        &req.model,
        canonical,
        now,
    );
    let job = state.db.tx(|s| jobs::create(s, job, idem.as_deref()))?;
    state.wake.notify_one();
    Ok(job_response(&state, StatusCode::ACCEPTED, &job))
}

/// `GET /v1/completion-jobs/{id}`.
pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Failure> {
    let key = authenticate(&state, &headers)?;
    let id = job_id(path)?;
    let job = state.db.tx(|s| jobs::owned(s, &key.id, id))?;
    Ok(job_response(&state, StatusCode::OK, &job))
}

/// Query of the job list.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<String>,
    after: Option<String>,
}

/// `GET /v1/completion-jobs`.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Failure> {
    let key = authenticate(&state, &headers)?;
    let Query(q) = query.map_err(|e| {
        ApiError::invalid_value("limit", format!("The query string is malformed: {e}."))
    })?;
    let now = state.now();
    let page = state
        .db
        .tx(|s| jobs::list(s, &key.id, q.limit.as_deref(), q.after.as_deref(), now))?;
    Ok(with_budget(
        &state,
        &key.id,
        json_response(StatusCode::OK, &page),
    ))
}

/// `POST /v1/completion-jobs/{id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Failure> {
    let key = authenticate(&state, &headers)?;
    let id = job_id(path)?;
    let now = state.now();
    let retention = state.config.retention_ms;
    let job = state
        .db
        .tx(|s| jobs::cancel(s, &key.id, id, now, retention))?;
    if job.status == JobStatus::Running {
        let tickets = state.running_jobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tickets.get(&id) {
            t.cancel();
        }
    }
    Ok(job_response(&state, StatusCode::OK, &job))
}

/// `GET /v1/completion-jobs/{id}/result`.
pub async fn result(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Failure> {
    let key = authenticate(&state, &headers)?;
    let id = job_id(path)?;
    let now = state.now();
    let completion = state.db.tx(|s| jobs::result(s, &key.id, id, now))?;
    let mut resp = json_response(StatusCode::OK, &completion);
    set_header(resp.headers_mut(), "x-request-id", &id.request_id());
    Ok(with_budget(&state, &key.id, resp))
}
