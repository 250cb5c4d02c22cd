//! The SQLite store: keys (hashed), budgets, holds, jobs, results and idempotency
//! records, with migrations. Every rule of `acs-core` runs inside one transaction
//! ([`Db::tx`]), so a crash leaves each rule applied whole or not at all.

use std::path::Path;
use std::sync::{Arc, Mutex};

use acs_core::ApiError;
use acs_core::sql::{MIGRATIONS, SqlConn, SqlValue};
use acs_core::store::{StoreError, StoreResult};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Transaction, params_from_iter};

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite refused.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file is from a newer ACS.
    #[error("database schema version {0} is newer than this acs knows ({1})")]
    TooNew(i64, usize),
    /// Another `acs serve` holds the directory.
    #[error("{0} is in use by another acs serve; stop it, or give this one another --data")]
    InUse(std::path::PathBuf),
    /// The directory or its lock file could not be had.
    #[error("{0}: {1}")]
    Io(std::path::PathBuf, std::io::Error),
}

/// One `acs serve`'s hold on its data directory: an exclusive lock on `serve.lock`
/// in it, which the system releases when the process ends, however it ends. Other
/// commands (`acs keys`) use the database beside a running server, as SQLite allows.
#[derive(Debug)]
pub struct DataLock {
    _file: std::fs::File,
}

impl DataLock {
    /// Locks `dir` (creating it), or says that another server holds it.
    pub fn acquire(dir: &Path) -> Result<DataLock, DbError> {
        let io = |e| DbError::Io(dir.to_owned(), e);
        std::fs::create_dir_all(dir).map_err(io)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("serve.lock"))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(DataLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(DbError::InUse(dir.to_owned())),
            Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
        }
    }
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
    ///
    /// On a thread of the server's async runtime, the transaction (a wait for the
    /// connection's lock, and a write to disk with `synchronous = FULL`) runs as a
    /// blocking section: the runtime moves its other tasks to another thread meanwhile,
    /// so that a slow disk never stalls every connection that thread serves.
    pub fn tx<T>(
        &self,
        f: impl FnOnce(&mut SqlStore<'_>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let on_runtime = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_runtime {
            tokio::task::block_in_place(|| self.tx_here(f))
        } else {
            self.tx_here(f)
        }
    }

    fn tx_here<T>(
        &self,
        f: impl FnOnce(&mut SqlStore<'_>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| ApiError::internal(format!("database: {e}")))?;
        let mut store = SqlStore::new(TxConn { tx: &tx });
        let out = f(&mut store)?;
        tx.commit()
            .map_err(|e| ApiError::internal(format!("database: {e}")))?;
        Ok(out)
    }
}

/// One transaction of the server's SQLite, as the shared SQL store runs on it.
#[derive(Debug)]
pub struct TxConn<'a> {
    tx: &'a Transaction<'a>,
}

/// The [`acs_core::Store`] of one transaction.
pub type SqlStore<'a> = acs_core::sql::SqlStore<TxConn<'a>>;

fn to_sql(v: &SqlValue) -> rusqlite::types::Value {
    match v {
        SqlValue::Null => rusqlite::types::Value::Null,
        SqlValue::Int(i) => rusqlite::types::Value::Integer(*i),
        SqlValue::Text(s) => rusqlite::types::Value::Text(s.clone()),
    }
}

fn from_sql(v: ValueRef<'_>) -> StoreResult<SqlValue> {
    match v {
        ValueRef::Null => Ok(SqlValue::Null),
        ValueRef::Integer(i) => Ok(SqlValue::Int(i)),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(|s| SqlValue::Text(s.to_owned()))
            .map_err(|e| StoreError(format!("stored text: {e}"))),
        other => Err(StoreError(format!(
            "unexpected stored {:?}",
            other.data_type()
        ))),
    }
}

