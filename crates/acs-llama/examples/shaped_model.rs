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
//!   128256 tokens, an output layer of its own; Q8_0 throughout.
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
        Some(other) => return Err(format!("unknown shape {other:?}").into()),
    };
    write_test_model(&spec, &out)?;
    eprintln!("wrote {}", std::path::Path::new(&out).display());
    Ok(())
}
