//! Arbitrary bytes as a request body: parsing for both endpoints, the model checks,
//! the Hold arithmetic and the canonical form must never panic, and every refusal
//! must be a 4xx of the contract.
#![no_main]

use acs_core::request::{canonical_json, hold_tokens, parse_json_object};
use acs_core::{CompletionRequest, Endpoint, ModelInfo};
use libfuzzer_sys::fuzz_target;

fn model() -> ModelInfo {
    ModelInfo {
        id: "m".into(),
        object: "model".into(),
        created: 0,
        owned_by: "acs".into(),
        family: "llama".into(),
        context_window: 2048,
        n_layers: 30,
        d_model: 576,
        vocab_size: 49152,
    }
}

fuzz_target!(|body: &[u8]| {
    for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions, Endpoint::Jobs] {
        match CompletionRequest::parse(body, endpoint) {
            Ok(req) => {
                // Prompt lengths as a tokenizer might give them: a few tokens per text.
                let lens: Vec<usize> = req
                    .prompt
                    .items()
                    .iter()
                    .map(|p| match p {
                        acs_core::PromptItem::Text(t) => t.len() / 3,
                        acs_core::PromptItem::Tokens(ids) => ids.len(),
                        acs_core::PromptItem::Chat(messages) => {
                            messages.iter().map(|m| m.content.len() / 3 + 4).sum()
                        }
                    })
                    .collect();
                if let Err(e) = req.check_against(&model(), &lens) {
                    assert!((400..500).contains(&e.status()), "{e:?}");
                }
                let _ = hold_tokens(&lens, req.n, req.max_tokens);
                assert!(req.n >= 1 && req.n <= 128);
            }
            Err(e) => {
                assert!((400..500).contains(&e.status()), "{e:?}");
                let _ = e.to_json();
            }
        }
    }
    if let Ok(v) = parse_json_object(body) {
        let once = canonical_json(&v);
        let again: serde_json::Value = serde_json::from_str(&once).expect("canonical JSON parses");
        assert_eq!(canonical_json(&again), once, "canonical form is stable");
    }
});
