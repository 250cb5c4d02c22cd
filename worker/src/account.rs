//! `Account`, the Durable Object of one API key: its key record (hashed), Budget,
//! Holds, running count, idempotency records and jobs, on the object's SQLite storage
//! with the rules of `acs-core`. Inference goes to the upstreams.
//!
//! Jobs run from the object's alarm: submitting a job sets the alarm, and the alarm
//! handler starts queued jobs as their Holds fit and stays until none is queued or
//! running, so the object is busy (not evicted) while a job runs. The first event of
//! every new instance recovers what a previous instance left: Holds are released and
//! running jobs queued again, exactly as `acs serve` does after a restart.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use acs_core::ids::{JobId, KeyHash, body_digest};
use acs_core::jobs::{self, Begin, Start};
use acs_core::request::{canonical_json, parse_json_object};
use acs_core::sql::{SqlConn, SqlValue};
use acs_core::{
    ApiError, ApiKey, Budget, CompletionRequest, Endpoint as RequestEndpoint, ErrorCode, Job,
    JobStatus, Outcome, Store, ledger,
};
use futures_util::StreamExt;
use worker::{
    AbortController, Delay, DurableObject, Env, Method, Request, Response, State, durable_object,
};

use crate::auth;
use crate::directory::{self, Listed, PageQuery};
use crate::http::{self, budget_headers, json, now, random, read_body, set};
use crate::policy::{self, Policy, PolicyChange};
use crate::run::{Ran, run_to_end};
use crate::store::Db;
use crate::upstream::{Endpoint, EventParser, Lease, RunEvent, Upstreams};
use crate::usage_log::{self, Asked, Entry};

/// The most bytes of a job's body (its canonical JSON) the edge keeps: a job is
/// stored whole in one row, and a Durable Object's SQLite stores no row over 2 MB.
const MAX_JOB_BODY_BYTES: usize = 1 << 20;

/// Jobs one alarm invocation starts at most, unless `ACS_JOBS_PER_ALARM` says
/// otherwise: Cloudflare counts an invocation's subrequests (10,000 on Workers
/// Paid), and a start makes two (the Hold's prepare and the run). Past it, the
/// invocation lets its jobs finish and hands the queue on to a fresh one.
const JOBS_PER_ALARM: u64 = 1000;

/// How often the alarm looks for queued jobs that may start while jobs run.
const TICK: Duration = Duration::from_millis(200);

/// What the entry worker asks of a key's object when it creates a key.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct NewKey {
    /// The key's id.
    pub id: String,
    /// SHA-256 of the secret.
    pub hash: String,
    /// A label.
    pub name: Option<String>,
    /// The token Budget.
    pub tokens: u64,
    /// The running-request limit.
    pub max_running: u32,
    /// Requests the key may start a minute, if limited.
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens the key's requests may hold a minute, if limited.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// When the key expires and which models it may use.
    #[serde(default)]
    pub policy: Policy,
}

/// How many rows of its usage log the admin reads.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct UsageQuery {
    pub limit: usize,
}

/// A top-up.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct TopUp {
    /// Tokens to add.
    pub tokens: u64,
}

/// The Durable Object of one API key.
#[durable_object]
pub struct Account {
    /// The object, or why it could not start (storage, configuration): every request
    /// is then answered that error rather than the object crashing.
    inner: Result<Rc<Inner>, ApiError>,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Ok(inner) => f
                .debug_struct("Account")
                .field("running", &inner.running.borrow().len())
                .finish_non_exhaustive(),
            Err(e) => f.debug_tuple("Account").field(e).finish(),
        }
    }
}

struct Inner {
    state: State,
    db: Db,
    upstreams: Upstreams,
    retention_ms: i64,
    max_body_bytes: usize,
    /// Most jobs the key may have queued (`ACS_MAX_QUEUED_JOBS`).
    max_queued_jobs: u64,
    /// Most jobs one alarm invocation starts (`ACS_JOBS_PER_ALARM`).
    jobs_per_alarm: u64,
    /// Whether this instance has recovered what an earlier one left.
    booted: Cell<bool>,
    /// Whether an alarm handler is driving jobs now.
    driving: Cell<bool>,
    /// Jobs running in this instance, with the switch that stops them.
    running: RefCell<HashMap<JobId, AbortController>>,
    /// Hold sizes of queued jobs, so that waiting does not ask upstream again.
    holds: RefCell<HashMap<JobId, u64>>,
}

