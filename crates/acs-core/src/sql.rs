//! The [`Store`] on SQLite, written once for every SQLite the project runs on: the
//! server's (rusqlite) and the edge's (Durable Object SQL storage).
//!
//! A backend supplies a [`SqlConn`], which runs one statement with positional `?`
//! parameters and returns its rows; [`SqlStore`] turns the storage methods into those
//! statements. Plain `?` and `excluded.` keep the SQL to what both backends take.
//! Transactions stay with the backend: it runs each rule of [`crate::ledger`] and
//! [`crate::jobs`] in one of its own.

use crate::clock::Timestamp;
use crate::ids::{JobId, KeyHash};
use crate::job::{Job, JobResult, JobStatus};
use crate::store::{
    ApiKey, Budget, Hold, IdempotencyRecord, IdempotencyState, Rate, Store, StoreError, StoreResult,
};

/// Each entry migrates the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE keys (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    name TEXT,
    created_at INTEGER NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE budgets (
    key_id TEXT PRIMARY KEY REFERENCES keys(id),
    tokens_left INTEGER NOT NULL,
    max_running INTEGER NOT NULL
);
CREATE TABLE holds (
    id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX holds_by_key ON holds(key_id);
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    status TEXT NOT NULL,
    expires_at INTEGER,
    data TEXT NOT NULL
);
CREATE INDEX jobs_by_key ON jobs(key_id, id);
CREATE INDEX jobs_by_status ON jobs(status, id);
CREATE TABLE results (
    job_id TEXT PRIMARY KEY,
    data TEXT NOT NULL
);
CREATE TABLE idempotency (
    key_id TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    body_digest TEXT NOT NULL,
    job_id TEXT,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (key_id, idem_key)
);
"#,
    // A result in parts of at most `RESULT_PART_BYTES`: a Durable Object stores no
    // value over 2 MB, and a job's result can be many megabytes.
    r#"
CREATE TABLE result_parts (
    job_id TEXT NOT NULL,
    part INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, part)
);
INSERT INTO result_parts (job_id, part, data) SELECT job_id, 0, data FROM results;
DROP TABLE results;
"#,
    // Per-minute traffic limits of a key, with the current minute's counts.
    r#"
CREATE TABLE rates (
    key_id TEXT PRIMARY KEY REFERENCES keys(id),
    requests_per_minute INTEGER,
    tokens_per_minute INTEGER,
    window_start INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    tokens INTEGER NOT NULL
);
"#,
];

/// The most bytes of a result's JSON that one stored value holds.
pub const RESULT_PART_BYTES: usize = 1 << 20;

/// `text` cut into pieces of at most `max` bytes, each ending on a character boundary.
fn parts(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = max.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (head, tail) = rest.split_at(end);
        out.push(head);
        rest = tail;
    }
    out
}

/// One SQL value, as both backends bind and return them.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// An integer. Every stored integer fits JavaScript's safe range (2^53): token
    /// counts are capped there and times are milliseconds.
    Int(i64),
    /// Text.
    Text(String),
}

impl From<&str> for SqlValue {
    fn from(s: &str) -> Self {
        SqlValue::Text(s.to_owned())
    }
}
impl From<String> for SqlValue {
    fn from(s: String) -> Self {
        SqlValue::Text(s)
    }
}
impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        SqlValue::Int(v)
    }
}
impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SqlValue::Null, Into::into)
    }
}

/// Where JavaScript stops counting integers exactly; stored counts stay under it.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

fn count(v: u64) -> SqlValue {
    SqlValue::Int(v.min(MAX_SAFE_INTEGER) as i64)
}

/// Runs one statement of the backend.
pub trait SqlConn {
    /// Runs `sql` with `params` bound to its `?`s, in order; returns every row.
    fn query(&self, sql: &str, params: &[SqlValue]) -> StoreResult<Vec<Vec<SqlValue>>>;

    /// Runs a statement for its effect.
    fn execute(&self, sql: &str, params: &[SqlValue]) -> StoreResult<()> {
        self.query(sql, params).map(|_| ())
    }
}

/// The [`Store`] over a [`SqlConn`] (one transaction's worth of it).
#[derive(Debug)]
pub struct SqlStore<C> {
    conn: C,
}

impl<C: SqlConn> SqlStore<C> {
    /// The store over `conn`.
    pub fn new(conn: C) -> Self {
        SqlStore { conn }
    }

    /// The connection, for a backend's own statements (its schema, its housekeeping).
    pub fn conn(&self) -> &C {
        &self.conn
    }
}

/// One row's columns, read by position with the stored types checked.
struct Row(std::vec::IntoIter<SqlValue>);

