//! Continuous batching: every running request's sequences advance together, one
//! [`Scheduler::step`] at a time, and requests join and leave between any two steps.
//!
//! A request's life: it waits until its KV memory fits; each of its prompts is
//! prefilled once (in chunks, so a long prompt never stalls the others' decoding);
//! when a prompt's prefill ends, its cache branches into its `n` choices, which sample
//! their first tokens from the same logits with their own random streams; then every
//! choice decodes one token per step until it stops. Each step's new text goes to the
//! request's sink; the last event carries the choices, usage and activations.
//!
//! Prompts share work where their tokens agree: a prompt that begins like one being
//! prefilled, in the same request or another, waits for it to reach the end of what
//! they share and branches from its cache there (it rides on it); one that begins
//! like a prompt of an earlier request starts from the prompt cache (see
//! [`SchedulerConfig::prompt_cache`]). A branch shares the positions on the CPU and
//! copies them on the GPU (see [`Backend::forks_share_prompt`]).
//!
//! This module holds a request's life, step by step; its parts are:
//! - `admission`: the KV memory a request reserves, and where each prompt starts;
//! - `sharing`: prompts that ride on others' prefill;
//! - `prompt_cache`: prompts kept for later requests;
//! - `batch`: what one step's forward pass runs;
//! - `choices`: a choice's sampler and text as its tokens come in;
//! - `output`: log-probabilities and activation read-outs in the contract's shapes;
//! - `events`: what the request's submitter receives and holds.

mod admission;
mod batch;
mod choices;
mod events;
mod output;
mod prompt_cache;
mod sharing;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use acs_core::request::Positions;
use acs_core::response::Activation;
use acs_core::{ApiError, Choice, Usage};
use acs_llama::model::{Model, SeqOutput};
use acs_llama::sample::Sampler;

pub use admission::SchedulerConfig;
pub use events::{Event, Finished, Sink, Ticket};
pub use prompt_cache::PROMPT_CACHE_ENTRIES;
pub use sharing::PREFIX_MIN_TOKENS;

use batch::Slot;
use choices::ChoiceRun;
use output::{EchoScores, scores_prompt};
use prompt_cache::PromptCache;
use sharing::{Ride, plain};

use crate::backend::Backend;
use crate::generation::Generation;

/// Counters of the work done, for benchmarks and `/metrics`-style reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps run.
    pub steps: u64,
    /// Prompts prefilled (a prompt with n choices counts once, and a prompt that
    /// branched from an identical one being prefilled not at all).
    pub prefills: u64,
    /// Prompt tokens prefilled: not those a prompt took over from another prompt's
    /// cache (one being prefilled beside it, or a kept one).
    pub prefill_tokens: u64,
    /// Prompts that started from the prompt cache (see
    /// [`SchedulerConfig::prompt_cache`]): branched from an identical prompt prefilled
    /// earlier, or from a copy of the beginning they share with one.
    pub prompt_cache_hits: u64,
    /// Tokens decoded (fed back one per choice per step).
    pub decode_tokens: u64,
    /// Most sequences in one step.
    pub max_batch: u64,
    /// Most KV cache memory the running requests held at once after a step, in bytes
    /// (the caches' capacity: what they take, not only what they fill).
    pub kv_bytes_peak: u64,
    /// KV cache memory held after the last step, kept prompts included, in bytes.
    pub kv_bytes: u64,
    /// Sequences in the last step.
    pub batch: u64,
    /// Requests running after the last step.
    pub running: u64,
    /// Requests waiting for KV room after the last step.
    pub waiting: u64,
}

struct PromptRun<C> {
    /// `None` until the request is admitted (a waiting request holds no KV memory),
    /// while it rides on another prompt's prefill (`rides_on`), and again once its
    /// choices have branched from it: `Some` exactly while the prompt is prefilled.
    cache: Option<C>,
    done: usize,
    /// The prompt being prefilled that this one waits for, to branch from its cache
    /// instead of prefilling their common tokens again; its `cache` is `None`
    /// meanwhile.
    rides_on: Option<Ride>,
    /// Captured residual rows per requested layer, over the prefilled positions.
    captured: BTreeMap<usize, Vec<f32>>,
    /// Echoed prompt log-probabilities, as the prefill gives their logits.
    echo: EchoScores,
    /// Its first tokens that came from a kept prompt (see
    /// [`SchedulerConfig::prompt_cache`]) instead of being prefilled: all of them, or
    /// the ones it begins with.
    cached: usize,
}

