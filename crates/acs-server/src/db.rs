//! The SQLite store: keys (hashed), budgets, holds, jobs, results and idempotency
//! records, with migrations. Every rule of `acs-core` runs inside one transaction
//! ([`Db::tx`]), so a crash leaves each rule applied whole or not at all.

use std::path::Path;
use std::sync::{Arc, Mutex};

use acs_core::store::{
    ApiKey, Budget, Hold, IdempotencyRecord, IdempotencyState, StoreError, StoreResult,
};
use acs_core::{ApiError, Job, JobId, JobResult, JobStatus, KeyHash, Store, Timestamp};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

/// Each entry migrates the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[r#"
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
"#];

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite refused.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file is from a newer ACS.
    #[error("database schema version {0} is newer than this acs knows ({1})")]
    TooNew(i64, usize),
}

/// The database: one connection behind a lock (SQLite serialises writers anyway, and
/// each rule is a short transaction).
#[derive(Debug, Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
}

fn se(e: rusqlite::Error) -> StoreError {
    StoreError(e.to_string())
}

fn de(e: serde_json::Error) -> StoreError {
    StoreError(format!("stored JSON: {e}"))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Db {
    /// Opens (creating) `dir/acs.sqlite3` and migrates it.
    pub fn open(dir: &Path) -> Result<Db, DbError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            DbError::Sqlite(rusqlite::Error::InvalidPath(
                format!("{}: {e}", dir.display()).into(),
            ))
        })?;
        let conn = Connection::open(dir.join("acs.sqlite3"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version as usize > MIGRATIONS.len() {
            return Err(DbError::TooNew(version, MIGRATIONS.len()));
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.unchecked_transaction()?;
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(Db {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` in one transaction; commits if it returns `Ok`, rolls back otherwise.
    pub fn tx<T>(
        &self,
        f: impl FnOnce(&mut SqlStore<'_>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| ApiError::internal(format!("database: {e}")))?;
        let mut store = SqlStore { tx: &tx };
        let out = f(&mut store)?;
        tx.commit()
            .map_err(|e| ApiError::internal(format!("database: {e}")))?;
        Ok(out)
    }
}

/// The [`Store`] of one transaction.
#[derive(Debug)]
pub struct SqlStore<'a> {
    tx: &'a Transaction<'a>,
}

fn key_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApiKey> {
    Ok(ApiKey {
        id: r.get(0)?,
        hash: KeyHash(r.get(1)?),
        name: r.get(2)?,
        created_at: Timestamp(r.get(3)?),
        revoked: r.get::<_, i64>(4)? != 0,
    })
}

fn hold_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Hold> {
    Ok(Hold {
        id: r.get(0)?,
        key_id: r.get(1)?,
        tokens: r.get::<_, i64>(2)? as u64,
        created_at: Timestamp(r.get(3)?),
    })
}

impl SqlStore<'_> {
    fn jobs_where(&self, sql: &str, p: impl rusqlite::Params) -> StoreResult<Vec<Job>> {
        let mut st = self.tx.prepare_cached(sql).map_err(se)?;
        let rows = st
            .query_map(p, |r| r.get::<_, String>(0))
            .map_err(se)?
            .collect::<Result<Vec<String>, _>>()
            .map_err(se)?;
        rows.iter()
            .map(|d| serde_json::from_str(d).map_err(de))
            .collect()
    }
}

const KEY_COLS: &str = "id, hash, name, created_at, revoked";

impl Store for SqlStore<'_> {
    fn key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        self.tx
            .query_row(
                &format!("SELECT {KEY_COLS} FROM keys WHERE hash = ?1"),
                [&hash.0],
                key_row,
            )
            .optional()
            .map_err(se)
    }
    fn key(&self, id: &str) -> StoreResult<Option<ApiKey>> {
        self.tx
            .query_row(
                &format!("SELECT {KEY_COLS} FROM keys WHERE id = ?1"),
                [id],
                key_row,
            )
            .optional()
            .map_err(se)
    }
    fn keys(&self) -> StoreResult<Vec<ApiKey>> {
        let mut st = self
            .tx
            .prepare(&format!(
                "SELECT {KEY_COLS} FROM keys ORDER BY created_at, id"
            ))
            .map_err(se)?;
        st.query_map([], key_row)
            .map_err(se)?
            .collect::<Result<_, _>>()
            .map_err(se)
    }
    fn put_key(&mut self, k: &ApiKey) -> StoreResult<()> {
        self.tx
            .execute(
                "INSERT INTO keys (id, hash, name, created_at, revoked) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(id) DO UPDATE SET hash = ?2, name = ?3, created_at = ?4, revoked = ?5",
                params![k.id, k.hash.0, k.name, k.created_at.0, i64::from(k.revoked)],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn budget(&self, key_id: &str) -> StoreResult<Option<Budget>> {
        self.tx
            .query_row(
                "SELECT tokens_left, max_running FROM budgets WHERE key_id = ?1",
                [key_id],
                |r| {
                    Ok(Budget {
                        tokens_left: r.get::<_, i64>(0)? as u64,
                        max_running: r.get::<_, i64>(1)? as u32,
                    })
                },
            )
            .optional()
            .map_err(se)
    }
    fn put_budget(&mut self, key_id: &str, b: &Budget) -> StoreResult<()> {
        self.tx
            .execute(
                "INSERT INTO budgets (key_id, tokens_left, max_running) VALUES (?1, ?2, ?3)
                 ON CONFLICT(key_id) DO UPDATE SET tokens_left = ?2, max_running = ?3",
                params![key_id, to_i64(b.tokens_left), i64::from(b.max_running)],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn holds(&self, key_id: &str) -> StoreResult<Vec<Hold>> {
        let mut st = self
            .tx
            .prepare_cached("SELECT id, key_id, tokens, created_at FROM holds WHERE key_id = ?1")
            .map_err(se)?;
        st.query_map([key_id], hold_row)
            .map_err(se)?
            .collect::<Result<_, _>>()
            .map_err(se)
    }
    fn all_holds(&self) -> StoreResult<Vec<Hold>> {
        let mut st = self
            .tx
            .prepare_cached("SELECT id, key_id, tokens, created_at FROM holds")
            .map_err(se)?;
        st.query_map([], hold_row)
            .map_err(se)?
            .collect::<Result<_, _>>()
            .map_err(se)
    }
    fn put_hold(&mut self, h: &Hold) -> StoreResult<()> {
        self.tx
            .execute(
                "INSERT INTO holds (id, key_id, tokens, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![h.id, h.key_id, to_i64(h.tokens), h.created_at.0],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn take_hold(&mut self, id: &str) -> StoreResult<Option<Hold>> {
        let hold = self
            .tx
            .query_row(
                "SELECT id, key_id, tokens, created_at FROM holds WHERE id = ?1",
                [id],
                hold_row,
            )
            .optional()
            .map_err(se)?;
        if hold.is_some() {
            self.tx
                .execute("DELETE FROM holds WHERE id = ?1", [id])
                .map_err(se)?;
        }
        Ok(hold)
    }
    fn job(&self, id: JobId) -> StoreResult<Option<Job>> {
        Ok(self
            .jobs_where("SELECT data FROM jobs WHERE id = ?1", [id.to_string()])?
            .pop())
    }
    fn put_job(&mut self, j: &Job) -> StoreResult<()> {
        let data = serde_json::to_string(j).map_err(de)?;
        self.tx
            .execute(
                "INSERT INTO jobs (id, key_id, status, expires_at, data) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(id) DO UPDATE SET status = ?3, expires_at = ?4, data = ?5",
                params![
                    j.id.to_string(),
                    j.key_id,
                    j.status.as_str(),
                    j.expires_at.map(|t| t.0),
                    data
                ],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn jobs_of(&self, key_id: &str, before: Option<JobId>, limit: usize) -> StoreResult<Vec<Job>> {
        // UUIDv7 text sorts by creation time.
        let before = before.map(|b| b.to_string()).unwrap_or_else(|| "~".into());
        self.jobs_where(
            "SELECT data FROM jobs WHERE key_id = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3",
            params![key_id, before, limit as i64],
        )
    }
    fn jobs_with_status(&self, status: JobStatus) -> StoreResult<Vec<Job>> {
        self.jobs_where(
            "SELECT data FROM jobs WHERE status = ?1 ORDER BY id",
            [status.as_str()],
        )
    }
    fn put_result(&mut self, id: JobId, r: &JobResult) -> StoreResult<()> {
        let data = serde_json::to_string(r).map_err(de)?;
        self.tx
            .execute(
                "INSERT INTO results (job_id, data) VALUES (?1, ?2)
                 ON CONFLICT(job_id) DO UPDATE SET data = ?2",
                params![id.to_string(), data],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn result(&self, id: JobId) -> StoreResult<Option<JobResult>> {
        let data: Option<String> = self
            .tx
            .query_row(
                "SELECT data FROM results WHERE job_id = ?1",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()
            .map_err(se)?;
        data.map(|d| serde_json::from_str(&d).map_err(de))
            .transpose()
    }
    fn purge_results(&mut self, now: Timestamp) -> StoreResult<usize> {
        self.tx
            .execute(
                "DELETE FROM results WHERE job_id IN
                   (SELECT id FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?1)",
                [now.0],
            )
            .map_err(se)
    }
    fn idempotency(&self, key_id: &str, idem: &str) -> StoreResult<Option<IdempotencyRecord>> {
        self.tx
            .query_row(
                "SELECT body_digest, job_id, created_at FROM idempotency WHERE key_id = ?1 AND idem_key = ?2",
                [key_id, idem],
                |r| {
                    let job: Option<String> = r.get(1)?;
                    Ok((r.get::<_, String>(0)?, job, r.get::<_, i64>(2)?))
                },
            )
            .optional()
            .map_err(se)?
            .map(|(digest, job, created)| {
                let state = match job {
                    None => IdempotencyState::Accepting,
                    Some(j) => IdempotencyState::Done(
                        j.parse().map_err(|e| StoreError(format!("stored job id: {e}")))?,
                    ),
                };
                Ok(IdempotencyRecord {
                    key_id: key_id.to_owned(),
                    idempotency_key: idem.to_owned(),
                    body_digest: digest,
                    state,
                    created_at: Timestamp(created),
                })
            })
            .transpose()
    }
    fn put_idempotency(&mut self, rec: &IdempotencyRecord) -> StoreResult<()> {
        let job = match &rec.state {
            IdempotencyState::Accepting => None,
            IdempotencyState::Done(id) => Some(id.to_string()),
        };
        self.tx
            .execute(
                "INSERT INTO idempotency (key_id, idem_key, body_digest, job_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(key_id, idem_key) DO UPDATE SET body_digest = ?3, job_id = ?4, created_at = ?5",
                params![rec.key_id, rec.idempotency_key, rec.body_digest, job, rec.created_at.0],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn delete_idempotency(&mut self, key_id: &str, idem: &str) -> StoreResult<()> {
        self.tx
            .execute(
                "DELETE FROM idempotency WHERE key_id = ?1 AND idem_key = ?2",
                [key_id, idem],
            )
            .map(|_| ())
            .map_err(se)
    }
    fn purge_idempotency(&mut self, before: Timestamp) -> StoreResult<usize> {
        self.tx
            .execute("DELETE FROM idempotency WHERE created_at < ?1", [before.0])
            .map_err(se)
    }
}
