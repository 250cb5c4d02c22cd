//! A completion request's way through the server, whoever asks for it (a client, the
//! edge or the job dispatcher):
//!
//! 1. [`prepare`]: validate the parsed request against the served model and tokenize it;
//! 2. admit: take the Hold of its [`hold`] tokens on the payer's Budget;
//! 3. [`resolve`]: run its contrast pairs through the model, the first model work,
//!    only now that it holds its tokens;
//! 4. run: hand it to the engine ([`start`]) and drive it to its end;
//! 5. settle: charge the tokens used and release the rest of the Hold.
//!
//! [`admit_and_run`] does 2-5 for a request answered at once. A job's Hold belongs to
//! its record, so the dispatcher admits and settles through `acs_core::jobs` (`start`,
//! `finish`), in the transactions that move the job; it prepares, resolves and runs
//! here.

use acs_core::ids::{completion_id, request_id};
use acs_core::{Answer, ApiError, Completion, CompletionRequest, Outcome, Shape, ledger};
use acs_engine::{Event, Finished, Generation, Ticket, prepare as prepare_generation};
use tokio::sync::mpsc;

use crate::clock::unix_now;
use crate::db::Db;
use crate::random::random;
use crate::service::Service;

/// Validates and prepares a request for the engine of the model it names
/// (tokenizing, off the async threads); no model work runs.
pub async fn prepare(service: &Service, req: CompletionRequest) -> Result<Generation, ApiError> {
    let served = service.served(&req.model)?;
    let info = service.model_info(served, &req.model);
    let model = std::sync::Arc::clone(served.engine.model());
    let controls = std::sync::Arc::clone(&served.controls);
    let seed = u64::from_le_bytes(random());
    tokio::task::spawn_blocking(move || prepare_generation(&req, &model, &info, &controls, seed))
        .await
        .map_err(|e| ApiError::internal(format!("prepare task: {e}")))?
}

/// Runs a prepared request's contrast pairs through `model` (the id it names; off
/// the async threads), so that the engine can take it.
pub async fn resolve(
    service: &Service,
    model: &str,
    mut g: Generation,
) -> Result<Generation, ApiError> {
    if g.contrasts.is_empty() {
        return Ok(g);
    }
    let model = std::sync::Arc::clone(service.served(model)?.engine.model());
    tokio::task::spawn_blocking(move || acs_engine::resolve(&mut g, &model).map(|()| g))
        .await
        .map_err(|e| ApiError::internal(format!("resolve task: {e}")))?
}

/// The tokens a prepared request holds while it runs: its prompts, every token it
/// may generate, and its contrast texts.
pub fn hold(generation: &Generation) -> u64 {
    generation.hold_tokens()
}

/// Hands a prepared request to the engine of `model` (the id it names); its events
/// arrive on the receiver, and the ticket cancels it.
pub fn start(
    service: &Service,
    model: &str,
    generation: Generation,
) -> Result<(Ticket, mpsc::UnboundedReceiver<Event>), ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let ticket = service
        .served(model)?
        .engine
        .submit(generation, Box::new(move |e| tx.send(e).is_ok()))?;
    Ok((ticket, rx))
}

/// The Completion of a finished run, with a new id, created now.
pub fn completion(f: Finished, model: &str) -> Completion {
    f.into_completion(model, completion_id(random()), unix_now())
}

/// The Outcome of a finished run and the tokens it used, as a job records them.
pub fn outcome(f: Finished, model: &str, shape: Shape) -> (Outcome, u64) {
    f.into_outcome(model, completion_id(random()), unix_now(), shape)
}

/// The answer of a finished run, shaped as its request asked.
pub fn answer(f: Finished, model: &str, shape: Shape) -> Answer {
    Answer::new(completion(f, model), shape)
}

/// Whose Budget a run draws on.
#[derive(Debug, Clone, Copy)]
pub enum Payer<'a> {
    /// This key's: the run takes a Hold and settles it.
    Key(&'a str),
    /// A trusted edge's, which keeps the ledger itself: no Hold here.
    Edge,
}

/// What the settling task passes on to whoever answers the request.
#[derive(Debug)]
pub enum Out {
    /// Tokens of one engine step.
    Delta(Vec<acs_core::Choice>),
    /// The end, settled.
    Done(Finished),
    /// The failure, settled.
    Failed(ApiError),
}