struct Active<C> {
    /// Unique among the scheduler's requests, for the prompts that ride on this one's.
    id: u64,
    generation: Generation,
    sink: Sink,
    cancel: Arc<AtomicBool>,
    prompts: Vec<PromptRun<C>>,
    choices: Vec<ChoiceRun<C>>,
    activations: Vec<Activation>,
}

/// The batching scheduler. Single-threaded: the caller drives [`Scheduler::step`]
/// (a thread natively, the Web Worker's loop in a browser). The batch steps on
/// backend `B` (the CPU model unless told otherwise); the model gives the tokenizer
/// and the shapes.
pub struct Scheduler<B: Backend = Model> {
    model: Arc<Model>,
    backend: Arc<B>,
    config: SchedulerConfig,
    waiting: VecDeque<Active<B::Cache>>,
    running: Vec<Active<B::Cache>>,
    kv_reserved: usize,
    /// Requests started ahead of the first waiting one since it became first (at most
    /// `admission::MAX_PASSES`).
    front_passed: usize,
    /// The prompt cache (see [`SchedulerConfig::prompt_cache`]).
    kept: PromptCache<B::Cache>,
    stats: Stats,
    /// The last request's [`Active::id`].
    last_id: u64,
}

impl<B: Backend> std::fmt::Debug for Scheduler<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .field("kv_reserved", &self.kv_reserved)
            .field("kept_prompts", &self.kept.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Scheduler<Model> {
    /// A scheduler over `model`, stepping on the CPU.
    pub fn new(model: Arc<Model>, config: SchedulerConfig) -> Self {
        Scheduler::with_backend(Arc::clone(&model), model, config)
    }
}

impl<B: Backend> Scheduler<B> {
    /// A scheduler over `model` whose batches step on `backend` (the same weights).
    pub fn with_backend(model: Arc<Model>, backend: Arc<B>, config: SchedulerConfig) -> Self {
        Scheduler {
            model,
            backend,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv_reserved: 0,
            front_passed: 0,
            kept: PromptCache::new(config.prompt_cache),
            stats: Stats::default(),
            last_id: 0,
        }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Work counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Queues a request; refuses one that could never fit the KV memory.
    pub fn submit(&mut self, generation: Generation, sink: Sink) -> Result<Ticket, ApiError> {
        let shared = self.backend.forks_share_prompt();
        self.config.admits(&self.model, &generation, shared)?;
        let cancel = Arc::new(AtomicBool::new(false));
        self.enqueue(generation, sink, Arc::clone(&cancel));
        Ok(Ticket::new(cancel))
    }

    /// Queues a request that [`SchedulerConfig::admits`] accepted, to stop when
    /// `cancel` is set.
    pub(crate) fn enqueue(&mut self, generation: Generation, sink: Sink, cancel: Arc<AtomicBool>) {
        let prompts = generation
            .prompts
            .iter()
            .map(|_| PromptRun {
                cache: None,
                done: 0,
                rides_on: None,
                captured: BTreeMap::new(),
                echo: EchoScores::default(),
                cached: 0,
            })
            .collect();
        self.last_id += 1;
        self.waiting.push_back(Active {
            id: self.last_id,
            generation,
            sink,
            cancel,
            prompts,
            choices: Vec::new(),
            activations: Vec::new(),
        });
    }

    /// Runs [`Scheduler::step`] on the calling thread, blocking on the backend.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_blocking(&mut self) {
        pollster::block_on(self.step());
    }

    /// Runs one step: admits waiting requests that fit, prefills a chunk of prompts,
    /// decodes one token for every running choice, and reports to the sinks.
    ///
    /// Natively the CPU backend's step is ready at once: [`Scheduler::step_blocking`]
    /// runs it to its end.
    pub async fn step(&mut self) {
        self.step_inner().await;
        // Counted after every step, those that end early included: a step that only
        // drops cancelled requests leaves the scheduler idle, and the counts must say
        // so (the server reports them as its load).
        self.stats.running = self.running.len() as u64;
        self.stats.waiting = self.waiting.len() as u64;
    }

    async fn step_inner(&mut self) {
        if let Err(e) = self.admit() {
            self.fail_all(ApiError::internal(format!(
                "branching a kept prompt failed: {e}"
            )));
            return;
        }
        self.drop_cancelled();
        if self.running.is_empty() {
            return;
        }
        let (slots, outputs) = match self.forward().await {
            Ok(x) => x,
            Err(e) => {
                self.fail_all(ApiError::internal(format!("model step failed: {e}")));
                return;
            }
        };
        let mut prefilled = Vec::new();
        let mut decoded = Vec::new();
        for (slot, out) in slots.into_iter().zip(outputs) {
            match slot {
                Slot::Prompt {
                    request,
                    prompt,
                    tokens,
                } => prefilled.push((request, prompt, tokens, out)),
                Slot::Choice { request, choice } => decoded.push(((request, choice), out.logits)),
            }
        }
        self.sample_decoded(decoded);
        // After the decoded choices: the prompts that rode on a prompt to where it
        // reached branch from it (those with the same tokens as prompts that finished),
        // and a prompt that finished branches new choices.
        for (request, prompt, tokens, out) in prefilled {
            let branched = self
                .branch_riders(request, prompt, tokens)
                .and_then(|riders| {
                    for &(r, p, len) in &riders {
                        let out = SeqOutput {
                            logits: out.logits.clone(),
                            captured: Vec::new(),
                        };
                        self.after_prefill(r, p, len, out, false)?;
                    }
                    self.after_prefill(request, prompt, tokens, out, true)
                });
            if let Err(e) = branched {
                self.fail_all(ApiError::internal(format!(
                    "branching a prompt failed: {e}"
                )));
                return;
            }
        }
        self.note_kv_bytes();
        self.report();
    }

    /// Ends requests whose ticket was cancelled, reporting what they generated.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancel.load(Ordering::SeqCst) {
                let mut a = self.running.swap_remove(i);
                self.kv_reserved -= self.reservation(&a.generation);
                self.release_riders(a.id);
                let finished = finish(&mut a, true);
                (a.sink)(Event::Done(finished));
            } else {
                i += 1;
            }
        }
        self.waiting.retain_mut(|a| {
            if a.cancel.load(Ordering::SeqCst) {
                let finished = finish(a, true);
                (a.sink)(Event::Done(finished));
                false
            } else {
                true
            }
        });
    }

    /// Takes in a prompt's prefilled `tokens` (`ran`: prefilled by this prompt's own
    /// forward pass, not branched from another request's); once the whole prompt is
    /// in, captures its activations and branches its choices, each sampling its first
    /// token from the last position's logits.
    fn after_prefill(
        &mut self,
        request: usize,
        prompt: usize,
        tokens: usize,
        out: SeqOutput,
        ran: bool,
    ) -> Result<(), B::Error> {
        let model = Arc::clone(&self.model);
        let backend = Arc::clone(&self.backend);
        let a = &mut self.running[request];
        let g = &a.generation;
        let ids = &g.prompts[prompt];
        let pr = &mut a.prompts[prompt];
        let start = pr.done;
        pr.done += tokens;
        // A read-out of the last position keeps each chunk's last row only, so that
        // it holds one row per layer however long the prompt.
        let last_only = matches!(g.capture, Some((_, Positions::Last)));
        let d = model.config.d_model;
        for (layer, rows) in out.captured {
            let kept = pr.captured.entry(layer).or_default();
            if last_only && !rows.is_empty() {
                kept.clear();
                kept.extend_from_slice(&rows[rows.len().saturating_sub(d)..]);
            } else {
                kept.extend(rows);
            }
        }
        let whole = pr.done == ids.len();
        let last_logits = match g.sampling.logprobs {
            Some(top) if scores_prompt(g) => {
                let vocab = model.config.vocab;
                pr.echo
                    .push_rows(&ids[start..], &out.logits, vocab, top as usize);
                if whole { pr.echo.take_last_row() } else { None }
            }
            _ => whole.then_some(out.logits),
        };
        let Some(logits) = last_logits else {
            return Ok(());
        };
        if ran {
            self.stats.prefills += 1;
        }
        let mut cache = pr.cache.take().expect("prefilled prompt has its cache");
        // A prompt this request prefilled itself goes to the prompt cache: a branch
        // that holds its positions, for later requests with the same tokens.
        let keep = ran && self.config.prompt_cache > 0 && plain(g);
        let kept = if keep {
            Some((
                g.scope.clone(),
                ids.clone(),
                backend.fork(&mut cache, ids.len())?,
                logits.clone(),
            ))
        } else {
            None
        };
        if let Some((layers, positions)) = &g.capture {
            let read_outs = output::activations(&model, prompt, layers, *positions, &pr.captured);
            a.activations.extend(read_outs);
            pr.captured.clear();
        }
        let choices = choices::branch(&*backend, &model, g, prompt, &pr.echo, cache, &logits)?;
        a.choices.extend(choices);
        if let Some((scope, ids, cache, logits)) = kept {
            let room = self.unreserved();
            self.kept.keep(&scope, ids, cache, logits, room);
        }
        Ok(())
    }

    /// Samples every decoded choice's next token from its logits (in parallel where
    /// threads exist: each choice has its own sampler and random stream, so the order
    /// changes nothing), then takes the tokens in. `decoded` is in (request, choice)
    /// order, as the step built it.
    fn sample_decoded(&mut self, decoded: Vec<((usize, usize), Vec<f32>)>) {
        let mut work = Vec::with_capacity(decoded.len());
        let mut next = decoded.into_iter().peekable();
        for (ri, a) in self.running.iter_mut().enumerate() {
            for (ci, c) in a.choices.iter_mut().enumerate() {
                if let Some(((r, ch), _)) = next.peek()
                    && (*r, *ch) == (ri, ci)
                {
                    let (at, logits) = next.next().expect("peeked");
                    work.push((at, &mut c.sampler, logits));
                }
            }
        }
        let draw = |(at, sampler, mut logits): (_, &mut Sampler, Vec<f32>)| {
            (at, sampler.sample(&mut logits))
        };
        #[cfg(not(target_arch = "wasm32"))]
        let sampled: Vec<_> = {
            use rayon::prelude::*;
            work.into_par_iter().map(draw).collect()
        };
        #[cfg(target_arch = "wasm32")]
        let sampled: Vec<_> = work.into_iter().map(draw).collect();
        for ((ri, ci), s) in sampled {
            let a = &mut self.running[ri];
            a.choices[ci].accept(&self.model, &a.generation, s);
        }
    }

    /// Updates [`Stats::kv_bytes_peak`] and [`Stats::kv_bytes`] with what the running
    /// requests' caches take.
    fn note_kv_bytes(&mut self) {
        let backend = &self.backend;
        let bytes: usize = self
            .running
            .iter()
            .map(|a| {
                let prompts = a.prompts.iter().filter_map(|p| p.cache.as_ref());
                let choices = a.choices.iter().map(|c| &c.cache);
                prompts
                    .chain(choices)
                    .map(|c| backend.cache_bytes(c))
                    .sum::<usize>()
            })
            .sum::<usize>()
            + self.kept.cache_bytes(&**backend);
        self.stats.kv_bytes_peak = self.stats.kv_bytes_peak.max(bytes as u64);
        self.stats.kv_bytes = bytes as u64;
    }

    /// Sends each request the text its choices made this step; ends finished ones.
    fn report(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let a = &mut self.running[i];
            let mut deltas: Vec<Choice> = a
                .choices
                .iter_mut()
                .filter_map(ChoiceRun::take_delta)
                .collect();
            deltas.sort_by_key(|c| c.index);
            let alive = deltas.is_empty() || (a.sink)(Event::Delta(deltas));
            let prompts_done = a
                .prompts
                .iter()
                .all(|p| p.cache.is_none() && p.rides_on.is_none());
            let all_done = prompts_done && a.choices.iter().all(|c| c.finish.is_some());
            if all_done || !alive {
                let mut a = self.running.swap_remove(i);
                self.kv_reserved -= self.reservation(&a.generation);
                self.release_riders(a.id);
                let finished = finish(&mut a, !all_done);
                (a.sink)(Event::Done(finished));
            } else {
                i += 1;
            }
        }
    }

    fn fail_all(&mut self, e: ApiError) {
        for mut a in self.running.drain(..) {
            (a.sink)(Event::Failed(e.clone()));
        }
        self.kv_reserved = 0;
    }
}

/// The Completion parts of a request that ends now.
fn finish<C>(a: &mut Active<C>, cancelled: bool) -> Finished {
    let mut choices: Vec<Choice> = a
        .choices
        .iter_mut()
        .map(ChoiceRun::take_completed)
        .collect();
    choices.sort_by_key(|c| c.index);
    let generated: Vec<usize> = a.choices.iter().map(|c| c.generated).collect();
    // A prompt counts once it was (at least partly) computed.
    let prompt_lens: Vec<usize> = a.prompts.iter().map(|p| p.done).collect();
    let cached: usize = a.prompts.iter().map(|p| p.cached.min(p.done)).sum();
    Finished {
        choices,
        usage: Usage::new(&prompt_lens, &generated).with_cached_tokens(cached as u64),
        activations: std::mem::take(&mut a.activations),
        cancelled,
    }
}
