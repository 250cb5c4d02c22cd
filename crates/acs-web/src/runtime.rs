//! The contract in the page: a store of the one local key's Budget, Holds and jobs,
//! the scheduler stepping on the event loop, and the job dispatcher.
//!
//! A browser has one thread here (the Web Worker's), so the scheduler is driven by a
//! task that steps while there is work and otherwise waits on its queue of
//! submissions, the way the native engine's thread waits on its channel. Between two
//! steps it yields to the event loop so that new requests and cancels get in.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use acs_core::chat::ChunkWriter;
use acs_core::ids::{body_digest, completion_id, request_id};
use acs_core::jobs::{self, Begin, Start};
use acs_core::request::canonical_json;
use acs_core::response::List;
use acs_core::sql::MAX_SAFE_INTEGER;
use acs_core::{
    Answer, ApiError, Budget, BudgetView, CompletionRequest, Endpoint, Job, JobId, JobObject,
    JobStatus, MemoryStore, ModelInfo, Outcome, Store, Timestamp, ledger,
};
use acs_engine::control::ControlVectors;
use acs_engine::{Event, Generation, Scheduler, SchedulerConfig, Sink, Stats, Ticket};
use acs_llama::model::Model;
use futures_channel::{mpsc, oneshot};
use futures_util::StreamExt;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::{JsFuture, spawn_local};

use crate::device::Device;

/// The id of the page's one API key: the visitor's own.
pub const KEY: &str = "browser";

/// The id the tutorial's requests name, served as an alias as `acs serve` does.
pub const TUTORIAL_ALIAS: &str = "llama-8b";

/// A request for the scheduler task.
type Submission = (
    Box<Generation>,
    Sink,
    oneshot::Sender<Result<Ticket, ApiError>>,
);

/// How a runtime is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The model's id in requests and `models()`.
    pub model_id: String,
    /// KV cache memory for all running sequences together.
    pub kv_bytes: usize,
    /// How long results of finished jobs are kept.
    pub retention_ms: i64,
    /// The page's Budget, if it was given one; otherwise the key is unlimited.
    pub budget: Option<Budget>,
}

/// The page's ACS: model, store, scheduler task and job dispatcher.
pub struct Runtime {
    model: Arc<Model>,
    device: Arc<Device>,
    settings: Settings,
    backend: String,
    started: i64,
    store: RefCell<MemoryStore>,
    submit: mpsc::UnboundedSender<Submission>,
    wake: mpsc::UnboundedSender<()>,
    running_jobs: RefCell<HashMap<JobId, Ticket>>,
    on_change: RefCell<Option<js_sys::Function>>,
    stats: Rc<Cell<Stats>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("backend", &self.backend)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Starts the scheduler task and the job dispatcher over `device`, with the store
    /// of an earlier page (`restored`) if there is one: its Holds are released and
    /// its running jobs queued again, as after a server's crash.
    pub fn start(
        model: Arc<Model>,
        device: Device,
        settings: Settings,
        restored: Option<MemoryStore>,
    ) -> Result<Rc<Runtime>, ApiError> {
        let mut store = restored.unwrap_or_default();
        jobs::recover(&mut store, now(), settings.retention_ms)?;
        let budget = settings.budget.unwrap_or(Budget {
            tokens_left: MAX_SAFE_INTEGER,
            max_running: 1024,
        });
        if settings.budget.is_some() || store.budget(KEY)?.is_none() {
            store.put_budget(KEY, &budget)?;
        }
        let backend = acs_engine::Backend::describe(&device);
        let config = SchedulerConfig::with_kv_bytes(&model, settings.kv_bytes);
        // The scheduler shares its backend through an `Arc` (natively with the engine
        // thread's owner); in the page one thread owns both, so `Send` is moot.
        #[allow(clippy::arc_with_non_send_sync)]
        let device = Arc::new(device);
        let scheduler = Scheduler::with_backend(Arc::clone(&model), Arc::clone(&device), config);
        let (submit, submissions) = mpsc::unbounded();
        let (wake, wakes) = mpsc::unbounded();
        let stats = Rc::new(Cell::new(Stats::default()));
        spawn_local(drive(scheduler, submissions, Rc::clone(&stats)));
        let rt = Rc::new(Runtime {
            model,
            device,
            settings,
            backend,
            started: now().unix_seconds(),
            store: RefCell::new(store),
            submit,
            wake,
            running_jobs: RefCell::new(HashMap::new()),
            on_change: RefCell::new(None),
            stats,
        });
        spawn_local(dispatch(Rc::clone(&rt), wakes));
        Ok(rt)
    }

