//! The job dispatcher: starts queued jobs, each key's in order, when their Hold and
//! the traffic limits fit, runs them on the engine, and finishes them (result +
//! charge in one transaction). Also purges expired results and, a day later, their
//! jobs.

use std::collections::HashMap;
use std::time::Duration;

use acs_core::jobs::{self, Start};
use acs_core::request::Endpoint;
use acs_core::{ApiError, CompletionRequest, ErrorCode, Job, JobId, Outcome, Store};
use acs_engine::{Event, Generation};

use crate::run;
use crate::service::Service;

/// How often queued jobs are looked at when nothing wakes the dispatcher.
const POLL: Duration = Duration::from_millis(250);

/// Runs forever: dispatches queued jobs, purges expired results.
pub async fn dispatch(state: Service) {
    let mut last_purge = std::time::Instant::now();
    // The job waiting for its Hold at the head of each key's queue keeps its
    // prepared work, so that each poll does not tokenize it again.
    let mut prepared = HashMap::new();
    loop {
        if let Err(e) = dispatch_once(&state, &mut prepared).await {
            tracing::error!(error = %e, "job dispatch failed");
        }
        if last_purge.elapsed() > Duration::from_secs(10) {
            let now = state.now();
            let retention = state.config.retention_ms;
            match state.db.tx(|s| jobs::purge(s, now, retention)) {
                Ok((r, k, j)) if r + k + j > 0 => {
                    tracing::info!(
                        results = r,
                        idempotency_keys = k,
                        jobs = j,
                        "purged expired records"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "purge failed"),
            }
            last_purge = std::time::Instant::now();
        }
        let _ = tokio::time::timeout(POLL, state.wake.notified()).await;
    }
}

/// Starts what can start: each key's oldest queued job, again while any starts (or
/// fails), so that a pass costs one job per key with queued work, plus the jobs it
/// starts, not the whole queue.
async fn dispatch_once(
    state: &Service,
    prepared: &mut HashMap<JobId, Generation>,
) -> Result<(), ApiError> {
    loop {
        let queued = state.db.tx(|s| Ok(s.oldest_queued_per_key()?))?;
        // Forget the work of jobs no longer at the head (cancelled).
        prepared.retain(|id, _| queued.iter().any(|j| j.id == *id));
        let mut moved = false;
        for job in queued {
            moved |= try_start(state, prepared, job).await?;
        }
        if !moved {
            return Ok(());
        }
    }
}

/// Prepares a queued job (or takes its prepared work) and starts it if its Hold
/// fits; says whether it left the queue (started, or failed).
async fn try_start(
    state: &Service,
    prepared: &mut HashMap<JobId, Generation>,
    job: Job,
) -> Result<bool, ApiError> {
    let generation = match prepared.remove(&job.id) {
        Some(g) => Ok(g),
        None => match CompletionRequest::parse(job.body.as_bytes(), Endpoint::Jobs) {
            Ok(r) => run::prepare(state, r).await,
            Err(e) => Err(e),
        },
    };
    let now = state.now();
    let retention = state.config.retention_ms;
    let generation = match generation {
        Ok(mut g) => {
            g.scope = state.scope(&job.key_id);
            g
        }
        Err(e) => {
            // The request became impossible (e.g. another model is served now).
            state
                .db
                .tx(|s| jobs::fail_queued(s, job.clone(), e, now, retention))?;
            return Ok(true);
        }
    };
    let hold = run::hold(&generation);
    match state
        .db
        .tx(|s| jobs::start(s, job.id, hold, now, retention))?
    {
        Start::Started(job) => {
            spawn_run(state.clone(), job, generation);
            Ok(true)
        }
        Start::Waiting(_) => {
            prepared.insert(job.id, generation);
            Ok(false)
        }
        Start::Failed(_) => Ok(true),
    }
}

fn spawn_run(state: Service, job: Job, generation: Generation) {
    tokio::spawn(async move {
        let id = job.id;
        let shape = generation.shape;
        // The job holds its tokens now: its contrast pairs may run.
        let started = match run::resolve(&state, &job.model, generation).await {
            Ok(g) => run::start(&state, &job.model, g),
            Err(e) => Err(e),
        };
        let (outcome, used) = match started {
            Err(e) => (Outcome::Failed(e), 0),
            Ok((ticket, mut rx)) => {
                state
                    .running_jobs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, ticket);
                // A cancel that came between start and now.
                if state
                    .db
                    .tx(|s| Ok(s.job(id)?))
                    .ok()
                    .flatten()
                    .is_some_and(|j| j.cancel_requested)
                    && let Some(t) = state
                        .running_jobs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&id)
                {
                    t.cancel();
                }
                let mut end = (Outcome::Failed(ApiError::internal("the engine stopped")), 0);
                while let Some(e) = rx.recv().await {
                    match e {
                        Event::Delta(_) => {}
                        Event::Done(f) => end = run::outcome(f, &job.model, shape),
                        Event::Failed(e) => end = (Outcome::Failed(e), 0),
                    }
                }
                if let Some(t) = state
                    .running_jobs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id)
                {
                    t.detach();
                }
                end
            }
        };
        let outcome = public(id, outcome);
        let now = state.now();
        let retention = state.config.retention_ms;
        if let Err(e) = state
            .db
            .tx(|s| jobs::finish(s, id, outcome, used, now, retention))
        {
            tracing::error!(job = %id, error = %e, "storing a job's result failed");
            // The job ends all the same, failed and charged once, its Hold released.
            let failed = Outcome::Failed(jobs::unstorable());
            if let Err(e) = state
                .db
                .tx(|s| jobs::finish(s, id, failed, used, now, retention))
            {
                tracing::error!(job = %id, error = %e, "finishing a job failed");
            }
        }
        state.wake.notify_one();
    });
}

/// The outcome a job's owner reads: an internal error's own text (a library's, a
/// path) goes to the log under the job's id, and the result says only where it is.
fn public(id: JobId, outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Failed(e) if e.code == ErrorCode::Internal => {
            tracing::error!(job = %id, message = %e.message, "a job failed on the server's side");
            Outcome::Failed(ApiError {
                message: "The server failed on this job; its log has the cause under the job's id."
                    .into(),
                ..e
            })
        }
        other => other,
    }
}

/// Startup: release every Hold of the previous process and requeue its running jobs
/// (failing those cut short too often: `jobs::MAX_JOB_RUNS`).
pub fn recover(state: &Service) -> Result<usize, ApiError> {
    let (now, retention) = (state.now(), state.config.retention_ms);
    state.db.tx(|s| jobs::recover(s, now, retention))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_internal_error_keeps_its_text_in_the_log() {
        let id = JobId::new_v7(acs_core::Timestamp(1), [1; 10]);
        let secret = ApiError::internal("database: disk I/O error at /srv/acs-data");
        let Outcome::Failed(e) = public(id, Outcome::Failed(secret)) else {
            panic!("still failed")
        };
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(
            !e.message.contains("/srv") && e.message.contains("job's id"),
            "{e}"
        );
        let refused = ApiError::invalid_value("n", "n is 1..=128.");
        assert_eq!(
            public(id, Outcome::Failed(refused.clone())),
            Outcome::Failed(refused)
        );
    }
}
