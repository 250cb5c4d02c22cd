//! Writes a GGUF with a real model's shapes and random weights, for benchmarks on a
//! machine that cannot fetch the model (one without network, such as a GPU machine
//! lent for an hour) and for models too big to ship: speed depends on the shapes and
//! formats, not on the weights' values.
//!
//! `cargo run --release -p acs-llama --example shaped_model -- OUT.gguf [SHAPE]`
//!
//! SHAPE is one of:
//! - `smollm2-135m` (the default): SmolLM2-135M-Instruct's 30 blocks 576 wide, 9 query
//!   heads of 64 over 3 key/value heads, a feed-forward of 1536, 49152 tokens; Q4_1
//!   matrices and a Q8_0 embedding that the output layer shares, as in the default file;
//! - `llama-3.2-1b`: 16 blocks 2048 wide, 32 query heads over 8 key/value heads, a
//!   feed-forward of 8192, 128256 tokens, tied output; Q8_0 throughout;
//! - `llama-3.1-8b`: 32 blocks 4096 wide, 32 over 8 heads, a feed-forward of 14336,
//!   128256 tokens, an output layer of its own; Q8_0 throughout;
//! - `qwen2.5-0.5b`: Qwen2 with biases, 24 blocks 896 wide, 14 over 2 heads of 64, a
//!   feed-forward of 4864, 151936 tokens, tied output;
//! - `qwen3-0.6b`: Qwen3 with Q/K norms, 28 blocks 1024 wide, 16 over 8 heads of 128,
//!   a feed-forward of 3072, 151936 tokens, tied output;
//! - `gemma3-1b`: Gemma 3, 26 blocks 1152 wide, 4 over 1 head of 256, a feed-forward
//!   of 6912, 262144 tokens, tied output, a window of 512 on five layers in six;
//! - `phi3-mini`: Phi-3 mini with its fused projections, 32 blocks 3072 wide, 32
//!   heads of 96, a feed-forward of 8192, 32064 tokens, an output layer of its own;
//!
//! all but the first in Q8_0 throughout.
//!
//! The Q8_0 files are meant for `llama-quantize --allow-requantize` to make the
//! formats people download (Q4_0, Q4_K_M, …) with llama.cpp's own mixes.

use acs_llama::model::Family;
use acs_llama::quant::GgmlType;
use acs_llama::testgen::{TestModelSpec, write_test_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let out = args.next().ok_or("usage: shaped_model OUT.gguf [SHAPE]")?;
    let shape = args.next().map(|s| s.to_string_lossy().into_owned());
    let default = TestModelSpec {
        family: Family::Llama,
        d_model: 576,
        n_layers: 30,
        n_heads: 9,
        n_kv_heads: 3,
        ffn: 1536,
        vocab: 49152,
        ctx: 8192,
        weight_type: GgmlType::Q4_1,
        value_down_type: None,
        embed_type: GgmlType::Q8_0,
        tied: true,
        seed: 1,
        rope_base: 100_000.0,
        rms_eps: 1e-5,
        rope_freq_factors: None,
        head_dim: None,
        sliding_window: None,
    };
    let llama3 = TestModelSpec {
        n_heads: 32,
        n_kv_heads: 8,
        vocab: 128_256,
        ctx: 131_072,
        weight_type: GgmlType::Q8_0,
        rope_base: 500_000.0,
        ..default.clone()
    };
    let spec = match shape.as_deref() {
        None | Some("smollm2-135m") => default,
        Some("llama-3.2-1b") => TestModelSpec {
            d_model: 2048,
            n_layers: 16,
            ffn: 8192,
            ..llama3
        },
        Some("llama-3.1-8b") => TestModelSpec {
            d_model: 4096,
            n_layers: 32,
            ffn: 14336,
            tied: false,
            ..llama3
        },
        Some("qwen2.5-0.5b") => TestModelSpec {
            family: Family::Qwen2,
            d_model: 896,
            n_layers: 24,
            n_heads: 14,
            n_kv_heads: 2,
            ffn: 4864,
            vocab: 151_936,
            rope_base: 1_000_000.0,
            ..llama3
        },
        Some("qwen3-0.6b") => TestModelSpec {
            family: Family::Qwen3,
            d_model: 1024,
            n_layers: 28,
            n_heads: 16,
            n_kv_heads: 8,
            head_dim: Some(128),
            ffn: 3072,
            vocab: 151_936,
            rope_base: 1_000_000.0,
            ..llama3
        },
        Some("gemma3-1b") => TestModelSpec {
            family: Family::Gemma3,
            d_model: 1152,
            n_layers: 26,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: Some(256),
            ffn: 6912,
            vocab: 262_144,
            ctx: 32_768,
            rope_base: 1_000_000.0,
            rms_eps: 1e-6,
            sliding_window: Some((512, 6)),
            ..llama3
        },
        Some("phi3-mini") => TestModelSpec {
            family: Family::Phi3,
            d_model: 3072,
            n_layers: 32,
            n_heads: 32,
            n_kv_heads: 32,
            ffn: 8192,
            vocab: 32_064,
            ctx: 4096,
            rope_base: 10_000.0,
            tied: false,
            ..llama3
        },
        Some(other) => return Err(format!("unknown shape {other:?}").into()),
    };
    write_test_model(&spec, &out)?;
    eprintln!("wrote {}", std::path::Path::new(&out).display());
    Ok(())
}
