//! The rules of background jobs over a [`Store`]: submit with idempotency, start with
//! a Hold, finish and charge, cancel, read results, expire, recover after a restart.
//!
//! Each function is one transaction's worth of work: the caller runs it inside one
//! transaction of its backend (or under one lock), so no rule is ever half applied.

use crate::chat::Answer;
use crate::clock::Timestamp;
use crate::error::{ApiError, ErrorCode};
use crate::ids::JobId;
use crate::job::{Job, JobObject, JobResult, JobStatus, Outcome};
use crate::ledger::{self, Settlement};
use crate::response::{List, page_limit};
use crate::store::{IdempotencyRecord, IdempotencyState, Store};

/// How long results and idempotency keys are kept unless configured otherwise.
pub const DEFAULT_RETENTION_MS: i64 = Timestamp::DAY_MS;

/// An idempotency key's first request that has been "accepting" this long is taken
/// to have died (its process crashed), and the key may be used again.
pub const ACCEPTING_TIMEOUT_MS: i64 = 60_000;

/// The largest result a job stores, as JSON: bigger ones (many choices with
/// logprobs, activations of every position) fail with `result_too_large` instead,
/// charged what they generated. The edge holds a result whole in an isolate of
/// 128 MB while it parses and stores it, which sets the size.
pub const MAX_RESULT_BYTES: usize = 16 << 20;

/// Default and largest page size of `GET /v1/completion-jobs`.
pub const DEFAULT_PAGE: usize = 20;
/// The largest page size.
pub const MAX_PAGE: usize = 100;

/// Checks an `Idempotency-Key` header: 1 to 255 visible ASCII characters.
pub fn check_idempotency_key(key: &str) -> Result<(), ApiError> {
    let ok =
        (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    if ok {
        Ok(())
    } else {
        Err(invalid_idempotency_key())
    }
}

/// The refusal of an `Idempotency-Key` that is not 1 to 255 visible ASCII characters
/// (also what the HTTP faces answer for a header that is not text at all).
pub fn invalid_idempotency_key() -> ApiError {
    ApiError::param(
        ErrorCode::InvalidIdempotencyKey,
        "Idempotency-Key",
        "Idempotency-Key must be 1 to 255 visible ASCII characters.",
    )
}

/// What the first step of a submission found.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// A new submission, with its claim: validate it, then [`create`] the job (or
    /// [`abandon`] the claim).
    New(Claim),
    /// The same key and body made this job already: answer it again.
    Replay(Job),
}

/// A submission's hold on its idempotency key (none without one), from [`begin`]
/// to [`create`] or [`abandon`]. A claim older than [`ACCEPTING_TIMEOUT_MS`] may be
/// taken over by another submission with the same key; then the first one's claim
/// is no longer the record's, and it neither makes a job nor frees the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    idempotency_key: Option<String>,
    at: Timestamp,
}

impl Claim {
    /// Whether `rec` is still this claim's record.
    fn holds(&self, rec: &IdempotencyRecord) -> bool {
        rec.state == IdempotencyState::Accepting && rec.created_at == self.at
    }
}

/// First step of `POST /v1/completion-jobs`: claims the idempotency key, if any.
///
/// Same key, same body → [`Begin::Replay`]; another body → 422
/// `idempotency_key_reused`; the first request still being accepted → 409
/// `idempotency_key_in_use`. Records older than `retention_ms` count as gone.
pub fn begin<S: Store>(
    store: &mut S,
    key_id: &str,
    idempotency_key: Option<&str>,
    body_digest: &str,
    now: Timestamp,
    retention_ms: i64,
) -> Result<Begin, ApiError> {
    let claim = Claim {
        idempotency_key: idempotency_key.map(str::to_owned),
        at: now,
    };
    let Some(idem) = idempotency_key else {
        return Ok(Begin::New(claim));
    };
    check_idempotency_key(idem)?;
    if let Some(rec) = store.idempotency(key_id, idem)?
        && rec.created_at.plus_millis(retention_ms) > now
    {
        if rec.body_digest != body_digest {
            return Err(ApiError::param(
                ErrorCode::IdempotencyKeyReused,
                "Idempotency-Key",
                "This Idempotency-Key was used with another request body.",
            ));
        }
        match rec.state {
            IdempotencyState::Done(id) => {
                let job = store.job(id)?.ok_or_else(|| {
                    ApiError::internal(format!("idempotency record points at missing job {id}"))
                })?;
                return Ok(Begin::Replay(job));
            }
            IdempotencyState::Accepting
                if rec.created_at.plus_millis(ACCEPTING_TIMEOUT_MS) > now =>
            {
                return Err(key_in_use());
            }
            IdempotencyState::Accepting => {}
        }
    }
    store.put_idempotency(&IdempotencyRecord {
        key_id: key_id.to_owned(),
        idempotency_key: idem.to_owned(),
        body_digest: body_digest.to_owned(),
        state: IdempotencyState::Accepting,
        created_at: now,
    })?;
    Ok(Begin::New(claim))
}

