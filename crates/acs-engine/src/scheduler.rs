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
//! they share and branches from its cache there (a [`Ride`]); one that begins like a
//! prompt of an earlier request starts from the prompt cache (see
//! [`SchedulerConfig::prompt_cache`]). A branch shares the positions on the CPU and
//! copies them on the GPU (see [`Backend::forks_share_prompt`]).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use acs_core::request::Positions;
use acs_core::response::{Activation, Logprobs, TEXT_COMPLETION};
use acs_core::{ApiError, Choice, Completion, FinishReason, Outcome, Usage};
use acs_llama::model::{Logits, Model, SeqInput};
use acs_llama::sample::{Rng, Sampled, Sampler, log_sum_exp, top_k_indices};
use acs_llama::tokenizer::StreamDecoder;
use base64::Engine as _;

use crate::backend::Backend;
use crate::generation::{Generation, too_big_for_memory};
use crate::text::ChoiceText;

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
    /// result but pays for what it generated.
    pub fn into_outcome(self, model: &str, id: String, created: i64) -> (Outcome, u64) {
        let used = self.usage.total_tokens;
        if self.cancelled {
            (Outcome::Cancelled, used)
        } else {
            (
                Outcome::Succeeded(self.into_completion(model, id, created)),
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
}

/// Limits of a scheduler.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// KV cache positions all running requests may hold together.
    pub kv_capacity_tokens: usize,
    /// Most prompt tokens prefilled in one step, across requests.
    pub prefill_chunk: usize,
    /// Prompts kept after their requests end, so that a later request with the same
    /// tokens branches from one instead of prefilling it again, and one that begins
    /// with at least [`PREFIX_MIN_TOKENS`] of a kept prompt's tokens starts from a
    /// copy of them and prefills only the rest (0: none). Kept
    /// prompts use KV memory that no request holds, and give it up, the least
    /// recently used first, whenever a request needs the room. Only for requests that
    /// neither steer, read out activations, nor score their prompt.
    pub prompt_cache: usize,
}

impl SchedulerConfig {
    /// Refuses a request that could never fit the KV memory, whatever runs beside
    /// it; one that fits waits for room if it must.
    pub(crate) fn admits(
        &self,
        model: &Model,
        generation: &Generation,
        shared_prompts: bool,
    ) -> Result<(), ApiError> {
        let need = generation.kv_tokens(shared_prompts);
        if need > self.kv_capacity_tokens {
            let per = model.config.kv_bytes_per_token();
            return Err(too_big_for_memory(
                need * per,
                self.kv_capacity_tokens * per,
            ));
        }
        Ok(())
    }

    /// A config with `kv_bytes` of KV memory for `model`.
    pub fn with_kv_bytes(model: &Model, kv_bytes: usize) -> Self {
        SchedulerConfig {
            kv_capacity_tokens: kv_bytes / model.config.kv_bytes_per_token(),
            prefill_chunk: 256,
            prompt_cache: PROMPT_CACHE_ENTRIES,
        }
    }
}

/// Prompts [`SchedulerConfig::with_kv_bytes`] keeps: each holds its last position's
/// logits (192 KiB at the default model's vocabulary) beside its KV positions.
pub const PROMPT_CACHE_ENTRIES: usize = 64;

/// The fewest tokens a prompt must share with the beginning of a kept prompt to start
/// from a copy of them: below that, finding and copying them saves little.
pub const PREFIX_MIN_TOKENS: usize = 16;

/// A prompt whose prefill ended, kept for later requests with the same tokens (or
/// that begin with some of them).
struct KeptPrompt<C> {
    ids: Vec<u32>,
    /// A branch of the prompt's cache that holds its positions and no room: every
    /// later request branches from it as a choice branches from its prompt.
    cache: C,
    /// The last position's logits, which each choice samples its first token from.
    logits: Vec<f32>,
    /// The scheduler's clock when it was last used, for evicting the least recent.
    used: u64,
}

/// A branch of a kept prompt's cache, and the logits its choices sample their first
/// tokens from.
type KeptBranch<C> = (C, Vec<f32>);

/// One echoed prompt token: its id, log-probability (none for the first) and the
/// likeliest alternatives at its position.
type EchoEntry = (u32, Option<f32>, Vec<(u32, f32)>);

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
    /// Echoed prompt log-probabilities: (token, logprob, top) per position.
    echo: Vec<EchoEntry>,
    /// Its first tokens that came from a kept prompt (see
    /// [`SchedulerConfig::prompt_cache`]) instead of being prefilled: all of them, or
    /// the ones it begins with.
    cached: usize,
    /// The logits row of the last position seen, for the next echo entry.
    last_row: Option<Vec<f32>>,
}

