//! What a chat request answers: OpenAI's `chat.completion` and its streamed
//! `chat.completion.chunk`s, made from the [`Completion`] and [`CompletionChunk`]s that
//! the engine's run of the rendered conversation gives, so that every face shapes chat
//! the same way.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::response::{
    Activation, Choice, Completion, CompletionChunk, FinishReason, Logprobs, Usage,
};

/// The `object` of a chat completion.
pub const CHAT_COMPLETION: &str = "chat.completion";
/// The `object` of a streamed chat completion's chunks.
pub const CHAT_COMPLETION_CHUNK: &str = "chat.completion.chunk";

/// One alternative of a token, in the chat shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes (a token can be part of a character).
    pub bytes: Vec<u8>,
}

/// One generated token with its alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The likeliest tokens at this position, likeliest first (`top_logprobs` of them).
    pub top_logprobs: Vec<TopLogprob>,
}

/// A choice's log-probabilities, in the chat shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// Each generated token, in order.
    pub content: Vec<TokenLogprob>,
}

/// The assistant's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Always `"assistant"`.
    pub role: String,
    /// The reply's text.
    pub content: String,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// The choice's index, `0..n`.
    pub index: u32,
    /// The reply.
    pub message: AssistantMessage,
    /// Why it ended.
    pub finish_reason: Option<FinishReason>,
    /// Log-probabilities when asked for.
    pub logprobs: Option<ChatLogprobs>,
}

/// A chat completion, as `POST /v1/chat/completions` and chat jobs answer it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `"chat.completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The model id as requested.
    pub model: String,
    /// Sorted by index.
    pub choices: Vec<ChatChoice>,
    /// Token counts; the rendered conversation is the prompt.
    pub usage: Usage,
    /// Activation read-outs, when the request asked for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations: Option<Vec<Activation>>,
}

/// What a choice's chunk adds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `"assistant"`, in a choice's first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text; absent from a chunk that only ends its choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice's part of a chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// The choice's index.
    pub index: u32,
    /// What it adds.
    pub delta: ChatDelta,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<FinishReason>,
    /// The new tokens' log-probabilities when asked for.
    pub logprobs: Option<ChatLogprobs>,
}

/// One server-sent event of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// The chat completion's id, the same in every chunk.
    pub id: String,
    /// Always `"chat.completion.chunk"`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The model id as requested.
    pub model: String,
    /// The choices that moved in this step.
    pub choices: Vec<ChatChunkChoice>,
    /// Only in the last chunk, when `stream_options.include_usage` asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A chat completion's id from a completion's (`cmpl-…` → `chatcmpl-…`).
fn chat_id(id: &str) -> String {
    format!("chatcmpl-{}", id.strip_prefix("cmpl-").unwrap_or(id))
}

/// How a request's answer is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A completion (`text_completion`).
    Text,
    /// A chat completion, with `top_logprobs` alternatives per token.
    Chat {
        /// Alternatives per token when log-probabilities are asked for.
        top_logprobs: usize,
    },
}

impl ChatCompletion {
    /// The chat completion of the engine's completion of the rendered conversation,
    /// listing `top_logprobs` alternatives per token.
    pub fn new(c: Completion, top_logprobs: usize) -> Self {
        ChatCompletion {
            id: chat_id(&c.id),
            object: CHAT_COMPLETION.into(),
            created: c.created,
            model: c.model,
            choices: c
                .choices
                .into_iter()
                .map(|ch| ChatChoice {
                    index: ch.index,
                    message: AssistantMessage {
                        role: "assistant".into(),
                        content: ch.text,
                    },
                    finish_reason: ch.finish_reason,
                    logprobs: ch
                        .logprobs
                        .as_ref()
                        .map(|lp| chat_logprobs(lp, top_logprobs)),
                })
                .collect(),
            usage: c.usage,
            activations: c.activations,
        }
    }
}

/// Turns a stream's completion chunks into chat chunks: a choice's first chunk
/// carries its role, as OpenAI's do.
#[derive(Debug, Clone, Default)]
pub struct ChatStream {
    started: BTreeSet<u32>,
    top_logprobs: usize,
}

impl ChatStream {
    /// A stream none of whose choices has started, listing `top_logprobs`
    /// alternatives per token.
    pub fn new(top_logprobs: usize) -> Self {
        ChatStream {
            started: BTreeSet::new(),
            top_logprobs,
        }
    }