/// Gives up a claimed idempotency key, when validation refused the body; a claim
/// that another submission took over is left to it.
pub fn abandon<S: Store>(store: &mut S, key_id: &str, claim: &Claim) -> Result<(), ApiError> {
    if let Some(idem) = &claim.idempotency_key
        && store
            .idempotency(key_id, idem)?
            .is_some_and(|rec| claim.holds(&rec))
    {
        store.delete_idempotency(key_id, idem)?;
    }
    Ok(())
}

/// The 409 of a key that another submission is accepting (or has just accepted).
fn key_in_use() -> ApiError {
    ApiError::param(
        ErrorCode::IdempotencyKeyInUse,
        "Idempotency-Key",
        "A request with this Idempotency-Key is still being accepted. Retry shortly.",
    )
    .with_retry_after(1)
}

/// The `retry-after` of `too_many_queued_jobs`: queued jobs start as running ones
/// end, which takes seconds at least.
pub const QUEUED_RETRY_SECS: u32 = 5;

/// Jobs one key may have queued unless the server says otherwise.
pub const MAX_QUEUED_JOBS: u64 = 256;

/// Second step of a submission: stores the queued job and completes the
/// idempotency record; 429 `too_many_queued_jobs` when the key already has
/// `max_queued` jobs queued (the caller then [`abandon`]s the claim), and 409
/// `idempotency_key_in_use` when another submission took the claim over (its job,
/// or its refusal, is the key's: a retry gets it).
pub fn create<S: Store>(
    store: &mut S,
    job: Job,
    claim: &Claim,
    max_queued: u64,
) -> Result<Job, ApiError> {
    if store.job(job.id)?.is_some() {
        return Err(ApiError::internal(format!("job id {} is taken", job.id)));
    }
    if store.queued_jobs_of(&job.key_id)? >= max_queued {
        return Err(ApiError::new(
            ErrorCode::TooManyQueuedJobs,
            format!(
                "This key has {max_queued} jobs queued, the most this server queues for one key; submit more as they start."
            ),
        )
        .with_retry_after(QUEUED_RETRY_SECS));
    }
    if let Some(idem) = &claim.idempotency_key {
        let mut rec = match store.idempotency(&job.key_id, idem)? {
            Some(rec) if claim.holds(&rec) => rec,
            _ => return Err(key_in_use()),
        };
        rec.state = IdempotencyState::Done(job.id);
        store.put_idempotency(&rec)?;
    }
    store.put_job(&job)?;
    Ok(job)
}

/// What trying to start a queued job did.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// It took its Hold and runs now.
    Started(Job),
    /// Its Hold or the traffic limits do not fit yet; it stays queued.
    Waiting(ApiError),
    /// Its Hold can never fit: it failed with the 402 error as its result.
    Failed(Job),
}

/// Starts a queued job if its Hold of `hold_tokens` fits.
pub fn start<S: Store>(
    store: &mut S,
    id: JobId,
    hold_tokens: u64,
    now: Timestamp,
    retention_ms: i64,
) -> Result<Start, ApiError> {
    let mut job = load(store, id)?;
    match ledger::admit(store, &job.key_id, &job.hold_id(), hold_tokens, now) {
        Ok(_) => {
            job.start(now)?;
            store.put_job(&job)?;
            Ok(Start::Started(job))
        }
        Err(e) if e.code == ErrorCode::BudgetExhausted => {
            fail_queued(store, job, e, now, retention_ms).map(Start::Failed)
        }
        Err(e) if e.status() == 429 => Ok(Start::Waiting(e)),
        Err(e) => Err(e),
    }
}