    /// Where the batches step.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Why the GPU device was lost, once it is.
    pub fn lost(&self) -> Option<String> {
        self.device.lost()
    }

    /// Work counters of the scheduler.
    pub fn stats(&self) -> Stats {
        self.stats.get()
    }

    /// Calls `f` with the store's snapshot (JSON) after every change, so that the
    /// page can keep it (IndexedDB).
    pub fn on_change(&self, f: Option<js_sys::Function>) {
        *self.on_change.borrow_mut() = f;
    }

    /// The store as JSON.
    pub fn snapshot(&self) -> String {
        serde_json::to_string(&self.store.borrow().snapshot()).expect("snapshots serialise")
    }

    /// Runs `f` on a copy of the store and keeps the copy only if `f` succeeds, so a
    /// failed rule leaves nothing half-written (the server's SQL transaction).
    fn tx<T>(
        &self,
        f: impl FnOnce(&mut MemoryStore) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut copy = self.store.borrow().clone();
        let out = f(&mut copy)?;
        *self.store.borrow_mut() = copy;
        if let Some(cb) = self.on_change.borrow().as_ref() {
            let _ = cb.call1(&JsValue::NULL, &JsValue::from_str(&self.snapshot()));
        }
        Ok(out)
    }

    /// `GET /v1/models`.
    pub fn models(&self) -> List<ModelInfo> {
        List {
            object: "list".into(),
            data: vec![
                self.info(&self.settings.model_id),
                self.info(TUTORIAL_ALIAS),
            ],
            first_id: None,
            last_id: None,
            has_more: false,
        }
    }

    fn info(&self, id: &str) -> ModelInfo {
        acs_engine::generation::model_info(&self.model, id, self.started)
    }

    /// The served model's facts, if `id` names it.
    fn check_model(&self, id: &str) -> Result<ModelInfo, ApiError> {
        if id == self.settings.model_id || id == TUTORIAL_ALIAS {
            Ok(self.info(id))
        } else {
            Err(ApiError::param(
                acs_core::ErrorCode::ModelNotFound,
                "model",
                format!(
                    "The model {id:?} does not exist. This page serves {:?} (also as {TUTORIAL_ALIAS:?}).",
                    self.settings.model_id
                ),
            ))
        }
    }

    /// Tokenizes and checks a request (no model work).
    fn prepare(&self, req: &CompletionRequest) -> Result<Generation, ApiError> {
        let info = self.check_model(&req.model)?;
        let seed = u64::from_le_bytes(random());
        let controls = ControlVectors::new();
        acs_engine::prepare(req, &self.model, &info, &controls, seed)
    }

