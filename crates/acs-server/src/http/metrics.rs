//! `GET /metrics`: the server in Prometheus' text format: requests answered by
//! method, route and status, and the engine's work (tokens, steps, prompt-cache
//! hits) and state (requests running and waiting, sequences in a step, KV memory).
//! It carries counts only, nothing of any request's content or key.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::AppState;

/// Requests answered so far, by (method, route, status). The route is the matched
/// route's pattern (`/v1/completion-jobs/{id}`), so the labels stay few.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
}

/// Counts each request that a route answers.
pub async fn count(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = req.method().to_string();
    let resp = next.run(req).await;
    let mut requests = metrics.requests.lock().unwrap_or_else(|p| p.into_inner());
    *requests
        .entry((method, route, resp.status().as_u16()))
        .or_default() += 1;
    resp
}

/// One metric's `# HELP` and `# TYPE` lines, and its unlabelled value.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// The handler.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut out = String::new();
    let name = "acs_http_requests_total";
    let _ = writeln!(
        out,
        "# HELP {name} HTTP requests answered, by method, route and status.\n# TYPE {name} counter"
    );
    let requests = state
        .metrics
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for ((method, route, status), n) in requests {
        let _ = writeln!(
            out,
            "{name}{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
        );
    }
    let engine = &state.service.engine;
    let s = engine.stats();
    let counters = [
        ("acs_engine_steps_total", "Batch steps run.", s.steps),
        (
            "acs_engine_prefills_total",
            "Prompts prefilled.",
            s.prefills,
        ),
        (
            "acs_engine_prefill_tokens_total",
            "Prompt tokens prefilled (not those reused from another prompt's cache).",
            s.prefill_tokens,
        ),
        (
            "acs_engine_decode_tokens_total",
            "Tokens decoded, one per choice per step.",
            s.decode_tokens,
        ),
        (
            "acs_engine_prompt_cache_hits_total",
            "Prompts that started from a kept prompt.",
            s.prompt_cache_hits,
        ),
    ];
    for (name, help, v) in counters {
        single(&mut out, name, "counter", help, v);
    }
    single(
        &mut out,
        "acs_engine_step_seconds_total",
        "counter",
        "Time spent in batch steps.",
        engine.step_seconds(),
    );
    let capacity = engine.config().kv_capacity_tokens * engine.model().config.kv_bytes_per_token();
    let gauges = [
        (
            "acs_engine_running_requests",
            "Requests running after the last step.",
            s.running,
        ),
        (
            "acs_engine_waiting_requests",
            "Requests waiting for KV memory after the last step.",
            s.waiting,
        ),
        (
            "acs_engine_batch_sequences",
            "Sequences in the last step.",
            s.batch,
        ),
        (
            "acs_engine_kv_bytes",
            "KV cache memory held after the last step, kept prompts included.",
            s.kv_bytes,
        ),
        (
            "acs_engine_kv_capacity_bytes",
            "KV cache memory the engine may hold.",
            capacity as u64,
        ),
        (
            "acs_engine_up",
            "1 while the engine thread runs.",
            u64::from(engine.is_running()),
        ),
    ];
    for (name, help, v) in gauges {
        single(&mut out, name, "gauge", help, v);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
