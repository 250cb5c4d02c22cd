//! A key's Durable Object storage as the contract's [`Store`]: the same SQLite schema
//! and statements as the server ([`acs_core::sql`]), run on the object's SQL storage.
//!
//! Each rule runs inside `transactionSync`, so a rule that fails half way leaves
//! nothing written, as a rolled-back SQLite transaction does on the server.

use std::cell::RefCell;
use std::rc::Rc;

use acs_core::ApiError;
use acs_core::sql::{MIGRATIONS, SqlConn, SqlStore, SqlValue};
use acs_core::store::{StoreError, StoreResult};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use worker::{SqlStorage, SqlStorageValue, Storage};

/// The object's SQL storage, one statement at a time.
#[derive(Debug, Clone)]
pub struct DoConn {
    sql: SqlStorage,
}

/// The [`acs_core::Store`] of one transaction.
pub type DoStore = SqlStore<DoConn>;

fn to_js(v: &SqlValue) -> SqlStorageValue {
    match v {
        SqlValue::Null => SqlStorageValue::Null,
        SqlValue::Int(i) => SqlStorageValue::Integer(*i),
        SqlValue::Text(s) => SqlStorageValue::String(s.clone()),
    }
}

fn from_js(v: SqlStorageValue) -> StoreResult<SqlValue> {
    match v {
        SqlStorageValue::Null => Ok(SqlValue::Null),
        SqlStorageValue::Integer(i) => Ok(SqlValue::Int(i)),
        SqlStorageValue::Boolean(b) => Ok(SqlValue::Int(i64::from(b))),
        SqlStorageValue::String(s) => Ok(SqlValue::Text(s)),
        other => Err(StoreError(format!("unexpected stored value {other:?}"))),
    }
}

fn se(e: worker::Error) -> StoreError {
    StoreError(e.to_string())
}

impl SqlConn for DoConn {
    fn query(&self, sql: &str, params: &[SqlValue]) -> StoreResult<Vec<Vec<SqlValue>>> {
        let cursor = self
            .sql
            .exec(sql, params.iter().map(to_js).collect::<Vec<_>>())
            .map_err(se)?;
        cursor
            .raw()
            .map(|row| row.map_err(se)?.into_iter().map(from_js).collect())
            .collect()
    }
}

/// The storage of one Durable Object.
#[derive(Debug)]
pub struct Db {
    storage: Storage,
}

impl Db {
    /// Opens the object's storage and brings its schema up to date: the contract's
    /// migrations, then the edge's own tables (`CREATE TABLE IF NOT EXISTS`
    /// statements in `tables`).
    pub fn open(storage: Storage, tables: &'static [&'static str]) -> Result<Db, ApiError> {
        let db = Db { storage };
        db.tx(move |s| {
            let conn = s.conn();
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                &[],
            )?;
            let rows = conn.query("SELECT version FROM schema_version", &[])?;
            let version = match rows.first().and_then(|r| r.first()) {
                Some(SqlValue::Int(v)) => usize::try_from(*v).unwrap_or(usize::MAX),
                _ => 0,
            };
            if version > MIGRATIONS.len() {
                return Err(ApiError::internal(format!(
                    "stored schema version {version} is newer than this edge knows"
                )));
            }
            for m in &MIGRATIONS[version..] {
                for statement in m.split(';').filter(|s| !s.trim().is_empty()) {
                    conn.execute(statement, &[])?;
                }
            }
            for table in tables {
                conn.execute(table, &[])?;
            }
            conn.execute("DELETE FROM schema_version", &[])?;
            conn.execute(
                "INSERT INTO schema_version (version) VALUES (?)",
                &[SqlValue::Int(MIGRATIONS.len() as i64)],
            )?;
            Ok(())
        })?;
        Ok(db)
    }

    /// Runs `f` in one transaction: its writes land together, or (when it returns an
    /// error) not at all.
    pub fn tx<T: 'static>(
        &self,
        f: impl FnOnce(&mut DoStore) -> Result<T, ApiError> + 'static,
    ) -> Result<T, ApiError> {
        let out: Rc<RefCell<Option<Result<T, ApiError>>>> = Rc::default();
        let slot = Rc::clone(&out);
        let conn = DoConn {
            sql: self.storage.sql(),
        };
        let body = Closure::once_into_js(move || -> Result<JsValue, JsValue> {
            let mut store = DoStore::new(conn);
            let r = f(&mut store);
            let failed = r.is_err();
            *slot.borrow_mut() = Some(r);
            // Throwing rolls the transaction back.
            if failed {
                Err(JsValue::from_str("rule refused; rolled back"))
            } else {
                Ok(JsValue::UNDEFINED)
            }
        });
        let raw: &JsValue = self.storage.as_raw().as_ref();
        let run = js_sys::Reflect::get(raw, &JsValue::from_str("transactionSync"))
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
            .ok_or_else(|| ApiError::internal("this runtime has no transactionSync"))?;
        let called = run.call1(raw, &body);
        let result = out.borrow_mut().take();
        match (result, called) {
            (Some(r), _) => r,
            (None, Err(e)) => Err(ApiError::internal(format!(
                "storage transaction failed: {e:?}"
            ))),
            (None, Ok(_)) => Err(ApiError::internal("storage transaction did not run")),
        }
    }
}
