//! The chat templates of six model families render as `transformers` renders them:
//! `fixtures/chat_templates/rendered.json` holds what Python's `jinja2` made of each
//! conversation (`scripts/oracle/chat_templates.py`), raised errors included.

use acs_llama::chat_template::{ChatTemplate, Message, TemplateError};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");

#[test]
fn templates_render_as_transformers_renders_them() {
    let rendered: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/rendered.json")).unwrap())
            .unwrap();
    let now = rendered["now"].as_i64().unwrap();
    let templates = rendered["templates"].as_object().unwrap();
    assert_eq!(templates.len(), 6);
    let mut checked = 0;
    for (name, t) in templates {
        let source = std::fs::read_to_string(format!("{DIR}/{name}.jinja")).unwrap();
        let template = ChatTemplate::new(
            &source,
            t["bos_token"].as_str().unwrap(),
            t["eos_token"].as_str().unwrap(),
        );
        for (case, want) in t["cases"].as_object().unwrap() {
            let (conversation, generation) = case.split_once('/').unwrap();
            let messages: Vec<Message<'_>> = rendered["conversations"][conversation]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message {
                    role: m["role"].as_str().unwrap(),
                    content: m["content"].as_str().unwrap(),
                })
                .collect();
            let got = template.render(&messages, generation == "generation", now);
            match (want.get("text"), want.get("error")) {
                (Some(text), _) => {
                    assert_eq!(got.as_deref(), Ok(text.as_str().unwrap()), "{name}: {case}")
                }
                (_, Some(error)) => assert_eq!(
                    got,
                    Err(TemplateError::Render(error.as_str().unwrap().to_owned())),
                    "{name}: {case}"
                ),
                _ => panic!("{name}: {case} has neither text nor error"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 60);
}
