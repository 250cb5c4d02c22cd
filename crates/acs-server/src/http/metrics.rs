//! `GET /metrics`: the server in Prometheus' text format: requests answered by
//! method, route and status, and the engine's work (tokens, steps, prompt-cache
//! hits) and state (requests running and waiting, sequences in a step, KV memory),
//! each engine's labelled with its `model`.
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
    // The engine's metrics, one line per served model (`model` label).
    let engines: Vec<(&str, &acs_engine::Engine)> = state
        .service
        .models
        .iter()
        .map(|m| (m.id.as_str(), &m.engine))
        .collect();
    let stats: Vec<_> = engines.iter().map(|(_, e)| e.stats()).collect();
    type Of<'a> = &'a dyn Fn(usize) -> f64;
    let per_model = |out: &mut String, name: &str, kind: &str, help: &str, value: Of<'_>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (i, (id, _)) in engines.iter().enumerate() {
            let _ = writeln!(out, "{name}{{model=\"{id}\"}} {}", value(i));
        }
    };
    let counters: [(&str, &str, Of<'_>); 6] = [
        ("acs_engine_steps_total", "Batch steps run.", &|i| {
            stats[i].steps as f64
        }),
        ("acs_engine_prefills_total", "Prompts prefilled.", &|i| {
            stats[i].prefills as f64
        }),
        (
            "acs_engine_prefill_tokens_total",
            "Prompt tokens prefilled (not those reused from another prompt's cache).",
            &|i| stats[i].prefill_tokens as f64,
        ),
        (
            "acs_engine_decode_tokens_total",
            "Tokens decoded, one per choice per step.",
            &|i| stats[i].decode_tokens as f64,
        ),
        (
            "acs_engine_prompt_cache_hits_total",
            "Prompts that started from a kept prompt.",
            &|i| stats[i].prompt_cache_hits as f64,
        ),
        (
            "acs_engine_step_seconds_total",
            "Time spent in batch steps.",
            &|i| engines[i].1.step_seconds(),
        ),
    ];
    for (name, help, v) in counters {
        per_model(&mut out, name, "counter", help, v);
    }
    let capacity = |i: usize| {
        let e = engines[i].1;
        (e.config().kv_capacity_tokens * e.model().config.kv_bytes_per_token()) as f64
    };
    let gauges: [(&str, &str, Of<'_>); 6] = [
        (
            "acs_engine_running_requests",
            "Requests running after the last step.",
            &|i| stats[i].running as f64,
        ),
        (
            "acs_engine_waiting_requests",
            "Requests waiting for KV memory after the last step.",
            &|i| stats[i].waiting as f64,
        ),
        (
            "acs_engine_batch_sequences",
            "Sequences in the last step.",
            &|i| stats[i].batch as f64,
        ),
        (
            "acs_engine_kv_bytes",
            "KV cache memory held after the last step, kept prompts included.",
            &|i| stats[i].kv_bytes as f64,
        ),
        (
            "acs_engine_kv_capacity_bytes",
            "KV cache memory the engine may hold.",
            &capacity,
        ),
        ("acs_engine_up", "1 while the engine thread runs.", &|i| {
            f64::from(u8::from(engines[i].1.is_running()))
        }),
    ];
    for (name, help, v) in gauges {
        per_model(&mut out, name, "gauge", help, v);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
