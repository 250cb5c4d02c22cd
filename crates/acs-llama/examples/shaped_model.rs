//! Writes a GGUF with the default model's shapes and formats and random weights, for
//! benchmarks on a machine that cannot fetch the model (one without network, such as
//! a GPU machine lent for an hour): speed depends on the shapes and formats, not on
//! the weights' values.
//!
//! `cargo run --release -p acs-llama --example shaped_model -- OUT.gguf`
//!
//! The shapes are SmolLM2-135M-Instruct's: 30 blocks 576 wide, 9 query heads of 64 over
//! 3 key/value heads, a feed-forward of 1536, 49152 tokens; Q4_1 matrices and a Q8_0
//! embedding that the output layer shares, as in the default Q4_1 file.

use acs_llama::model::Family;
use acs_llama::quant::GgmlType;
use acs_llama::testgen::{TestModelSpec, write_test_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os()
        .nth(1)
        .ok_or("usage: shaped_model OUT.gguf")?;
    let spec = TestModelSpec {
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
    };
    write_test_model(&spec, &out)?;
    eprintln!("wrote {}", std::path::Path::new(&out).display());
    Ok(())
}
