//! The chat request (`POST /v1/chat/completions`, and chat bodies of jobs): OpenAI's
//! Chat Completions fields, parsed into the one [`CompletionRequest`] every face runs,
//! with the conversation as its one prompt ([`Prompt::Chat`]).

use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    CompletionRequest, Endpoint, Fields, Prompt, Shared, missing, parse_model, reject_unknown,
    wrong_type,
};
use crate::error::{ApiError, ErrorCode};

/// Most messages in one conversation.
pub const MAX_MESSAGES: usize = 4096;
/// Most alternatives per token in a chat's `top_logprobs`.
pub const MAX_TOP_LOGPROBS: u8 = 20;
/// A choice's most tokens when the body names no `max_completion_tokens` (or
/// `max_tokens`): OpenAI's default is the rest of the context window, and a Hold and
/// the KV memory are sized by it, so this bounds what a request that names no limit
/// takes; the rest of the context window where that is less.
pub const DEFAULT_CHAT_MAX_TOKENS: u32 = 4096;

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_completion_tokens",
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stream",
    "stream_options",
    "user",
    "steering",
    "activations",
];

const MESSAGE_FIELDS: &[&str] = &["role", "content", "name"];

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    /// Instructions for the whole conversation.
    System,
    /// The person (or program) the model answers.
    User,
    /// The model's earlier turns.
    Assistant,
}

impl ChatRole {
    /// The role as templates name it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatRole::System => "system",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: ChatRole,
    /// Its text (a list of text parts is joined with newlines, as one text).
    pub content: String,
}

/// Parses a chat body sent to `endpoint`.
pub(super) fn parse(
    obj: &Map<String, Value>,
    endpoint: Endpoint,
) -> Result<CompletionRequest, ApiError> {
    reject_unknown(obj, FIELDS, "")?;
    let f = Fields { obj, prefix: "" };
    let model = parse_model(&f)?;
    let messages = parse_messages(obj.get("messages"))?;
    let limit = match f.int_in("max_completion_tokens", 0, i64::from(u32::MAX))? {
        Some(v) => Some(v),
        None => f.int_in("max_tokens", 0, i64::from(u32::MAX))?,
    };
    let shared = Shared::parse(&f, endpoint)?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top_logprobs = f.int_in("top_logprobs", 0, i64::from(MAX_TOP_LOGPROBS))?;
    if top_logprobs.is_some() && !logprobs {
        return Err(ApiError::invalid_value(
            "top_logprobs",
            "top_logprobs needs logprobs: true.",
        ));
    }
    let mut req = shared.into_request(
        model,
        Prompt::Chat(messages),
        limit.map_or(DEFAULT_CHAT_MAX_TOKENS, |v| v as u32),
        0,
        false,
        logprobs.then(|| top_logprobs.unwrap_or(0) as u8),
    );
    req.fit_max_tokens = limit.is_none();
    Ok(req)
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match v {
        None | Some(Value::Null) => {
            return Err(missing("messages", "You must provide messages."));
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wrong_type("messages", "an array of messages")),
    };
    if items.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "messages must hold at least one message.",
        ));
    }
    if items.len() > MAX_MESSAGES {
        return Err(ApiError::invalid_value(
            "messages",
            format!(
                "At most {MAX_MESSAGES} messages per request; got {}.",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect()
}

fn parse_message(i: usize, v: &Value) -> Result<ChatMessage, ApiError> {
    let at = format!("messages[{i}]");
    let obj = v
        .as_object()
        .ok_or_else(|| wrong_type(&at, "an object with role and content"))?;
    let prefix = format!("{at}.");
    reject_unknown(obj, MESSAGE_FIELDS, &prefix)?;
    let f = Fields {
        obj,
        prefix: &prefix,
    };
    let role = f
        .string("role")?
        .ok_or_else(|| missing(&format!("{at}.role"), "Each message needs a role."))?;
    let role = match role.as_str() {
        "system" => ChatRole::System,
        "user" => ChatRole::User,
        "assistant" => ChatRole::Assistant,
        other => {
            return Err(ApiError::invalid_value(
                format!("{at}.role"),
                format!(
                    "role must be one of system, user or assistant; got {:?}.",
                    truncated(other)
                ),
            ));
        }
    };
    if f.string("name")?.is_some_and(|n| n.len() > 256) {
        return Err(ApiError::invalid_value(
            format!("{at}.name"),
            "name must be at most 256 characters.",
        ));
    }
    let content = parse_content(&at, f.get("content"))?;
    Ok(ChatMessage { role, content })
}

/// A message's content: a string, or a list of text parts (`{"type": "text",
/// "text": …}`), joined with newlines.
fn parse_content(at: &str, v: Option<&Value>) -> Result<String, ApiError> {
    let param = format!("{at}.content");
    const SHAPES: &str = "a string or an array of text parts";
    match v {
        None => Err(ApiError::param(
            ErrorCode::MissingParameter,
            param,
            "Each message needs its content.",
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let part_param = format!("{param}[{j}]");
                let obj = part.as_object().ok_or_else(|| {
                    wrong_type(
                        &part_param,
                        "a text part ({\"type\": \"text\", \"text\": …})",
                    )
                })?;
                let prefix = format!("{part_param}.");
                let pf = Fields {
                    obj,
                    prefix: &prefix,
                };
                // The type first: an image part's own fields are not "unknown", the
                // part is of a kind this server does not take.
                match pf.string("type")?.as_deref() {
                    Some("text") => {}
                    Some(other) => {
                        return Err(ApiError::invalid_value(
                            format!("{part_param}.type"),
                            format!(
                                "Only text parts are supported; got a part of type {:?}.",
                                truncated(other)
                            ),
                        ));
                    }
                    None => {
                        return Err(missing(
                            &format!("{part_param}.type"),
                            "Each content part needs a type.",
                        ));
                    }
                }
                reject_unknown(obj, &["type", "text"], &prefix)?;
                let text = pf.string("text")?.ok_or_else(|| {
                    missing(&format!("{part_param}.text"), "A text part needs its text.")
                })?;
                texts.push(text);
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(wrong_type(&param, SHAPES)),
    }
}

/// At most 64 characters of a value that goes back into an error message.
fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}
