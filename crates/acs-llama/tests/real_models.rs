//! Real weights against llama.cpp on the CPU: Gemma 3 270M Q4_K_M tokenizes each
//! recorded prompt to llama.cpp's ids and continues it greedily with llama.cpp's
//! tokens (see `gemma3_270m/mod.rs`).
// Native only: the file is 240 MiB.
#![cfg(not(target_arch = "wasm32"))]

mod gemma3_270m;

use acs_llama::model::Model;
use gemma3_270m::{cases, gemma3_path};

#[test]
fn gemma3_270m_tokenizes_and_continues_as_llama_cpp() {
    let model = Model::open(gemma3_path()).expect("Gemma 3 270M loads");
    let mut compared = 0;
    for case in cases() {
        let ids = model
            .tokenizer
            .encode(&case.prompt, true, false)
            .expect("encodes");
        assert_eq!(ids, case.prompt_ids, "tokens of {:?}", case.prompt);
        let upto = case.compared();
        let got = model.greedy(&ids, upto).expect("greedy steps");
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
        compared += upto;
    }
    assert!(compared >= 64, "{compared} greedy tokens compared in all");
}