/// A completion that holds its tokens and runs.
#[derive(Debug)]
pub struct Admitted {
    /// The request id, also the Hold's id.
    pub request_id: String,
    /// Tokens of each prompt, for running usage.
    pub prompt_lens: Vec<usize>,
    /// How the answer is shaped.
    pub shape: Shape,
    /// Events of the engine, after settlement.
    pub rx: mpsc::UnboundedReceiver<Out>,
}

/// Takes the payer's Hold; says whether the run must settle one.
fn admit(
    service: &Service,
    payer: Payer<'_>,
    hold_id: &str,
    tokens: u64,
) -> Result<bool, ApiError> {
    match payer {
        Payer::Key(key_id) => {
            let now = service.now();
            service
                .db
                .tx(|s| ledger::admit(s, key_id, hold_id, tokens, now))?;
            Ok(true)
        }
        Payer::Edge => Ok(false),
    }
}

/// Charges `used` tokens of the Hold and releases the rest.
fn settle(db: &Db, hold_id: &str, used: u64) -> Result<(), ApiError> {
    db.tx(|s| ledger::settle(s, hold_id, used))?;
    Ok(())
}

/// Takes the Hold, resolves the request's contrast pairs and starts the engine of
/// `model`; a task settles the Hold when the engine reports the end, and cancels the
/// engine's work if the receiver goes away.
pub async fn admit_and_run(
    service: &Service,
    payer: Payer<'_>,
    model: &str,
    generation: Generation,
) -> Result<Admitted, ApiError> {
    let rid = request_id(random());
    let prompt_lens = generation.prompt_lens();
    let shape = generation.shape;
    let settles = admit(service, payer, &rid, hold(&generation))?;
    let started = match resolve(service, model, generation).await {
        Ok(g) => start(service, model, g),
        Err(e) => Err(e),
    };
    let (ticket, mut erx) = match started {
        Ok(started) => started,
        Err(e) => {
            if settles {
                settle(&service.db, &rid, 0)?;
            }
            return Err(e);
        }
    };
    let (otx, orx) = mpsc::unbounded_channel();
    let db = service.db.clone();
    let hold_id = rid.clone();
    let wake = service.wake.clone();
    tokio::spawn(async move {
        let ticket = ticket;
        let mut gone = false;
        let mut ended = false;
        loop {
            let e = tokio::select! {
                e = erx.recv() => match e {
                    Some(e) => e,
                    None if ended => break,
                    // The engine dropped the request without its end (its thread
                    // stopped): it ends failed, and its Hold is released.
                    None => Event::Failed(ApiError::internal("the engine stopped during the request")),
                },
                // The reader went away (the client left and its handler was
                // dropped): stop at the next step, even in a long prefill that
                // sends nothing yet; keep draining to settle.
                () = otx.closed(), if !gone => {
                    gone = true;
                    ticket.cancel();
                    continue;
                }
            };
            let out = match e {
                Event::Delta(d) => Out::Delta(d),
                Event::Done(f) => {
                    ended = true;
                    let used = f.usage.total_tokens;
                    tracing::info!(
                        target: "acs::run",
                        request_id = %hold_id,
                        prompt_tokens = f.usage.prompt_tokens,
                        completion_tokens = f.usage.completion_tokens,
                        client_left = gone,
                        "run ended"
                    );
                    if settles && let Err(err) = settle(&db, &hold_id, used) {
                        tracing::error!(%hold_id, %err, "settling a hold failed");
                    }
                    wake.notify_one();
                    Out::Done(f)
                }
                Event::Failed(err) => {
                    ended = true;
                    tracing::info!(
                        target: "acs::run",
                        request_id = %hold_id,
                        code = err.code.code(),
                        "run failed"
                    );
                    if settles {
                        let _ = settle(&db, &hold_id, 0);
                    }
                    wake.notify_one();
                    Out::Failed(err)
                }
            };
            if otx.send(out).is_err() {
                // The client is gone: stop generating; keep draining to settle.
                ticket.cancel();
            }
        }
        ticket.detach();
    });
    Ok(Admitted {
        request_id: rid,
        prompt_lens,
        shape,
        rx: orx,
    })
}
