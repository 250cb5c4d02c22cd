//! The contract's error: one type that every face renders the same way.
//!
//! Each [`ErrorCode`] fixes the HTTP status and the `type` field, so a handler
//! can never pair a code with the wrong status. The JSON shape is
//! `{"error":{"message","type","param","code"}}`.

use serde::{Deserialize, Serialize};

/// What went wrong, in the contract's vocabulary. Fixes status, `type` and `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The body is not JSON, or not a JSON object.
    InvalidJson,
    /// A field the contract does not know.
    UnknownParameter,
    /// A required field is absent.
    MissingParameter,
    /// A field has the wrong JSON type.
    InvalidType,
    /// A field has the right type but a value outside its range.
    InvalidValue,
    /// The prompt plus `max_tokens` exceed the model's context window.
    ContextLengthExceeded,
    /// A chat request names a model whose file has no chat template.
    ChatTemplateMissing,
    /// The key started its requests-per-minute, or held its tokens-per-minute, for
    /// this minute.
    RateLimitExceeded,
    /// The `model` names no served model.
    ModelNotFound,
    /// No or unknown API key.
    InvalidApiKey,
    /// A job (or other object) that this key cannot see.
    NotFound,
    /// A route that does not exist.
    UnknownRoute,
    /// A route that exists, with another method.
    MethodNotAllowed,
    /// The body is over the size limit.
    RequestTooLarge,
    /// The body did not arrive within the server's deadline.
    RequestTimeout,
    /// The Hold can never fit into the key's Budget.
    BudgetExhausted,
    /// The Hold fits the Budget, but not beside the running requests' Holds.
    BudgetHeld,
    /// The key already runs as many requests as its traffic limit allows.
    TooManyRunning,
    /// The key already has as many jobs queued as the server allows one key.
    TooManyQueuedJobs,
    /// The `Idempotency-Key` header is malformed.
    InvalidIdempotencyKey,
    /// The idempotency key was used with another body.
    IdempotencyKeyReused,
    /// The idempotency key's first request is still being accepted.
    IdempotencyKeyInUse,
    /// The job has not finished yet.
    JobNotFinished,
    /// The job was cancelled, so it has no result.
    JobCancelled,
    /// The job's result is past `expires_at`.
    ResultExpired,
    /// The job's result is over the size a stored result may have.
    ResultTooLarge,
    /// The engine cannot take more work right now.
    Overloaded,
    /// No upstream model server answered (the edge's proxy).
    UpstreamUnavailable,
    /// A bug or a failed dependency on the server's side.
    Internal,
}

impl ErrorCode {
    /// The HTTP status this error is answered with.
    pub fn status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidJson
            | UnknownParameter
            | MissingParameter
            | InvalidType
            | InvalidValue
            | ContextLengthExceeded
            | ChatTemplateMissing
            | InvalidIdempotencyKey => 400,
            InvalidApiKey => 401,
            BudgetExhausted => 402,
            ModelNotFound | NotFound | UnknownRoute => 404,
            MethodNotAllowed => 405,
            RequestTimeout => 408,
            IdempotencyKeyInUse | JobNotFinished | JobCancelled => 409,
            ResultExpired => 410,
            RequestTooLarge | ResultTooLarge => 413,
            IdempotencyKeyReused => 422,
            BudgetHeld | TooManyRunning | TooManyQueuedJobs | RateLimitExceeded => 429,
            Internal => 500,
            UpstreamUnavailable => 502,
            Overloaded => 503,
        }
    }

    /// The error's `type` field.
    pub fn kind(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BudgetExhausted => "insufficient_quota",
            BudgetHeld | TooManyRunning | TooManyQueuedJobs | RateLimitExceeded => {
                "rate_limit_error"
            }
            InvalidApiKey => "authentication_error",
            Internal | Overloaded | UpstreamUnavailable => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The error's `code` field.
    pub fn code(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidJson => "invalid_json",
            UnknownParameter => "unknown_parameter",
            MissingParameter => "missing_required_parameter",
            InvalidType => "invalid_type",
            InvalidValue => "invalid_value",
            ContextLengthExceeded => "context_length_exceeded",
            ChatTemplateMissing => "chat_template_missing",
            RateLimitExceeded => "rate_limit_exceeded",
            ModelNotFound => "model_not_found",
            InvalidApiKey => "invalid_api_key",
            NotFound => "not_found",
            UnknownRoute => "unknown_route",
            MethodNotAllowed => "method_not_allowed",
            RequestTooLarge => "request_too_large",
            RequestTimeout => "request_timeout",
            BudgetExhausted => "budget_exhausted",
            BudgetHeld => "budget_held",
            TooManyRunning => "too_many_running",
            TooManyQueuedJobs => "too_many_queued_jobs",
            InvalidIdempotencyKey => "invalid_idempotency_key",
            IdempotencyKeyReused => "idempotency_key_reused",
            IdempotencyKeyInUse => "idempotency_key_in_use",
            JobNotFinished => "job_not_finished",
            JobCancelled => "job_cancelled",
            ResultExpired => "result_expired",
            ResultTooLarge => "result_too_large",
            Overloaded => "overloaded",
            UpstreamUnavailable => "upstream_unavailable",
            Internal => "internal_error",
        }
    }

    /// Parses a `code` string back, for errors read from storage or an upstream.
    pub fn from_code(code: &str) -> Option<Self> {
        use ErrorCode::*;
        const ALL: [ErrorCode; 29] = [
            InvalidJson,
            UnknownParameter,
            MissingParameter,
            InvalidType,
            InvalidValue,
            ContextLengthExceeded,
            ChatTemplateMissing,
            RateLimitExceeded,
            ModelNotFound,
            InvalidApiKey,
            NotFound,
            UnknownRoute,
            MethodNotAllowed,
            RequestTooLarge,
            RequestTimeout,
            BudgetExhausted,
            BudgetHeld,
            TooManyRunning,
            TooManyQueuedJobs,
            InvalidIdempotencyKey,
            IdempotencyKeyReused,
            IdempotencyKeyInUse,
            JobNotFinished,
            JobCancelled,
            ResultExpired,
            ResultTooLarge,
            Overloaded,
            UpstreamUnavailable,
            Internal,
        ];
        ALL.into_iter().find(|c| c.code() == code)
    }
}