/// Fails a queued job before it ran (its Hold can never fit, or its request turned
/// out invalid for the model); nothing was held, nothing is charged.
pub fn fail_queued<S: Store>(
    store: &mut S,
    mut job: Job,
    error: ApiError,
    now: Timestamp,
    retention_ms: i64,
) -> Result<Job, ApiError> {
    job.finish(JobStatus::Failed, now, retention_ms)?;
    store.put_result(job.id, &JobResult::Error(error.body()))?;
    store.put_job(&job)?;
    Ok(job)
}

/// Ends a running job: stores its result, charges `used_tokens` and releases the rest
/// of its Hold, all in one step so that a crash can never charge it twice.
pub fn finish<S: Store>(
    store: &mut S,
    id: JobId,
    outcome: Outcome,
    used_tokens: u64,
    now: Timestamp,
    retention_ms: i64,
) -> Result<(Job, Option<Settlement>), ApiError> {
    let mut job = load(store, id)?;
    let status = match &outcome {
        Outcome::Succeeded(_) => JobStatus::Succeeded,
        Outcome::Failed(_) => JobStatus::Failed,
        Outcome::Cancelled => JobStatus::Cancelled,
    };
    if job.status != JobStatus::Running {
        return Err(ApiError::internal(format!(
            "job {id} finished while {:?}",
            job.status
        )));
    }
    let result = match outcome {
        Outcome::Succeeded(c) => Some(JobResult::Completion(c)),
        Outcome::Failed(e) => Some(JobResult::Error(e.body())),
        Outcome::Cancelled => None,
    };
    let (status, result) = match result {
        Some(r) => match json_len(&r) {
            Some(len) if len <= MAX_RESULT_BYTES => (status, Some(r)),
            len => (
                JobStatus::Failed,
                Some(JobResult::Error(result_too_large(len).body())),
            ),
        },
        None => (status, None),
    };
    job.finish(status, now, retention_ms)?;
    if let Some(r) = &result {
        store.put_result(id, r)?;
    }
    let settlement = ledger::settle(store, &job.hold_id(), used_tokens)?;
    store.put_job(&job)?;
    Ok((job, settlement))
}

/// The length of `r` as JSON, without making the text; `None` if it does not
/// serialize.
fn json_len(r: &JobResult) -> Option<usize> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, r).ok()?;
    Some(count.0)
}

/// The failure of a job whose result is over [`MAX_RESULT_BYTES`] (or does not
/// serialize at all: `len` is `None`).
pub fn result_too_large(len: Option<usize>) -> ApiError {
    let size = len.map_or_else(String::new, |l| format!(" ({l} bytes)"));
    ApiError::new(
        ErrorCode::ResultTooLarge,
        format!(
            "The job's result{size} is over the {} MiB a stored result may have; ask for \
             fewer choices, tokens, logprobs or activation positions, or stream it from \
             /v1/completions.",
            MAX_RESULT_BYTES >> 20
        ),
    )
}

/// What a job ends with when its result cannot be stored (a failing disk, a storage
/// limit): the job still ends, failed, and is charged what it generated.
pub fn unstorable() -> ApiError {
    ApiError::internal("The job's result could not be stored.")
}

/// `POST …/{id}/cancel`: a queued job is cancelled at once; a running one is marked
/// and stops at its next token; a finished one is left as it is.
pub fn cancel<S: Store>(
    store: &mut S,
    key_id: &str,
    id: JobId,
    now: Timestamp,
    retention_ms: i64,
) -> Result<Job, ApiError> {
    let mut job = owned(store, key_id, id)?;
    match job.status {
        JobStatus::Queued => {
            job.cancel_requested = true;
            job.finish(JobStatus::Cancelled, now, retention_ms)?;
        }
        JobStatus::Running => job.cancel_requested = true,
        _ => return Ok(job),
    }
    store.put_job(&job)?;
    Ok(job)
}

/// A job of this key; 404 for a job of another key, as for none at all.
pub fn owned<S: Store>(store: &S, key_id: &str, id: JobId) -> Result<Job, ApiError> {
    store
        .job(id)?
        .filter(|j| j.key_id == key_id)
        .ok_or_else(|| not_found(&id.to_string()))
}

/// Parses a job id from a path, answering 404 for anything that is not one.
pub fn parse_id(text: &str) -> Result<JobId, ApiError> {
    text.parse().map_err(|_| not_found(text))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("No job with id {id}."))
}

fn load<S: Store>(store: &S, id: JobId) -> Result<Job, ApiError> {
    store
        .job(id)?
        .ok_or_else(|| ApiError::internal(format!("job {id} vanished")))
}

