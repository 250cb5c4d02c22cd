//! `POST /v1/completions` and `POST /v1/chat/completions`: validate, take a Hold, run
//! on the engine, answer (whole or streamed), and always settle the Hold when the
//! request ends, whatever the client does in between ([`crate::run`]). A chat request
//! is a completion of its rendered conversation, answered in chat's shape.

use acs_core::{ApiError, CompletionRequest, Endpoint, ledger};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::auth::Authenticated;
use super::body::LimitedBody;
use super::error::Failure;
use super::response::{budget_headers, json_response, set_header, with_budget};
use super::sse::{Audience, sse};
use super::state::AppState;
use crate::run::{self, Out, Payer};

/// `POST /v1/completions`.
pub async fn create(
    State(state): State<AppState>,
    key: Result<Authenticated, Failure>,
    body: Result<LimitedBody, Failure>,
) -> Result<Response, Failure> {
    answer(state, key, body, Endpoint::Completions).await
}

/// `POST /v1/chat/completions`.
pub async fn create_chat(
    State(state): State<AppState>,
    key: Result<Authenticated, Failure>,
    body: Result<LimitedBody, Failure>,
) -> Result<Response, Failure> {
    answer(state, key, body, Endpoint::ChatCompletions).await
}

async fn answer(
    state: AppState,
    key: Result<Authenticated, Failure>,
    body: Result<LimitedBody, Failure>,
    endpoint: Endpoint,
) -> Result<Response, Failure> {
    let (Authenticated(key), LimitedBody(bytes)) = (key?, body?);
    let service = &state.service;
    let req = CompletionRequest::parse(&bytes, endpoint)?;
    let (model, shape) = (req.model.clone(), req.shape());
    let (stream, include_usage) = (req.stream, req.stream_include_usage);
    let mut generation = run::prepare(service, req).await?;
    generation.scope = service.scope(&key.id);
    let admitted = match run::admit_and_run(service, Payer::Key(&key.id), &model, generation).await
    {
        Ok(a) => a,
        Err(e) => {
            // Refusals (402, 429) tell the client where its key stands.
            return Ok(with_budget(
                &service.db,
                &key.id,
                Failure(e).into_response(),
            ));
        }
    };
    let view = service.db.tx(|s| ledger::view(s, &key.id))?;
    let rid = admitted.request_id.clone();
    let mut resp = if stream {
        sse(admitted, model, Audience::Client { include_usage })
    } else {
        let mut a = admitted;
        let mut result = None;
        while let Some(out) = a.rx.recv().await {
            match out {
                Out::Delta(_) => {}
                Out::Done(f) => result = Some(Ok(run::answer(f, &model, shape))),
                Out::Failed(e) => result = Some(Err(e)),
            }
        }
        match result {
            Some(Ok(c)) => json_response(StatusCode::OK, &c),
            Some(Err(e)) => return Err(Failure(e)),
            None => {
                return Err(Failure(ApiError::internal(
                    "the engine ended without a result",
                )));
            }
        }
    };
    budget_headers(resp.headers_mut(), &view);
    set_header(resp.headers_mut(), "x-request-id", &rid);
    Ok(resp)
}
