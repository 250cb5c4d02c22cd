//! `/v1/completion-jobs`: submit (with idempotency), status, list, cancel, result.

use acs_core::ids::body_digest;
use acs_core::jobs::{self, Begin};
use acs_core::request::canonical_json;
use acs_core::{ApiError, CompletionRequest, Endpoint, ErrorCode, Job, JobId, JobStatus};
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::auth::Authenticated;
use super::body::LimitedBody;
use super::error::Failure;
use super::response::{json_response, set_header, with_budget};
use super::state::AppState;
use crate::random::random;
use crate::run;
use crate::service::Service;

/// A job id from the path; anything that is not one (not even UTF-8) is 404.
#[derive(Debug)]
pub struct JobPath(JobId);

impl FromRequestParts<AppState> for JobPath {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Failure> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(JobPath(jobs::parse_id(&id)?)),
            Err(_) => Err(Failure(ApiError::new(
                ErrorCode::NotFound,
                "No job with that id.",
            ))),
        }
    }
}

fn job_response(service: &Service, status: StatusCode, job: &Job) -> Response {
    let mut resp = json_response(status, &job.view(service.now()));
    set_header(resp.headers_mut(), "x-request-id", &job.id.request_id());
    with_budget(&service.db, &job.key_id, resp)
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
    key: Result<Authenticated, Failure>,
    headers: HeaderMap,
    body: Result<LimitedBody, Failure>,
) -> Result<Response, Failure> {
    let service = &state.service;
    let Authenticated(key) = key?;
    let idem = idempotency_key(&headers)?;
    let LimitedBody(bytes) = body?;
    let value = acs_core::request::parse_json_object(&bytes)?;
    let req = CompletionRequest::from_value(&value, Endpoint::Jobs)?;
    let canonical = canonical_json(&value);
    let digest = body_digest(&canonical);
    let now = service.now();
    let retention = service.config.retention_ms;
    let claim = match service
        .db
        .tx(|s| jobs::begin(s, &key.id, idem.as_deref(), &digest, now, retention))?
    {
        Begin::Replay(job) => {
            let mut resp = job_response(service, StatusCode::OK, &job);
            set_header(resp.headers_mut(), "idempotent-replayed", "true");
            return Ok(resp);
        }
        Begin::New(claim) => claim,
    };
    // Refuse what can never run now, rather than fail the job later.
    if let Err(e) = run::prepare(service, req.clone()).await {
        let _ = service.db.tx(|s| jobs::abandon(s, &key.id, &claim));
        return Err(Failure(e));
    }
    let now = service.now();
    let job = Job::new(
        JobId::new_v7(now, random()),
        &key.id,
        &req.model,
        canonical,
        now,
    );
    let max_queued = service.config.max_queued_jobs;
    let job = match service.db.tx(|s| jobs::create(s, job, &claim, max_queued)) {
        Ok(job) => job,
        Err(e) => {
            let _ = service.db.tx(|s| jobs::abandon(s, &key.id, &claim));
            return Ok(with_budget(
                &service.db,
                &key.id,
                Failure(e).into_response(),
            ));
        }
    };
    service.wake.notify_one();
    Ok(job_response(service, StatusCode::ACCEPTED, &job))
}

/// `GET /v1/completion-jobs/{id}`.
pub async fn get(
    State(state): State<AppState>,
    Authenticated(key): Authenticated,
    JobPath(id): JobPath,
) -> Result<Response, Failure> {
    let service = &state.service;
    let job = service.db.tx(|s| jobs::owned(s, &key.id, id))?;
    Ok(job_response(service, StatusCode::OK, &job))
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
    Authenticated(key): Authenticated,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Failure> {
    let service = &state.service;
    let Query(q) = query.map_err(|e| {
        ApiError::invalid_value("limit", format!("The query string is malformed: {e}."))
    })?;
    let now = service.now();
    let page = service
        .db
        .tx(|s| jobs::list(s, &key.id, q.limit.as_deref(), q.after.as_deref(), now))?;
    Ok(with_budget(
        &service.db,
        &key.id,
        json_response(StatusCode::OK, &page),
    ))
}

/// `POST /v1/completion-jobs/{id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    Authenticated(key): Authenticated,
    JobPath(id): JobPath,
) -> Result<Response, Failure> {
    let service = &state.service;
    let now = service.now();
    let retention = service.config.retention_ms;
    let job = service
        .db
        .tx(|s| jobs::cancel(s, &key.id, id, now, retention))?;
    if job.status == JobStatus::Running {
        let tickets = service
            .running_jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tickets.get(&id) {
            t.cancel();
        }
    }
    Ok(job_response(service, StatusCode::OK, &job))
}

/// `GET /v1/completion-jobs/{id}/result`.
pub async fn result(
    State(state): State<AppState>,
    Authenticated(key): Authenticated,
    JobPath(id): JobPath,
) -> Result<Response, Failure> {
    let service = &state.service;
    let now = service.now();
    let completion = service.db.tx(|s| jobs::result(s, &key.id, id, now))?;
    let mut resp = json_response(StatusCode::OK, &completion);
    set_header(resp.headers_mut(), "x-request-id", &id.request_id());
    Ok(with_budget(&service.db, &key.id, resp))
}
