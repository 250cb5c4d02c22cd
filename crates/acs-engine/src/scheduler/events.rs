//! What a request's submitter deals with: the [`Event`]s its [`Sink`] receives, the
//! [`Finished`] parts of its Completion, and the [`Ticket`] that cancels it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use acs_core::response::{Activation, TEXT_COMPLETION};
use acs_core::{Answer, ApiError, Choice, Completion, Outcome, Shape, Usage};

/// What a request's sink receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New text of some choices (each with its index; `finish_reason` set on the
    /// choice's last delta).
    Delta(Vec<Choice>),
    /// The request ended; nothing follows.
    Done(Finished),
    /// The request failed; nothing follows.
    Failed(ApiError),
}

/// A finished request's parts of a Completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// Every choice, sorted by index.
    pub choices: Vec<Choice>,
    /// Token counts (what the ledger charges).
    pub usage: Usage,
    /// Activation read-outs, if asked for.
    pub activations: Vec<Activation>,
    /// Whether a cancel (or a gone client) ended it early.
    pub cancelled: bool,
}

impl Finished {
    /// The Completion the request answers with.
    pub fn into_completion(self, model: &str, id: String, created: i64) -> Completion {
        Completion {
            id,
            object: TEXT_COMPLETION.into(),
            created,
            model: model.to_owned(),
            choices: self.choices,
            usage: self.usage,
            activations: (!self.activations.is_empty()).then_some(self.activations),
        }
    }

    /// How a job's run ended, and the tokens it is charged: a cancelled job keeps no
    /// result but pays for what it generated. The result is shaped as `shape` says.
    pub fn into_outcome(
        self,
        model: &str,
        id: String,
        created: i64,
        shape: Shape,
    ) -> (Outcome, u64) {
        let used = self.usage.total_tokens;
        if self.cancelled {
            (Outcome::Cancelled, used)
        } else {
            (
                Outcome::Succeeded(Answer::new(self.into_completion(model, id, created), shape)),
                used,
            )
        }
    }
}

/// Where events of a request go. Returning `false` says the receiver is gone: the
/// request is cancelled at the next step.
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// Cancels its request when asked, or when dropped (a handler that goes away takes
/// its request with it), unless [`Ticket::detach`]ed.
#[derive(Debug)]
pub struct Ticket {
    cancel: Arc<AtomicBool>,
    armed: bool,
}

impl Ticket {
    /// The ticket of the request that watches `cancel`.
    pub(crate) fn new(cancel: Arc<AtomicBool>) -> Ticket {
        Ticket {
            cancel,
            armed: true,
        }
    }

    /// Asks the request to stop at its next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// Lets the request run on after this ticket is dropped.
    pub fn detach(mut self) {
        self.armed = false;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.armed {
            self.cancel();
        }
    }
}
