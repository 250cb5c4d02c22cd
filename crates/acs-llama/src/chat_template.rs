//! The model's own chat template (`tokenizer.chat_template`): a Jinja template that
//! turns a conversation into the one prompt the model was trained on.
//!
//! Templates are written for Python's `jinja2` as `transformers` runs it
//! (`apply_chat_template`): blocks trim their newline and strip their indentation,
//! strings have Python's methods (`.strip()`, `.startswith()`, …), and the helpers
//! `raise_exception`, `strftime_now` and a `tojson` that writes as `json.dumps` does
//! are defined. [`ChatTemplate`] renders them the same way with minijinja.
//!
//! A GGUF file is untrusted, and so is its template: rendering runs on a fuel budget
//! (a template that loops without end runs out of it) and a refused or broken template
//! is an error, never a panic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, syntax::SyntaxConfig};

use crate::gguf::Metadata;

/// The metadata key of the template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Instructions a render may spend (minijinja's fuel): a conversation of the largest
/// body a server accepts renders in far fewer, and a template that loops forever stops.
const FUEL: u64 = 10_000_000;

/// The context variable `strftime_now` reads the render's time from (a name no
/// template uses).
const RENDER_TIME: &str = "acs_render_time";

/// One message of a conversation, as the template sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// `system`, `user` or `assistant`.
    pub role: &'a str,
    /// The message's text.
    pub content: &'a str,
}

/// Why a conversation could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The file's template is not a template minijinja can compile.
    #[error("the model's chat template does not compile: {0}")]
    Compile(String),
    /// The template raised an error for these messages (`raise_exception`), or failed
    /// while rendering them.
    #[error("the model's chat template refused the messages: {0}")]
    Render(String),
}

/// A model's chat template, compiled once at load.
#[derive(Debug)]
pub struct ChatTemplate {
    /// The template, or why it does not compile (reported on each render, so that a
    /// model with a broken template still serves completions).
    env: Result<Environment<'static>, String>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The template `source`, with the text of the model's BOS and EOS tokens, which
    /// templates write as `bos_token` and `eos_token`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> ChatTemplate {
        ChatTemplate {
            env: environment(source).map_err(|e| describe(&e)),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        }
    }

    /// The template of a GGUF file, if it has one; `token_text` names a token id.
    pub fn from_metadata(
        meta: &Metadata,
        bos: Option<u32>,
        eos: Option<u32>,
        token_text: impl Fn(u32) -> String,
    ) -> Option<ChatTemplate> {
        let source = meta.get_str(CHAT_TEMPLATE_KEY).ok()?;
        let text = |id: Option<u32>| id.map(&token_text).unwrap_or_default();
        Some(ChatTemplate::new(source, &text(bos), &text(eos)))
    }

    /// The text of BOS as the template writes it (a rendered prompt that starts with
    /// it must not get a second BOS from the tokenizer).
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// Renders `messages` into one prompt; with `add_generation_prompt` the prompt
    /// ends where the assistant's reply begins. `now` (Unix seconds) is what
    /// `strftime_now` formats.
    pub fn render(
        &self,
        messages: &[Message<'_>],
        add_generation_prompt: bool,
        now: i64,
    ) -> Result<String, TemplateError> {
        let env = self
            .env
            .as_ref()
            .map_err(|e| TemplateError::Compile(e.clone()))?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from(BTreeMap::from([
                    ("role", Value::from(m.role)),
                    ("content", Value::from(m.content)),
                ]))
            })
            .collect();
        let ctx = Value::from(BTreeMap::from([
            ("messages", Value::from(messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
            (RENDER_TIME, Value::from(now)),
        ]));
        let template = env
            .get_template("chat")
            .map_err(|e| TemplateError::Compile(describe(&e)))?;
        template
            .render(ctx)
            .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// The environment `transformers` renders chat templates in, as minijinja.
fn environment(source: &str) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?,
    );
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function(
        "strftime_now",
        |state: &minijinja::State, format: String| -> Result<String, Error> {
            let now = state
                .lookup(RENDER_TIME)
                .and_then(|v| v.as_i64())
                .unwrap_or_default();
            Ok(strftime(&format, now))
        },
    );
    env.add_filter("tojson", tojson);
    env.add_template_owned("chat", source.to_owned())?;
    Ok(env)
}

