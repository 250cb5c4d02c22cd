//! One step's batch: the prompt tokens each prompt prefills within the step's budget,
//! and one token for every choice still decoding, run in one forward pass.

use std::collections::BTreeMap;

use acs_llama::model::{Logits, SeqInput, SeqOutput};

use super::output::scores_prompt;
use super::sharing::{Ride, prefill_stop};
use super::{Active, Scheduler};
use crate::backend::Backend;

/// What a sequence of the batch is, by place in `running`.
pub(super) enum Slot {
    /// A prompt prefilling `tokens` more tokens.
    Prompt {
        request: usize,
        prompt: usize,
        tokens: usize,
    },
    /// A choice decoding its next token.
    Choice { request: usize, choice: usize },
}

impl<B: Backend> Scheduler<B> {
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
                    let stop = prefill_stop(a, pi, pr.done, &rides);
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

    /// Runs the step's forward pass: the planned prefills, then every unfinished
    /// choice's fed-back token. Returns what each output is, in the batch's order.
    pub(super) async fn forward(&mut self) -> Result<(Vec<Slot>, Vec<SeqOutput>), B::Error> {
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
            let echo_scores = scores_prompt(generation);
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
        self.stats.batch = batch.len() as u64;
        for s in &slots {
            match s {
                Slot::Prompt { tokens, .. } => self.stats.prefill_tokens += *tokens as u64,
                Slot::Choice { .. } => self.stats.decode_tokens += 1,
            }
        }
        let out = self.backend.forward(&mut batch).await?;
        Ok((slots, out))
    }
}
