//! `POST /v1/completions`: validate, take a Hold, run on the engine, answer (whole or
//! streamed), and always settle the Hold when the request ends, whatever the client
//! does in between.

use std::convert::Infallible;

use acs_core::ids::{completion_id, request_id};
use acs_core::request::hold_tokens;
use acs_core::response::{CompletionChunk, TEXT_COMPLETION};
use acs_core::{ApiError, CompletionRequest, Endpoint, Usage, ledger};
use acs_engine::{Event, Finished, prepare};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use crate::app::{
    AppState, Failure, authenticate, budget_headers, json_response, read_body, set_header,
    with_budget,
};
use crate::cli::{random, unix_now};

/// What the settling task passes on to the HTTP side.
enum Out {
    Delta(Vec<acs_core::Choice>),
    Done(Finished),
    Failed(ApiError),
}

/// A completion that holds its tokens and runs.
pub struct Admitted {
    /// The request id, also the Hold's id.
    request_id: String,
    /// Tokens of each prompt, for running usage.
    prompt_lens: Vec<usize>,
    /// Events of the engine, after settlement.
    rx: mpsc::UnboundedReceiver<Out>,
}

/// Whose Budget a run draws on.
#[derive(Debug, Clone, Copy)]
pub enum Payer<'a> {
    /// This key's: the run takes a Hold and settles it.
    Key(&'a str),
    /// A trusted edge's, which keeps the ledger itself: no Hold here.
    Edge,
}

/// Validates and prepares a request body for the engine (tokenizing, and running
/// the model for contrast steering vectors, off the async threads).
pub async fn prepare_request(
    state: &AppState,
    req: CompletionRequest,
) -> Result<acs_engine::Generation, ApiError> {
    let info = state.check_model(&req.model)?;
    let model = std::sync::Arc::clone(state.engine.model());
    let controls = std::sync::Arc::clone(&state.controls);
    let seed = u64::from_le_bytes(random());
    tokio::task::spawn_blocking(move || prepare(&req, &model, &info, &controls, seed))
        .await
        .map_err(|e| ApiError::internal(format!("prepare task: {e}")))?
}

/// Takes the Hold and starts the engine; a task settles the Hold when the engine
/// reports the end, and cancels the engine's work if the receiver goes away.
pub fn admit_and_run(
    state: &AppState,
    payer: Payer<'_>,
    generation: acs_engine::Generation,
) -> Result<Admitted, ApiError> {
    let rid = request_id(random());
    let prompt_lens = generation.prompt_lens();
    let hold = hold_tokens(
        &prompt_lens,
        generation.n as u32,
        generation.max_tokens as u32,
    );
    let now = state.now();
    let settles = match payer {
        Payer::Key(key_id) => {
            state.db.tx(|s| ledger::admit(s, key_id, &rid, hold, now))?;
            true
        }
        Payer::Edge => false,
    };
    let (etx, mut erx) = mpsc::unbounded_channel();
    let ticket = match state
        .engine
        .submit(generation, Box::new(move |e| etx.send(e).is_ok()))
    {
        Ok(t) => t,
        Err(e) => {
            if settles {
                state.db.tx(|s| ledger::settle(s, &rid, 0))?;
            }
            return Err(e);
        }
    };
    let (otx, orx) = mpsc::unbounded_channel();
    let db = state.db.clone();
    let hold_id = rid.clone();
    let wake = state.wake.clone();
    tokio::spawn(async move {
        let ticket = ticket;
        let mut gone = false;
        loop {
            let e = tokio::select! {
                e = erx.recv() => match e {
                    Some(e) => e,
                    None => break,
                },
                // The reader went away (the client left and its handler was
                // dropped): stop at the next step, even in a long prefill that
                // sends nothing yet; keep draining to settle.
                () = otx.closed(), if !gone => {
                    gone = true;
                    ticket.cancel();
                    continue;
                }
            };
            let out = match e {
                Event::Delta(d) => Out::Delta(d),
                Event::Done(f) => {
                    let used = f.usage.total_tokens;
                    if settles && let Err(err) = db.tx(|s| ledger::settle(s, &hold_id, used)) {
                        tracing::error!(%hold_id, %err, "settling a hold failed");
                    }
                    wake.notify_one();
                    Out::Done(f)
                }
                Event::Failed(err) => {
                    if settles {
                        let _ = db.tx(|s| ledger::settle(s, &hold_id, 0));
                    }
                    wake.notify_one();
                    Out::Failed(err)
                }
            };
            if otx.send(out).is_err() {
                // The client is gone: stop generating; keep draining to settle.
                ticket.cancel();
            }
        }
        ticket.detach();
    });
    Ok(Admitted {
        request_id: rid,
        prompt_lens,
        rx: orx,
    })
}

