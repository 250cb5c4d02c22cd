//! The request body, read once for every handler up to the size limit.

use acs_core::{ApiError, ErrorCode};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};

use super::error::Failure;
use super::state::AppState;

/// The whole request body: 413 past the size limit, 400 when it ends before its
/// `Content-Length` (the client sent part of it and stopped), 408 when it has not
/// arrived whole within the body's deadline (a client sending a byte now and then).
#[derive(Debug)]
pub struct LimitedBody(pub Bytes);

impl FromRequest<AppState> for LimitedBody {
    type Rejection = Failure;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Failure> {
        let (limit, deadline) = (state.config.max_body_bytes, state.config.body_timeout);
        let read = tokio::time::timeout(deadline, axum::body::to_bytes(req.into_body(), limit));
        let bytes = read
            .await
            .map_err(|_| {
                ApiError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "The request body did not arrive within {} s.",
                        deadline.as_secs()
                    ),
                )
            })?
            .map_err(|e| {
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
                while let Some(s) = source {
                    if s.is::<http_body_util::LengthLimitError>() {
                        return ApiError::new(
                            ErrorCode::RequestTooLarge,
                            format!("The request body is over the limit of {limit} bytes."),
                        );
                    }
                    source = s.source();
                }
                ApiError::new(
                    ErrorCode::InvalidJson,
                    format!("The request body could not be read whole ({e}); send it again."),
                )
            })?;
        Ok(LimitedBody(bytes))
    }
}
