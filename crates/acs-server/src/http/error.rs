//! Errors as responses, in the contract's shape: every handler, extractor and fallback
//! answers its refusals through [`Failure`], and [`log_internal`] logs the ones that
//! are the server's fault.

use acs_core::{ApiError, ErrorCode};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// An error answered in the contract's shape.
#[derive(Debug)]
pub struct Failure(pub ApiError);

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure(e)
    }
}

/// The message of an internal error, carried by its response (as an extension, never
/// sent) to [`log_internal`].
#[derive(Debug, Clone)]
struct InternalError(String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            e.to_json(),
        )
            .into_response();
        if let Some(s) = e.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if e.code == ErrorCode::Internal {
            resp.extensions_mut().insert(InternalError(e.message));
        }
        resp
    }
}

/// Logs the internal errors that responses answer.
pub async fn log_internal(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if let Some(InternalError(message)) = resp.extensions().get() {
        tracing::error!(message = %message, "internal error");
    }
    resp
}