    /// The chat chunk of `chunk`.
    pub fn chunk(&mut self, chunk: CompletionChunk) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: chat_id(&chunk.id),
            object: CHAT_COMPLETION_CHUNK.into(),
            created: chunk.created,
            model: chunk.model,
            choices: chunk
                .choices
                .into_iter()
                .map(|ch| self.choice(ch))
                .collect(),
            usage: chunk.usage,
        }
    }

    fn choice(&mut self, ch: Choice) -> ChatChunkChoice {
        let first = self.started.insert(ch.index);
        let content = (first || !ch.text.is_empty()).then_some(ch.text);
        ChatChunkChoice {
            index: ch.index,
            delta: ChatDelta {
                role: first.then(|| "assistant".into()),
                content,
            },
            finish_reason: ch.finish_reason,
            logprobs: ch
                .logprobs
                .as_ref()
                .map(|lp| chat_logprobs(lp, self.top_logprobs)),
        }
    }
}

/// Log-probabilities in the chat shape, `count` alternatives a token. The legacy
/// alternatives always include the chosen token, one more than asked for where it is
/// not among the likeliest; the chat shape lists the likeliest `count` alone.
fn chat_logprobs(lp: &Logprobs, count: usize) -> ChatLogprobs {
    let content = lp
        .tokens
        .iter()
        .zip(&lp.token_logprobs)
        .zip(&lp.top_logprobs)
        .filter_map(|((token, logprob), top)| {
            let logprob = (*logprob)?;
            let mut alternatives: Vec<(&String, f32)> =
                top.iter().flatten().map(|(text, &l)| (text, l)).collect();
            alternatives.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            Some(TokenLogprob {
                token: token.clone(),
                logprob,
                bytes: token_bytes(token),
                top_logprobs: alternatives
                    .into_iter()
                    .take(count)
                    .map(|(text, l)| TopLogprob {
                        token: text.clone(),
                        logprob: l,
                        bytes: token_bytes(text),
                    })
                    .collect(),
            })
        })
        .collect();
    ChatLogprobs { content }
}

/// A token's bytes from its name: `bytes:\xNN…` for a piece of a character, else its
/// text.
fn token_bytes(name: &str) -> Vec<u8> {
    match name.strip_prefix("bytes:") {
        Some(escaped) if escaped.starts_with("\\x") => escaped
            .split("\\x")
            .skip(1)
            .filter_map(|h| u8::from_str_radix(h, 16).ok())
            .collect(),
        _ => name.as_bytes().to_vec(),
    }
}

/// A run's answer: a completion, or for a chat request a chat completion. Stored job
/// results are one or the other, in their own JSON, told apart by their `object`
/// (their fields alone do not tell: a completion without choices has a chat
/// completion's).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// A chat request's.
    Chat(ChatCompletion),
    /// A completions request's.
    Text(Completion),
}

impl<'de> Deserialize<'de> for Answer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let value = serde_json::Value::deserialize(d)?;
        if value.get("object").and_then(serde_json::Value::as_str) == Some(CHAT_COMPLETION) {
            ChatCompletion::deserialize(value).map(Answer::Chat)
        } else {
            Completion::deserialize(value).map(Answer::Text)
        }
        .map_err(D::Error::custom)
    }
}

impl Answer {
    /// The answer to a request of `shape`, from the engine's completion.
    pub fn new(completion: Completion, shape: Shape) -> Answer {
        match shape {
            Shape::Text => Answer::Text(completion),
            Shape::Chat { top_logprobs } => {
                Answer::Chat(ChatCompletion::new(completion, top_logprobs))
            }
        }
    }

    /// Its token counts.
    pub fn usage(&self) -> &Usage {
        match self {
            Answer::Chat(c) => &c.usage,
            Answer::Text(c) => &c.usage,
        }
    }
}

/// One streamed chunk in its request's shape: a completion's or a chat completion's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StreamChunk {
    /// A `text_completion` chunk.
    Text(CompletionChunk),
    /// A `chat.completion.chunk`.
    Chat(ChatCompletionChunk),
}

/// Writes one stream's chunks in its request's shape, so that every face streams the
/// same: the completion's id, time and model in each, and for chat the role in each
/// choice's first chunk.
#[derive(Debug, Clone)]
pub struct ChunkWriter {
    id: String,
    created: i64,
    model: String,
    chat: Option<ChatStream>,
}

impl ChunkWriter {
    /// The writer of the stream of completion `id`, made at `created` (Unix seconds)
    /// for `model`, in `shape`.
    pub fn new(id: String, created: i64, model: String, shape: Shape) -> Self {
        let chat = match shape {
            Shape::Chat { top_logprobs } => Some(ChatStream::new(top_logprobs)),
            Shape::Text => None,
        };
        ChunkWriter {
            id,
            created,
            model,
            chat,
        }
    }

