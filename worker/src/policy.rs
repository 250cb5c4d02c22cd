//! What a key may do beyond its Budget and traffic limits: when it expires, and which
//! models it may ask for. The admin sets both (`POST /admin/keys`, `POST
//! /admin/keys/{id}/policy`); the key's object checks them on every request, in the
//! same read as the key's record.

use acs_core::sql::{SqlConn, SqlValue};
use acs_core::{ApiError, ErrorCode, Timestamp};
use serde::{Deserialize, Serialize};

use crate::store::DoStore;

/// The edge's own table, beside the contract's schema (one row per key object).
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS edge_policy (
    key_id TEXT PRIMARY KEY,
    expires_at INTEGER,
    models TEXT
)";

/// A key's expiry and model allow-list; `None` is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Unix seconds from which the key is refused.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// The models the key may ask for; any model when absent.
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

/// A change to a key's policy: each field present replaces the stored one (`null`
/// lifts that limit), each absent field stays.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    #[serde(default, with = "present")]
    pub expires_at: Option<Option<i64>>,
    #[serde(default, with = "present")]
    pub models: Option<Option<Vec<String>>>,
}

/// `Some(value)` for a field that is present, `null` included, so that a change can
/// tell "lift the limit" (`null`) from "leave it" (absent).
mod present {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        Option::<T>::deserialize(d).map(Some)
    }
}

/// The most models an allow-list names, and the longest name: an allow-list is
/// read on every request.
const MAX_MODELS: usize = 64;
const MAX_MODEL_NAME: usize = 256;

impl Policy {
    /// `self` with `change` applied, or why the change is refused.
    pub fn changed(mut self, change: PolicyChange) -> Result<Policy, ApiError> {
        if let Some(at) = change.expires_at {
            self.expires_at = at;
        }
        if let Some(models) = change.models {
            self.models = models;
        }
        self.check()?;
        Ok(self)
    }

    /// Refuses values no request could meet sensibly.
    pub fn check(&self) -> Result<(), ApiError> {
        if let Some(at) = self.expires_at
            && !(0..=acs_core::sql::MAX_SAFE_INTEGER as i64 / 1000).contains(&at)
        {
            return Err(ApiError::invalid_value(
                "expires_at",
                "expires_at is a time in Unix seconds.",
            ));
        }
        if let Some(models) = &self.models
            && (models.len() > MAX_MODELS
                || models
                    .iter()
                    .any(|m| m.is_empty() || m.len() > MAX_MODEL_NAME))
        {
            return Err(ApiError::invalid_value(
                "models",
                format!(
                    "models lists at most {MAX_MODELS} model ids of 1 to {MAX_MODEL_NAME} bytes."
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a key past its expiry, as a key that is not valid (401).
    pub fn check_key(&self, now: Timestamp) -> Result<(), ApiError> {
        match self.expires_at {
            Some(at) if now.0 >= at.saturating_mul(1000) => Err(ApiError::new(
                ErrorCode::InvalidApiKey,
                "This API key has expired.",
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a model the key may not use the way OpenAI answers a model the caller
    /// has no access to: 404 `model_not_found`, the same as a model that does not
    /// exist, so that a key learns nothing of the models kept from it.
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        match &self.models {
            Some(models) if !models.iter().any(|m| m == model) => Err(ApiError::new(
                ErrorCode::ModelNotFound,
                format!("The model `{model}` does not exist or you do not have access to it."),
            )),
            _ => Ok(()),
        }
    }
}

/// The stored policy of key `key_id` (no limits when none is stored).
pub fn get(s: &DoStore, key_id: &str) -> Result<Policy, ApiError> {
    let rows = s.conn().query(
        "SELECT expires_at, models FROM edge_policy WHERE key_id = ?",
        &[SqlValue::Text(key_id.to_owned())],
    )?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(Policy::default());
    };
    let expires_at = match row.first() {
        Some(SqlValue::Int(at)) => Some(*at),
        _ => None,
    };
    let models = match row.get(1) {
        Some(SqlValue::Text(t)) => Some(
            serde_json::from_str(t)
                .map_err(|e| ApiError::internal(format!("stored allow-list: {e}")))?,
        ),
        _ => None,
    };
    Ok(Policy { expires_at, models })
}

/// Stores `policy` as key `key_id`'s.
pub fn put(s: &DoStore, key_id: &str, policy: &Policy) -> Result<(), ApiError> {
    let expires_at = policy.expires_at.map_or(SqlValue::Null, SqlValue::Int);
    let models = policy.models.as_ref().map_or(SqlValue::Null, |m| {
        SqlValue::Text(serde_json::to_string(m).expect("a list of strings serialises"))
    });
    s.conn().execute(
        "INSERT INTO edge_policy (key_id, expires_at, models) VALUES (?, ?, ?)
         ON CONFLICT (key_id) DO UPDATE SET
           expires_at = excluded.expires_at, models = excluded.models",
        &[SqlValue::Text(key_id.to_owned()), expires_at, models],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_expires_at_its_second() {
        let p = Policy {
            expires_at: Some(100),
            models: None,
        };
        assert!(p.check_key(Timestamp(99_999)).is_ok());
        let e = p.check_key(Timestamp(100_000)).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidApiKey);
        assert!(Policy::default().check_key(Timestamp(i64::MAX)).is_ok());
    }

    #[test]
    fn an_allow_list_refuses_other_models_as_not_found() {
        let p = Policy {
            expires_at: None,
            models: Some(vec!["a".into()]),
        };
        assert!(p.check_model("a").is_ok());
        assert_eq!(
            p.check_model("b").unwrap_err().code,
            ErrorCode::ModelNotFound
        );
        assert!(Policy::default().check_model("b").is_ok());
    }

    #[test]
    fn a_change_replaces_what_it_names_and_null_lifts_a_limit() {
        let p = Policy {
            expires_at: Some(5),
            models: Some(vec!["a".into()]),
        };
        let change: PolicyChange = serde_json::from_str(r#"{"models": null}"#).unwrap();
        let q = p.clone().changed(change).unwrap();
        assert_eq!(q.expires_at, Some(5));
        assert_eq!(q.models, None);
        let change: PolicyChange = serde_json::from_str(r#"{"expires_at": -1}"#).unwrap();
        assert_eq!(
            p.clone().changed(change).unwrap_err().code,
            ErrorCode::InvalidValue
        );
        let many = format!(r#"{{"models": {:?}}}"#, vec!["m"; 65]);
        let change: PolicyChange = serde_json::from_str(&many).unwrap();
        assert!(p.changed(change).is_err());
        assert!(serde_json::from_str::<PolicyChange>(r#"{"model": []}"#).is_err());
    }
}
