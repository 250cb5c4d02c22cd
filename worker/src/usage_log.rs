//! A key's usage log: one row for every completion and job its object sent upstream,
//! with what was asked, the tokens charged, how long it took and which upstream ran
//! it. The rows live in the key's object beside its Budget (the newest [`KEEP`]), and
//! the admin reads them with `GET /admin/keys/{id}/usage`.

use acs_core::sql::{SqlConn, SqlValue};
use acs_core::{ApiError, CompletionRequest, Timestamp};
use serde::Serialize;

use crate::store::DoStore;

/// The edge's own table, beside the contract's schema.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS edge_usage (
    seq INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    prompts INTEGER NOT NULL,
    n INTEGER NOT NULL,
    max_tokens INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    latency_ms INTEGER NOT NULL,
    upstream TEXT,
    outcome TEXT NOT NULL
)";

/// Rows kept per key: the oldest go as new ones come, so that the log's storage stays
/// bounded whatever the key's traffic.
pub const KEEP: i64 = 1000;

/// The most rows one read returns.
pub const MAX_LIMIT: usize = KEEP as usize;

/// What a request asked for, noted when it is admitted.
#[derive(Debug, Clone)]
pub struct Asked {
    pub request_id: String,
    pub endpoint: &'static str,
    pub model: String,
    pub prompts: u64,
    pub n: u64,
    pub max_tokens: u64,
    pub stream: bool,
    pub started: Timestamp,
}

impl Asked {
    /// The notes of request `request_id` to `endpoint`, admitted at `started`.
    pub fn new(
        request_id: &str,
        endpoint: &'static str,
        r: &CompletionRequest,
        started: Timestamp,
    ) -> Asked {
        Asked {
            request_id: request_id.to_owned(),
            endpoint,
            model: r.model.clone(),
            prompts: r.prompt.len() as u64,
            n: u64::from(r.n),
            max_tokens: u64::from(r.max_tokens),
            stream: r.stream,
            started,
        }
    }
}

/// One row of the log, as the admin reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub request_id: String,
    /// Unix seconds of the request's admission.
    pub created_at: i64,
    pub endpoint: String,
    pub model: String,
    pub prompts: u64,
    pub n: u64,
    pub max_tokens: u64,
    pub stream: bool,
    /// Tokens charged to the Budget.
    pub tokens: u64,
    /// From admission to the end of the run.
    pub latency_ms: u64,
    /// The upstream that ran it (none when no upstream took it).
    pub upstream: Option<String>,
    /// `succeeded`, `failed` or `cancelled`.
    pub outcome: String,
}

impl Entry {
    /// The row of `asked`, ended at `now` with `tokens` charged.
    pub fn ended(
        asked: &Asked,
        now: Timestamp,
        tokens: u64,
        upstream: Option<String>,
        outcome: &str,
    ) -> Entry {
        Entry {
            request_id: asked.request_id.clone(),
            created_at: asked.started.0.div_euclid(1000),
            endpoint: asked.endpoint.to_owned(),
            model: asked.model.clone(),
            prompts: asked.prompts,
            n: asked.n,
            max_tokens: asked.max_tokens,
            stream: asked.stream,
            tokens,
            latency_ms: u64::try_from(now.0 - asked.started.0).unwrap_or(0),
            upstream,
            outcome: outcome.to_owned(),
        }
    }
}

fn int(v: u64) -> SqlValue {
    SqlValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

/// Adds `e` to the log and drops the rows past the newest [`KEEP`].
pub fn append(s: &DoStore, e: &Entry) -> Result<(), ApiError> {
    let c = s.conn();
    c.execute(
        "INSERT INTO edge_usage (request_id, created_at, endpoint, model, prompts, n,
           max_tokens, stream, tokens, latency_ms, upstream, outcome)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        &[
            SqlValue::Text(e.request_id.clone()),
            SqlValue::Int(e.created_at),
            SqlValue::Text(e.endpoint.clone()),
            SqlValue::Text(e.model.clone()),
            int(e.prompts),
            int(e.n),
            int(e.max_tokens),
            SqlValue::Int(i64::from(e.stream)),
            int(e.tokens),
            int(e.latency_ms),
            e.upstream.clone().map_or(SqlValue::Null, SqlValue::Text),
            SqlValue::Text(e.outcome.clone()),
        ],
    )?;
    c.execute(
        "DELETE FROM edge_usage WHERE seq <= (SELECT MAX(seq) FROM edge_usage) - ?",
        &[SqlValue::Int(KEEP)],
    )?;
    Ok(())
}

/// The newest `limit` rows, newest first.
pub fn recent(s: &DoStore, limit: usize) -> Result<Vec<Entry>, ApiError> {
    let rows = s.conn().query(
        "SELECT request_id, created_at, endpoint, model, prompts, n, max_tokens, stream,
           tokens, latency_ms, upstream, outcome
         FROM edge_usage ORDER BY seq DESC LIMIT ?",
        &[SqlValue::Int(limit.min(MAX_LIMIT) as i64)],
    )?;
    rows.into_iter().map(|r| entry(&r)).collect()
}

fn entry(r: &[SqlValue]) -> Result<Entry, ApiError> {
    let text = |i: usize| match r.get(i) {
        Some(SqlValue::Text(t)) => Ok(t.clone()),
        _ => Err(ApiError::internal(format!(
            "usage log: column {i} is not text"
        ))),
    };
    let number = |i: usize| match r.get(i) {
        Some(SqlValue::Int(v)) => Ok(*v),
        _ => Err(ApiError::internal(format!(
            "usage log: column {i} is not a number"
        ))),
    };
    let count = |i: usize| number(i).map(|v| u64::try_from(v).unwrap_or(0));
    Ok(Entry {
        request_id: text(0)?,
        created_at: number(1)?,
        endpoint: text(2)?,
        model: text(3)?,
        prompts: count(4)?,
        n: count(5)?,
        max_tokens: count(6)?,
        stream: number(7)? != 0,
        tokens: count(8)?,
        latency_ms: count(9)?,
        upstream: text(10).ok(),
        outcome: text(11)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_counts_from_admission_in_seconds_and_milliseconds() {
        let asked = Asked {
            request_id: "req_1".into(),
            endpoint: "completions",
            model: "m".into(),
            prompts: 2,
            n: 3,
            max_tokens: 4,
            stream: false,
            started: Timestamp(1_700_000_000_250),
        };
        let e = Entry::ended(&asked, Timestamp(1_700_000_001_000), 30, None, "succeeded");
        assert_eq!(e.created_at, 1_700_000_000);
        assert_eq!(e.latency_ms, 750);
        // A clock that went back gives no negative latency.
        let e = Entry::ended(&asked, Timestamp(0), 0, None, "failed");
        assert_eq!(e.latency_ms, 0);
    }

    #[test]
    fn a_row_reads_back_as_it_was_written() {
        let row = vec![
            SqlValue::Text("req_1".into()),
            SqlValue::Int(5),
            SqlValue::Text("chat.completions".into()),
            SqlValue::Text("m".into()),
            SqlValue::Int(1),
            SqlValue::Int(2),
            SqlValue::Int(3),
            SqlValue::Int(1),
            SqlValue::Int(40),
            SqlValue::Int(12),
            SqlValue::Null,
            SqlValue::Text("cancelled".into()),
        ];
        let e = entry(&row).unwrap();
        assert!(e.stream && e.upstream.is_none() && e.tokens == 40 && e.outcome == "cancelled");
        assert!(entry(&row[..5]).is_err());
    }
}
