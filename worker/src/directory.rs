//! The list of the edge's keys, for `GET /admin/keys`: each key lives in an object of
//! its own, so one more object, named [`NAME`], holds a row per key (its id, name
//! and time of creation; never its secret). The entry worker adds the row after the
//! key's own object has stored the key.

use acs_core::ApiError;
use acs_core::sql::{SqlConn, SqlValue};
use serde::{Deserialize, Serialize};

use crate::store::DoStore;

/// The directory object's name; no key id (`key_` and 12 hex digits) can be it.
pub const NAME: &str = "directory";

/// The edge's own table (empty in every object but the directory).
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS edge_directory (
    id TEXT PRIMARY KEY,
    name TEXT,
    created_at INTEGER NOT NULL
)";

/// The most rows one page lists.
pub const MAX_LIMIT: usize = 1000;

/// A key as the list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    pub id: String,
    pub name: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
}

/// A page of the list: the keys after `after` (by id), `limit` at most.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageQuery {
    pub limit: usize,
    pub after: Option<String>,
}

/// Adds a key to the list.
pub fn add(s: &DoStore, k: &Listed) -> Result<(), ApiError> {
    s.conn().execute(
        "INSERT OR REPLACE INTO edge_directory (id, name, created_at) VALUES (?, ?, ?)",
        &[
            SqlValue::Text(k.id.clone()),
            k.name.clone().map_or(SqlValue::Null, SqlValue::Text),
            SqlValue::Int(k.created_at),
        ],
    )?;
    Ok(())
}

/// One page of the list, in order of id, and whether more follow.
pub fn page(s: &DoStore, q: &PageQuery) -> Result<(Vec<Listed>, bool), ApiError> {
    let limit = q.limit.clamp(1, MAX_LIMIT);
    let rows = s.conn().query(
        "SELECT id, name, created_at FROM edge_directory WHERE id > ? ORDER BY id LIMIT ?",
        &[
            SqlValue::Text(q.after.clone().unwrap_or_default()),
            SqlValue::Int(limit as i64 + 1),
        ],
    )?;
    let mut listed = rows
        .into_iter()
        .map(|r| match r.as_slice() {
            [SqlValue::Text(id), name, SqlValue::Int(at)] => Ok(Listed {
                id: id.clone(),
                name: match name {
                    SqlValue::Text(n) => Some(n.clone()),
                    _ => None,
                },
                created_at: *at,
            }),
            _ => Err(ApiError::internal("directory: a malformed row")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let more = listed.len() > limit;
    listed.truncate(limit);
    Ok((listed, more))
}