impl Row {
    fn next(&mut self) -> StoreResult<SqlValue> {
        self.0
            .next()
            .ok_or_else(|| StoreError("a stored row has too few columns".into()))
    }
    fn text(&mut self) -> StoreResult<String> {
        match self.next()? {
            SqlValue::Text(s) => Ok(s),
            v => Err(StoreError(format!("expected stored text, found {v:?}"))),
        }
    }
    fn opt_text(&mut self) -> StoreResult<Option<String>> {
        match self.next()? {
            SqlValue::Null => Ok(None),
            SqlValue::Text(s) => Ok(Some(s)),
            v => Err(StoreError(format!("expected stored text, found {v:?}"))),
        }
    }
    fn int(&mut self) -> StoreResult<i64> {
        match self.next()? {
            SqlValue::Int(i) => Ok(i),
            v => Err(StoreError(format!(
                "expected a stored integer, found {v:?}"
            ))),
        }
    }
    fn count(&mut self) -> StoreResult<u64> {
        u64::try_from(self.int()?).map_err(|_| StoreError("a stored count is negative".into()))
    }
    fn opt_count(&mut self) -> StoreResult<Option<u64>> {
        match self.next()? {
            SqlValue::Null => Ok(None),
            SqlValue::Int(i) => u64::try_from(i)
                .map(Some)
                .map_err(|_| StoreError("a stored count is negative".into())),
            v => Err(StoreError(format!(
                "expected a stored integer, found {v:?}"
            ))),
        }
    }
}

/// An optional count as a SQL value: NULL for none.
fn opt_count(v: Option<u64>) -> SqlValue {
    v.map_or(SqlValue::Null, count)
}

fn json<T: serde::de::DeserializeOwned>(text: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError(format!("stored JSON: {e}")))
}

fn to_json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| StoreError(format!("JSON: {e}")))
}

const KEY_COLS: &str = "SELECT id, hash, name, created_at, revoked FROM keys";
const HOLD_COLS: &str = "SELECT id, key_id, tokens, created_at FROM holds";

impl<C: SqlConn> SqlStore<C> {
    fn rows<T>(
        &self,
        sql: &str,
        params: &[SqlValue],
        f: impl Fn(&mut Row) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        self.conn
            .query(sql, params)?
            .into_iter()
            .map(|r| f(&mut Row(r.into_iter())))
            .collect()
    }

    fn keys_where(&self, sql: &str, params: &[SqlValue]) -> StoreResult<Vec<ApiKey>> {
        self.rows(sql, params, |r| {
            Ok(ApiKey {
                id: r.text()?,
                hash: KeyHash(r.text()?),
                name: r.opt_text()?,
                created_at: Timestamp(r.int()?),
                revoked: r.int()? != 0,
            })
        })
    }

    fn holds_where(&self, sql: &str, params: &[SqlValue]) -> StoreResult<Vec<Hold>> {
        self.rows(sql, params, |r| {
            Ok(Hold {
                id: r.text()?,
                key_id: r.text()?,
                tokens: r.count()?,
                created_at: Timestamp(r.int()?),
            })
        })
    }

    fn jobs_where(&self, sql: &str, params: &[SqlValue]) -> StoreResult<Vec<Job>> {
        self.rows(sql, params, |r| json(&r.text()?))
    }
}

