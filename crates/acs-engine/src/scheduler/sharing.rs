//! Prefill sharing between prompts being prefilled together: a prompt that begins
//! like one being prefilled (its leader, of the same request or another) waits for it
//! to reach the end of what they share, and branches from its cache there instead of
//! prefilling those tokens again (a [`Ride`]).

use super::output::scores_prompt;
use super::{Active, Scheduler};
use crate::backend::Backend;
use crate::generation::Generation;

/// The fewest tokens a prompt must share with the beginning of a kept prompt to start
/// from a copy of them: below that, finding and copying them saves little.
pub const PREFIX_MIN_TOKENS: usize = 16;

/// Where a prompt waits for another prompt that is being prefilled (its leader, of the
/// same request or another) to branch from its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ride {
    /// The leader's request ([`Active::id`]).
    pub(super) leader: u64,
    /// Which of that request's prompts.
    pub(super) prompt: usize,
    /// The positions the rider takes over: all of them when the two prompts are the
    /// same tokens (it then samples from the leader's last logits too), or the
    /// beginning they share (see [`branch_point`]), after which it prefills the rest.
    /// The leader's prefill pauses there, so that the rider shares those positions.
    pub(super) at: usize,
}

/// Whether a request's prompts may be shared with other requests' identical ones
/// (prefilled once, or kept for later): when it neither steers the residual stream,
/// reads it out, nor scores its prompt's tokens (any of which makes the prefill
/// differ, or needs more from it than its last logits).
pub(super) fn plain(g: &Generation) -> bool {
    g.steering.is_empty() && g.capture.is_none() && !scores_prompt(g)
}

/// How many positions a prompt of `ids` can take over from the cache of a prompt of
/// `theirs`: all of them when the tokens are the same; otherwise the beginning they
/// share, stopping one short of the whole prompt (whose last logits the other does not
/// have), when that is at least [`PREFIX_MIN_TOKENS`] long: below that, sharing saves
/// little.
pub(super) fn branch_point(ids: &[u32], theirs: &[u32]) -> Option<usize> {
    if ids == theirs {
        return Some(ids.len());
    }
    let shared = ids.iter().zip(theirs).take_while(|(a, b)| a == b).count();
    let at = shared.min(ids.len().saturating_sub(1));
    (at >= PREFIX_MIN_TOKENS).then_some(at)
}

impl<B: Backend> Scheduler<B> {
    /// The prompt being prefilled (request and prompt, by place in `running`) that a
    /// plain prompt of `ids` shares the most with, and its [`branch_point`], among
    /// [`plain`] requests of `scope`.
    pub(super) fn leader_for(&self, scope: &str, ids: &[u32]) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (ri, a) in self.running.iter().enumerate() {
            if !plain(&a.generation) || a.generation.scope != scope {
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
    pub(super) fn branch_riders(
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
    pub(super) fn release_riders(&mut self, id: u64) {
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
}

/// Where request `a`'s prompt `prompt`, prefilled up to `done`, pauses next: the
/// first position past `done` where one of `rides` on it branches, or the prompt's
/// end.
pub(super) fn prefill_stop<C>(a: &Active<C>, prompt: usize, done: usize, rides: &[Ride]) -> usize {
    rides
        .iter()
        .filter(|r| (r.leader, r.prompt) == (a.id, prompt) && r.at > done)
        .map(|r| r.at)
        .min()
        .unwrap_or(a.generation.prompts[prompt].len())
}