/// `GET …/{id}/result`.
pub fn result<S: Store>(
    store: &S,
    key_id: &str,
    id: JobId,
    now: Timestamp,
) -> Result<Answer, ApiError> {
    let job = owned(store, key_id, id)?;
    match job.status {
        JobStatus::Queued | JobStatus::Running => {
            return Err(ApiError::new(
                ErrorCode::JobNotFinished,
                format!(
                    "Job {id} is {}; its result is not ready.",
                    job.status.as_str()
                ),
            ));
        }
        JobStatus::Cancelled => {
            return Err(ApiError::new(
                ErrorCode::JobCancelled,
                format!("Job {id} was cancelled; it has no result."),
            ));
        }
        JobStatus::Succeeded | JobStatus::Failed => {}
    }
    if job.result_expired(now) {
        return Err(ApiError::new(
            ErrorCode::ResultExpired,
            format!("The result of job {id} expired."),
        ));
    }
    match store.result(id)? {
        Some(JobResult::Completion(c)) => Ok(c),
        Some(JobResult::Error(body)) => Err(ApiError::from_body(&body)
            .unwrap_or_else(|| ApiError::internal(body.error.message.clone()))),
        // Purged a moment before expires_at passed on this clock.
        None => Err(ApiError::new(
            ErrorCode::ResultExpired,
            format!("The result of job {id} expired."),
        )),
    }
}

/// `GET /v1/completion-jobs?limit&after`: newest first.
pub fn list<S: Store>(
    store: &S,
    key_id: &str,
    limit: Option<&str>,
    after: Option<&str>,
    now: Timestamp,
) -> Result<List<JobObject>, ApiError> {
    let limit = page_limit(limit, DEFAULT_PAGE, MAX_PAGE)?;
    let after = after
        .map(|a| {
            a.parse::<JobId>()
                .map_err(|_| ApiError::invalid_value("after", format!("{a:?} is not a job id.")))
        })
        .transpose()?;
    let mut jobs = store.jobs_of(key_id, after, limit + 1)?;
    let has_more = jobs.len() > limit;
    jobs.truncate(limit);
    let data: Vec<JobObject> = jobs.iter().map(|j| j.view(now)).collect();
    Ok(List {
        object: "list".into(),
        first_id: data.first().map(|j| j.id.clone()),
        last_id: data.last().map(|j| j.id.clone()),
        data,
        has_more,
    })
}

/// How long a job stays (as `result_expired: true`) after its result expired,
/// before its record is deleted too.
pub const EXPIRED_JOB_KEPT_MS: i64 = Timestamp::DAY_MS;

/// Deletes expired results, idempotency records, and jobs whose results expired
/// [`EXPIRED_JOB_KEPT_MS`] ago; returns how many results, idempotency records and
/// jobs went.
pub fn purge<S: Store>(
    store: &mut S,
    now: Timestamp,
    retention_ms: i64,
) -> Result<(usize, usize, usize), ApiError> {
    let results = store.purge_results(now)?;
    let keys = store.purge_idempotency(now.plus_millis(-retention_ms))?;
    let jobs = store.purge_jobs(now.plus_millis(-EXPIRED_JOB_KEPT_MS))?;
    Ok((results, keys, jobs))
}

/// Runs of a job that a stop of the server may cut short before the job fails
/// instead of running again: a job that makes the process die (memory, a bug) would
/// otherwise take down every restart.
pub const MAX_JOB_RUNS: u32 = 3;

/// What a process does before it serves: no request of an earlier process runs any
/// more, so every Hold is released uncharged and every running job is queued to run
/// again (it is charged once, when that run finishes), unless it has run
/// [`MAX_JOB_RUNS`] times: then it fails, uncharged. Returns the jobs requeued.
pub fn recover<S: Store>(
    store: &mut S,
    now: Timestamp,
    retention_ms: i64,
) -> Result<usize, ApiError> {
    ledger::release_all(store)?;
    let mut requeued = 0;
    for mut job in store.jobs_with_status(JobStatus::Running)? {
        if job.runs >= MAX_JOB_RUNS {
            let e = ApiError::internal(format!(
                "This job was started {} times and the server stopped before each run ended; it is not run again.",
                job.runs
            ));
            job.finish(JobStatus::Failed, now, retention_ms)?;
            store.put_result(job.id, &JobResult::Error(e.body()))?;
        } else {
            job.requeue()?;
            requeued += 1;
        }
        store.put_job(&job)?;
    }
    Ok(requeued)
}
