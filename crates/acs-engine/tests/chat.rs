//! Chat requests on a generated tiny model: the conversation rendered by the model's
//! own template into one prompt, the default limit fitted to the context window, a
//! model without a template, a template that refuses the messages; then a run to its
//! end, answered in chat's shape.

use std::sync::{Arc, Mutex};

use acs_core::{Answer, CompletionRequest, Endpoint, ErrorCode, Shape};
use acs_engine::generation::model_info;
use acs_engine::{Event, Scheduler, SchedulerConfig, prepare};
use acs_llama::chat_template::ChatTemplate;
use acs_llama::gguf::GgufFile;
use acs_llama::model::Model;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use serde_json::json;

fn model() -> Model {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    Model::from_gguf(Arc::new(GgufFile::from_vec(bytes).unwrap())).unwrap()
}

fn chat(body: serde_json::Value) -> CompletionRequest {
    CompletionRequest::from_value(&body, Endpoint::ChatCompletions).unwrap()
}

#[test]
fn a_conversation_is_rendered_into_one_prompt() {
    let m = model();
    let info = model_info(&m, "m", 0);
    let req = chat(json!({"model": "m", "n": 3, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
    ]}));
    let g = prepare(&req, &m, &info, &Default::default(), 1).unwrap();
    // The file's template (testgen's ChatML), parts joined by a newline, and the
    // control tokens read as such.
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        g.prompts,
        vec![m.tokenizer.encode(rendered, true, true).unwrap()]
    );
    assert_eq!(g.prompt_texts, vec![rendered.to_owned()]);
    assert!(
        g.prompts[0].iter().any(|&id| m.tokenizer.is_control(id)),
        "{:?}",
        g.prompts[0]
    );
    assert_eq!(g.n, 3);
    assert_eq!(g.shape, Shape::Chat { top_logprobs: 0 });
    // No limit named: what the context window leaves after the prompt.
    assert_eq!(
        g.max_tokens,
        (m.config.context - g.prompts[0].len()).min(4096)
    );
    let named = chat(json!({"model": "m", "max_completion_tokens": 5,
                            "messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(
        prepare(&named, &m, &info, &Default::default(), 1)
            .unwrap()
            .max_tokens,
        5
    );
}

#[test]
fn a_model_without_a_template_or_a_template_that_refuses_is_a_400() {
    let mut m = model();
    let info = model_info(&m, "m", 0);
    let req = chat(json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}));
    m.chat_template = None;
    let e = prepare(&req, &m, &info, &Default::default(), 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::ChatTemplateMissing);
    assert_eq!(
        (e.code.status(), e.param.as_deref()),
        (400, Some("messages"))
    );
    m.chat_template = Some(ChatTemplate::new(
        "{% if messages[0].role != 'system' %}{{ raise_exception('A system message comes first') }}{% endif %}",
        "",
        "",
    ));
    let e = prepare(&req, &m, &info, &Default::default(), 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
    assert!(
        e.message.contains("A system message comes first"),
        "{}",
        e.message
    );
}

#[test]
fn a_chat_run_answers_a_chat_completion() {
    let m = Arc::new(model());
    let info = model_info(&m, "m", 0);
    let req = chat(
        json!({"model": "m", "n": 2, "max_completion_tokens": 4, "seed": 3,
                          "logprobs": true, "top_logprobs": 2,
                          "messages": [{"role": "user", "content": "Hi"}]}),
    );
    let g = prepare(&req, &m, &info, &Default::default(), 1).unwrap();
    let shape = g.shape;
    let mut s = Scheduler::new(Arc::clone(&m), SchedulerConfig::with_kv_bytes(&m, 16 << 20));
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let l = Arc::clone(&log);
    s.submit(
        g,
        Box::new(move |e| {
            l.lock().unwrap().push(e);
            true
        }),
    )
    .unwrap()
    .detach();
    let mut guard = 0;
    while !s.is_idle() {
        s.step_blocking();
        guard += 1;
        assert!(guard < 1000, "the scheduler never finished");
    }
    let Some(Event::Done(f)) = log.lock().unwrap().pop() else {
        panic!("no end")
    };
    let Answer::Chat(c) = Answer::new(f.into_completion("m", "cmpl-x".into(), 0), shape) else {
        panic!("not chat")
    };
    assert_eq!(c.object, "chat.completion");
    assert_eq!(c.choices.len(), 2);
    for ch in &c.choices {
        let lp = &ch.logprobs.as_ref().unwrap().content;
        assert!(!lp.is_empty() && lp.len() <= 4);
        assert!(lp.iter().all(|t| t.top_logprobs.len() == 2));
    }
}
