//! What a request's response holds beside its text, in the contract's shapes:
//! log-probabilities (of sampled tokens, and of the prompt's with `echo`), and
//! activation read-outs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use acs_core::request::Positions;
use acs_core::response::{Activation, Logprobs};
use acs_llama::model::Model;
use acs_llama::sample::{log_sum_exp, top_k_indices};
use acs_llama::tokenizer::StreamDecoder;
use base64::Engine as _;

use crate::generation::Generation;

/// Whether a request scores its prompt's tokens (`echo` with `logprobs`): its prefill
/// then gives every position's logits, not only the last one's.
pub(super) fn scores_prompt(g: &Generation) -> bool {
    g.echo && g.sampling.logprobs.is_some()
}

/// One echoed prompt token: its id, log-probability (none for the first) and the
/// likeliest alternatives at its position.
type EchoEntry = (u32, Option<f32>, Vec<(u32, f32)>);

/// A prompt's echoed log-probabilities, gathered as its prefill gives each position's
/// logits (a position's token is scored by the row of the position before it).
#[derive(Default)]
pub(super) struct EchoScores {
    /// (token, logprob, top) per position.
    entries: Vec<EchoEntry>,
    /// The logits row of the last position seen, for the next entry.
    last_row: Option<Vec<f32>>,
}

impl EchoScores {
    /// Scores the next `tokens` of the prompt from their `logits` (one row of `vocab`
    /// per token), with the `top` likeliest alternatives at each.
    pub(super) fn push_rows(&mut self, tokens: &[u32], logits: &[f32], vocab: usize, top: usize) {
        for (row, &token) in logits.chunks_exact(vocab).zip(tokens) {
            let entry = match &self.last_row {
                None => (token, None, Vec::new()),
                Some(prev) => {
                    let lse = log_sum_exp(prev);
                    let top = top_k_indices(prev, top)
                        .into_iter()
                        .map(|t| (t as u32, prev[t] - lse))
                        .collect();
                    (token, Some(prev[token as usize] - lse), top)
                }
            };
            self.entries.push(entry);
            self.last_row = Some(row.to_vec());
        }
    }

    /// The last position's logits, once the whole prompt is in: what its choices
    /// sample their first tokens from.
    pub(super) fn take_last_row(&mut self) -> Option<Vec<f32>> {
        self.last_row.take()
    }

    /// The prompt's tokens as the first entries of a choice's `logprobs`.
    pub(super) fn logprobs(&self, model: &Model) -> Logprobs {
        let mut lp = Logprobs::default();
        // Offsets count the characters of the text the tokens decode to (a piece of a
        // character adds none until it is whole).
        let mut decoder = StreamDecoder::new();
        let mut offset = 0u32;
        for (token, logprob, top) in &self.entries {
            let (text, tops) = named(model, *token, *logprob, top);
            push_token(&mut lp, text, *logprob, logprob.map(|_| tops), offset);
            offset += decoder.push(&model.tokenizer, *token).chars().count() as u32;
        }
        lp
    }
}

/// Adds a token to `logprobs`: its name, log-probability, alternatives and character
/// offset in the choice's text.
pub(super) fn push_token(
    logprobs: &mut Logprobs,
    text: String,
    logprob: Option<f32>,
    top: Option<BTreeMap<String, f32>>,
    offset: u32,
) {
    logprobs.tokens.push(text);
    logprobs.token_logprobs.push(logprob);
    logprobs.top_logprobs.push(top);
    logprobs.text_offset.push(offset);
}

/// A token's name in `logprobs`, and its alternatives by name. The token's own
/// log-probability is always among the alternatives (so `logprobs` + 1 of them at
/// most), as OpenAI's API gives it.
pub(super) fn named(
    model: &Model,
    token: u32,
    logprob: Option<f32>,
    top: &[(u32, f32)],
) -> (String, BTreeMap<String, f32>) {
    let text = token_text(model, token);
    let mut tops = top_map(model, top);
    if let Some(l) = logprob {
        tops.entry(text.clone()).or_insert(l);
    }
    (text, tops)
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

/// The read-outs of prompt `prompt`: each of `layers`' rows `captured` over its
/// prefill, at every position or the last, as little-endian f32 in base64.
pub(super) fn activations(
    model: &Model,
    prompt: usize,
    layers: &[usize],
    positions: Positions,
    captured: &BTreeMap<usize, Vec<f32>>,
) -> Vec<Activation> {
    let d = model.config.d_model;
    layers
        .iter()
        .map(|&layer| {
            let rows = captured.get(&layer).map(Vec::as_slice).unwrap_or(&[]);
            let rows = match positions {
                Positions::All => rows,
                Positions::Last => &rows[rows.len().saturating_sub(d)..],
            };
            Activation {
                prompt_index: prompt as u32,
                layer: layer as u32,
                positions,
                shape: [(rows.len() / d) as u32, d as u32],
                dtype: "f32".into(),
                data: base64::engine::general_purpose::STANDARD.encode(
                    rows.iter()
                        .flat_map(|x| x.to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
            }
        })
        .collect()
}