impl SqlConn for TxConn<'_> {
    fn query(&self, sql: &str, params: &[SqlValue]) -> StoreResult<Vec<Vec<SqlValue>>> {
        let mut st = self.tx.prepare_cached(sql).map_err(se)?;
        let width = st.column_count();
        let mut rows = st
            .query(params_from_iter(params.iter().map(to_sql)))
            .map_err(se)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(se)? {
            let cols = (0..width)
                .map(|i| from_sql(row.get_ref(i).map_err(se)?))
                .collect::<StoreResult<Vec<_>>>()?;
            out.push(cols);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use acs_core::{Job, JobId, JobStatus, Store, Timestamp};

    use super::*;

    /// The SQL of the queries the dispatcher and the purge run, on SQLite itself.
    #[test]
    fn oldest_queued_per_key_and_expired_jobs_in_sqlite() {
        let dir = std::env::temp_dir().join(format!("acs-db-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = Db::open(&dir).unwrap();
        let job = |r: u8, key: &str, t: i64| {
            Job::new(
                JobId::new_v7(Timestamp(t), [r; 10]),
                key,
                "m",
                "{}".into(),
                Timestamp(t),
            )
        };
        let made = [
            job(1, "a", 10),
            job(2, "b", 20),
            job(3, "a", 30),
            job(4, "b", 40),
        ];
        let (oldest, gone, left) = db
            .tx(|s| {
                for j in &made {
                    s.put_job(j)?;
                }
                let mut ended = made[0].clone();
                ended.status = JobStatus::Failed;
                ended.expires_at = Some(Timestamp(100));
                s.put_job(&ended)?;
                let oldest: Vec<JobId> = s.oldest_queued_per_key()?.iter().map(|j| j.id).collect();
                let gone = (s.purge_jobs(Timestamp(100))?, s.purge_jobs(Timestamp(101))?);
                let left = s.jobs_of("a", None, 10)?.len();
                Ok((oldest, gone, left))
            })
            .unwrap();
        assert_eq!(oldest, vec![made[1].id, made[2].id]);
        assert_eq!(gone, (0, 1));
        assert_eq!(left, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A result of many megabytes is stored in parts no bigger than a Durable
    /// Object's value limit, cut between characters, and read back whole.
    #[test]
    fn a_big_result_is_stored_in_parts_and_read_back_whole() {
        use acs_core::job::JobResult;
        use acs_core::response::{Completion, Usage};
        use acs_core::sql::RESULT_PART_BYTES;
        let dir = std::env::temp_dir().join(format!("acs-db-parts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = Db::open(&dir).unwrap();
        let id = JobId::new_v7(Timestamp(1), [7; 10]);
        let mut job = Job::new(id, "k", "m", "{}".into(), Timestamp(1));
        job.status = JobStatus::Succeeded;
        job.expires_at = Some(Timestamp(50));
        // Three-byte characters, so that a cut at a byte count would split one.
        let result = JobResult::Completion(acs_core::Answer::Text(Completion {
            id: "\u{2603}".repeat(RESULT_PART_BYTES + 5),
            object: "text_completion".into(),
            created: 1,
            model: "m".into(),
            choices: vec![],
            usage: Usage::default(),
            activations: None,
        }));
        let (back, sizes) = db
            .tx(|s| {
                s.put_job(&job)?;
                s.put_result(id, &result)?;
                s.put_result(id, &result)?;
                let sizes: Vec<usize> = s
                    .conn()
                    .query(
                        "SELECT length(CAST(data AS BLOB)) FROM result_parts ORDER BY part",
                        &[],
                    )?
                    .into_iter()
                    .map(|r| match r[0] {
                        SqlValue::Int(n) => n as usize,
                        _ => usize::MAX,
                    })
                    .collect();
                Ok((s.result(id)?, sizes))
            })
            .unwrap();
        assert_eq!(back, Some(result));
        assert_eq!(sizes.len(), 4, "{sizes:?}");
        assert!(sizes.iter().all(|&n| n <= RESULT_PART_BYTES), "{sizes:?}");
        let purged = db.tx(|s| Ok(s.purge_results(Timestamp(50))?)).unwrap();
        assert_eq!(purged, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