impl<C: SqlConn> Store for SqlStore<C> {
    fn key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        let sql = format!("{KEY_COLS} WHERE hash = ?");
        Ok(self.keys_where(&sql, &[hash.0.as_str().into()])?.pop())
    }
    fn key(&self, id: &str) -> StoreResult<Option<ApiKey>> {
        let sql = format!("{KEY_COLS} WHERE id = ?");
        Ok(self.keys_where(&sql, &[id.into()])?.pop())
    }
    fn keys(&self) -> StoreResult<Vec<ApiKey>> {
        self.keys_where(&format!("{KEY_COLS} ORDER BY created_at, id"), &[])
    }
    fn put_key(&mut self, k: &ApiKey) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO keys (id, hash, name, created_at, revoked) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(id) DO UPDATE SET hash = excluded.hash, name = excluded.name,
               created_at = excluded.created_at, revoked = excluded.revoked",
            &[
                k.id.as_str().into(),
                k.hash.0.as_str().into(),
                k.name.clone().into(),
                k.created_at.0.into(),
                i64::from(k.revoked).into(),
            ],
        )
    }
    fn budget(&self, key_id: &str) -> StoreResult<Option<Budget>> {
        let mut rows = self.rows(
            "SELECT tokens_left, max_running FROM budgets WHERE key_id = ?",
            &[key_id.into()],
            |r| {
                Ok(Budget {
                    tokens_left: r.count()?,
                    max_running: u32::try_from(r.count()?).unwrap_or(u32::MAX),
                })
            },
        )?;
        Ok(rows.pop())
    }
    fn put_budget(&mut self, key_id: &str, b: &Budget) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO budgets (key_id, tokens_left, max_running) VALUES (?, ?, ?)
             ON CONFLICT(key_id) DO UPDATE SET tokens_left = excluded.tokens_left,
               max_running = excluded.max_running",
            &[
                key_id.into(),
                count(b.tokens_left),
                i64::from(b.max_running).into(),
            ],
        )
    }
    fn rate(&self, key_id: &str) -> StoreResult<Option<Rate>> {
        let mut rows = self.rows(
            "SELECT requests_per_minute, tokens_per_minute, window_start, requests, tokens
             FROM rates WHERE key_id = ?",
            &[key_id.into()],
            |r| {
                Ok(Rate {
                    requests_per_minute: r
                        .opt_count()?
                        .map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
                    tokens_per_minute: r.opt_count()?,
                    window_start: Timestamp(r.int()?),
                    requests: u32::try_from(r.count()?).unwrap_or(u32::MAX),
                    tokens: r.count()?,
                })
            },
        )?;
        Ok(rows.pop())
    }
    fn put_rate(&mut self, key_id: &str, rate: &Rate) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO rates (key_id, requests_per_minute, tokens_per_minute, window_start,
               requests, tokens) VALUES (?, ?, ?, ?, ?, ?)
             ON CONFLICT(key_id) DO UPDATE SET
               requests_per_minute = excluded.requests_per_minute,
               tokens_per_minute = excluded.tokens_per_minute,
               window_start = excluded.window_start, requests = excluded.requests,
               tokens = excluded.tokens",
            &[
                key_id.into(),
                opt_count(rate.requests_per_minute.map(u64::from)),
                opt_count(rate.tokens_per_minute),
                rate.window_start.0.into(),
                i64::from(rate.requests).into(),
                count(rate.tokens),
            ],
        )
    }
    fn holds(&self, key_id: &str) -> StoreResult<Vec<Hold>> {
        self.holds_where(&format!("{HOLD_COLS} WHERE key_id = ?"), &[key_id.into()])
    }
    fn all_holds(&self) -> StoreResult<Vec<Hold>> {
        self.holds_where(HOLD_COLS, &[])
    }
    fn put_hold(&mut self, h: &Hold) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO holds (id, key_id, tokens, created_at) VALUES (?, ?, ?, ?)",
            &[
                h.id.as_str().into(),
                h.key_id.as_str().into(),
                count(h.tokens),
                h.created_at.0.into(),
            ],
        )
    }
    fn take_hold(&mut self, id: &str) -> StoreResult<Option<Hold>> {
        Ok(self
            .holds_where(
                "DELETE FROM holds WHERE id = ? RETURNING id, key_id, tokens, created_at",
                &[id.into()],
            )?
            .pop())
    }
    fn job(&self, id: JobId) -> StoreResult<Option<Job>> {
        Ok(self
            .jobs_where(
                "SELECT data FROM jobs WHERE id = ?",
                &[id.to_string().into()],
            )?
            .pop())
    }
    fn put_job(&mut self, j: &Job) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO jobs (id, key_id, status, expires_at, data) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(id) DO UPDATE SET status = excluded.status,
               expires_at = excluded.expires_at, data = excluded.data",
            &[
                j.id.to_string().into(),
                j.key_id.as_str().into(),
                j.status.as_str().into(),
                j.expires_at.map(|t| t.0).into(),
                to_json(j)?.into(),
            ],
        )
    }
    fn jobs_of(&self, key_id: &str, before: Option<JobId>, limit: usize) -> StoreResult<Vec<Job>> {
        // UUIDv7 text sorts by creation time; "~" sorts after every id.
        let before = before.map_or_else(|| "~".to_owned(), |b| b.to_string());
        self.jobs_where(
            "SELECT data FROM jobs WHERE key_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
            &[
                key_id.into(),
                before.into(),
                i64::try_from(limit).unwrap_or(i64::MAX).into(),
            ],
        )
    }
    fn jobs_with_status(&self, status: JobStatus) -> StoreResult<Vec<Job>> {
        self.jobs_where(
            "SELECT data FROM jobs WHERE status = ? ORDER BY id",
            &[status.as_str().into()],
        )
    }
    fn queued_jobs_of(&self, key_id: &str) -> StoreResult<u64> {
        let mut rows = self.rows(
            "SELECT COUNT(*) FROM jobs WHERE key_id = ? AND status = ?",
            &[key_id.into(), JobStatus::Queued.as_str().into()],
            |r| r.count(),
        )?;
        Ok(rows.pop().unwrap_or(0))
    }
    fn put_result(&mut self, id: JobId, r: &JobResult) -> StoreResult<()> {
        let job = SqlValue::from(id.to_string());
        self.conn.execute(
            "DELETE FROM result_parts WHERE job_id = ?",
            std::slice::from_ref(&job),
        )?;
        let text = to_json(r)?;
        for (i, part) in parts(&text, RESULT_PART_BYTES).into_iter().enumerate() {
            self.conn.execute(
                "INSERT INTO result_parts (job_id, part, data) VALUES (?, ?, ?)",
                &[job.clone(), (i as i64).into(), part.into()],
            )?;
        }
        Ok(())
    }
    fn result(&self, id: JobId) -> StoreResult<Option<JobResult>> {
        let parts = self.rows(
            "SELECT data FROM result_parts WHERE job_id = ? ORDER BY part",
            &[id.to_string().into()],
            |r| r.text(),
        )?;
        if parts.is_empty() {
            return Ok(None);
        }
        json(&parts.concat()).map(Some)
    }
    fn purge_results(&mut self, now: Timestamp) -> StoreResult<usize> {
        let deleted = self.conn.query(
            "DELETE FROM result_parts WHERE job_id IN
               (SELECT id FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?)
             RETURNING part",
            &[now.0.into()],
        )?;
        Ok(deleted
            .iter()
            .filter(|row| row.first() == Some(&SqlValue::Int(0)))
            .count())
    }
    fn purge_jobs(&mut self, before: Timestamp) -> StoreResult<usize> {
        self.conn.execute(
            "DELETE FROM result_parts WHERE job_id IN
               (SELECT id FROM jobs WHERE expires_at IS NOT NULL AND expires_at < ?)",
            &[before.0.into()],
        )?;
        Ok(self
            .conn
            .query(
                "DELETE FROM jobs WHERE expires_at IS NOT NULL AND expires_at < ? RETURNING id",
                &[before.0.into()],
            )?
            .len())
    }
    fn oldest_queued_per_key(&self) -> StoreResult<Vec<Job>> {
        self.jobs_where(
            "SELECT data FROM jobs WHERE id IN
               (SELECT MIN(id) FROM jobs WHERE status = ? GROUP BY key_id)
             ORDER BY id",
            &[JobStatus::Queued.as_str().into()],
        )
    }
    fn idempotency(&self, key_id: &str, idem: &str) -> StoreResult<Option<IdempotencyRecord>> {
        let mut rows = self.rows(
            "SELECT body_digest, job_id, created_at FROM idempotency
             WHERE key_id = ? AND idem_key = ?",
            &[key_id.into(), idem.into()],
            |r| {
                let body_digest = r.text()?;
                let state = match r.opt_text()? {
                    None => IdempotencyState::Accepting,
                    Some(j) => IdempotencyState::Done(
                        j.parse()
                            .map_err(|e| StoreError(format!("stored job id: {e}")))?,
                    ),
                };
                Ok(IdempotencyRecord {
                    key_id: key_id.to_owned(),
                    idempotency_key: idem.to_owned(),
                    body_digest,
                    state,
                    created_at: Timestamp(r.int()?),
                })
            },
        )?;
        Ok(rows.pop())
    }
    fn put_idempotency(&mut self, rec: &IdempotencyRecord) -> StoreResult<()> {
        let job = match &rec.state {
            IdempotencyState::Accepting => None,
            IdempotencyState::Done(id) => Some(id.to_string()),
        };
        self.conn.execute(
            "INSERT INTO idempotency (key_id, idem_key, body_digest, job_id, created_at)
             VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(key_id, idem_key) DO UPDATE SET body_digest = excluded.body_digest,
               job_id = excluded.job_id, created_at = excluded.created_at",
            &[
                rec.key_id.as_str().into(),
                rec.idempotency_key.as_str().into(),
                rec.body_digest.as_str().into(),
                job.into(),
                rec.created_at.0.into(),
            ],
        )
    }
    fn delete_idempotency(&mut self, key_id: &str, idem: &str) -> StoreResult<()> {
        self.conn.execute(
            "DELETE FROM idempotency WHERE key_id = ? AND idem_key = ?",
            &[key_id.into(), idem.into()],
        )
    }
    fn purge_idempotency(&mut self, before: Timestamp) -> StoreResult<usize> {
        Ok(self
            .conn
            .query(
                "DELETE FROM idempotency WHERE created_at < ? RETURNING key_id",
                &[before.0.into()],
            )?
            .len())
    }
}
