//! The HTTP face of the server. Handlers, one module per resource, take who is calling
//! ([`auth`]) and the body ([`body`]) as extractors and answer errors as [`error`]
//! shapes them; [`router`] routes to them, and nothing routes back. [`serve`] accepts
//! the connections.

mod auth;
mod body;
mod budget;
mod completions;
mod edge;
mod error;
mod jobs;
mod listen;
mod meta;
mod metrics;
mod models;
mod response;
mod router;
mod sse;
mod state;

pub use listen::{Limits, serve};
pub use metrics::Metrics;
pub use router::router;
pub use state::{AppState, Config};
