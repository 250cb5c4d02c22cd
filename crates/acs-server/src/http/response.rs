//! Building responses: JSON bodies, headers, and the traffic headers every answer to
//! a key carries.

use acs_core::ledger;
use acs_core::response::BudgetView;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::db::Db;

/// A JSON response with a status.
pub fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let text = serde_json::to_string(body).expect("responses serialise");
    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// Sets a header from a string known to be a valid header value.
pub fn set_header(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

/// The traffic headers of a key's responses.
pub fn budget_headers(h: &mut HeaderMap, v: &BudgetView) {
    for (name, value) in v.headers() {
        set_header(h, name, &value);
    }
}

/// `resp` with the traffic headers of key `key_id`, which every answer to a key
/// carries (refusals too: they tell the client where its key stands).
pub fn with_budget(db: &Db, key_id: &str, mut resp: Response) -> Response {
    if let Ok(v) = db.tx(|s| ledger::view(s, key_id)) {
        budget_headers(resp.headers_mut(), &v);
    }
    resp
}