/// The handler.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    // The body is read whatever the key: answering before it is read makes hyper
    // close the connection, which a client reusing it sees as a dropped request.
    let key = authenticate(&state, &headers);
    let bytes = read_body(&state, body).await;
    let (key, bytes) = (key?, bytes?);
    let req = CompletionRequest::parse(&bytes, Endpoint::Completions)?;
    let model = req.model.clone();
    let (stream, include_usage) = (req.stream, req.stream_include_usage);
    let generation = prepare_request(&state, req).await?;
    let admitted = match admit_and_run(&state, Payer::Key(&key.id), generation) {
        Ok(a) => a,
        Err(e) => {
            // Refusals (402, 429) tell the client where its key stands.
            return Ok(with_budget(&state, &key.id, Failure(e).into_response()));
        }
    };
    let view = state.db.tx(|s| ledger::view(s, &key.id))?;
    let rid = admitted.request_id.clone();
    let mut resp = if stream {
        sse(admitted, model, Audience::Client { include_usage })
    } else {
        let mut a = admitted;
        let mut result = None;
        while let Some(out) = a.rx.recv().await {
            match out {
                Out::Delta(_) => {}
                Out::Done(f) => {
                    result = Some(Ok(f.into_completion(
                        &model,
                        completion_id(random()),
                        unix_now(),
                    )));
                }
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

/// Who reads a stream, and so what it carries.
#[derive(Debug, Clone, Copy)]
pub enum Audience {
    /// A client of the contract: `data:` chunks, an optional usage chunk, `[DONE]`.
    Client {
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
    /// A trusted edge, which charges the key itself. Besides the client's chunks (when
    /// the client streams) it gets the running usage after every step as
    /// `event: usage` (so that a client who leaves is charged what was generated),
    /// the whole Completion as `event: result` when the client does not stream, and
    /// failures as `event: error`.
    Edge {
        /// Whether the edge's client streams (and so wants the chunks).
        chunks: bool,
        /// The client's `stream_options.include_usage`.
        include_usage: bool,
    },
}

/// Server-sent events: one event per engine step, `data: [DONE]` at the end.
pub fn sse(a: Admitted, model: String, audience: Audience) -> Response {
    let id = completion_id(random());
    let created = unix_now();
    let (chunks, include_usage, edge) = match audience {
        Audience::Client { include_usage } => (true, include_usage, false),
        Audience::Edge {
            chunks,
            include_usage,
        } => (chunks, include_usage, true),
    };
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |choices, usage| CompletionChunk {
            id: id.clone(),
            object: TEXT_COMPLETION.into(),
            created,
            model: model.clone(),
            choices,
            usage,
        }
    };
    let prompt_lens = a.prompt_lens;
    // Completion tokens so far: every generated token moves its choice once.
    let start = (a.rx, false, 0usize);
    let events = futures_util::stream::unfold(start, move |(mut rx, ended, generated)| {
        let chunk = chunk.clone();
        let (id, model, prompt_lens) = (id.clone(), model.clone(), prompt_lens.clone());
        async move {
            if ended {
                return None;
            }
            let mut t = String::new();
            match rx.recv().await? {
                Out::Delta(d) => {
                    let generated = generated + d.len();
                    if edge {
                        t.push_str(&usage_event(&Usage::new(&prompt_lens, &[generated])));
                    }
                    if chunks {
                        t.push_str(&data_line(&chunk(d, None)));
                    }
                    Some((Ok::<_, Infallible>(t), (rx, false, generated)))
                }
                Out::Done(f) => {
                    if edge {
                        t.push_str(&usage_event(&f.usage));
                    }
                    if chunks && include_usage {
                        t.push_str(&data_line(&chunk(Vec::new(), Some(f.usage))));
                    }
                    if edge && !chunks {
                        let c = f.into_completion(&model, id, created);
                        t.push_str(&event("result", &c));
                    }
                    t.push_str("data: [DONE]\n\n");
                    Some((Ok(t), (rx, true, generated)))
                }
                Out::Failed(e) => {
                    if edge {
                        t.push_str(&format!("event: error\ndata: {}\n\n", e.to_json()));
                    } else {
                        t.push_str(&format!("data: {}\n\n", e.to_json()));
                    }
                    t.push_str("data: [DONE]\n\n");
                    Some((Ok(t), (rx, true, generated)))
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

fn data_line(c: &CompletionChunk) -> String {
    format!(
        "data: {}\n\n",
        serde_json::to_string(c).expect("chunks serialise")
    )
}

fn event(name: &str, body: &impl serde::Serialize) -> String {
    format!(
        "event: {name}\ndata: {}\n\n",
        serde_json::to_string(body).expect("events serialise")
    )
}

fn usage_event(u: &Usage) -> String {
    event("usage", u)
}
