//! Errors as responses, in the contract's shape: every handler, extractor and fallback
//! answers its refusals through [`Failure`], and [`log_internal`] logs the ones that
//! are the server's fault. Their own text (a database's, a task's) stays in the log,
//! under the response's request id: the client gets [`public`]'s words.

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

/// What a client is told of an internal error: that it happened and where to find it,
/// not the server's own text (paths, SQL, library messages).
pub fn public(e: ApiError) -> ApiError {
    if e.code == ErrorCode::Internal {
        ApiError {
            message: "The server failed on this request; its log has the cause under this response's x-request-id.".into(),
            ..e
        }
    } else {
        e
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let logged = (self.0.code == ErrorCode::Internal).then(|| self.0.message.clone());
        let e = public(self.0);
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
        if let Some(message) = logged {
            resp.extensions_mut().insert(InternalError(message));
        }
        resp
    }
}

/// Logs the internal errors that responses answer.
pub async fn log_internal(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if let Some(InternalError(message)) = resp.extensions().get() {
        let id = resp
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        tracing::error!(request_id = %id, message = %message, "internal error");
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn internal_errors_keep_their_text_out_of_the_response() {
        let secret = "database: disk I/O error at /srv/acs-data/acs.sqlite3";
        let resp = Failure(ApiError::internal(secret)).into_response();
        assert_eq!(resp.status(), 500);
        let logged = resp.extensions().get::<InternalError>().cloned();
        assert_eq!(logged.map(|l| l.0).as_deref(), Some(secret));
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "internal_error");
        assert_eq!(body["error"]["type"], "server_error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains("/srv") && !message.contains("database"),
            "{message}"
        );
        assert!(message.contains("x-request-id"), "{message}");
        // Other errors say what they say.
        let e = ApiError::invalid_value("n", "n is 1..=128.");
        assert_eq!(public(e.clone()), e);
    }
}