/// An error with its cause chain, in one line.
fn describe(e: &Error) -> String {
    let mut text = match e.detail() {
        Some(detail) if e.kind() == ErrorKind::InvalidOperation => detail.to_owned(),
        _ => e.to_string(),
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = write!(text, ": {s}");
        source = s.source();
    }
    text
}

/// `tojson` as `transformers` defines it: Python's `json.dumps(x, ensure_ascii=False)`
/// (`", "` and `": "` between items), with `indent` for pretty output.
fn tojson(value: Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out);
    out
}

fn write_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let (item_sep, key_sep) = match indent {
        Some(_) => (",", ": "),
        None => (", ", ": "),
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let _ = write!(out, "{v}");
        }
        ValueKind::String | ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            json_string(&v.to_string(), out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter().map(Iterator::collect).unwrap_or_default();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter().map(Iterator::collect).unwrap_or_default();
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                json_string(&key.to_string(), out);
                out.push_str(key_sep);
                let item = v.get_item(key).unwrap_or_default();
                write_json(&item, indent, depth + 1, out);
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        // A kind added to minijinja later: its text, quoted.
        _ => json_string(&v.to_string(), out),
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Python's `strftime` for a UTC time, for the directives templates use (dates,
/// times, names of days and months); others are written as they are.
fn strftime(format: &str, unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:>2}"),
            Some('m') => write!(out, "{month:02}"),
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('B') => write!(out, "{month_name}"),
            Some('b') | Some('h') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('j') => write!(out, "{day_of_year:03}"),
            Some('H') => write!(out, "{:02}", secs / 3600),
            Some('I') => write!(out, "{:02}", (secs / 3600 + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if secs < 43_200 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{:02}", secs / 60 % 60),
            Some('S') => write!(out, "{:02}", secs % 60),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// The (year, month, day) of a count of days since 1970-01-01 (the proleptic
/// Gregorian calendar, by eras of 400 years).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a date: the inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_formatted_as_python_formats_them() {
        // 2026-12-04T20:26:51Z, a Friday.
        let t = 1_796_416_011;
        assert_eq!(strftime("%d %b %Y", t), "04 Dec 2026");
        assert_eq!(
            strftime("%A %B %e, %y %H:%M:%S %j %%", t),
            "Friday December  4, 26 20:26:51 338 %"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
        for d in [-800_000, -1, 0, 59, 11_016, 20_000, 2_000_000] {
            let (y, m, day) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, day), d);
        }
    }

    #[test]
    fn tojson_writes_as_json_dumps() {
        let v = Value::from(BTreeMap::from([
            ("a", Value::from(vec![Value::from(1), Value::from("x\"\n")])),
            ("b", Value::from(())),
        ]));
        assert_eq!(tojson(v.clone(), None), r#"{"a": [1, "x\"\n"], "b": null}"#);
        assert_eq!(
            tojson(v, Some(2)),
            "{\n  \"a\": [\n    1,\n    \"x\\\"\\n\"\n  ],\n  \"b\": null\n}"
        );
    }

    #[test]
    fn a_template_that_raises_or_loops_is_an_error() {
        let raises = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations start with the user') }}{% endif %}",
            "",
            "",
        );
        let system = [Message {
            role: "system",
            content: "hi",
        }];
        assert_eq!(
            raises.render(&system, true, 0),
            Err(TemplateError::Render(
                "Conversations start with the user".into()
            ))
        );
        let endless = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
            "",
            "",
        );
        assert!(matches!(
            endless.render(&system, true, 0),
            Err(TemplateError::Render(_))
        ));
        let broken = ChatTemplate::new("{% for %}", "", "");
        assert!(matches!(
            broken.render(&system, true, 0),
            Err(TemplateError::Compile(_))
        ));
    }
}