fn env_number(env: &Env, name: &str, default: u64) -> u64 {
    env.var(name)
        .ok()
        .and_then(|v| v.to_string().trim().parse().ok())
        .unwrap_or(default)
}

impl DurableObject for Account {
    fn new(state: State, env: Env) -> Self {
        let tables = &[policy::SCHEMA, usage_log::SCHEMA, directory::SCHEMA];
        let inner = Db::open(state.storage(), tables).and_then(|db| {
            let retention_ms = env_number(&env, "ACS_RETENTION_SECS", 86_400).saturating_mul(1000);
            Ok(Rc::new(Inner {
                // One object is one key: its id is the key's scope upstream.
                upstreams: Upstreams::from_env(&env)?.scoped(state.id().to_string()),
                state,
                db,
                retention_ms: i64::try_from(retention_ms).unwrap_or(i64::MAX),
                max_body_bytes: env_number(&env, "ACS_MAX_BODY_BYTES", 4 << 20) as usize,
                max_queued_jobs: env_number(&env, "ACS_MAX_QUEUED_JOBS", jobs::MAX_QUEUED_JOBS),
                jobs_per_alarm: env_number(&env, "ACS_JOBS_PER_ALARM", JOBS_PER_ALARM).max(1),
                booted: Cell::new(false),
                driving: Cell::new(false),
                running: RefCell::default(),
                holds: RefCell::default(),
            }))
        });
        if let Err(e) = &inner {
            worker::console_error!("the account object cannot start: {e}");
        }
        Account { inner }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        let resp = match &self.inner {
            Ok(inner) => match inner.boot().await {
                Ok(()) => Rc::clone(inner).route(req).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e.clone()),
        };
        Ok(resp.unwrap_or_else(|e| http::error(&e)))
    }

    async fn alarm(&self) -> worker::Result<Response> {
        let Ok(inner) = &self.inner else {
            return Response::ok("");
        };
        let inner = Rc::clone(inner);
        if let Err(e) = inner.boot().await {
            worker::console_error!("recovery failed: {e}");
        }
        let more = Rc::clone(&inner).drive().await;
        inner.purge_and_plan().await;
        if more {
            // Queued jobs this invocation may not start: a fresh invocation will.
            inner.wake().await;
        }
        Response::ok("")
    }
}

impl Inner {
    /// Once per instance: release the Holds and requeue the running jobs of the
    /// instance before (nothing of it runs any more), then let queued jobs start.
    async fn boot(&self) -> Result<(), ApiError> {
        if self.booted.replace(true) {
            return Ok(());
        }
        let (t, retention) = (now(), self.retention_ms);
        let requeued = self.db.tx(move |s| jobs::recover(s, t, retention))?;
        if requeued > 0 {
            worker::console_log!("requeued {requeued} jobs of an earlier instance");
        }
        self.wake().await;
        Ok(())
    }

    /// Sets the alarm now, so that queued jobs are looked at.
    async fn wake(&self) {
        if let Err(e) = self.state.storage().set_alarm(0).await {
            worker::console_error!("set_alarm: {e}");
        }
    }

