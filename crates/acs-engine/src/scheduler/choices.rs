//! A choice: its branch of its prompt's cache, its own sampler and random stream, and
//! its text as the sampled tokens come in (stop sequences, log-probabilities, the
//! length limit), until it finishes.

use acs_core::response::Logprobs;
use acs_core::{Choice, FinishReason};
use acs_llama::model::Model;
use acs_llama::sample::{Rng, Sampled, Sampler};
use acs_llama::tokenizer::StreamDecoder;

use super::output::{self, EchoScores};
use crate::backend::Backend;
use crate::generation::Generation;
use crate::text::ChoiceText;

pub(super) struct ChoiceRun<C> {
    index: u32,
    pub(super) cache: C,
    pub(super) sampler: Sampler,
    /// The token the next step feeds back.
    pub(super) feed: [u32; 1],
    pub(super) generated: usize,
    text: ChoiceText,
    decoder: StreamDecoder,
    pub(super) finish: Option<FinishReason>,
    logprobs: Option<Logprobs>,
    /// Text emitted this step, for the next Delta.
    delta: String,
    delta_logprobs: Option<Logprobs>,
    /// Whether this step produced something to report (text or the end).
    moved: bool,
}

/// The `g.n` choices of prompt `prompt`, whose prefill just ended: the choices share
/// the prompt's `cache`, and each samples its first token from the last position's
/// `logits` with its own random stream. With `echo`, each choice's text (and
/// log-probabilities, from `echo`'s scores) begin with the prompt's.
pub(super) fn branch<B: Backend>(
    backend: &B,
    model: &Model,
    g: &Generation,
    prompt: usize,
    echo: &EchoScores,
    cache: B::Cache,
    logits: &[f32],
) -> Result<Vec<ChoiceRun<B::Cache>>, B::Error> {
    let n = g.n;
    let logprobs = match g.sampling.logprobs {
        None => None,
        Some(_) if g.echo => Some(echo.logprobs(model)),
        Some(_) => Some(Logprobs::default()),
    };
    let mut cache = Some(cache);
    let mut choices = Vec::with_capacity(n);
    for i in 0..n {
        let index = (prompt * n + i) as u32;
        let (text, delta) = if g.echo {
            let prompt_text = &g.prompt_texts[prompt];
            (ChoiceText::with_prefix(prompt_text), prompt_text.clone())
        } else {
            (ChoiceText::default(), String::new())
        };
        // Every choice but the last branches from the prompt's cache (sharing or
        // copying its positions, as the backend does); the last takes it.
        let cache = if i + 1 == n {
            cache.take().expect("taken once, by the last choice")
        } else {
            backend.fork(
                cache.as_mut().expect("still there before the last choice"),
                g.prompts[prompt].len() + g.max_tokens,
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
            logprobs: logprobs.clone(),
            delta,
            delta_logprobs: logprobs.clone(),
            moved: true,
        };
        if g.max_tokens == 0 {
            choice.finish = Some(FinishReason::Length);
        } else {
            let mut l = logits.to_vec();
            let sampled = choice.sampler.sample(&mut l);
            choice.accept(model, g, sampled);
        }
        choices.push(choice);
    }
    Ok(choices)
}

impl<C> ChoiceRun<C> {
    /// Takes a sampled token in: end of generation, text and stop sequences,
    /// log-probabilities, the length limit.
    pub(super) fn accept(&mut self, model: &Model, g: &Generation, s: Sampled) {
        self.generated += 1;
        self.moved = true;
        let tok = &model.tokenizer;
        if tok.is_eog(s.token) {
            let rest = self.decoder.finish();
            let (out, _) = self.text.push(&rest, &g.stop);
            self.delta.push_str(&out);
            self.delta.push_str(&self.text.finish());
            self.finish = Some(FinishReason::Stop);
            return;
        }
        let offset = self.text.chars() as u32;
        if let (Some(lp), Some(dlp)) = (self.logprobs.as_mut(), self.delta_logprobs.as_mut()) {
            let (text, tops) = output::named(model, s.token, s.logprob, &s.top);
            for target in [lp, dlp] {
                output::push_token(target, text.clone(), s.logprob, Some(tops.clone()), offset);
            }
        }
        let piece = self.decoder.push(tok, s.token);
        let (out, stopped) = self.text.push(&piece, &g.stop);
        self.delta.push_str(&out);
        if stopped {
            self.finish = Some(FinishReason::Stop);
        } else if self.generated >= g.max_tokens {
            let rest = self.decoder.finish();
            let (out, stopped) = self.text.push(&rest, &g.stop);
            self.delta.push_str(&out);
            if !stopped {
                self.delta.push_str(&self.text.finish());
            }
            self.finish = Some(if stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            });
        } else {
            self.feed = [s.token];
        }
    }

    /// What this step added to the choice, for its request's next Delta; `None` when
    /// nothing did.
    pub(super) fn take_delta(&mut self) -> Option<Choice> {
        if !self.moved {
            return None;
        }
        self.moved = false;
        Some(Choice {
            index: self.index,
            text: std::mem::take(&mut self.delta),
            finish_reason: self.finish,
            logprobs: self.delta_logprobs.as_mut().map(std::mem::take),
        })
    }

    /// The whole choice, as the request's Completion gives it (its log-probabilities
    /// taken out).
    pub(super) fn take_completed(&mut self) -> Choice {
        Choice {
            index: self.index,
            text: self.text.emitted().to_owned(),
            finish_reason: self.finish,
            logprobs: self.logprobs.take(),
        }
    }
}
