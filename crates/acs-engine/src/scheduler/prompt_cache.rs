//! The prompt cache: prompts kept after their requests end, which later prompts with
//! the same tokens branch from, and later prompts that begin with enough of their
//! tokens copy the beginning of (see [`SchedulerConfig::prompt_cache`]). They hold KV
//! memory that no request reserved, and give it up, the least recently used first.
//!
//! [`SchedulerConfig::prompt_cache`]: super::SchedulerConfig::prompt_cache

use super::sharing::branch_point;
use crate::backend::Backend;

/// Prompts [`SchedulerConfig::with_kv_bytes`] keeps: each holds its last position's
/// logits (192 KiB at the default model's vocabulary) beside its KV positions.
///
/// [`SchedulerConfig::with_kv_bytes`]: super::SchedulerConfig::with_kv_bytes
pub const PROMPT_CACHE_ENTRIES: usize = 64;

/// A prompt whose prefill ended, kept for later requests with the same tokens (or
/// that begin with some of them).
struct KeptPrompt<C> {
    /// The [`Generation::scope`] of the request that prefilled it: only requests of
    /// that scope use it.
    ///
    /// [`Generation::scope`]: crate::Generation::scope
    scope: String,
    ids: Vec<u32>,
    /// A branch of the prompt's cache that holds its positions and no room: every
    /// later request branches from it as a choice branches from its prompt.
    cache: C,
    /// The last position's logits, which each choice samples its first token from.
    logits: Vec<f32>,
    /// The cache's clock when it was last used, for evicting the least recent.
    used: u64,
}

/// The kept prompts, with the KV positions they hold.
pub(super) struct PromptCache<C> {
    kept: Vec<KeptPrompt<C>>,
    /// Most prompts kept ([`SchedulerConfig::prompt_cache`]).
    ///
    /// [`SchedulerConfig::prompt_cache`]: super::SchedulerConfig::prompt_cache
    entries: usize,
    /// KV positions the kept prompts hold, reserved beside the running requests'.
    tokens: usize,
    /// Counts the uses of kept prompts: when each was last used.
    clock: u64,
}

impl<C> PromptCache<C> {
    /// An empty cache that keeps at most `entries` prompts.
    pub(super) fn new(entries: usize) -> Self {
        PromptCache {
            kept: Vec::new(),
            entries,
            tokens: 0,
            clock: 0,
        }
    }

    /// Prompts kept.
    pub(super) fn len(&self) -> usize {
        self.kept.len()
    }

    /// KV positions the kept prompts hold.
    pub(super) fn tokens(&self) -> usize {
        self.tokens
    }

    /// Memory the kept prompts' caches take, in bytes.
    pub(super) fn cache_bytes<B: Backend<Cache = C>>(&self, backend: &B) -> usize {
        self.kept
            .iter()
            .map(|k| backend.cache_bytes(&k.cache))
            .sum()
    }

    /// The kept prompt of `scope` (its place) with these tokens.
    pub(super) fn find(&self, scope: &str, ids: &[u32]) -> Option<usize> {
        self.kept
            .iter()
            .position(|k| k.scope == scope && k.ids == ids)
    }

    /// The kept prompt of `scope` (its place) that shares the longest beginning with
    /// `ids`, and that beginning's length, where one shares a [`branch_point`].
    pub(super) fn longest_prefix(&self, scope: &str, ids: &[u32]) -> Option<(usize, usize)> {
        (0..self.kept.len())
            .filter(|&i| self.kept[i].scope == scope)
            .filter_map(|i| Some((i, branch_point(ids, &self.kept[i].ids)?)))
            .max_by_key(|&(_, n)| n)
    }

    /// Makes kept prompt `k` the most recently used, the last to be evicted.
    pub(super) fn touch(&mut self, k: usize) {
        self.kept[k].used = self.tick();
    }

    /// A branch of kept prompt `k`'s cache with room for `positions`, and the logits
    /// its choices sample their first tokens from.
    pub(super) fn branch<B: Backend<Cache = C>>(
        &mut self,
        backend: &B,
        k: usize,
        positions: usize,
    ) -> Result<(C, Vec<f32>), B::Error> {
        let k = &mut self.kept[k];
        let cache = backend.fork(&mut k.cache, positions)?;
        Ok((cache, k.logits.clone()))
    }

    /// A cache of its own holding the first `prefix` positions of kept prompt `k`,
    /// with room for `positions`.
    pub(super) fn copy_prefix<B: Backend<Cache = C>>(
        &self,
        backend: &B,
        k: usize,
        prefix: usize,
        positions: usize,
    ) -> Result<C, B::Error> {
        backend.copy_prefix(&self.kept[k].cache, prefix, positions)
    }

    /// Keeps a prompt of `scope` whose prefill just ended (`cache`: a branch of it
    /// with no room of its own), if the cache takes it: the least recently used kept
    /// prompts make way for it, within the entries allowed and the `room` of KV
    /// positions that no request reserved.
    pub(super) fn keep(
        &mut self,
        scope: &str,
        ids: Vec<u32>,
        cache: C,
        logits: Vec<f32>,
        room: usize,
    ) {
        let now = self.tick();
        if let Some(k) = self
            .kept
            .iter_mut()
            .find(|k| k.scope == scope && k.ids == ids)
        {
            k.used = now;
            return;
        }
        let full = |s: &Self| s.kept.len() >= s.entries || s.tokens + ids.len() > room;
        while full(self) && self.evict_lru() {}
        if !full(self) {
            self.tokens += ids.len();
            self.kept.push(KeptPrompt {
                scope: scope.to_owned(),
                ids,
                cache,
                logits,
                used: now,
            });
        }
    }

    /// Drops the least recently used kept prompt; false when none is kept.
    pub(super) fn evict_lru(&mut self) -> bool {
        let Some(oldest) = (0..self.kept.len()).min_by_key(|&i| self.kept[i].used) else {
            return false;
        };
        let k = self.kept.swap_remove(oldest);
        self.tokens -= k.ids.len();
        true
    }

    /// The next value of the clock.
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}