    async fn route(self: Rc<Self>, mut req: Request) -> Result<Response, ApiError> {
        let path = req.path();
        let method = req.method();
        if let Some(admin) = path.strip_prefix("/internal/") {
            return self.admin(admin, &mut req).await;
        }
        let (key, policy) = self.authenticate(&req)?;
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            (Method::Get, ["v1", "budget"]) => {
                let id = key.id.clone();
                let view = self.db.tx(move |s| ledger::view(s, &id))?;
                let resp = json(200, &view);
                budget_headers(resp.headers(), &view);
                Ok(resp)
            }
            (Method::Post, ["v1", "completions"]) => {
                self.complete(key, &policy, &mut req, Endpoint::Completions)
                    .await
            }
            (Method::Post, ["v1", "chat", "completions"]) => {
                self.complete(key, &policy, &mut req, Endpoint::Chat).await
            }
            (Method::Post, ["v1", "completion-jobs"]) => self.submit(key, &policy, &mut req).await,
            (Method::Get, ["v1", "completion-jobs"]) => {
                let url = req.url().map_err(|e| ApiError::internal(e.to_string()))?;
                let (mut limit, mut after) = (None, None);
                for (k, v) in url.query_pairs() {
                    match k.as_ref() {
                        "limit" => limit = Some(v.into_owned()),
                        "after" => after = Some(v.into_owned()),
                        _ => {}
                    }
                }
                let t = now();
                let key_id = key.id.clone();
                let page = self
                    .db
                    .tx(move |s| jobs::list(s, &key.id, limit.as_deref(), after.as_deref(), t))?;
                Ok(self.with_budget(&key_id, json(200, &page)))
            }
            (Method::Get, ["v1", "completion-jobs", id]) => {
                let id = jobs::parse_id(id)?;
                let job = self.db.tx(move |s| jobs::owned(s, &key.id, id))?;
                Ok(self.job_response(200, &job))
            }
            (Method::Get, ["v1", "completion-jobs", id, "result"]) => {
                let id = jobs::parse_id(id)?;
                let t = now();
                let key_id = key.id.clone();
                let completion = self.db.tx(move |s| jobs::result(s, &key.id, id, t))?;
                let resp = json(200, &completion);
                set(resp.headers(), "x-request-id", &id.request_id());
                Ok(self.with_budget(&key_id, resp))
            }
            (Method::Post, ["v1", "completion-jobs", id, "cancel"]) => {
                let id = jobs::parse_id(id)?;
                let (t, retention) = (now(), self.retention_ms);
                let job = self
                    .db
                    .tx(move |s| jobs::cancel(s, &key.id, id, t, retention))?;
                if job.status == JobStatus::Running
                    && let Some(c) = self.running.borrow_mut().remove(&id)
                {
                    c.abort();
                }
                Ok(self.job_response(200, &job))
            }
            _ => Err(ApiError::new(
                ErrorCode::UnknownRoute,
                format!("No route {} {path}.", req.method()),
            )),
        }
    }

    /// The key of `Authorization: Bearer <key>` and its policy, or 401 (the same
    /// messages as `acs serve`, and one for a key past its expiry).
    fn authenticate(&self, req: &Request) -> Result<(ApiKey, Policy), ApiError> {
        let secret = auth::bearer(req)?;
        let hash = KeyHash::of(&secret);
        let found = self.db.tx(move |s| {
            let Some(key) = s.key_by_hash(&hash)? else {
                return Ok(None);
            };
            let policy = policy::get(s, &key.id)?;
            Ok(Some((key, policy)))
        })?;
        match found {
            Some((k, p)) if !k.revoked => {
                p.check_key(now())?;
                Ok((k, p))
            }
            Some(_) => Err(auth::unauthorized("This API key was revoked.")),
            None => Err(auth::unauthorized("Incorrect API key provided.")),
        }
    }

    /// The entry worker's key administration (it checked the admin secret).
    async fn admin(&self, what: &str, req: &mut Request) -> Result<Response, ApiError> {
        let body = read_body(req, 64 << 10).await?;
        let bad = |e: serde_json::Error| ApiError::invalid_value("body", e.to_string());
        match what {
            "create" => {
                let k: NewKey = serde_json::from_slice(&body).map_err(bad)?;
                k.policy.check()?;
                let t = now();
                let view = self.db.tx(move |s| {
                    s.put_key(&ApiKey {
                        id: k.id.clone(),
                        hash: KeyHash(k.hash),
                        name: k.name,
                        created_at: t,
                        revoked: false,
                    })?;
                    s.put_budget(
                        &k.id,
                        &Budget {
                            tokens_left: k.tokens.min(acs_core::sql::MAX_SAFE_INTEGER),
                            max_running: k.max_running,
                        },
                    )?;
                    if k.requests_per_minute.is_some() || k.tokens_per_minute.is_some() {
                        ledger::set_rate_limits(
                            s,
                            &k.id,
                            k.requests_per_minute,
                            k.tokens_per_minute,
                        )?;
                    }
                    if k.policy != Policy::default() {
                        policy::put(s, &k.id, &k.policy)?;
                    }
                    ledger::view(s, &k.id)
                })?;
                Ok(json(201, &view))
            }
            "info" => Ok(json(200, &self.db.tx(key_info)?)),
            "policy" => {
                let change: PolicyChange = serde_json::from_slice(&body).map_err(bad)?;
                let info = self.db.tx(move |s| {
                    let key = only_key(s)?;
                    let changed = policy::get(s, &key.id)?.changed(change)?;
                    policy::put(s, &key.id, &changed)?;
                    key_info(s)
                })?;
                Ok(json(200, &info))
            }
            "directory-add" => {
                let k: Listed = serde_json::from_slice(&body).map_err(bad)?;
                self.db.tx(move |s| directory::add(s, &k))?;
                Ok(json(200, &serde_json::json!({})))
            }
            "directory-list" => {
                let q: PageQuery = serde_json::from_slice(&body).map_err(bad)?;
                let (data, has_more) = self.db.tx(move |s| directory::page(s, &q))?;
                let list = acs_core::response::List {
                    object: "list".into(),
                    first_id: data.first().map(|k| k.id.clone()),
                    last_id: data.last().map(|k| k.id.clone()),
                    data,
                    has_more,
                };
                Ok(json(200, &list))
            }
            "usage" => {
                let q: UsageQuery = serde_json::from_slice(&body).map_err(bad)?;
                let rows = self.db.tx(move |s| usage_log::recent(s, q.limit))?;
                Ok(json(
                    200,
                    &serde_json::json!({ "object": "list", "data": rows }),
                ))
            }
            "top-up" => {
                let t: TopUp = serde_json::from_slice(&body).map_err(bad)?;
                let view = self.db.tx(move |s| {
                    let key = only_key(s)?;
                    ledger::top_up(s, &key.id, t.tokens)?;
                    ledger::view(s, &key.id)
                })?;
                // More tokens may let waiting jobs start.
                self.wake().await;
                Ok(json(200, &view))
            }
            "revoke" => {
                let key = self.db.tx(|s| {
                    let mut key = only_key(s)?;
                    key.revoked = true;
                    s.put_key(&key)?;
                    Ok(key)
                })?;
                Ok(json(
                    200,
                    &serde_json::json!({ "id": key.id, "revoked": true }),
                ))
            }
            _ => Err(ApiError::new(
                ErrorCode::UnknownRoute,
                "No such admin route.",
            )),
        }
    }

    fn job_response(&self, status: u16, job: &Job) -> Response {
        let resp = json(status, &job.view(now()));
        set(resp.headers(), "x-request-id", &job.id.request_id());
        self.with_budget(&job.key_id, resp)
    }

    /// `resp` with the traffic headers of key `key_id`, which every answer to a key
    /// carries (refusals too: they tell the client where its key stands).
    fn with_budget(&self, key_id: &str, resp: Response) -> Response {
        let key_id = key_id.to_owned();
        if let Ok(v) = self.db.tx(move |s| ledger::view(s, &key_id)) {
            budget_headers(resp.headers(), &v);
        }
        resp
    }

    /// A refusal, with the traffic headers that tell the client where its key stands.
    fn refusal(&self, key_id: &str, e: &ApiError) -> Response {
        self.with_budget(key_id, http::error(e))
    }

    /// Charges `used` of the Hold of request `asked` and releases the rest, and
    /// notes the request in the key's usage log, together.
    fn settle(&self, asked: &Asked, used: u64, upstream: Option<String>, outcome: &str) {
        let entry = Entry::ended(asked, now(), used, upstream, outcome);
        let id = asked.request_id.clone();
        let settled = self.db.tx(move |s| {
            ledger::settle(s, &id, used)?;
            usage_log::append(s, &entry)
        });
        if let Err(e) = settled {
            worker::console_error!("settling a Hold failed: {e}");
        }
    }

    /// `POST /v1/completions` and `POST /v1/chat/completions`: validate, ask an
    /// upstream for the Hold's size, take the Hold, run upstream, answer (whole or
    /// streamed), settle. The upstream shapes chat's answer.
    async fn complete(
        self: Rc<Self>,
        key: ApiKey,
        policy: &Policy,
        req: &mut Request,
        endpoint: Endpoint,
    ) -> Result<Response, ApiError> {
        let bytes = read_body(req, self.max_body_bytes).await?;
        let rules = match endpoint {
            Endpoint::Chat => RequestEndpoint::ChatCompletions,
            _ => RequestEndpoint::Completions,
        };
        let parsed = CompletionRequest::parse(&bytes, rules)?;
        policy.check_model(&parsed.model)?;
        let body = String::from_utf8_lossy(&bytes).into_owned();
        let hold = self.upstreams.hold_tokens(&body, endpoint).await?;
        let rid = http::new_request_id();
        let (t, key_id, hold_id) = (now(), key.id.clone(), rid.clone());
        let admitted = self
            .db
            .tx(move |s| ledger::admit(s, &key_id, &hold_id, hold, t));
        if let Err(e) = admitted {
            return Ok(self.refusal(&key.id, &e));
        }
        let asked = Asked::new(&rid, endpoint.name(), &parsed, t);
        let key_id = key.id.clone();
        let view = self.db.tx(move |s| ledger::view(s, &key_id))?;
        let resp = if parsed.stream {
            self.stream(asked, body, endpoint).await
        } else {
            self.whole(&asked, &body, endpoint).await
        }?;
        budget_headers(resp.headers(), &view);
        set(resp.headers(), "x-request-id", &rid);
        Ok(resp)
    }

    /// A completion answered whole. An upstream that dies before the end is replaced
    /// by the next (the lost attempt is not charged).
    async fn whole(
        &self,
        asked: &Asked,
        body: &str,
        endpoint: Endpoint,
    ) -> Result<Response, ApiError> {
        let signal = AbortController::default().signal();
        let Ran {
            outcome,
            used,
            upstream,
        } = match run_to_end(&self.upstreams, body, endpoint, &signal).await {
            Ok(ran) => ran,
            Err(e) => {
                self.settle(asked, 0, None, "failed");
                return Err(e);
            }
        };
        let name = outcome_name(&outcome);
        match outcome {
            Outcome::Succeeded(c) => {
                self.settle(asked, used, upstream, name);
                Ok(json(200, &c))
            }
            Outcome::Failed(e) => {
                self.settle(asked, 0, upstream, name);
                Err(e)
            }
            Outcome::Cancelled => {
                self.settle(asked, used, upstream, name);
                Err(ApiError::internal("the run stopped"))
            }
        }
    }

    /// A streamed completion: the upstream's chunks pass through as they come; the
    /// Hold is settled when the stream ends, or, when the client goes away, with what
    /// was generated until then (and the upstream run is cancelled).
    async fn stream(
        self: Rc<Self>,
        asked: Asked,
        body: String,
        endpoint: Endpoint,
    ) -> Result<Response, ApiError> {
        let controller = AbortController::default();
        let started = self
            .upstreams
            .run(&body, endpoint, &controller.signal())
            .await
            .and_then(|(mut r, lease)| {
                r.stream()
                    .map(|s| (s, lease))
                    .map_err(|e| ApiError::internal(format!("upstream body: {e}")))
            });
        let (upstream, lease) = match started {
            Ok(s) => s,
            Err(e) => {
                self.settle(&asked, 0, None, "failed");
                return Err(e);
            }
        };
        let guard = HoldGuard {
            inner: Rc::clone(&self),
            asked,
            used: 0,
            outcome: "cancelled",
            controller: Some(controller),
            lease,
        };
        let state = (upstream, EventParser::default(), guard, false);
        let events = futures_util::stream::unfold(
            state,
            |(mut up, mut parser, mut guard, ended)| async move {
                if ended {
                    return None;
                }
                loop {
                    let bytes = match up.next().await {
                        Some(Ok(b)) => b,
                        Some(Err(_)) | None => {
                            // The upstream went away mid-stream: end the client's stream
                            // with the error; the guard charges what was generated.
                            let e = ApiError::new(
                                ErrorCode::UpstreamUnavailable,
                                "The model server went away during the stream.",
                            );
                            let text = format!("data: {}\n\ndata: [DONE]\n\n", e.to_json());
                            guard.outcome = "failed";
                            guard.close();
                            return Some((
                                Ok::<_, worker::Error>(text.into_bytes()),
                                (up, parser, guard, true),
                            ));
                        }
                    };
                    let events = match parser.push(&bytes) {
                        Ok(ev) => ev,
                        Err(e) => vec![RunEvent::Error(e)],
                    };
                    let mut out = String::new();
                    let mut done = false;
                    for ev in events {
                        match ev {
                            RunEvent::Chunk(data) => {
                                out.push_str("data: ");
                                out.push_str(&data);
                                out.push_str("\n\n");
                            }
                            RunEvent::Usage(u) => guard.used = u.total_tokens,
                            RunEvent::Result(_) => {}
                            RunEvent::Error(e) => {
                                guard.used = 0;
                                guard.outcome = "failed";
                                out.push_str(&format!("data: {}\n\n", e.to_json()));
                            }
                            RunEvent::Done => {
                                out.push_str("data: [DONE]\n\n");
                                if guard.outcome == "cancelled" {
                                    guard.outcome = "succeeded";
                                }
                                done = true;
                            }
                        }
                    }
                    if done {
                        guard.close();
                    }
                    if !out.is_empty() || done {
                        return Some((Ok(out.into_bytes()), (up, parser, guard, done)));
                    }
                }
            },
        );
        let resp = Response::from_stream(events)
            .map_err(|e| ApiError::internal(format!("stream: {e}")))?;
        set(resp.headers(), "content-type", "text/event-stream");
        set(resp.headers(), "cache-control", "no-cache");
        Ok(resp)
    }

    /// `POST /v1/completion-jobs`.
    async fn submit(
        &self,
        key: ApiKey,
        policy: &Policy,
        req: &mut Request,
    ) -> Result<Response, ApiError> {
        let idem = req
            .headers()
            .get("idempotency-key")
            .map_err(|_| jobs::invalid_idempotency_key())?;
        let bytes = read_body(req, self.max_body_bytes).await?;
        let value = parse_json_object(&bytes)?;
        let parsed = CompletionRequest::from_value(&value, RequestEndpoint::Jobs)?;
        policy.check_model(&parsed.model)?;
        let canonical = canonical_json(&value);
        if canonical.len() > MAX_JOB_BODY_BYTES {
            return Err(ApiError::new(
                ErrorCode::RequestTooLarge,
                format!(
                    "A job's body may be at most {MAX_JOB_BODY_BYTES} bytes at the edge (it is \
                     stored whole, and a Durable Object stores no row over 2 MB); this one is \
                     {} bytes. Send its prompts in several jobs.",
                    canonical.len()
                ),
            ));
        }
        let digest = body_digest(&canonical);
        let (t, retention) = (now(), self.retention_ms);
        let (key_id, idem2) = (key.id.clone(), idem.clone());
        let begun = self
            .db
            .tx(move |s| jobs::begin(s, &key_id, idem2.as_deref(), &digest, t, retention))?;
        let claim = match begun {
            Begin::Replay(job) => {
                let resp = self.job_response(200, &job);
                set(resp.headers(), "idempotent-replayed", "true");
                return Ok(resp);
            }
            Begin::New(claim) => claim,
        };
        // Refuse what can never run now, rather than fail the job later.
        let hold = match self.upstreams.hold_tokens(&canonical, Endpoint::Jobs).await {
            Ok(h) => h,
            Err(e) => {
                let (key_id, claim) = (key.id.clone(), claim.clone());
                let _ = self.db.tx(move |s| jobs::abandon(s, &key_id, &claim));
                return Err(e);
            }
        };
        let t = now();
        let job = Job::new(
            JobId::new_v7(t, random()),
            &key.id,
            &parsed.model,
            canonical,
            t,
        );
        let (key_id, claim2, max_queued) = (key.id.clone(), claim.clone(), self.max_queued_jobs);
        let created = self
            .db
            .tx(move |s| jobs::create(s, job, &claim2, max_queued));
        let job = match created {
            Ok(job) => job,
            Err(e) => {
                let _ = self.db.tx(move |s| jobs::abandon(s, &key_id, &claim));
                return Ok(self.refusal(&key.id, &e));
            }
        };
        self.holds.borrow_mut().insert(job.id, hold);
        self.wake().await;
        Ok(self.job_response(202, &job))
    }

    /// The alarm's work: start queued jobs as they fit, until none is queued or
    /// running in this instance, or until this invocation has started its
    /// [`JOBS_PER_ALARM`] and those have ended. Returns whether jobs are left queued
    /// for a fresh invocation.
    async fn drive(self: Rc<Self>) -> bool {
        if self.driving.replace(true) {
            return false;
        }
        let mut started = 0;
        let more = loop {
            let queued = match self.db.tx(|s| Ok(s.jobs_with_status(JobStatus::Queued)?)) {
                Ok(q) => q,
                Err(e) => {
                    worker::console_error!("reading queued jobs: {e}");
                    Vec::new()
                }
            };
            for job in &queued {
                if started >= self.jobs_per_alarm {
                    break;
                }
                if Rc::clone(&self).try_start(job.clone()).await {
                    started += 1;
                }
            }
            let still_queued = self
                .db
                .tx(|s| Ok(!s.jobs_with_status(JobStatus::Queued)?.is_empty()))
                .unwrap_or(false);
            if self.running.borrow().is_empty() && (!still_queued || started >= self.jobs_per_alarm)
            {
                break still_queued;
            }
            Delay::from(TICK).await;
        };
        self.driving.set(false);
        more
    }

    /// Starts one queued job if its Hold and the traffic limits fit now; returns
    /// whether it started.
    async fn try_start(self: Rc<Self>, job: Job) -> bool {
        let cached = self.holds.borrow().get(&job.id).copied();
        let hold = match cached {
            Some(h) => h,
            None => match self.upstreams.hold_tokens(&job.body, Endpoint::Jobs).await {
                Ok(h) => {
                    self.holds.borrow_mut().insert(job.id, h);
                    h
                }
                // No upstream now: try again on the next tick.
                Err(e) if e.code == ErrorCode::UpstreamUnavailable => return false,
                Err(e) => {
                    // The request became impossible (another model is served now).
                    let (t, retention) = (now(), self.retention_ms);
                    let _ = self
                        .db
                        .tx(move |s| jobs::fail_queued(s, job, e, t, retention));
                    return false;
                }
            },
        };
        let (id, t, retention) = (job.id, now(), self.retention_ms);
        match self.db.tx(move |s| jobs::start(s, id, hold, t, retention)) {
            Ok(Start::Started(job)) => {
                self.holds.borrow_mut().remove(&job.id);
                let controller = AbortController::default();
                let signal = controller.signal();
                self.running.borrow_mut().insert(job.id, controller);
                wasm_bindgen_futures::spawn_local(Rc::clone(&self).run_job(job, signal));
                true
            }
            Ok(Start::Failed(job)) => {
                self.holds.borrow_mut().remove(&job.id);
                false
            }
            Ok(Start::Waiting(_)) => false,
            Err(e) => {
                worker::console_error!("starting job {id}: {e}");
                false
            }
        }
    }

    /// Runs a started job upstream and finishes it: result and charge together.
    async fn run_job(self: Rc<Self>, job: Job, signal: worker::AbortSignal) {
        let id = job.id;
        // A cancel that came between start and now.
        let cancel_now = self
            .db
            .tx(move |s| Ok(s.job(id)?.is_some_and(|j| j.cancel_requested)))
            .unwrap_or(false);
        let started = now();
        let asked = CompletionRequest::parse(job.body.as_bytes(), RequestEndpoint::Jobs)
            .ok()
            .map(|r| Asked::new(&id.request_id(), Endpoint::Jobs.name(), &r, started));
        let (outcome, used, upstream) = if cancel_now {
            (Outcome::Cancelled, 0, None)
        } else {
            match run_to_end(&self.upstreams, &job.body, Endpoint::Jobs, &signal).await {
                Ok(r) => (r.outcome, r.used, r.upstream),
                Err(e) => (Outcome::Failed(e), 0, None),
            }
        };
        self.running.borrow_mut().remove(&id);
        if let Some(asked) = asked {
            let entry = Entry::ended(&asked, now(), used, upstream, outcome_name(&outcome));
            if let Err(e) = self.db.tx(move |s| usage_log::append(s, &entry)) {
                worker::console_error!("logging job {id}: {e}");
            }
        }
        let (t, retention) = (now(), self.retention_ms);
        if let Err(e) = self
            .db
            .tx(move |s| jobs::finish(s, id, outcome, used, t, retention))
        {
            worker::console_error!("storing the result of job {id}: {e}");
            // The job ends all the same, failed and charged once, its Hold released.
            let failed = Outcome::Failed(jobs::unstorable());
            if let Err(e) = self
                .db
                .tx(move |s| jobs::finish(s, id, failed, used, t, retention))
            {
                worker::console_error!("finishing job {id}: {e}");
            }
        }
    }

    /// After driving: purge expired results, and set the alarm for the next expiry.
    async fn purge_and_plan(&self) {
        let (t, retention) = (now(), self.retention_ms);
        if let Err(e) = self.db.tx(move |s| jobs::purge(s, t, retention)) {
            worker::console_error!("purge: {e}");
        }
        let next = self.db.tx(|s| {
            let rows = s.conn().query(
                "SELECT MIN(j.expires_at) FROM jobs j
                 JOIN result_parts r ON r.job_id = j.id AND r.part = 0",
                &[],
            )?;
            Ok(match rows.first().and_then(|r| r.first()) {
                Some(SqlValue::Int(at)) => Some(*at),
                _ => None,
            })
        });
        if let Ok(Some(at)) = next {
            let wait = (at - now().0).max(0) + 50;
            if let Err(e) = self.state.storage().set_alarm(wait).await {
                worker::console_error!("set_alarm: {e}");
            }
        }
    }
}

