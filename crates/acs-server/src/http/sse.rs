//! Completions as server-sent events: one event per engine step, `data: [DONE]` at
//! the end, for a client or for a trusted edge ([`Audience`]); a chat request's are
//! chat chunks, and its result a chat completion.

use std::convert::Infallible;

use acs_core::chat::ChunkWriter;
use acs_core::ids::completion_id;
use acs_core::{Answer, Usage};
use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::clock::unix_now;
use crate::random::random;
use crate::run::{Admitted, Out};

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
    /// the whole answer as `event: result` when the client does not stream, and
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
    let shape = a.shape;
    let writer = ChunkWriter::new(id.clone(), created, model.clone(), shape);
    let prompt_lens = a.prompt_lens;
    // Completion tokens so far: every generated token moves its choice once.
    let start = (a.rx, writer, false, 0usize);
    let events =
        futures_util::stream::unfold(start, move |(mut rx, mut writer, ended, generated)| {
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
                            t.push_str(&data_line(&writer.chunk(d, None)));
                        }
                        Some((Ok::<_, Infallible>(t), (rx, writer, false, generated)))
                    }
                    Out::Done(f) => {
                        if edge {
                            t.push_str(&usage_event(&f.usage));
                        }
                        if chunks && include_usage {
                            t.push_str(&data_line(&writer.chunk(Vec::new(), Some(f.usage))));
                        }
                        if edge && !chunks {
                            let c = f.into_completion(&model, id, created);
                            t.push_str(&event("result", &Answer::new(c, shape)));
                        }
                        t.push_str("data: [DONE]\n\n");
                        Some((Ok(t), (rx, writer, true, generated)))
                    }
                    Out::Failed(e) => {
                        if edge {
                            t.push_str(&format!("event: error\ndata: {}\n\n", e.to_json()));
                        } else {
                            t.push_str(&format!("data: {}\n\n", e.to_json()));
                        }
                        t.push_str("data: [DONE]\n\n");
                        Some((Ok(t), (rx, writer, true, generated)))
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

fn data_line(c: &impl serde::Serialize) -> String {
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
