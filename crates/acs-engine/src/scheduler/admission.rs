//! Admission to the KV memory: a request that could never fit it is refused at once;
//! one that fits waits until the running requests leave it room (kept prompts give
//! theirs up), and then each of its prompts gets the cache it starts from.

use acs_core::ApiError;
use acs_llama::model::{Model, SeqOutput};

use super::Scheduler;
use super::prompt_cache::PROMPT_CACHE_ENTRIES;
use super::sharing::{Ride, plain};
use crate::backend::Backend;
use crate::generation::{Generation, too_big_for_memory};

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
    /// copy of them and prefills only the rest (0: none). Kept prompts use KV memory
    /// that no request holds, and give it up, the least recently used first, whenever
    /// a request needs the room. Only for requests that neither steer, read out
    /// activations, nor score their prompt.
    ///
    /// [`PREFIX_MIN_TOKENS`]: super::PREFIX_MIN_TOKENS
    pub prompt_cache: usize,
}

impl SchedulerConfig {
    /// Refuses a request that could never fit the KV memory, whatever runs beside
    /// it (one that fits waits for room if it must), and one whose contrast pairs
    /// are still to be resolved.
    pub(crate) fn admits(
        &self,
        model: &Model,
        generation: &Generation,
        shared_prompts: bool,
    ) -> Result<(), ApiError> {
        if !generation.contrasts.is_empty() {
            return Err(ApiError::internal(
                "a request reached the engine before its contrast pairs were resolved",
            ));
        }
        let need = generation.kv_tokens(shared_prompts);
        if need > self.kv_capacity_tokens {
            let per = model.config.kv_bytes_per_token();
            // Saturating, as `kv_tokens` is: a usize is 32 bits on wasm32.
            return Err(too_big_for_memory(
                need.saturating_mul(per),
                self.kv_capacity_tokens.saturating_mul(per),
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

/// Requests that may start ahead of the first waiting one while it waits for room:
/// smaller requests behind a big one run meanwhile, and the big one is not starved
/// (after this many, the queue waits for it in order).
pub const MAX_PASSES: usize = 32;

impl<B: Backend> Scheduler<B> {
    /// Starts the waiting requests that fit, in order; kept prompts give up their
    /// room first. One that does not fit yet lets those behind it that fit start
    /// ahead of it, up to [`MAX_PASSES`] of them. A prompt found in the prompt cache
    /// branches its choices at once.
    pub(super) fn admit(&mut self) -> Result<(), B::Error> {
        let mut at = 0;
        while let Some(next) = self.waiting.get(at) {
            if at > 0 && self.front_passed >= MAX_PASSES {
                break;
            }
            let need = self.reservation(&next.generation);
            while !self.has_room(need) && self.kept.evict_lru() {}
            if !self.has_room(need) {
                at += 1;
                continue;
            }
            if at == 0 {
                self.front_passed = 0;
            } else {
                self.front_passed += 1;
            }
            self.kv_reserved += need;
            let a = self.waiting.remove(at).expect("a waiting request is there");
            self.running.push(a);
            let request = self.running.len() - 1;
            for prompt in 0..self.running[request].prompts.len() {
                self.start_prompt(request, prompt)?;
            }
        }
        Ok(())
    }

    /// KV positions a running request holds a reservation for: its prompts once where
    /// the backend's branches share them.
    pub(super) fn reservation(&self, g: &Generation) -> usize {
        g.kv_tokens(self.backend.forks_share_prompt())
    }

    /// Whether `positions` more fit beside the running requests' reservations and the
    /// kept prompts.
    fn has_room(&self, positions: usize) -> bool {
        self.kv_reserved + self.kept.tokens() + positions <= self.config.kv_capacity_tokens
    }

    /// KV positions no running request reserved: the most the kept prompts may hold.
    pub(super) fn unreserved(&self) -> usize {
        self.config
            .kv_capacity_tokens
            .saturating_sub(self.kv_reserved)
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
        let ids = g.prompts[prompt].clone();
        let scope = g.scope.clone();
        if let Some(k) = self.kept.find(&scope, &ids) {
            self.hit_kept(k);
            let (cache, logits) = self.kept.branch(&*self.backend, k, positions)?;
            let pr = &mut self.running[request].prompts[prompt];
            pr.cache = Some(cache);
            pr.cached = ids.len();
            let out = SeqOutput {
                logits,
                captured: Vec::new(),
            };
            return self.after_prefill(request, prompt, ids.len(), out, false);
        }
        let (cache, done, cached) = match (
            self.leader_for(&scope, &ids),
            self.kept.longest_prefix(&scope, &ids),
        ) {
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
                let cache = self.kept.copy_prefix(&*self.backend, k, n, positions)?;
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

    /// Counts a prompt that started from kept prompt `k` (whole or its beginning), and
    /// makes `k` the most recently used, the last to be evicted.
    fn hit_kept(&mut self, k: usize) {
        self.kept.touch(k);
        self.stats.prompt_cache_hits += 1;
    }
}
