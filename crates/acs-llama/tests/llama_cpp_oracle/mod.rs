//! llama.cpp's reference data for the default model (a copy of
//! shared/oracle/smollm2-llamacpp.json, so the tests need nothing beside this
//! checkout), read the same way by the CPU test (`oracle.rs`) and the WebGPU one
//! (`webgpu.rs`).

use std::path::PathBuf;

use serde_json::Value;

/// The whole fixture.
pub fn oracle() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-llamacpp.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("oracle {} unreadable: {e}", path.display()));
    serde_json::from_str(&text).expect("oracle is JSON")
}

/// A list of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A prompt's `top5_last`: (token, llama.cpp's logit), best first.
pub fn top5_last(prompt: &Value) -> Vec<(usize, f32)> {
    prompt["top5_last"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e[0].as_u64().unwrap() as usize,
                e[1].as_f64().unwrap() as f32,
            )
        })
        .collect()
}
