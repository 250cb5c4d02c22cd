//! Keys at the edge. A key's secret names its Durable Object: `acs-<id>-<secret>`,
//! where `<id>` (12 hex digits) is the public key id `key_<id>`. The object stores
//! only the secret's SHA-256 and compares it, so the id in the secret only routes.

use acs_core::{ApiError, ErrorCode};
use worker::Request;

use crate::http::random;

/// 401 with a message.
pub fn unauthorized(message: &str) -> ApiError {
    ApiError::new(ErrorCode::InvalidApiKey, message)
}

/// The secret of `Authorization: Bearer <secret>`, with the server's messages.
pub fn bearer(req: &Request) -> Result<String, ApiError> {
    let value = req
        .headers()
        .get("authorization")
        .ok()
        .flatten()
        .ok_or_else(|| {
            unauthorized("Missing Authorization header: send Authorization: Bearer <key>.")
        })?;
    acs_core::ids::bearer_secret(&value)
        .map(str::to_owned)
        .ok_or_else(|| unauthorized("The Authorization header must be Bearer <key>."))
}

/// The key id a secret routes to, if it has the edge's shape.
pub fn key_id_of(secret: &str) -> Option<String> {
    let rest = secret.strip_prefix("acs-")?;
    let (id, tail) = rest.split_once('-')?;
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    (id.len() == 12 && hex(id) && tail.len() == 48 && hex(tail)).then(|| format!("key_{id}"))
}

/// A new key: `(id, secret)`.
pub fn new_key() -> (String, String) {
    let id = hex::encode(random::<6>());
    let secret = format!("acs-{id}-{}", hex::encode(random::<24>()));
    (format!("key_{id}"), secret)
}

/// Whether `given` is the admin secret; compared as digests, so that the time taken
/// says nothing of the secret.
pub fn is_admin(given: &str, admin: &str) -> bool {
    !admin.is_empty() && acs_core::KeyHash::of(given) == acs_core::KeyHash::of(admin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_routes_to_its_key() {
        let id = "0123456789ab";
        let secret = format!("acs-{id}-{}", "f".repeat(48));
        assert_eq!(key_id_of(&secret).as_deref(), Some("key_0123456789ab"));
        assert_eq!(key_id_of("acs-0123-ffff"), None);
        assert_eq!(key_id_of(&format!("acs-{}", "f".repeat(48))), None);
        assert_eq!(key_id_of(&format!("acs-{id}-{}", "g".repeat(48))), None);
    }
}
