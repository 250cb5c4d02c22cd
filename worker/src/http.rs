//! Responses in the contract's shape, with the headers `acs serve` sends: JSON
//! bodies, errors with `retry-after`, the traffic headers, request ids and CORS.

use acs_core::ids::request_id;
use acs_core::{ApiError, BudgetView, ErrorCode};
use worker::{Headers, Request, Response};

/// Random bytes from the runtime's CSPRNG (Web Crypto).
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the Workers runtime has crypto.getRandomValues");
    b
}

/// Milliseconds since the Unix epoch, by the runtime's clock.
pub fn now() -> acs_core::Timestamp {
    acs_core::Timestamp(worker::Date::now().as_millis() as i64)
}

/// A JSON response.
pub fn json(status: u16, body: &impl serde::Serialize) -> Response {
    let text = serde_json::to_string(body).expect("responses serialise");
    text_response(status, "application/json", text)
}

/// A response with a body of the given type.
pub fn text_response(status: u16, content_type: &str, body: String) -> Response {
    let headers = Headers::new();
    set(&headers, "content-type", content_type);
    Response::from_bytes(body.into_bytes())
        .expect("a byte body is always accepted")
        .with_status(status)
        .with_headers(headers)
}

/// The contract's error response.
pub fn error(e: &ApiError) -> Response {
    if e.code == ErrorCode::Internal {
        worker::console_error!("internal error: {}", e.message);
    }
    let resp = text_response(e.status(), "application/json", e.to_json());
    if let Some(s) = e.retry_after {
        set(resp.headers(), "retry-after", &s.to_string());
    }
    resp
}

/// Sets a header whose name and value are known to be valid.
pub fn set(h: &Headers, name: &str, value: &str) {
    if let Err(e) = h.set(name, value) {
        worker::console_error!("header {name}: {e}");
    }
}

/// The traffic headers of a key's responses.
pub fn budget_headers(h: &Headers, v: &BudgetView) {
    for (name, value) in v.headers() {
        set(h, name, &value);
    }
}

/// A new `x-request-id`.
pub fn new_request_id() -> String {
    request_id(random())
}

/// Gives a response an `x-request-id` unless it has one, and the CORS headers that
/// let pages on any origin read it (as `acs serve` does).
pub fn finish(resp: Response) -> Response {
    // A Durable Object's response has immutable headers: copy them into new ones.
    let status = resp.status_code();
    let h = Headers::new();
    for (name, value) in resp.headers().entries() {
        if let Err(e) = h.append(&name, &value) {
            worker::console_error!("header {name}: {e}");
        }
    }
    let (_, body) = resp.into_parts();
    let resp = Response::from_body(body)
        .expect("a response body moves into a new response")
        .with_status(status)
        .with_headers(h);
    let h = resp.headers();
    if !h.has("x-request-id").unwrap_or(false) {
        set(h, "x-request-id", &new_request_id());
    }
    set(h, "access-control-allow-origin", "*");
    set(h, "access-control-expose-headers", "*");
    resp
}

/// The answer to a CORS preflight. Browsers never let `*` cover `Authorization`, so
/// the headers asked for are named back.
pub fn preflight(req: &Request) -> Response {
    let resp = text_response(200, "text/plain", String::new());
    let h = resp.headers();
    set(h, "access-control-allow-methods", "GET,POST,OPTIONS");
    if let Ok(Some(asked)) = req.headers().get("access-control-request-headers") {
        set(h, "access-control-allow-headers", &asked);
    }
    set(h, "access-control-max-age", "3600");
    set(h, "vary", "access-control-request-headers");
    resp
}

/// Reads a request body up to `limit` bytes: 413 past it, 400 when it cannot be read
/// whole.
pub async fn read_body(req: &mut Request, limit: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorCode::RequestTooLarge,
            format!("The request body is over the limit of {limit} bytes."),
        )
    };
    if let Ok(Some(len)) = req.headers().get("content-length")
        && len.trim().parse::<usize>().is_ok_and(|n| n > limit)
    {
        return Err(too_large());
    }
    let bytes = req.bytes().await.map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("The request body could not be read whole ({e}); send it again."),
        )
    })?;
    if bytes.len() > limit {
        return Err(too_large());
    }
    Ok(bytes)
}