/// An error of the contract: renders to its JSON body and HTTP status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// What went wrong; fixes status, `type` and `code`.
    pub code: ErrorCode,
    /// A sentence for people.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// Seconds after which a retry may succeed (429 and 503), sent as `retry-after`.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with no `param`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// An error about the request field `param`.
    pub fn param(code: ErrorCode, param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(code, message)
        }
    }

    /// `400 invalid_value` about `param`.
    pub fn invalid_value(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::param(ErrorCode::InvalidValue, param, message)
    }

    /// Adds a `retry-after` in seconds.
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// `500` for a failure inside the server; the message is for the log, not the client.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// The contract's body, `{"error":{…}}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.code.kind().to_owned(),
                param: self.param.clone(),
                code: Some(self.code.code().to_owned()),
            },
        }
    }

    /// The body as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).expect("an error body always serialises")
    }

    /// Rebuilds an error from its stored body; `None` if the code is unknown.
    pub fn from_body(body: &ErrorBody) -> Option<Self> {
        let code = ErrorCode::from_code(body.error.code.as_deref()?)?;
        Some(ApiError {
            code,
            message: body.error.message.clone(),
            param: body.error.param.clone(),
            retry_after: None,
        })
    }
}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorObject,
}

/// The inner error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// A sentence for people.
    pub message: String,
    /// The error's class, e.g. `invalid_request_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// The machine-readable code.
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_contract_shape() {
        let e = ApiError::param(ErrorCode::UnknownParameter, "tempature", "Unknown field");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error":{"message":"Unknown field","type":"invalid_request_error","param":"tempature","code":"unknown_parameter"}})
        );
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn statuses_and_types_follow_the_contract() {
        assert_eq!(ErrorCode::BudgetExhausted.status(), 402);
        assert_eq!(ErrorCode::BudgetExhausted.kind(), "insufficient_quota");
        assert_eq!(ErrorCode::BudgetHeld.status(), 429);
        assert_eq!(ErrorCode::TooManyRunning.status(), 429);
        assert_eq!(ErrorCode::ModelNotFound.status(), 404);
        assert_eq!(ErrorCode::IdempotencyKeyReused.status(), 422);
        assert_eq!(ErrorCode::IdempotencyKeyInUse.status(), 409);
        assert_eq!(ErrorCode::JobNotFinished.status(), 409);
        assert_eq!(ErrorCode::JobCancelled.status(), 409);
        assert_eq!(ErrorCode::ResultExpired.status(), 410);
        assert_eq!(ErrorCode::RequestTooLarge.status(), 413);
    }

    #[test]
    fn codes_round_trip() {
        let e = ApiError::new(ErrorCode::BudgetExhausted, "no tokens");
        assert_eq!(ApiError::from_body(&e.body()), Some(e));
        assert_eq!(ErrorCode::from_code("nope"), None);
    }
}
