//! The request body, read once for every handler up to the size limit.

use acs_core::{ApiError, ErrorCode};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};

use super::error::Failure;
use super::state::AppState;

/// The whole request body: 413 past the size limit, 400 when it ends before its
/// `Content-Length` (the client sent part of it and stopped).
#[derive(Debug)]
pub struct LimitedBody(pub Bytes);

impl FromRequest<AppState> for LimitedBody {
    type Rejection = Failure;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Failure> {
        let limit = state.config.max_body_bytes;
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
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