    /// The chunk of the choices that moved in a step, with `usage` in the last one.
    pub fn chunk(&mut self, choices: Vec<Choice>, usage: Option<Usage>) -> StreamChunk {
        let c = CompletionChunk {
            id: self.id.clone(),
            object: crate::response::TEXT_COMPLETION.into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        match &mut self.chat {
            Some(stream) => StreamChunk::Chat(stream.chunk(c)),
            None => StreamChunk::Text(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn completion() -> Completion {
        Completion {
            id: "cmpl-abc".into(),
            object: "text_completion".into(),
            created: 7,
            model: "m".into(),
            choices: vec![Choice {
                index: 1,
                text: "Hi".into(),
                finish_reason: Some(FinishReason::Stop),
                logprobs: Some(Logprobs {
                    tokens: vec!["H".into(), "bytes:\\xe2\\x9c".into()],
                    token_logprobs: vec![Some(-0.5), Some(-3.0)],
                    top_logprobs: vec![
                        Some(BTreeMap::from([("H".into(), -0.5), ("A".into(), -0.25)])),
                        Some(BTreeMap::from([("bytes:\\xe2\\x9c".into(), -3.0)])),
                    ],
                    text_offset: vec![0, 1],
                }),
            }],
            usage: Usage::new(&[5], &[2]),
            activations: None,
        }
    }

    #[test]
    fn a_completion_becomes_a_chat_completion() {
        let chat = ChatCompletion::new(completion(), 2);
        assert_eq!(chat.id, "chatcmpl-abc");
        assert_eq!(chat.object, "chat.completion");
        assert_eq!(chat.choices[0].message.content, "Hi");
        assert_eq!(chat.choices[0].message.role, "assistant");
        let lp = &chat.choices[0].logprobs.as_ref().unwrap().content;
        assert_eq!(lp[0].top_logprobs[0].token, "A", "likeliest first");
        assert_eq!(lp[0].top_logprobs[1].token, "H");
        assert_eq!(lp[1].bytes, vec![0xe2, 0x9c]);
        let one = ChatCompletion::new(completion(), 1);
        let lp = &one.choices[0].logprobs.as_ref().unwrap().content;
        assert_eq!(lp[0].top_logprobs.len(), 1);
        // The stored JSON reads back as the same kind of answer, with choices or
        // without.
        let mut empty = completion();
        empty.choices.clear();
        for (c, shape) in [
            (completion(), Shape::Chat { top_logprobs: 2 }),
            (completion(), Shape::Text),
            (empty.clone(), Shape::Chat { top_logprobs: 0 }),
            (empty, Shape::Text),
        ] {
            let answer = Answer::new(c, shape);
            let json = serde_json::to_string(&answer).unwrap();
            assert_eq!(serde_json::from_str::<Answer>(&json).unwrap(), answer);
        }
    }

    #[test]
    fn a_choices_first_chunk_carries_its_role() {
        let mut stream = ChatStream::new(0);
        let chunk = |text: &str, finish| CompletionChunk {
            id: "cmpl-abc".into(),
            object: "text_completion".into(),
            created: 7,
            model: "m".into(),
            choices: vec![Choice {
                index: 0,
                text: text.into(),
                finish_reason: finish,
                logprobs: None,
            }],
            usage: None,
        };
        let first = stream.chunk(chunk("He", None));
        assert_eq!(
            serde_json::to_value(&first.choices[0]).unwrap(),
            serde_json::json!({"index": 0, "delta": {"role": "assistant", "content": "He"},
                               "finish_reason": null, "logprobs": null})
        );
        let last = stream.chunk(chunk("", Some(FinishReason::Stop)));
        assert_eq!(
            serde_json::to_value(&last.choices[0]).unwrap(),
            serde_json::json!({"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": null})
        );
        assert_eq!(last.object, "chat.completion.chunk");
    }

    #[test]
    fn a_writer_streams_in_its_requests_shape() {
        let choice = |text: &str| Choice {
            index: 1,
            text: text.into(),
            finish_reason: None,
            logprobs: None,
        };
        let mut text = ChunkWriter::new("cmpl-x".into(), 7, "m".into(), Shape::Text);
        let t = serde_json::to_value(text.chunk(vec![choice("a")], None)).unwrap();
        assert_eq!(t["object"], "text_completion");
        assert_eq!(t["id"], "cmpl-x");
        assert_eq!(t["choices"][0]["text"], "a");

        let shape = Shape::Chat { top_logprobs: 0 };
        let mut chat = ChunkWriter::new("cmpl-x".into(), 7, "m".into(), shape);
        let first = serde_json::to_value(chat.chunk(vec![choice("a")], None)).unwrap();
        let second = serde_json::to_value(chat.chunk(vec![choice("b")], None)).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["id"], "chatcmpl-x");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert!(second["choices"][0]["delta"].get("role").is_none());
        let usage = Usage::new(&[3], &[2]);
        let last = serde_json::to_value(chat.chunk(Vec::new(), Some(usage))).unwrap();
        assert_eq!(last["usage"]["total_tokens"], 5);
    }
}
