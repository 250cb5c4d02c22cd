//! Real weights against llama.cpp on the CPU: Gemma 3 270M Q4_K_M tokenizes each
//! recorded prompt to llama.cpp's ids and continues it greedily with llama.cpp's
//! tokens (see `gemma3_270m/mod.rs`).
// Native only: the file is 240 MiB.
#![cfg(not(target_arch = "wasm32"))]

mod gemma3_270m;

use acs_llama::model::{Logits, Model, SeqInput};
use gemma3_270m::{cases, gemma3_path};

/// `n` greedy tokens after `prompt`, one decode step each.
fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut next: Vec<u32> = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let mut batch = [SeqInput {
            cache: &mut cache,
            tokens: &next,
            steering: &[],
            capture: &[],
            logits: Logits::Last,
        }];
        let logits = model.forward(&mut batch).expect("step").remove(0).logits;
        let t = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .expect("logits") as u32;
        out.push(t);
        next = vec![t];
    }
    out
}

#[test]
fn gemma3_270m_tokenizes_and_continues_as_llama_cpp() {
    let model = Model::open(gemma3_path()).expect("Gemma 3 270M loads");
    let mut clean = 0;
    for case in cases() {
        let ids = model
            .tokenizer
            .encode(&case.prompt, true, false)
            .expect("encodes");
        assert_eq!(ids, case.prompt_ids, "tokens of {:?}", case.prompt);
        let upto = case.compared();
        let got = greedy(&model, &ids, upto);
        eprintln!(
            "{:?} -> {:?} ({upto} tokens compared)",
            case.prompt,
            model.tokenizer.decode(&got)
        );
        assert_eq!(
            got,
            case.ids[..upto],
            "greedy continuation of {:?}: ours {:?}, llama.cpp's {:?}",
            case.prompt,
            model.tokenizer.decode(&got),
            model.tokenizer.decode(&case.ids[..upto]),
        );
        clean += usize::from(upto == 16);
    }
    assert!(clean >= 4, "{clean} prompts compared over all 16 tokens");
}
