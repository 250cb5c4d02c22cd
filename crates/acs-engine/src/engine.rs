//! The scheduler on a thread of its own, for native servers and the CLI: requests
//! arrive over a channel, the thread steps the batch while there is work and sleeps
//! on the channel when there is none.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use acs_core::ApiError;
use acs_llama::model::Model;

use crate::backend::Backend;
use crate::generation::Generation;
use crate::scheduler::{Event, Scheduler, SchedulerConfig, Sink, Stats, Ticket};

enum Command {
    /// A request that the config admits, and its cancel flag.
    Submit(Box<Generation>, Sink, Arc<AtomicBool>),
}

/// A handle on the engine thread; cheap to clone. The thread ends when the last
/// handle is dropped and its work is done.
#[derive(Debug, Clone)]
pub struct Engine {
    tx: Sender<Command>,
    model: Arc<Model>,
    config: SchedulerConfig,
    backend: Arc<str>,
    /// The backend's [`Backend::forks_share_prompt`], for the admission check.
    shared_prompts: bool,
    stats: Arc<Mutex<Stats>>,
    /// Cleared when the engine thread ends (a panic in a step): the requests it held
    /// ended with it, and no other will run.
    running: Arc<AtomicBool>,
    /// Time spent in steps, in nanoseconds.
    step_nanos: Arc<AtomicU64>,
}

/// Clears the engine's `running` flag when the thread ends, however it ends: its
/// drop runs as a panic unwinds the thread too.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            eprintln!(
                "acs: the engine thread stopped (a panic in a step); no request runs any more"
            );
        }
    }
}

impl Engine {
    /// Starts the engine thread over `model`, stepping on the CPU.
    pub fn start(model: Arc<Model>, config: SchedulerConfig) -> Engine {
        Engine::start_on(Arc::clone(&model), model, config)
    }

    /// Starts the engine thread over `model`, stepping its batches on `backend` (the
    /// same weights, e.g. on a WebGPU device).
    pub fn start_on<B>(model: Arc<Model>, backend: Arc<B>, config: SchedulerConfig) -> Engine
    where
        B: Backend + Send + Sync + 'static,
        B::Cache: Send,
    {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let described: Arc<str> = backend.describe().into();
        let shared_prompts = backend.forks_share_prompt();
        let scheduler = Scheduler::with_backend(Arc::clone(&model), backend, config);
        let shared = Arc::clone(&stats);
        let running = Arc::new(AtomicBool::new(true));
        let guard = Running(Arc::clone(&running));
        let step_nanos = Arc::new(AtomicU64::new(0));
        let nanos = Arc::clone(&step_nanos);
        // The thread ends by itself once every handle (every sender) is gone.
        std::thread::Builder::new()
            .name("acs-engine".into())
            .spawn(move || {
                let _running = guard;
                run(scheduler, rx, shared, nanos)
            })
            .expect("the OS can start a thread");
        Engine {
            tx,
            model,
            config,
            backend: described,
            shared_prompts,
            stats,
            running,
            step_nanos,
        }
    }

    /// Time the engine thread has spent in steps, in seconds.
    pub fn step_seconds(&self) -> f64 {
        self.step_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// The scheduler's configuration (KV capacity, prefill chunk, prompt cache).
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Whether the engine thread still runs (false after a panic in a step: the
    /// server is then unhealthy and should be restarted).
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Where the batches step (`cpu`, or the WebGPU adapter).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Work counters so far.
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request; its events go to `sink` on the engine thread.
    ///
    /// Returns at once: whether the request can ever fit is decided here, from the
    /// config alone, so a caller never waits for the engine thread to finish its
    /// step, and a client that submits several requests in turn has them join the
    /// batch together instead of one per step.
    pub fn submit(&self, generation: Generation, sink: Sink) -> Result<Ticket, ApiError> {
        self.config
            .admits(&self.model, &generation, self.shared_prompts)?;
        let cancel = Arc::new(AtomicBool::new(false));
        self.tx
            .send(Command::Submit(
                Box::new(generation),
                sink,
                Arc::clone(&cancel),
            ))
            .map_err(|_| ApiError::internal("the engine thread has stopped"))?;
        Ok(Ticket::new(cancel))
    }

    /// Runs a request to its end on the calling thread's behalf: returns every event.
    pub fn run(&self, generation: Generation) -> Result<Vec<Event>, ApiError> {
        let (tx, rx) = mpsc::channel();
        let ticket = self.submit(generation, Box::new(move |e| tx.send(e).is_ok()))?;
        let events: Vec<Event> = rx.iter().collect();
        ticket.detach();
        Ok(events)
    }
}

fn run<B: Backend>(
    mut scheduler: Scheduler<B>,
    rx: Receiver<Command>,
    stats: Arc<Mutex<Stats>>,
    step_nanos: Arc<AtomicU64>,
) {
    let take = |s: &mut Scheduler<B>, cmd: Command| match cmd {
        Command::Submit(g, sink, cancel) => s.enqueue(*g, sink, cancel),
    };
    loop {
        if scheduler.is_idle() {
            match rx.recv() {
                Ok(cmd) => take(&mut scheduler, cmd),
                Err(_) => return,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            take(&mut scheduler, cmd);
        }
        let t = Instant::now();
        scheduler.step_blocking();
        let spent = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        step_nanos.fetch_add(spent, Ordering::Relaxed);
        *stats.lock().unwrap_or_else(|p| p.into_inner()) = scheduler.stats();
    }
}
