//! The tokenizer against llama.cpp's own test suite: for each vocabulary of
//! `models/ggml-vocab-*.gguf` in llama.cpp's tree whose pre-tokenizer ACS implements,
//! every input of its `.inp` file gives the ids of its `.out` file (what llama.cpp's
//! `test-tokenizer-0` checks: no special tokens added, none parsed).
//!
//! Needs the suite: `scripts/fetch-vocab.sh` puts it where this test looks (or set
//! `ACS_LLAMA_CPP_VOCAB`). Without it the test fails.
// Native only: it reads files.
#![cfg(not(target_arch = "wasm32"))]

use std::path::PathBuf;

use acs_llama::gguf::GgufFile;
use acs_llama::model::tokenizer_spec;
use acs_llama::tokenizer::Tokenizer;

/// The vocabularies checked: the families ACS runs (Llama 2's SentencePiece, Llama 3's
/// BPE, Qwen2, Phi-3) and the other pre-tokenizers of llama.cpp's table it implements.
const VOCABS: &[&str] = &[
    "llama-spm",
    "llama-bpe",
    "qwen2",
    "phi-3",
    "deepseek-llm",
    "deepseek-coder",
    "gpt-2",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
    "mpt",
];

/// Separates the inputs of a `.inp` file (which ends with one too).
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn suite_dir() -> PathBuf {
    let dir = std::env::var_os("ACS_LLAMA_CPP_VOCAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".cache/acs/llama-cpp-vocab")
        });
    assert!(
        dir.join("ggml-vocab-qwen2.gguf.out").exists(),
        "llama.cpp's vocab suite missing at {}: run scripts/fetch-vocab.sh",
        dir.display()
    );
    dir
}

/// The inputs and expected ids of vocabulary `name`, and its tokenizer.
fn load(dir: &std::path::Path, name: &str) -> (Tokenizer, Vec<String>, Vec<Vec<u32>>) {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&base).unwrap_or_else(|e| panic!("{name}: {e}"));
    let spec = tokenizer_spec(file.metadata()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let tokenizer = Tokenizer::from_spec(spec).unwrap_or_else(|e| panic!("{name}: {e}"));
    let read = |ext: &str| {
        let path = base.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let inp = read("inp");
    let inputs: Vec<String> = inp
        .strip_suffix(SEPARATOR)
        .unwrap_or(&inp)
        .split(SEPARATOR)
        .map(str::to_owned)
        .collect();
    let outputs: Vec<Vec<u32>> = read("out")
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("an id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: inputs against outputs"
    );
    (tokenizer, inputs, outputs)
}

#[test]
fn every_vocab_gives_llama_cpp_ids() {
    let dir = suite_dir();
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in VOCABS {
        let (tokenizer, inputs, outputs) = load(&dir, name);
        for (text, want) in inputs.iter().zip(&outputs) {
            let got = tokenizer
                .encode(text, false, false)
                .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
            checked += 1;
            if &got != want {
                failures.push(format!(
                    "{name}: {text:?}\n  ours      {got:?}\n  llama.cpp {want:?}"
                ));
            }
        }
    }
    eprintln!("{checked} inputs over {} vocabularies", VOCABS.len());
    assert!(
        failures.is_empty(),
        "{} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