    /// Runs a request's contrast pairs on the page's device (once it holds its
    /// tokens), then hands it to the scheduler task.
    async fn submit(&self, mut g: Generation, sink: Sink) -> Result<Ticket, ApiError> {
        acs_engine::resolve_on(&mut g, &self.model, &*self.device).await?;
        let stopped = || ApiError::internal("the engine task has stopped");
        let (reply, answer) = oneshot::channel();
        self.submit
            .unbounded_send((Box::new(g), sink, reply))
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// `GET /v1/budget`.
    pub fn budget(&self) -> Result<BudgetView, ApiError> {
        ledger::view(&*self.store.borrow(), KEY)
    }

    /// Gives the page a Budget (the same rules as a key's on a server).
    pub fn set_budget(&self, budget: Budget) -> Result<BudgetView, ApiError> {
        self.tx(|s| Ok(s.put_budget(KEY, &budget)?))?;
        let _ = self.wake.unbounded_send(());
        self.budget()
    }

    /// `POST /v1/completions` or `POST /v1/chat/completions` (`endpoint`): `on_chunk`
    /// gets the stream's chunks (as JSON) when the request streams (returning `false`,
    /// or `aborted()` turning true, cancels it); the whole answer is returned either
    /// way.
    pub async fn complete(
        &self,
        body: &serde_json::Value,
        endpoint: Endpoint,
        mut on_chunk: impl FnMut(&serde_json::Value) -> bool,
        aborted: impl Fn() -> bool,
    ) -> Result<Answer, ApiError> {
        let req = CompletionRequest::from_value(body, endpoint)?;
        let shape = req.shape();
        let generation = self.prepare(&req)?;
        let rid = request_id(random());
        let hold = generation.hold_tokens();
        self.tx(|s| ledger::admit(s, KEY, &rid, hold, now()))?;
        let (tx, mut rx) = mpsc::unbounded();
        let ticket = match self
            .submit(generation, Box::new(move |e| tx.unbounded_send(e).is_ok()))
            .await
        {
            Ok(t) => t,
            Err(e) => {
                self.tx(|s| ledger::settle(s, &rid, 0))?;
                return Err(e);
            }
        };
        let (id, created) = (completion_id(random()), now().unix_seconds());
        let mut writer = ChunkWriter::new(id.clone(), created, req.model.clone(), shape);
        let mut chunk =
            |choices, usage| serde_json::to_value(writer.chunk(choices, usage)).unwrap_or_default();
        let mut end = Err(ApiError::internal("the engine ended without a result"));
        while let Some(event) = rx.next().await {
            match event {
                Event::Delta(d) => {
                    if req.stream && !on_chunk(&chunk(d, None)) || aborted() {
                        ticket.cancel();
                    }
                }
                Event::Done(f) => {
                    self.tx(|s| ledger::settle(s, &rid, f.usage.total_tokens).map(drop))?;
                    if req.stream && req.stream_include_usage {
                        on_chunk(&chunk(Vec::new(), Some(f.usage)));
                    }
                    let c = f.into_completion(&req.model, id.clone(), created);
                    end = Ok(Answer::new(c, shape));
                }
                Event::Failed(e) => {
                    self.tx(|s| ledger::settle(s, &rid, 0).map(drop))?;
                    end = Err(e);
                }
            }
        }
        ticket.detach();
        let _ = self.wake.unbounded_send(());
        end
    }

    /// `POST /v1/completion-jobs`: the job, and whether it is an idempotent replay.
    pub async fn create_job(
        &self,
        body: &serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> Result<(JobObject, bool), ApiError> {
        let req = CompletionRequest::from_value(body, Endpoint::Jobs)?;
        let canonical = canonical_json(body);
        let digest = body_digest(&canonical);
        let retention = self.settings.retention_ms;
        let begun = self.tx(|s| jobs::begin(s, KEY, idempotency_key, &digest, now(), retention))?;
        let claim = match begun {
            Begin::Replay(job) => return Ok((job.view(now()), true)),
            Begin::New(claim) => claim,
        };
        if let Err(e) = self.prepare(&req) {
            self.tx(|s| jobs::abandon(s, KEY, &claim))?;
            return Err(e);
        }
        let t = now();
        let job = Job::new(JobId::new_v7(t, random()), KEY, &req.model, canonical, t);
        let created = self.tx(|s| jobs::create(s, job, &claim, jobs::MAX_QUEUED_JOBS));
        let job = match created {
            Ok(job) => job,
            Err(e) => {
                self.tx(|s| jobs::abandon(s, KEY, &claim))?;
                return Err(e);
            }
        };
        let _ = self.wake.unbounded_send(());
        Ok((job.view(now()), false))
    }

    /// `GET /v1/completion-jobs/{id}`.
    pub fn job(&self, id: &str) -> Result<JobObject, ApiError> {
        let id = jobs::parse_id(id)?;
        Ok(jobs::owned(&*self.store.borrow(), KEY, id)?.view(now()))
    }

    /// `GET /v1/completion-jobs`.
    pub fn jobs(
        &self,
        limit: Option<&str>,
        after: Option<&str>,
    ) -> Result<List<JobObject>, ApiError> {
        jobs::list(&*self.store.borrow(), KEY, limit, after, now())
    }

    /// `POST /v1/completion-jobs/{id}/cancel`.
    pub fn cancel_job(&self, id: &str) -> Result<JobObject, ApiError> {
        let id = jobs::parse_id(id)?;
        let retention = self.settings.retention_ms;
        let job = self.tx(|s| jobs::cancel(s, KEY, id, now(), retention))?;
        if let Some(t) = self.running_jobs.borrow().get(&id) {
            t.cancel();
        }
        let _ = self.wake.unbounded_send(());
        Ok(job.view(now()))
    }

    /// `GET /v1/completion-jobs/{id}/result`.
    pub fn job_result(&self, id: &str) -> Result<Answer, ApiError> {
        let id = jobs::parse_id(id)?;
        jobs::result(&*self.store.borrow(), KEY, id, now())
    }
}

/// The scheduler task: steps while there is work, waits for submissions otherwise.
async fn drive(
    mut scheduler: Scheduler<Device>,
    mut submissions: mpsc::UnboundedReceiver<Submission>,
    stats: Rc<Cell<Stats>>,
) {
    let take = |s: &mut Scheduler<Device>, (g, sink, reply): Submission| {
        let _ = reply.send(s.submit(*g, sink));
    };
    loop {
        if scheduler.is_idle() {
            match submissions.next().await {
                Some(sub) => take(&mut scheduler, sub),
                None => return,
            }
        }
        while let Ok(sub) = submissions.try_recv() {
            take(&mut scheduler, sub);
        }
        scheduler.step().await;
        stats.set(scheduler.stats());
        // The CPU backend's step never yields by itself.
        next_task().await;
    }
}

/// The job dispatcher: on every wake, purges expired results and starts the queued
/// jobs whose Hold fits.
async fn dispatch(rt: Rc<Runtime>, mut wakes: mpsc::UnboundedReceiver<()>) {
    loop {
        dispatch_once(&rt).await;
        if wakes.next().await.is_none() {
            return;
        }
        while wakes.try_recv().is_ok() {}
    }
}

async fn dispatch_once(rt: &Rc<Runtime>) {
    let retention = rt.settings.retention_ms;
    let _ = rt.tx(|s| jobs::purge(s, now(), retention));
    let queued = match rt.store.borrow().jobs_with_status(JobStatus::Queued) {
        Ok(q) => q,
        Err(_) => return,
    };
    for job in queued {
        let generation = match CompletionRequest::parse(job.body.as_bytes(), Endpoint::Jobs) {
            Ok(r) => rt.prepare(&r),
            Err(e) => Err(e),
        };
        let generation = match generation {
            Ok(g) => g,
            Err(e) => {
                let _ = rt.tx(|s| jobs::fail_queued(s, job.clone(), e, now(), retention));
                continue;
            }
        };
        let hold = generation.hold_tokens();
        if let Ok(Start::Started(job)) = rt.tx(|s| jobs::start(s, job.id, hold, now(), retention)) {
            spawn_local(run_job(Rc::clone(rt), job, generation));
        }
    }
}

async fn run_job(rt: Rc<Runtime>, job: Job, generation: Generation) {
    let id = job.id;
    let shape = generation.shape;
    let (tx, mut rx) = mpsc::unbounded();
    let (outcome, used) = match rt
        .submit(generation, Box::new(move |e| tx.unbounded_send(e).is_ok()))
        .await
    {
        Err(e) => (Outcome::Failed(e), 0),
        Ok(ticket) => {
            // A cancel that came while the job was being handed over.
            if rt
                .store
                .borrow()
                .job(id)
                .ok()
                .flatten()
                .is_some_and(|j| j.cancel_requested)
            {
                ticket.cancel();
            }
            rt.running_jobs.borrow_mut().insert(id, ticket);
            let mut end = (Outcome::Failed(ApiError::internal("the engine stopped")), 0);
            while let Some(e) = rx.next().await {
                match e {
                    Event::Delta(_) => {}
                    Event::Done(f) => {
                        let id = completion_id(random());
                        end = f.into_outcome(&job.model, id, now().unix_seconds(), shape);
                    }
                    Event::Failed(e) => end = (Outcome::Failed(e), 0),
                }
            }
            if let Some(t) = rt.running_jobs.borrow_mut().remove(&id) {
                t.detach();
            }
            end
        }
    };
    let retention = rt.settings.retention_ms;
    let _ = rt.tx(|s| jobs::finish(s, id, outcome, used, now(), retention));
    let _ = rt.wake.unbounded_send(());
}

/// Now, from the page's clock.
pub fn now() -> Timestamp {
    Timestamp::from_millis(js_sys::Date::now() as i64)
}

/// Random bytes from the browser's `crypto.getRandomValues`.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the browser has crypto.getRandomValues");
    b
}

/// Resolves on the event loop's next task (a zero `setTimeout`), letting messages in.
async fn next_task() {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let set_timeout = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("setTimeout"))
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        match set_timeout {
            Some(f) => {
                let _ = f.call2(&JsValue::NULL, &resolve, &JsValue::from(0));
            }
            None => {
                let _ = resolve.call0(&JsValue::NULL);
            }
        }
    });
    let _ = JsFuture::from(promise).await;
}
