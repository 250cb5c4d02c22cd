//! Identifiers: UUIDv7 job ids, request ids, completion ids, API keys and their hashes.
//!
//! Core never draws randomness itself (no I/O, same code on wasm32 and native):
//! callers pass the random bytes, from the OS or `crypto.getRandomValues`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::clock::Timestamp;

/// A job's id: a UUIDv7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(uuid::Uuid);

impl JobId {
    /// A UUIDv7 for `now`, its 80 random bits taken from `random`.
    pub fn new_v7(now: Timestamp, random: [u8; 10]) -> Self {
        let ms = u64::try_from(now.millis()).unwrap_or(0);
        JobId(uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid())
    }

    /// The request id of this job: `req_job_<id without dashes>`.
    pub fn request_id(&self) -> String {
        format!("req_job_{}", self.0.simple())
    }

    /// The 32 hex digits without dashes.
    pub fn simple(&self) -> String {
        self.0.simple().to_string()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// The text is not a dashed UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a job id: {0:?}")]
pub struct BadJobId(pub String);

impl FromStr for JobId {
    type Err = BadJobId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Only the dashed form the API hands out; uuid also accepts others.
        if s.len() != 36 {
            return Err(BadJobId(s.to_owned()));
        }
        uuid::Uuid::parse_str(s)
            .map(JobId)
            .map_err(|_| BadJobId(s.to_owned()))
    }
}

impl Serialize for JobId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A request id for a response header: `req_<32 hex>`.
pub fn request_id(random: [u8; 16]) -> String {
    format!("req_{}", hex::encode(random))
}

/// A completion's id: `cmpl-<24 hex>`.
pub fn completion_id(random: [u8; 12]) -> String {
    format!("cmpl-{}", hex::encode(random))
}

/// The SHA-256 of an API key, the only form in which keys are stored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyHash(pub String);

impl KeyHash {
    /// Hashes a secret key.
    pub fn of(secret: &str) -> Self {
        KeyHash(hex::encode(Sha256::digest(secret.as_bytes())))
    }
}

/// The secret of an `Authorization: Bearer <secret>` header value, if it has that
/// shape. The scheme's name is case-insensitive (RFC 9110), so `bearer` works too.
pub fn bearer_secret(value: &str) -> Option<&str> {
    let (scheme, secret) = value.trim_start().split_once(' ')?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

/// A fresh API key, `acs-<48 hex>`, from 24 random bytes. Shown once, then only its hash is kept.
pub fn new_api_key(random: [u8; 24]) -> String {
    format!("acs-{}", hex::encode(random))
}

/// The SHA-256 of a canonical request body, to tell idempotent replays from reuse.
pub fn body_digest(canonical_json: &str) -> String {
    hex::encode(Sha256::digest(canonical_json.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_secrets_take_any_case_of_the_scheme() {
        assert_eq!(bearer_secret("Bearer acs-1"), Some("acs-1"));
        assert_eq!(bearer_secret("bearer  acs-1 "), Some("acs-1"));
        assert_eq!(bearer_secret("BEARER acs-1"), Some("acs-1"));
        assert_eq!(bearer_secret("Basic YWxhZGRpbg=="), None);
        assert_eq!(bearer_secret("Bearer "), None);
        assert_eq!(bearer_secret("Bearer"), None);
        assert_eq!(bearer_secret("Bearerx acs-1"), None);
    }

    #[test]
    fn job_ids_are_v7_and_render_like_the_tutorial() {
        let t = Timestamp::parse("2026-11-02T18:35:08.037+00:00").unwrap();
        let id = JobId::new_v7(t, [7; 10]);
        let text = id.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "7", "version nibble");
        assert_eq!(
            id.request_id(),
            format!("req_job_{}", text.replace('-', ""))
        );
        assert_eq!(text.parse::<JobId>().unwrap(), id);
        assert!("not-a-uuid".parse::<JobId>().is_err());
        assert!(
            id.simple().parse::<JobId>().is_err(),
            "only the dashed form"
        );
    }

    #[test]
    fn job_ids_sort_by_time() {
        let a = JobId::new_v7(Timestamp(1_000), [255; 10]);
        let b = JobId::new_v7(Timestamp(1_001), [0; 10]);
        assert!(a < b);
    }

    #[test]
    fn request_ids_have_32_hex_digits() {
        let r = request_id([0xab; 16]);
        assert_eq!(r.len(), 4 + 32);
        assert!(r.starts_with("req_"));
    }

    #[test]
    fn key_hash_is_sha256_hex() {
        let h = KeyHash::of("abc");
        assert_eq!(
            h.0,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
