//! The ACS contract, shared by every face of the project (server, browser, edge).
//!
//! - [`request`]: parse and check completion requests, with the contract's errors;
//! - [`response`]: completions, chunks, usage, models, budgets; [`chat`]: chat
//!   completions and their chunks, made from completions;
//! - [`error`]: the one error type and its JSON;
//! - [`ledger`]: Budgets, Holds and traffic limits;
//! - [`job`] and [`jobs`]: the job state machine and its rules;
//! - [`store`]: the storage trait those rules run on, and an in-memory store;
//! - [`sql`]: that trait on SQLite, shared by the server and the edge;
//! - [`clock`] and [`ids`]: time and identifiers, with no I/O of their own.
//!
//! Nothing here does I/O or needs an async runtime, so the same code builds for
//! native targets and `wasm32-unknown-unknown`.

pub mod chat;
pub mod clock;
pub mod error;
pub mod ids;
pub mod job;
pub mod jobs;
pub mod ledger;
pub mod request;
pub mod response;
pub mod sql;
pub mod store;

pub use chat::{Answer, ChatCompletion, Shape};
pub use clock::{Clock, ManualClock, Timestamp};
pub use error::{ApiError, ErrorBody, ErrorCode};
pub use ids::{JobId, KeyHash};
pub use job::{Job, JobObject, JobResult, JobStatus, Outcome};
pub use request::{CompletionRequest, Endpoint, Prompt, PromptItem};
pub use response::{
    BudgetView, Choice, Completion, CompletionChunk, FinishReason, ModelInfo, PromptTokensDetails,
    Usage,
};
pub use store::{ApiKey, Budget, Hold, MemoryStore, Store};
