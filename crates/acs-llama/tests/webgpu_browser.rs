//! The WebGPU backend in a browser: headless Chromium's WebGPU (SwiftShader without a
//! GPU), on generated models, against the CPU backend compiled to the same wasm.
//!
//! Run: `wasm-pack test --headless --chrome crates/acs-llama --features webgpu --test
//! webgpu_browser` (chromedriver on PATH or `--chromedriver`; `webdriver.json` beside
//! the crate turns WebGPU on). The tolerance is the native test's (`tests/webgpu.rs`):
//! every position within 3e-2 of its largest |logit|, greedy tokens identical wherever
//! no rounding step flipped (the position within 1e-4).
#![cfg(all(target_arch = "wasm32", feature = "webgpu"))]

mod common;

use std::sync::Arc;

use acs_llama::gguf::GgufFile;
use acs_llama::model::{Logits, Model, SeqInput};
use acs_llama::quant::GgmlType;
use acs_llama::sample::top_k_indices;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use acs_llama::webgpu::{GpuModel, GpuSeqInput, MatmulLayout, pick_adapter};
use common::rel_diff;
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

/// Relative tolerance on a position's logits (of its largest |logit|).
const FLIP: f32 = 3e-2;
/// Relative difference below which no rounding step flipped (float noise only).
const TIGHT: f32 = 1e-4;

/// A prompt's logits at every position, then greedy decoding, on both backends, with
/// each matmul layout (SwiftShader, a fallback adapter, would choose a thread per row).
async fn matches_cpu(spec: TestModelSpec, prompt_len: usize, steps: usize) {
    let file = Arc::new(GgufFile::from_vec(test_model_bytes(&spec).expect("model")).expect("gguf"));
    let cpu = Model::from_gguf(Arc::clone(&file)).expect("cpu model");
    for layout in [MatmulLayout::ThreadPerRow, MatmulLayout::LanesPerRow] {
        let adapter = pick_adapter(true).await.expect("the browser offers WebGPU");
        let gpu = GpuModel::load_with_layout(&file, adapter, Some(layout))
            .await
            .expect("gpu model");
        let what = format!("{:?}/{:?}, {layout:?}", spec.weight_type, spec.embed_type);
        compare(&what, &cpu, &gpu, prompt_len, steps).await;
    }
}

async fn compare(what: &str, cpu: &Model, gpu: &GpuModel, prompt_len: usize, steps: usize) {
    let vocab = cpu.config.vocab;
    let (mut cc, mut gc) = (cpu.new_cache(), gpu.new_cache());
    // The native test's prompt (`prompt(n, 1)` in tests/webgpu.rs).
    let mut tokens: Vec<u32> = (0..prompt_len as u32)
        .map(|i| 3 + (i * 37 + 11) % 300)
        .collect();
    let mut worst = 0f32;
    for step in 0..=steps {
        let logits = if step == 0 { Logits::All } else { Logits::Last };
        let c = cpu
            .forward(&mut [SeqInput {
                cache: &mut cc,
                tokens: &tokens,
                steering: &[],
                capture: &[],
                logits,
            }])
            .expect("cpu forward");
        let g = gpu
            .forward_async(&mut [GpuSeqInput {
                cache: &mut gc,
                tokens: &tokens,
                steering: &[],
                capture: &[],
                logits,
            }])
            .await
            .expect("gpu forward");
        let (lc, lg) = (&c[0].logits, &g[0].logits);
        let mut rel = 0f32;
        for (p, (a, b)) in lc.chunks(vocab).zip(lg.chunks(vocab)).enumerate() {
            rel = rel_diff(a, b);
            assert!(rel <= FLIP, "{what}: step {step}, position {p}: {rel}");
            worst = worst.max(rel);
        }
        let last = |l: &[f32]| top_k_indices(&l[l.len() - vocab..], 1)[0] as u32;
        let top2 = top_k_indices(&lc[lc.len() - vocab..], 2);
        let gap = lc[lc.len() - vocab + top2[0]] - lc[lc.len() - vocab + top2[1]];
        if rel <= TIGHT {
            assert_eq!(
                last(lc),
                last(lg),
                "{what}: greedy token of step {step} (the CPU's top two {gap} apart)"
            );
        } else if last(lc) != last(lg) {
            // A flipped rounding moved this position by `rel` (within FLIP, asserted
            // above), enough to reorder a near tie.
            wasm_bindgen_test::console_log!(
                "{what}: step {step}: a rounding flip ({rel:.2e}) reordered the CPU's top two, {gap} apart"
            );
        }
        tokens = vec![last(lc)];
    }
    assert_eq!(gc.len(), prompt_len + steps);
    wasm_bindgen_test::console_log!(
        "{what}: {} positions within {worst:.2e} of the CPU's logits ({})",
        prompt_len + steps,
        gpu.adapter_info().name
    );
}

/// The tiny model with its matrices and embedding in `ty`.
fn tiny_of(ty: GgmlType) -> TestModelSpec {
    TestModelSpec {
        weight_type: ty,
        embed_type: ty,
        ..TestModelSpec::tiny()
    }
}

#[wasm_bindgen_test]
async fn q8_0_matches_cpu_in_the_browser() {
    matches_cpu(TestModelSpec::tiny(), 9, 8).await;
}

#[wasm_bindgen_test]
async fn q4_1_matches_cpu_in_the_browser() {
    let spec = TestModelSpec {
        weight_type: GgmlType::Q4_1,
        embed_type: GgmlType::Q8_0,
        ..TestModelSpec::tiny()
    };
    matches_cpu(spec, 9, 8).await;
}

#[wasm_bindgen_test]
async fn q4_k_matches_cpu_in_the_browser() {
    matches_cpu(TestModelSpec::tiny_k(GgmlType::Q4_K), 9, 8).await;
}

#[wasm_bindgen_test]
async fn q4_0_matches_cpu_in_the_browser() {
    matches_cpu(tiny_of(GgmlType::Q4_0), 9, 8).await;
}

#[wasm_bindgen_test]
async fn f16_matches_cpu_in_the_browser() {
    matches_cpu(tiny_of(GgmlType::F16), 9, 8).await;
}

#[wasm_bindgen_test]
async fn bf16_matches_cpu_in_the_browser() {
    matches_cpu(tiny_of(GgmlType::BF16), 9, 8).await;
}

#[wasm_bindgen_test]
async fn q5_k_matches_cpu_in_the_browser() {
    matches_cpu(TestModelSpec::tiny_k(GgmlType::Q5_K), 9, 8).await;
}

#[wasm_bindgen_test]
async fn q6_k_matches_cpu_in_the_browser() {
    matches_cpu(TestModelSpec::tiny_k(GgmlType::Q6_K), 9, 8).await;
}
