//! One run upstream, to its end: the attempts on the upstreams in turn, each read
//! as a stream of events, until one ends with an outcome. A key's object runs its
//! whole completions and its jobs through [`run_to_end`].

use acs_core::{ApiError, ErrorCode, Outcome};
use futures_util::StreamExt;
use worker::ByteStream;

use crate::upstream::{Endpoint, EventParser, RunEvent, Upstreams};

/// How a run ended: its outcome, the tokens to charge, and the upstream that ran it
/// (none where none took it).
pub struct Ran {
    pub outcome: Outcome,
    pub used: u64,
    pub upstream: Option<String>,
}

/// Runs a body upstream to its end. An upstream that goes away is replaced by the
/// next (its lost attempt is not charged); a run stopped through `signal` ends
/// cancelled, charged what it generated.
pub async fn run_to_end(
    upstreams: &Upstreams,
    body: &str,
    endpoint: Endpoint,
    signal: &worker::AbortSignal,
) -> Result<Ran, ApiError> {
    let mut last = None;
    for _ in 0..upstreams.len() {
        let (attempt, upstream) = run_once(upstreams, body, endpoint, signal).await;
        let ran = |outcome, used| Ran {
            outcome,
            used,
            upstream,
        };
        match attempt {
            Attempt::Ended(outcome, used) => return Ok(ran(outcome, used)),
            Attempt::Lost(_, used) if signal.aborted() => {
                return Ok(ran(Outcome::Cancelled, used));
            }
            Attempt::Lost(e, _) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| ApiError::internal("no upstream attempt ran")))
}

/// How one upstream attempt ended.
enum Attempt {
    /// With an outcome and the tokens to charge.
    Ended(Outcome, u64),
    /// The upstream went away (or was cut off) after generating `used` tokens.
    Lost(ApiError, u64),
}

/// One attempt on the upstream a run goes to, and that upstream's URL (none where
/// no upstream took the run).
async fn run_once(
    upstreams: &Upstreams,
    body: &str,
    endpoint: Endpoint,
    signal: &worker::AbortSignal,
) -> (Attempt, Option<String>) {
    let (stream, lease): (ByteStream, _) = match upstreams.run(body, endpoint, signal).await {
        Ok((mut r, lease)) => match r.stream() {
            Ok(s) => (s, lease),
            Err(e) => return (Attempt::Lost(ApiError::internal(e.to_string()), 0), None),
        },
        Err(e) if e.code == ErrorCode::UpstreamUnavailable => return (Attempt::Lost(e, 0), None),
        Err(e) => return (Attempt::Ended(Outcome::Failed(e), 0), None),
    };
    // The lease counts the run in its upstream's load until the run's events end.
    let attempt = read_run(stream).await;
    (attempt, Some(lease.upstream().to_owned()))
}

/// An upstream run's events to their end.
async fn read_run(mut stream: ByteStream) -> Attempt {
    let mut parser = EventParser::default();
    let mut used = 0;
    while let Some(bytes) = stream.next().await {
        let Ok(bytes) = bytes else { break };
        let events = match parser.push(&bytes) {
            Ok(ev) => ev,
            Err(e) => return Attempt::Lost(e, used),
        };
        for ev in events {
            match ev {
                RunEvent::Usage(u) => used = u.total_tokens,
                RunEvent::Result(c) => {
                    let used = c.usage().total_tokens;
                    return Attempt::Ended(Outcome::Succeeded(*c), used);
                }
                // Generated, but more than the edge carries: charged all the same.
                RunEvent::Error(e) if e.code == ErrorCode::ResultTooLarge => {
                    return Attempt::Ended(Outcome::Failed(e), used);
                }
                RunEvent::Error(e) => return Attempt::Ended(Outcome::Failed(e), 0),
                RunEvent::Chunk(_) | RunEvent::Done => {}
            }
        }
    }
    Attempt::Lost(
        ApiError::new(
            ErrorCode::UpstreamUnavailable,
            "The model server went away during the run.",
        ),
        used,
    )
}