/// The admin's view of the object's key: its record, Budget, per-minute limits and
/// policy.
fn key_info(s: &mut crate::store::DoStore) -> Result<serde_json::Value, ApiError> {
    let key = only_key(s)?;
    let view = ledger::view(s, &key.id)?;
    let rate = s.rate(&key.id)?;
    let policy = policy::get(s, &key.id)?;
    Ok(serde_json::json!({
        "id": key.id,
        "name": key.name,
        "created_at": key.created_at.0.div_euclid(1000),
        "revoked": key.revoked,
        "tokens_left": view.tokens_left,
        "tokens_held": view.tokens_held,
        "running": view.running,
        "max_running": view.max_running,
        "requests_per_minute": rate.and_then(|r| r.requests_per_minute),
        "tokens_per_minute": rate.and_then(|r| r.tokens_per_minute),
        "expires_at": policy.expires_at,
        "models": policy.models,
    }))
}

/// How a run ended, as the usage log names it.
fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Succeeded(_) => "succeeded",
        Outcome::Failed(_) => "failed",
        Outcome::Cancelled => "cancelled",
    }
}

/// The one key of an object.
fn only_key(s: &mut crate::store::DoStore) -> Result<ApiKey, ApiError> {
    s.keys()?
        .pop()
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "No key with that id."))
}

/// Settles a streamed completion's Hold exactly once: when the stream ends, or when
/// the client goes away and the response stream is dropped (which also cancels the
/// upstream run).
struct HoldGuard {
    inner: Rc<Inner>,
    /// The request, whose id is its Hold's.
    asked: Asked,
    /// Tokens generated so far, by the upstream's running usage.
    used: u64,
    /// How the stream ended, for the usage log: `cancelled` until it ends otherwise.
    outcome: &'static str,
    controller: Option<AbortController>,
    /// The run's place in its upstream's load, given up with the stream.
    lease: Lease,
}

impl HoldGuard {
    fn settle(&self) {
        let upstream = Some(self.lease.upstream().to_owned());
        self.inner
            .settle(&self.asked, self.used, upstream, self.outcome);
    }

    fn close(&mut self) {
        if self.controller.take().is_some() {
            self.settle();
        }
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(c) = self.controller.take() {
            c.abort();
            self.settle();
        }
    }
}
