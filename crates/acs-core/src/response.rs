//! What the API answers: completions, chunks, usage, models, budgets, activations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::request::Positions;

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The EOS token or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// Token log-probabilities of one choice, in the legacy Completions shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability (`null` for the first echoed prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// The likeliest alternatives at each position, text → log-probability.
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Each token's character offset in the choice's text.
    pub text_offset: Vec<u32>,
}

/// One choice of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// `prompt * n + i`.
    pub index: u32,
    /// The generated text (with the prompt in front when `echo`).
    pub text: String,
    /// Why it ended; `null` in stream chunks until the last.
    pub finish_reason: Option<FinishReason>,
    /// Log-probabilities when asked for.
    pub logprobs: Option<Logprobs>,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of every prompt, each prompt counted once whatever `n` is.
    pub prompt_tokens: u64,
    /// Generated tokens of every choice.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
    /// Where the prompt tokens came from (OpenAI's field of the same name). Absent
    /// from older stored results and upstreams, hence the default.
    #[serde(default)]
    pub prompt_tokens_details: PromptTokensDetails,
}

/// The part of `prompt_tokens` an engine did not compute for this request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens the engine took from its prompt cache (a prompt prefilled for an
    /// earlier request, identical or sharing their beginning) instead of prefilling
    /// them. They still count in `prompt_tokens`, and are charged.
    pub cached_tokens: u64,
}

impl Usage {
    /// Usage from the prompts' lengths and each choice's generated count.
    pub fn new(prompt_lens: &[usize], completion_lens: &[usize]) -> Self {
        let prompt_tokens = prompt_lens.iter().map(|&l| l as u64).sum();
        let completion_tokens = completion_lens.iter().map(|&l| l as u64).sum();
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails::default(),
        }
    }

    /// This usage, with `cached_tokens` of its prompt tokens from the prompt cache.
    pub fn with_cached_tokens(mut self, cached_tokens: u64) -> Self {
        self.prompt_tokens_details.cached_tokens = cached_tokens;
        self
    }
}

/// A read-out of the residual stream after one block for one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activation {
    /// Which prompt.
    pub prompt_index: u32,
    /// After which block.
    pub layer: u32,
    /// Which positions were kept.
    pub positions: Positions,
    /// `[positions, d_model]`.
    pub shape: [u32; 2],
    /// Always `"f32"`.
    pub dtype: String,
    /// Base64 of the little-endian f32 values, row-major.
    pub data: String,
}

/// A completion, as `POST /v1/completions` and job results answer it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// Always `"text_completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The model id as requested.
    pub model: String,
    /// Sorted by index.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
    /// Activation read-outs, when the request asked for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations: Option<Vec<Activation>>,
}

/// One server-sent event of a streamed completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunk {
    /// The completion's id, the same in every chunk.
    pub id: String,
    /// Always `"text_completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The model id as requested.
    pub model: String,
    /// The choices that moved in this step.
    pub choices: Vec<Choice>,
    /// Only in the last chunk, when `stream_options.include_usage` asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The `object` of completions and their chunks.
pub const TEXT_COMPLETION: &str = "text_completion";

/// A served model, as `GET /v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The id requests name.
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// Always `"acs"`.
    pub owned_by: String,
    /// The model family (`general.architecture`: `llama`, `qwen2`, `gemma3`, …).
    /// Absent from older upstreams, hence the default.
    #[serde(default)]
    pub family: String,
    /// Tokens of prompt plus completion one sequence may hold.
    pub context_window: u32,
    /// Transformer blocks; steering layers are `0..n_layers`.
    pub n_layers: u32,
    /// Width of the residual stream; steering vectors have this length.
    pub d_model: u32,
    /// Tokens in the vocabulary; token ids are `0..vocab_size`.
    pub vocab_size: u32,
}

/// `GET /v1/budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetView {
    /// Tokens not yet charged.
    pub tokens_left: u64,
    /// Tokens held by running requests.
    pub tokens_held: u64,
    /// Requests running now.
    pub running: u32,
    /// The key's running-request limit.
    pub max_running: u32,
}

impl BudgetView {
    /// The traffic headers every response of the key carries, as (name, value).
    pub fn headers(&self) -> [(&'static str, String); 3] {
        [
            ("x-ratelimit-limit-requests", self.max_running.to_string()),
            (
                "x-ratelimit-remaining-requests",
                self.max_running.saturating_sub(self.running).to_string(),
            ),
            (
                "x-budget-remaining-tokens",
                self.tokens_left
                    .saturating_sub(self.tokens_held)
                    .to_string(),
            ),
        ]
    }
}

/// A page of a list, in the OpenAI list shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct List<T> {
    /// Always `"list"`.
    pub object: String,
    /// The items.
    pub data: Vec<T>,
    /// The first item's id, for paging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_id: Option<String>,
    /// The last item's id: pass it as `after` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_id: Option<String>,
    /// Whether more items follow.
    pub has_more: bool,
}

/// A page's `limit` query parameter: `default` when absent, else a whole number from
/// 1 to `max` (400 `invalid_value` otherwise).
pub fn page_limit(limit: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    let Some(text) = limit else {
        return Ok(default);
    };
    text.parse::<usize>()
        .ok()
        .filter(|l| (1..=max).contains(l))
        .ok_or_else(|| ApiError::invalid_value("limit", format!("limit is from 1 to {max}.")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_each_prompt_once() {
        // Two prompts of 3 tokens, n = 2, two tokens per choice.
        let u = Usage::new(&[3, 3], &[2, 2, 2, 2]);
        assert_eq!(u.prompt_tokens, 6);
        assert_eq!(u.completion_tokens, 8);
        assert_eq!(u.total_tokens, 14);
    }

    #[test]
    fn choice_serialises_with_null_logprobs() {
        let c = Choice {
            index: 3,
            text: " . .".into(),
            finish_reason: Some(FinishReason::Length),
            logprobs: None,
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"index":3,"text":" . .","finish_reason":"length","logprobs":null}"#
        );
    }
}
