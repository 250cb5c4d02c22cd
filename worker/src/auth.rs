//! Keys at the edge. A key's secret names its Durable Object: `acs-<id>-<secret>`,
//! where `<id>` (12 hex digits) is the public key id `key_<id>`. The object stores
//! only the secret's SHA-256 and compares it, so the id in the secret only routes.
//!
//! The last 16 hex digits of `<secret>` are a MAC of the rest of the key under the
//! admin secret, which the entry worker checks before it touches any object: a
//! forged or mistyped key is refused without creating one (an object, once
//! addressed, would set up its storage).

use acs_core::{ApiError, ErrorCode};
use hmac::{Hmac, Mac};
use sha2::Sha256;
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
    (hex_digits(id, 12) && hex_digits(tail, 48)).then(|| format!("key_{id}"))
}

/// Whether `id` has the shape of the ids [`new_key`] makes (`key_` and 12 hex
/// digits): the admin routes address no object for any other id.
pub fn is_key_id(id: &str) -> bool {
    id.strip_prefix("key_").is_some_and(|h| hex_digits(h, 12))
}

/// Whether `s` is `n` hex digits.
fn hex_digits(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Hex digits of the MAC at the end of a key.
const TAG_HEX: usize = 16;

/// The MAC of a key's beginning (`acs-<id>-<random>`) under `admin`.
fn mac(admin: &str, head: &str) -> Hmac<Sha256> {
    let mut m =
        Hmac::<Sha256>::new_from_slice(admin.as_bytes()).expect("HMAC takes a key of any length");
    m.update(b"acs key\0");
    m.update(head.as_bytes());
    m
}

/// A new key, MACed under the admin secret `admin`: `(id, secret)`.
pub fn new_key(admin: &str) -> (String, String) {
    let id = hex::encode(random::<6>());
    let head = format!("acs-{id}-{}", hex::encode(random::<16>()));
    let tag = hex::encode(&mac(admin, &head).finalize().into_bytes()[..TAG_HEX / 2]);
    (format!("key_{id}"), format!("{head}{tag}"))
}

/// Whether `secret` carries a valid MAC under `admin` (compared in constant time).
pub fn is_signed(secret: &str, admin: &str) -> bool {
    if admin.is_empty() || key_id_of(secret).is_none() {
        return false;
    }
    let (head, tag) = secret.split_at(secret.len() - TAG_HEX);
    match hex::decode(tag) {
        Ok(tag) => mac(admin, head).verify_truncated_left(&tag).is_ok(),
        Err(_) => false,
    }
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
    fn only_the_edges_key_ids_address_objects() {
        let (id, secret) = new_key("admin");
        assert!(is_key_id(&id));
        assert_eq!(key_id_of(&secret), Some(id));
        for other in [
            "directory",
            "key_",
            "key_0123456789ab0",
            "key_0123456789ag",
            "KEY_0123456789ab",
        ] {
            assert!(!is_key_id(other), "{other}");
        }
    }

    #[test]
    fn a_secret_routes_to_its_key() {
        let id = "0123456789ab";
        let secret = format!("acs-{id}-{}", "f".repeat(48));
        assert_eq!(key_id_of(&secret).as_deref(), Some("key_0123456789ab"));
        assert_eq!(key_id_of("acs-0123-ffff"), None);
        assert_eq!(key_id_of(&format!("acs-{}", "f".repeat(48))), None);
        assert_eq!(key_id_of(&format!("acs-{id}-{}", "g".repeat(48))), None);
    }

    #[test]
    fn only_keys_made_under_the_admin_secret_are_signed() {
        let (id, secret) = new_key("admin");
        assert_eq!(key_id_of(&secret), Some(id));
        assert!(is_signed(&secret, "admin"));
        assert!(!is_signed(&secret, "another admin"));
        assert!(!is_signed(&secret, ""));
        // Any one digit changed, in the id, the random part or the MAC.
        for at in [4, 20, secret.len() - 1] {
            let mut b = secret.clone().into_bytes();
            b[at] = if b[at] == b'0' { b'1' } else { b'0' };
            assert!(!is_signed(&String::from_utf8(b).unwrap(), "admin"), "{at}");
        }
        assert!(!is_signed(
            &format!("acs-0123456789ab-{}", "f".repeat(48)),
            "admin"
        ));
    }
}