/// Where a prompt waits for another prompt that is being prefilled (its leader, of the
/// same request or another) to branch from its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ride {
    /// The leader's request ([`Active::id`]).
    leader: u64,
    /// Which of that request's prompts.
    prompt: usize,
    /// The positions the rider takes over: all of them when the two prompts are the
    /// same tokens (it then samples from the leader's last logits too), or the
    /// beginning they share (see [`branch_point`]), after which it prefills the rest.
    /// The leader's prefill pauses there, so that the rider shares those positions.
    at: usize,
}

struct ChoiceRun<C> {
    index: u32,
    cache: C,
    sampler: Sampler,
    feed: [u32; 1],
    generated: usize,
    text: ChoiceText,
    decoder: StreamDecoder,
    finish: Option<FinishReason>,
    logprobs: Option<Logprobs>,
    /// Text emitted this step, for the next Delta.
    delta: String,
    delta_logprobs: Option<Logprobs>,
    /// Whether this step produced something to report (text or the end).
    moved: bool,
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

enum Slot {
    Prompt {
        request: usize,
        prompt: usize,
        tokens: usize,
    },
    Choice {
        request: usize,
        choice: usize,
    },
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
    /// The prompt cache (see [`SchedulerConfig::prompt_cache`]).
    kept: Vec<KeptPrompt<B::Cache>>,
    /// KV positions the kept prompts hold, reserved beside the running requests'.
    kept_tokens: usize,
    stats: Stats,
    /// The next request's [`Active::id`], and the prompt cache's clock.
    next_id: u64,
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
            kept: Vec::new(),
            kept_tokens: 0,
            stats: Stats::default(),
            next_id: 0,
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
                echo: Vec::new(),
                cached: 0,
                last_row: None,
            })
            .collect();
        let id = self.tick();
        self.waiting.push_back(Active {
            id,
            generation,
            sink,
            cancel,
            prompts,
            choices: Vec::new(),
            activations: Vec::new(),
        });
    }

    /// Runs one step: admits waiting requests that fit, prefills a chunk of prompts,
    /// decodes one token for every running choice, and reports to the sinks.
    ///
    /// Natively the CPU backend's step is ready at once: [`Scheduler::step_blocking`]
    /// runs it to its end.
    pub async fn step(&mut self) {
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
                        let out = acs_llama::model::SeqOutput {
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

    /// Updates [`Stats::kv_bytes_peak`] with what the running requests' caches take.
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
            + self
                .kept
                .iter()
                .map(|k| backend.cache_bytes(&k.cache))
                .sum::<usize>();
        self.stats.kv_bytes_peak = self.stats.kv_bytes_peak.max(bytes as u64);
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
            accept(&self.model, &a.generation, &mut a.choices[ci], s);
        }
    }

    /// Starts the waiting requests that fit, in order; kept prompts give up their
    /// room first. A prompt found in the prompt cache branches its choices at once.
    fn admit(&mut self) -> Result<(), B::Error> {
        while let Some(front) = self.waiting.front() {
            let need = self.reservation(&front.generation);
            while !self.has_room(need) && self.evict_kept() {}
            if !self.has_room(need) {
                break;
            }
            self.kv_reserved += need;
            let a = self.waiting.pop_front().expect("front exists");
            self.running.push(a);
            let request = self.running.len() - 1;
            for prompt in 0..self.running[request].prompts.len() {
                self.start_prompt(request, prompt)?;
            }
        }
        Ok(())
    }

    /// Gives a newly admitted prompt what it starts from, the longest-reaching first: a
    /// kept prompt of the same tokens (its choices branch at once), a ride on a prompt
    /// being prefilled (see [`Ride`]), a copy of the beginning it shares with a kept
    /// prompt or with one being prefilled past that beginning, or an empty cache (the
    /// only start of a prompt whose request is not [`plain`]). Each cache has the room
    /// of one choice (its last choice takes it over): the prompt and the completion.
    fn start_prompt(&mut self, request: usize, prompt: usize) -> Result<(), B::Error> {
        let g = &self.running[request].generation;
        let positions = g.prompts[prompt].len() + g.max_tokens;
        if !plain(g) {
            self.running[request].prompts[prompt].cache = Some(self.backend.new_cache(positions));
            return Ok(());
        }
        let (ids, max_tokens) = (g.prompts[prompt].clone(), g.max_tokens);
        if let Some((cache, logits)) = self.branch_kept(&ids, max_tokens)? {
            let pr = &mut self.running[request].prompts[prompt];
            pr.cache = Some(cache);
            pr.cached = ids.len();
            let out = acs_llama::model::SeqOutput {
                logits,
                captured: Vec::new(),
            };
            return self.after_prefill(request, prompt, ids.len(), out, false);
        }
        let (cache, done, cached) = match (self.leader_for(&ids), self.kept_prefix(&ids)) {
            (Some((ri, pi, at)), kept) if kept.is_none_or(|(_, n)| n < at) => {
                let leader = self.running[ri].id;
                let theirs = &mut self.running[ri].prompts[pi];
                let cache = theirs.cache.as_mut().expect("a leader is being prefilled");
                if theirs.done < at {
                    let ride = Ride {
                        leader,
                        prompt: pi,
                        at,
                    };
                    self.running[request].prompts[prompt].rides_on = Some(ride);
                    return Ok(());
                }
                // The leader is there already (a branch of its cache) or past it (a
                // copy of its first positions).
                let cache = if theirs.done == at {
                    self.backend.fork(cache, positions)?
                } else {
                    self.backend.copy_prefix(cache, at, positions)?
                };
                (cache, at, 0)
            }
            (_, Some((k, n))) => {
                let cache = self
                    .backend
                    .copy_prefix(&self.kept[k].cache, n, positions)?;
                self.hit_kept(k);
                (cache, n, n)
            }
            _ => (self.backend.new_cache(positions), 0, 0),
        };
        let pr = &mut self.running[request].prompts[prompt];
        pr.cache = Some(cache);
        (pr.done, pr.cached) = (done, cached);
        Ok(())
    }

    /// A branch of the kept prompt with these tokens, for a prompt that generates
    /// `max_tokens`, with the logits its choices sample their first tokens from; `None`
    /// when none is kept.
    fn branch_kept(
        &mut self,
        ids: &[u32],
        max_tokens: usize,
    ) -> Result<Option<KeptBranch<B::Cache>>, B::Error> {
        let Some(at) = self.kept.iter().position(|k| k.ids == ids) else {
            return Ok(None);
        };
        self.hit_kept(at);
        let k = &mut self.kept[at];
        let cache = self.backend.fork(&mut k.cache, ids.len() + max_tokens)?;
        Ok(Some((cache, k.logits.clone())))
    }

    /// The kept prompt (its place in `kept`) that shares the longest beginning with
    /// `ids`, and that beginning's length, where one shares a [`branch_point`].
    fn kept_prefix(&self, ids: &[u32]) -> Option<(usize, usize)> {
        (0..self.kept.len())
            .filter_map(|i| Some((i, branch_point(ids, &self.kept[i].ids)?)))
            .max_by_key(|&(_, n)| n)
    }

    /// Keeps a prompt whose prefill just ended (`cache`: a branch of it with no room
    /// of its own), if the prompt cache takes it: the least recently used kept
    /// prompts make way for it, within the entries allowed and the KV room that no
    /// request reserved.
    fn keep(&mut self, ids: Vec<u32>, cache: B::Cache, logits: Vec<f32>) {
        let now = self.tick();
        if let Some(k) = self.kept.iter_mut().find(|k| k.ids == ids) {
            k.used = now;
            return;
        }
        let full = |s: &Self| s.kept.len() >= s.config.prompt_cache || !s.has_room(ids.len());
        while full(self) && self.evict_kept() {}
        if !full(self) {
            self.kept_tokens += ids.len();
            self.kept.push(KeptPrompt {
                ids,
                cache,
                logits,
                used: now,
            });
        }
    }

    /// Counts a prompt that started from kept prompt `k` (whole or its beginning), and
    /// makes `k` the most recently used, the last to be evicted.
    fn hit_kept(&mut self, k: usize) {
        self.kept[k].used = self.tick();
        self.stats.prompt_cache_hits += 1;
    }

    /// Whether `positions` more fit beside the running requests' reservations and the
    /// kept prompts.
    fn has_room(&self, positions: usize) -> bool {
        self.kv_reserved + self.kept_tokens + positions <= self.config.kv_capacity_tokens
    }

    /// The next value of the scheduler's clock: requests' ids, and when kept prompts
    /// were last used.
    fn tick(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Drops the least recently used kept prompt; false when none is kept.
    fn evict_kept(&mut self) -> bool {
        let Some(oldest) = (0..self.kept.len()).min_by_key(|&i| self.kept[i].used) else {
            return false;
        };
        let k = self.kept.swap_remove(oldest);
        self.kept_tokens -= k.ids.len();
        true
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

    /// Runs [`Scheduler::step`] on the calling thread, blocking on the backend.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_blocking(&mut self) {
        pollster::block_on(self.step());
    }

    /// Prompt tokens each prompt prefills this step, by (request, prompt): the step's
    /// budget goes to the prompts with the fewest tokens left first, so that a short
    /// prompt starts at once instead of waiting behind long ones (which take the rest
    /// of the budget, and all of it when no short prompt waits).
    ///
    /// A prompt that others ride on stops at the next position where one of them
    /// branches (see [`Ride::at`]).
    fn prefill_plan(&self) -> BTreeMap<(usize, usize), usize> {
        let rides: Vec<Ride> = self
            .running
            .iter()
            .flat_map(|a| a.prompts.iter().filter_map(|p| p.rides_on))
            .collect();
        let mut left: Vec<(usize, usize, usize)> = Vec::new();
        for (ri, a) in self.running.iter().enumerate() {
            for (pi, pr) in a.prompts.iter().enumerate() {
                if pr.cache.is_some() {
                    let stop = rides
                        .iter()
                        .filter(|r| (r.leader, r.prompt) == (a.id, pi) && r.at > pr.done)
                        .map(|r| r.at)
                        .min()
                        .unwrap_or(a.generation.prompts[pi].len());
                    left.push((stop - pr.done, ri, pi));
                }
            }
        }
        left.sort_unstable();
        let mut budget = self.config.prefill_chunk;
        let mut plan = BTreeMap::new();
        for (n, ri, pi) in left {
            let take = n.min(budget);
            if take == 0 {
                break;
            }
            budget -= take;
            plan.insert((ri, pi), take);
        }
        plan
    }

    async fn forward(&mut self) -> Result<(Vec<Slot>, Vec<acs_llama::model::SeqOutput>), B::Error> {
        let mut slots = Vec::new();
        let mut batch: Vec<SeqInput<'_, B::Cache>> = Vec::new();
        let plan = self.prefill_plan();
        for (ri, a) in self.running.iter_mut().enumerate() {
            let Active {
                generation,
                prompts,
                choices,
                ..
            } = a;
            let capture: &[usize] = generation
                .capture
                .as_ref()
                .map(|(l, _)| l.as_slice())
                .unwrap_or(&[]);
            let echo_scores = generation.echo && generation.sampling.logprobs.is_some();
            for (pi, pr) in prompts.iter_mut().enumerate() {
                let Some(cache) = pr.cache.as_mut() else {
                    continue;
                };
                let ids = &generation.prompts[pi];
                let Some(&take) = plan.get(&(ri, pi)) else {
                    continue;
                };
                let last = pr.done + take == ids.len();
                slots.push(Slot::Prompt {
                    request: ri,
                    prompt: pi,
                    tokens: take,
                });
                batch.push(SeqInput {
                    cache,
                    tokens: &ids[pr.done..pr.done + take],
                    steering: &generation.steering,
                    capture,
                    logits: match (echo_scores, last) {
                        (true, _) => Logits::All,
                        (false, true) => Logits::Last,
                        (false, false) => Logits::None,
                    },
                });
            }
            for (ci, c) in choices.iter_mut().enumerate() {
                if c.finish.is_some() {
                    continue;
                }
                slots.push(Slot::Choice {
                    request: ri,
                    choice: ci,
                });
                batch.push(SeqInput {
                    cache: &mut c.cache,
                    tokens: &c.feed,
                    steering: &generation.steering,
                    capture: &[],
                    logits: Logits::Last,
                });
            }
        }
        self.stats.steps += 1;
        self.stats.max_batch = self.stats.max_batch.max(batch.len() as u64);
        for s in &slots {
            match s {
                Slot::Prompt { tokens, .. } => self.stats.prefill_tokens += *tokens as u64,
                Slot::Choice { .. } => self.stats.decode_tokens += 1,
            }
        }
        let out = self.backend.forward(&mut batch).await?;
        Ok((slots, out))
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
        out: acs_llama::model::SeqOutput,
        ran: bool,
    ) -> Result<(), B::Error> {
        let model = Arc::clone(&self.model);
        let backend = Arc::clone(&self.backend);
        let vocab = model.config.vocab;
        let a = &mut self.running[request];
        let g = &a.generation;
        let ids = &g.prompts[prompt];
        let pr = &mut a.prompts[prompt];
        let start = pr.done;
        pr.done += tokens;
        for (layer, rows) in out.captured {
            pr.captured.entry(layer).or_default().extend(rows);
        }
        let mut last_logits = None;
        if g.echo && g.sampling.logprobs.is_some() {
            let k = g.sampling.logprobs.unwrap_or(0) as usize;
            for (i, row) in out.logits.chunks_exact(vocab).enumerate() {
                let token = ids[start + i];
                let entry = match &pr.last_row {
                    None => (token, None, Vec::new()),
                    Some(prev) => {
                        let lse = log_sum_exp(prev);
                        let top = top_k_indices(prev, k)
                            .into_iter()
                            .map(|t| (t as u32, prev[t] - lse))
                            .collect();
                        (token, Some(prev[token as usize] - lse), top)
                    }
                };
                pr.echo.push(entry);
                pr.last_row = Some(row.to_vec());
            }
            if pr.done == ids.len() {
                last_logits = pr.last_row.take();
            }
        } else if pr.done == ids.len() {
            last_logits = Some(out.logits);
        }
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
                ids.clone(),
                backend.fork(&mut cache, ids.len())?,
                logits.clone(),
            ))
        } else {
            None
        };
        if let Some((layers, positions)) = &g.capture {
            let d = model.config.d_model;
            for &layer in layers {
                let rows = pr.captured.get(&layer).map(Vec::as_slice).unwrap_or(&[]);
                let rows = match positions {
                    Positions::All => rows,
                    Positions::Last => &rows[rows.len().saturating_sub(d)..],
                };
                a.activations.push(Activation {
                    prompt_index: prompt as u32,
                    layer: layer as u32,
                    positions: *positions,
                    shape: [(rows.len() / d) as u32, d as u32],
                    dtype: "f32".into(),
                    data: base64::engine::general_purpose::STANDARD.encode(
                        rows.iter()
                            .flat_map(|x| x.to_le_bytes())
                            .collect::<Vec<u8>>(),
                    ),
                });
            }
            pr.captured.clear();
        }
        // Branch: the n choices share the prompt's cache, each with its own stream.
        let n = g.n;
        let mut cache = Some(cache);
        for i in 0..n {
            let index = (prompt * n + i) as u32;
            let text = if g.echo {
                ChoiceText::with_prefix(&g.prompt_texts[prompt])
            } else {
                ChoiceText::default()
            };
            let mut logprobs = g.sampling.logprobs.map(|_| Logprobs::default());
            let mut delta = String::new();
            let mut delta_logprobs = logprobs.clone();
            if g.echo {
                delta.push_str(&g.prompt_texts[prompt]);
                if let (Some(lp), Some(dlp)) = (logprobs.as_mut(), delta_logprobs.as_mut()) {
                    // Offsets count the characters of the text the tokens decode to
                    // (a piece of a character adds none until it is whole).
                    let mut decoder = StreamDecoder::new();
                    let mut offset = 0u32;
                    for (token, logprob, top) in &pr.echo {
                        let t = token_text(&model, *token);
                        let mut tops = top_map(&model, top);
                        if let Some(l) = logprob {
                            tops.entry(t.clone()).or_insert(*l);
                        }
                        for target in [&mut *lp, &mut *dlp] {
                            target.tokens.push(t.clone());
                            target.token_logprobs.push(*logprob);
                            target.top_logprobs.push(logprob.map(|_| tops.clone()));
                            target.text_offset.push(offset);
                        }
                        offset += decoder.push(&model.tokenizer, *token).chars().count() as u32;
                    }
                }
            }
            // Every choice but the last branches from the prompt's cache (sharing or
            // copying its positions, as the backend does); the last takes it.
            let cache = if i + 1 == n {
                cache.take().expect("taken once, by the last choice")
            } else {
                backend.fork(
                    cache.as_mut().expect("still there before the last choice"),
                    ids.len() + g.max_tokens,
                )?
            };
            let mut choice = ChoiceRun {
                index,
                cache,
                sampler: Sampler::new(
                    g.sampling.clone(),
                    Rng::for_choice(g.seed, u64::from(index)),
                ),
                feed: [0],
                generated: 0,
                text,
                decoder: StreamDecoder::new(),
                finish: None,
                logprobs,
                delta,
                delta_logprobs,
                moved: true,
            };
            if g.max_tokens == 0 {
                choice.finish = Some(FinishReason::Length);
            } else {
                let mut l = logits.clone();
                let sampled = choice.sampler.sample(&mut l);
                accept(&model, g, &mut choice, sampled);
            }
            a.choices.push(choice);
        }
        if let Some((ids, cache, logits)) = kept {
            self.keep(ids, cache, logits);
        }
        Ok(())
    }

    /// Sends each request the text its choices made this step; ends finished ones.
    fn report(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let a = &mut self.running[i];
            let mut deltas = Vec::new();
            for c in a.choices.iter_mut().filter(|c| c.moved) {
                c.moved = false;
                deltas.push(Choice {
                    index: c.index,
                    text: std::mem::take(&mut c.delta),
                    finish_reason: c.finish,
                    logprobs: c.delta_logprobs.as_mut().map(std::mem::take),
                });
            }
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

    /// KV positions a running request holds a reservation for: its prompts once where
    /// the backend's branches share them.
    fn reservation(&self, g: &Generation) -> usize {
        g.kv_tokens(self.backend.forks_share_prompt())
    }

    /// The prompt being prefilled (request and prompt, by place in `running`) that a
    /// plain prompt of `ids` shares the most with, and its [`branch_point`], among
    /// [`plain`] requests.
    fn leader_for(&self, ids: &[u32]) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (ri, a) in self.running.iter().enumerate() {
            if !plain(&a.generation) {
                continue;
            }
            for (pi, pr) in a.prompts.iter().enumerate() {
                if pr.cache.is_none() {
                    continue;
                }
                let Some(at) = branch_point(ids, &a.generation.prompts[pi]) else {
                    continue;
                };
                if best.is_none_or(|(_, _, b)| b < at) {
                    best = Some((ri, pi, at));
                }
            }
        }
        best
    }

    /// When request `request`'s prompt `prompt` reaches the end of these `tokens`,
    /// gives each prompt that rides on it to there (see [`Ride`]) a branch of its
    /// cache. A rider with other tokens after that prefills them from the next step;
    /// the riders with the same tokens are returned as (request, prompt, tokens), to
    /// be taken in as prefilled.
    fn branch_riders(
        &mut self,
        request: usize,
        prompt: usize,
        tokens: usize,
    ) -> Result<Vec<(usize, usize, usize)>, B::Error> {
        let leader = &self.running[request];
        let at = leader.prompts[prompt].done + tokens;
        let ride = Some(Ride {
            leader: leader.id,
            prompt,
            at,
        });
        let mut riders = Vec::new();
        for (ri, a) in self.running.iter().enumerate() {
            for (pi, pr) in a.prompts.iter().enumerate() {
                if pr.rides_on == ride {
                    riders.push((
                        ri,
                        pi,
                        a.generation.prompts[pi].len(),
                        a.generation.max_tokens,
                    ));
                }
            }
        }
        if riders.is_empty() {
            return Ok(Vec::new());
        }
        let mut cache = self.running[request].prompts[prompt]
            .cache
            .take()
            .expect("a prompt being prefilled has its cache");
        let mut branched = Ok(());
        for &(ri, pi, len, max_tokens) in &riders {
            match self.backend.fork(&mut cache, len + max_tokens) {
                Ok(c) => {
                    let pr = &mut self.running[ri].prompts[pi];
                    pr.cache = Some(c);
                    pr.rides_on = None;
                    if len > at {
                        pr.done = at;
                    }
                }
                Err(e) => {
                    branched = Err(e);
                    break;
                }
            }
        }
        self.running[request].prompts[prompt].cache = Some(cache);
        branched?;
        Ok(riders
            .into_iter()
            .filter(|&(_, _, len, _)| len == at)
            .map(|(ri, pi, len, _)| (ri, pi, len))
            .collect())
    }

    /// Gives the prompts that rode on request `id` (which leaves before their prefill
    /// ended) caches of their own: they prefill themselves from the next step.
    fn release_riders(&mut self, id: u64) {
        for a in &mut self.running {
            let g = &a.generation;
            for (pr, ids) in a.prompts.iter_mut().zip(&g.prompts) {
                if pr.rides_on.is_some_and(|r| r.leader == id) {
                    pr.rides_on = None;
                    pr.cache = Some(self.backend.new_cache(ids.len() + g.max_tokens));
                }
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

/// Whether a request's prompts may be shared with other requests' identical ones
/// (prefilled once, or kept for later): when it neither steers the residual stream,
/// reads it out, nor scores its prompt's tokens (any of which makes the prefill
/// differ, or needs more from it than its last logits).
fn plain(g: &Generation) -> bool {
    g.steering.is_empty() && g.capture.is_none() && !(g.echo && g.sampling.logprobs.is_some())
}

/// How many positions a prompt of `ids` can take over from the cache of a prompt of
/// `theirs`: all of them when the tokens are the same; otherwise the beginning they
/// share, stopping one short of the whole prompt (whose last logits the other does not
/// have), when that is at least [`PREFIX_MIN_TOKENS`] long: below that, sharing saves
/// little.
fn branch_point(ids: &[u32], theirs: &[u32]) -> Option<usize> {
    if ids == theirs {
        return Some(ids.len());
    }
    let shared = ids.iter().zip(theirs).take_while(|(a, b)| a == b).count();
    let at = shared.min(ids.len().saturating_sub(1));
    (at >= PREFIX_MIN_TOKENS).then_some(at)
}

/// Alternatives as the contract's map from token text to log-probability. Tokens can
/// share a text (partial UTF-8 prints as U+FFFD): the likeliest keeps the entry.
fn top_map(model: &Model, top: &[(u32, f32)]) -> BTreeMap<String, f32> {
    let mut map = BTreeMap::new();
    for &(id, l) in top {
        map.entry(token_text(model, id)).or_insert(l);
    }
    map
}

/// A token as `logprobs` names it: its text, or, where its bytes are not whole UTF-8
/// (a piece of a character), `bytes:` and the bytes as `\xNN` escapes, as OpenAI's API
/// writes them, so that two such pieces never share a name among the alternatives.
fn token_text(model: &Model, id: u32) -> String {
    let bytes = model.tokenizer.token_bytes(id);
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => bytes.iter().fold("bytes:".to_owned(), |mut s, b| {
            // Writing to a String cannot fail.
            let _ = write!(s, "\\x{b:02x}");
            s
        }),
    }
}

/// Takes a sampled token into a choice: end of generation, text and stop sequences,
/// log-probabilities, the length limit.
fn accept<C>(model: &Model, g: &Generation, c: &mut ChoiceRun<C>, s: Sampled) {
    c.generated += 1;
    c.moved = true;
    let tok = &model.tokenizer;
    if tok.is_eog(s.token) {
        let rest = c.decoder.finish();
        let (out, _) = c.text.push(&rest, &g.stop);
        c.delta.push_str(&out);
        c.delta.push_str(&c.text.finish());
        c.finish = Some(FinishReason::Stop);
        return;
    }
    let offset = c.text.chars() as u32;
    if let (Some(lp), Some(dlp)) = (c.logprobs.as_mut(), c.delta_logprobs.as_mut()) {
        let t = token_text(model, s.token);
        let mut tops = top_map(model, &s.top);
        // The chosen token's log-probability is always among the alternatives (so
        // `logprobs` + 1 of them at most), as OpenAI's API gives it.
        if let Some(l) = s.logprob {
            tops.entry(t.clone()).or_insert(l);
        }
        for target in [lp, dlp] {
            target.tokens.push(t.clone());
            target.token_logprobs.push(s.logprob);
            target.top_logprobs.push(Some(tops.clone()));
            target.text_offset.push(offset);
        }
    }
    let piece = c.decoder.push(tok, s.token);
    let (out, stopped) = c.text.push(&piece, &g.stop);
    c.delta.push_str(&out);
    if stopped {
        c.finish = Some(FinishReason::Stop);
    } else if c.generated >= g.max_tokens {
        let rest = c.decoder.finish();
        let (out, stopped) = c.text.push(&rest, &g.stop);
        c.delta.push_str(&out);
        if !stopped {
            c.delta.push_str(&c.text.finish());
        }
        c.finish = Some(if stopped {
            FinishReason::Stop
        } else {
            FinishReason::Length
        });
    } else {
        c.feed = [s.token];
    }
}

/// The Completion parts of a request that ends now.
fn finish<C>(a: &mut Active<C>, cancelled: bool) -> Finished {
    let mut choices: Vec<Choice> = a
        .choices
        .iter_mut()
        .map(|c| Choice {
            index: c.index,
            text: c.text.emitted().to_owned(),
            finish_reason: c.finish,
            logprobs: c.logprobs.take(),
        })
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
