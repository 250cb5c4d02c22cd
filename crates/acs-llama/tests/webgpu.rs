//! The WebGPU forward pass against the CPU one, on generated tiny models of every
//! weight format the WGSL kernels read.
//!
//! Both backends round block-format matmul inputs to 8 bits the same way, so their
//! logits differ by float rounding only (summation order, GPU `exp`): about 1e-6 of
//! the largest |logit|, and every position must stay within [`TIGHT`] of it … except
//! where an activation lies so near a rounding boundary of that 8-bit step that the
//! 1e-7 noise puts it on the other side on one backend. One such flip moves that
//! value by 1/127 of its block's largest, which reaches the logits as up to ~1.5%
//! (measured on these models; it stays in the KV cache, so later positions of the
//! sequence carry a smaller echo of it). The KV cache's rounding to half floats is a
//! second such boundary, finer (2^-11 of the value) and met by every key and value:
//! one key that rounds the other way can push a later 8-bit rounding over, so flips
//! come earlier in a sequence (the K-quant models flip at most of their positions, at
//! the same ~1.5%). So: every position within [`FLIP`], and greedy decoding picks the
//! same tokens wherever no rounding flipped (a flip may reorder a near tie: the
//! browser test met one on the Q5_K model, the CPU's top two 0.009 apart).
//!
//! Needs a WebGPU adapter; software ones count (lavapipe: apt `mesa-vulkan-drivers`).
//! Run: `cargo test -p acs-llama --features webgpu --test webgpu`.
#![cfg(all(feature = "webgpu", not(target_arch = "wasm32")))]

mod common;
mod gemma3_270m;
mod llama_cpp_oracle;

use std::sync::Arc;

use acs_llama::gguf::GgufFile;
use acs_llama::model::Family;
use acs_llama::model::{KvCache, LayerAdd, Logits, Model, ModelError, SeqInput, SeqOutput};
use acs_llama::quant::GgmlType;
use acs_llama::sample::top_k_indices;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use acs_llama::webgpu::{
    GpuCache, GpuError, GpuModel, GpuSeqInput, Kernel, MatmulLayout, pick_adapter,
};
use common::rel_diff;
use llama_cpp_oracle::{ids, oracle, top5_last};

/// Relative tolerance on a position's logits (of its largest |logit|) without a flip.
const TIGHT: f32 = 1e-4;
/// Relative tolerance on a position's logits when a rounding flipped.
const FLIP: f32 = 3e-2;

fn load(spec: &TestModelSpec) -> (Model, GpuModel) {
    let bytes = test_model_bytes(spec).expect("test model");
    let file = Arc::new(GgufFile::from_vec(bytes).expect("gguf parses"));
    let cpu = Model::from_gguf(Arc::clone(&file)).expect("cpu model");
    let gpu = GpuModel::new(&file).expect("gpu model");
    (cpu, gpu)
}

/// The GPU model with the matmul layout given, whatever the adapter would choose, so
/// that both layouts run here (lavapipe alone would choose one thread per row).
fn load_gpu(file: &GgufFile, layout: MatmulLayout) -> GpuModel {
    pollster::block_on(async {
        let adapter = pick_adapter(true).await.expect("an adapter");
        GpuModel::load_with_layout(file, adapter, Some(layout))
            .await
            .expect("gpu model")
    })
}

fn spec(weights: GgmlType, embed: GgmlType) -> TestModelSpec {
    TestModelSpec {
        weight_type: weights,
        embed_type: embed,
        ..TestModelSpec::tiny()
    }
}

/// Max abs difference (for the report).
fn abs_diff(cpu: &[f32], gpu: &[f32]) -> f32 {
    cpu.iter()
        .zip(gpu)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
}

/// One sequence's request, shared by both backends.
struct Req<'a> {
    tokens: &'a [u32],
    steering: &'a [LayerAdd],
    capture: &'a [usize],
    logits: Logits,
}

fn step_cpu(model: &Model, caches: &mut [KvCache], reqs: &[Req<'_>]) -> Vec<SeqOutput> {
    let mut batch: Vec<SeqInput<'_>> = caches
        .iter_mut()
        .zip(reqs)
        .map(|(cache, r)| SeqInput {
            cache,
            tokens: r.tokens,
            steering: r.steering,
            capture: r.capture,
            logits: r.logits,
        })
        .collect();
    model.forward(&mut batch).expect("cpu forward")
}

fn gpu_batch<'a>(caches: &'a mut [GpuCache], reqs: &'a [Req<'_>]) -> Vec<GpuSeqInput<'a>> {
    caches
        .iter_mut()
        .zip(reqs)
        .map(|(cache, r)| GpuSeqInput {
            cache,
            tokens: r.tokens,
            steering: r.steering,
            capture: r.capture,
            logits: r.logits,
        })
        .collect()
}

fn step_gpu(model: &GpuModel, caches: &mut [GpuCache], reqs: &[Req<'_>]) -> Vec<SeqOutput> {
    model
        .forward(&mut gpu_batch(caches, reqs))
        .expect("gpu forward")
}

/// How far two backends' results are apart over a run.
#[derive(Debug, Default)]
struct Diffs {
    /// Positions compared.
    rows: usize,
    /// Positions beyond [`TIGHT`] (a rounding flipped).
    flipped: usize,
    /// Largest relative difference of a position without a flip.
    tight: f32,
    /// Largest relative and absolute differences of any position.
    rel: f32,
    abs: f32,
}

impl Diffs {
    /// Adds one position's logits (or captured activations).
    fn add(&mut self, cpu: &[f32], gpu: &[f32], what: &str) {
        let rel = rel_diff(cpu, gpu);
        assert!(rel <= FLIP, "{what}: differs by {rel} (relative)");
        self.rows += 1;
        if rel > TIGHT {
            self.flipped += 1;
        } else {
            self.tight = self.tight.max(rel);
        }
        self.rel = self.rel.max(rel);
        self.abs = self.abs.max(abs_diff(cpu, gpu));
    }

    /// Compares two steps' outputs position by position.
    fn step(&mut self, cpu: &[SeqOutput], gpu: &[SeqOutput], vocab: usize, d: usize, what: &str) {
        for (i, (c, g)) in cpu.iter().zip(gpu).enumerate() {
            assert_eq!(c.logits.len(), g.logits.len(), "{what}: logit counts");
            for (p, (lc, lg)) in c
                .logits
                .chunks(vocab)
                .zip(g.logits.chunks(vocab))
                .enumerate()
            {
                self.add(lc, lg, &format!("{what}, sequence {i}, logits {p}"));
            }
            assert_eq!(c.captured.len(), g.captured.len(), "{what}: captures");
            for ((lc, xc), (lg, xg)) in c.captured.iter().zip(&g.captured) {
                assert_eq!(lc, lg);
                assert_eq!(xc.len(), xg.len(), "{what}: captured rows");
                for (xc, xg) in xc.chunks(d).zip(xg.chunks(d)) {
                    self.add(
                        xc,
                        xg,
                        &format!("{what}, sequence {i}, capture of layer {lc}"),
                    );
                }
            }
        }
    }

    /// Reports the run. The stated tolerance is [`FLIP`] at every position, asserted
    /// by [`Diffs::add`]; how many positions exceed [`TIGHT`] is reported, not bounded:
    /// one 8-bit rounding that flips early in a prompt moves every later position of
    /// that sequence through the KV cache, so the count says where a flip happened
    /// (seen: 2 of 72 for Q8_0, 12 to 24 of 25 for the K-quants), not how often.
    fn check(&self, what: &str) {
        eprintln!(
            "{what}: {} positions, max relative diff {:.2e} without a flip; {} flipped; \
             max relative {:.2e}, max abs {:.2e}",
            self.rows, self.tight, self.flipped, self.rel, self.abs
        );
        assert!(self.rows > 0, "{what}: nothing compared");
    }
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 37 + seed * 11) % 300)
        .collect()
}

/// A prefill with every position's logits, then greedy decoding on both backends,
/// with each matmul layout.
fn prefill_and_decode(spec: &TestModelSpec, prompt_len: usize, steps: usize) {
    let bytes = test_model_bytes(spec).expect("test model");
    let file = Arc::new(GgufFile::from_vec(bytes).expect("gguf parses"));
    let cpu = Model::from_gguf(Arc::clone(&file)).expect("cpu model");
    for layout in [MatmulLayout::ThreadPerRow, MatmulLayout::LanesPerRow] {
        let gpu = load_gpu(&file, layout);
        eprintln!(
            "adapter: {} ({:?}, {:?}), {layout:?}",
            gpu.adapter_info().name,
            gpu.adapter_info().backend,
            gpu.adapter_info().device_type
        );
        compare(spec, &cpu, &gpu, prompt_len, steps);
    }
}

fn compare(spec: &TestModelSpec, cpu: &Model, gpu: &GpuModel, prompt_len: usize, steps: usize) {
    let mut cc = vec![cpu.new_cache()];
    let mut gc = vec![gpu.new_cache()];
    let p = prompt(prompt_len, 1);
    let req = [Req {
        tokens: &p,
        steering: &[],
        capture: &[],
        logits: Logits::All,
    }];
    let (c, g) = (step_cpu(cpu, &mut cc, &req), step_gpu(gpu, &mut gc, &req));
    let (vocab, d) = (cpu.config.vocab, cpu.config.d_model);
    let mut diffs = Diffs::default();
    diffs.step(&c, &g, vocab, d, "prefill");
    let mut next = top_k_indices(&c[0].logits[(prompt_len - 1) * vocab..], 1)[0] as u32;
    for s in 0..steps {
        let tok = [next];
        let req = [Req {
            tokens: &tok,
            steering: &[],
            capture: &[],
            logits: Logits::Last,
        }];
        let (c, g) = (step_cpu(cpu, &mut cc, &req), step_gpu(gpu, &mut gc, &req));
        diffs.step(&c, &g, vocab, d, &format!("decode step {s}"));
        let (tc, tg) = (
            top_k_indices(&c[0].logits, 1)[0],
            top_k_indices(&g[0].logits, 1)[0],
        );
        if rel_diff(&c[0].logits, &g[0].logits) <= TIGHT {
            assert_eq!(tc, tg, "greedy token of decode step {s}");
        } else if tc != tg {
            eprintln!("decode step {s}: a rounding flip reordered a near tie ({tc} vs {tg})");
        }
        next = tc as u32;
    }
    assert_eq!(gc[0].len(), prompt_len + steps);
    diffs.check(&format!("{:?}/{:?}", spec.weight_type, spec.embed_type));
}

#[test]
fn q8_0_matches_cpu() {
    // 56 prompt tokens + 16 decode steps cross the cache's first growth at 64.
    prefill_and_decode(&TestModelSpec::tiny(), 56, 16);
}

#[test]
fn q4_0_matches_cpu() {
    prefill_and_decode(&spec(GgmlType::Q4_0, GgmlType::Q4_0), 9, 16);
}

#[test]
fn q4_1_matches_cpu() {
    // SmolLM2's mix: Q4_1 matrices, Q8_0 embedding.
    prefill_and_decode(&spec(GgmlType::Q4_1, GgmlType::Q8_0), 9, 16);
}

#[test]
fn q5_0_matches_cpu() {
    prefill_and_decode(&spec(GgmlType::Q5_0, GgmlType::Q5_0), 9, 16);
}

#[test]
fn q5_1_matches_cpu() {
    prefill_and_decode(&spec(GgmlType::Q5_1, GgmlType::Q8_0), 9, 16);
}

/// What `llama-quantize` makes of a model whose width is not a multiple of 256 (the
/// default model's 576): K-quant rows where they fit, Q5_0 beside them.
#[test]
fn q4_k_beside_q5_0_matches_cpu() {
    let s = TestModelSpec {
        value_down_type: Some(GgmlType::Q5_0),
        ..TestModelSpec::tiny_k(GgmlType::Q4_K)
    };
    prefill_and_decode(&s, 9, 16);
}

#[test]
fn f16_matches_cpu() {
    prefill_and_decode(&spec(GgmlType::F16, GgmlType::F16), 9, 16);
}

#[test]
fn bf16_matches_cpu() {
    prefill_and_decode(&spec(GgmlType::BF16, GgmlType::BF16), 9, 16);
}

#[test]
fn f32_matches_cpu() {
    let s = TestModelSpec {
        tied: false,
        ..spec(GgmlType::F32, GgmlType::F32)
    };
    prefill_and_decode(&s, 9, 16);
}

#[test]
fn iq4_nl_matches_cpu() {
    prefill_and_decode(&spec(GgmlType::IQ4_NL, GgmlType::Q8_0), 9, 16);
}

#[test]
fn iq4_xs_matches_cpu() {
    prefill_and_decode(&TestModelSpec::tiny_k(GgmlType::IQ4_XS), 9, 16);
}

#[test]
fn q2_k_matches_cpu() {
    prefill_and_decode(&TestModelSpec::tiny_k(GgmlType::Q2_K), 9, 16);
}

#[test]
fn q3_k_matches_cpu() {
    prefill_and_decode(&TestModelSpec::tiny_k(GgmlType::Q3_K), 9, 16);
}

#[test]
fn q4_k_matches_cpu() {
    prefill_and_decode(&TestModelSpec::tiny_k(GgmlType::Q4_K), 9, 16);
}

#[test]
fn q5_k_matches_cpu() {
    prefill_and_decode(&TestModelSpec::tiny_k(GgmlType::Q5_K), 9, 16);
}

#[test]
fn q6_k_matches_cpu() {
    prefill_and_decode(&TestModelSpec::tiny_k(GgmlType::Q6_K), 9, 16);
}

/// llama.cpp's Q4_K_M mix: value and down projections in Q6_K. The query, key and
/// value projections then stay three tensors (a matmul dispatch each, into one
/// buffer), the gate and up ones share one.
#[test]
fn q4_k_m_mix_matches_cpu() {
    let s = TestModelSpec {
        value_down_type: Some(GgmlType::Q6_K),
        ..TestModelSpec::tiny_k(GgmlType::Q4_K)
    };
    prefill_and_decode(&s, 9, 16);
}

/// The Qwen2 family: biases on the query, key and value projections, and RoPE on the
/// halves of each head, applied by its own kernel after the matmul.
#[test]
fn qwen2_matches_cpu() {
    let s = TestModelSpec {
        family: Family::Qwen2,
        ..spec(GgmlType::Q8_0, GgmlType::Q8_0)
    };
    prefill_and_decode(&s, 56, 16);
}

/// Llama 3.1's per-pair RoPE frequency factors (`rope_freqs.weight`), read by the
/// streaming loader as by the CPU's.
#[test]
fn rope_freq_factors_match_cpu() {
    let s = TestModelSpec::oracle_case("llama-rope-freqs").expect("a known case");
    prefill_and_decode(&s, 56, 16);
}

/// Qwen3: heads wider than d_model/heads, each query and key head normed before
/// RoPE by its own kernel.
#[test]
fn qwen3_matches_cpu() {
    let s = TestModelSpec::oracle_case("qwen3").expect("a known case");
    prefill_and_decode(&s, 56, 16);
}

/// Gemma 3: scaled embeddings, Q/K norms, normed block outputs, GeGLU, and a
/// sliding-window layer (8 positions, passed by the 56-token prompt) with its own
/// RoPE base beside a global one.
#[test]
fn gemma3_matches_cpu() {
    let s = TestModelSpec::oracle_case("gemma3").expect("a known case");
    prefill_and_decode(&s, 56, 16);
}

/// Phi-3: the query, key and value projections one tensor in the file, and the
/// gate and up ones another, each uploaded and run as the one matmul it is.
#[test]
fn phi3_matches_cpu() {
    let s = TestModelSpec::oracle_case("phi3").expect("a known case");
    prefill_and_decode(&s, 56, 16);
}

/// Real Gemma 3 weights (270M Q4_K_M, 262,144 tokens, Q5_0, Q8_0, Q4_K and Q6_K
/// matrices) on the GPU: llama.cpp's greedy continuation of each recorded prompt, up
/// to its first near tie, as on the CPU (`real_models.rs`).
#[test]
fn gemma3_270m_continues_as_llama_cpp() {
    let file = GgufFile::open(gemma3_270m::gemma3_path()).expect("Gemma 3 270M opens");
    let gpu = GpuModel::new(&file).expect("gpu model");
    for case in gemma3_270m::cases() {
        let mut caches = vec![gpu.new_cache()];
        let mut next = case.prompt_ids.clone();
        let mut got = Vec::new();
        while got.len() < case.compared() {
            let req = [Req {
                tokens: &next,
                steering: &[],
                capture: &[],
                logits: Logits::Last,
            }];
            let out = step_gpu(&gpu, &mut caches, &req);
            let t = top_k_indices(&out[0].logits, 1)[0] as u32;
            got.push(t);
            next = vec![t];
        }
        assert_eq!(
            got,
            case.ids[..got.len()],
            "greedy continuation of {:?}",
            case.prompt
        );
    }
}

/// Float value and down projections beside 8-bit blocks: one matmul over the three
/// attention projections reads both the rounded input and the floats, and the
/// feed-forward's activation reaches the down projection unrounded.
#[test]
fn float_value_and_down_beside_blocks_match_cpu() {
    let s = TestModelSpec {
        value_down_type: Some(GgmlType::F16),
        ..spec(GgmlType::Q8_0, GgmlType::Q8_0)
    };
    prefill_and_decode(&s, 9, 16);
}

/// Sequences of different lengths in one batch, prefills and decodes mixed, with
/// steering and captures on some: every sequence gets what the CPU gives it.
#[test]
fn mixed_batch_matches_cpu() {
    let (cpu, gpu) = load(&TestModelSpec::tiny());
    let d = cpu.config.d_model;
    let steer = [LayerAdd {
        layer: 0,
        vector: (0..d).map(|i| ((i % 7) as f32 - 3.0) * 0.3).collect(),
    }];
    let (a, b, c) = (prompt(7, 2), prompt(3, 3), prompt(4, 4));
    let mut cc: Vec<KvCache> = (0..3).map(|_| cpu.new_cache()).collect();
    let mut gc: Vec<GpuCache> = (0..3).map(|_| gpu.new_cache()).collect();

    // Step 1: A and B prefill (B steered, all logits), C waits.
    let reqs = [
        Req {
            tokens: &a,
            steering: &[],
            capture: &[1],
            logits: Logits::Last,
        },
        Req {
            tokens: &b,
            steering: &steer,
            capture: &[],
            logits: Logits::All,
        },
        Req {
            tokens: &[],
            steering: &[],
            capture: &[],
            logits: Logits::None,
        },
    ];
    let (oc, og) = (
        step_cpu(&cpu, &mut cc, &reqs),
        step_gpu(&gpu, &mut gc, &reqs),
    );
    let vocab = cpu.config.vocab;
    let mut diffs = Diffs::default();
    diffs.step(&oc, &og, vocab, d, "step 1");

    // Step 2: A decodes, B continues its prefill in a second chunk, C prefills.
    let (a2, b2) = ([5u32], prompt(5, 5));
    let reqs = [
        Req {
            tokens: &a2,
            steering: &[],
            capture: &[],
            logits: Logits::Last,
        },
        Req {
            tokens: &b2,
            steering: &steer,
            capture: &[0, 1],
            logits: Logits::Last,
        },
        Req {
            tokens: &c,
            steering: &[],
            capture: &[],
            logits: Logits::All,
        },
    ];
    let (oc, og) = (
        step_cpu(&cpu, &mut cc, &reqs),
        step_gpu(&gpu, &mut gc, &reqs),
    );
    diffs.step(&oc, &og, vocab, d, "step 2");
    assert_eq!(
        gc.iter().map(GpuCache::len).collect::<Vec<_>>(),
        [8, 8, 4],
        "cache lengths"
    );
    diffs.check("mixed batch");
}

/// A profiled step gives the unprofiled step's results, and times every dispatch:
/// two sequences (one steered) decoding after their prefills, against the same step
/// unprofiled on copies of their caches.
#[test]
fn profile_times_every_dispatch() {
    let (cpu, gpu) = load(&TestModelSpec::tiny());
    let c = &cpu.config;
    let steer = [LayerAdd {
        layer: 1,
        vector: vec![0.25; c.d_model],
    }];
    let mut caches: Vec<GpuCache> = (0..2).map(|_| gpu.new_cache()).collect();
    let (a, b) = (prompt(5, 6), prompt(3, 7));
    let req = |tokens, steering| Req {
        tokens,
        steering,
        capture: &[],
        logits: Logits::Last,
    };
    step_gpu(&gpu, &mut caches, &[req(&a, &[]), req(&b, &steer)]);
    let mut copies: Vec<GpuCache> = caches
        .iter()
        .map(|c| gpu.fork_cache(c, c.len() + 1).expect("fork"))
        .collect();
    let decode = [req(&[3], &[]), req(&[4], &steer)];
    let plain = step_gpu(&gpu, &mut copies, &decode);
    let (out, profile) = gpu
        .profile(&mut gpu_batch(&mut caches, &decode))
        .expect("lavapipe has timestamp queries");
    for (p, q) in plain.iter().zip(&out) {
        assert_eq!(p.logits, q.logits, "profiling changes no result");
    }
    assert_eq!(caches[0].len(), 6, "the profiled step advanced the cache");

    let count =
        |f: &dyn Fn(&Kernel) -> bool| profile.kernels.iter().filter(|k| f(&k.kernel)).count();
    let layers = c.n_layers;
    assert_eq!(count(&|k| *k == Kernel::Embed), 1);
    assert_eq!(
        count(&|k| *k == Kernel::Attention),
        2 * layers,
        "one a sequence and layer"
    );
    assert_eq!(count(&|k| *k == Kernel::RmsNorm), 2 * layers + 1);
    assert_eq!(count(&|k| *k == Kernel::SwiGlu), layers);
    assert_eq!(
        count(&|k| *k == Kernel::Steer),
        1,
        "one steered sequence, one layer"
    );
    let matmul_bytes: u64 = profile.kernels.iter().map(|k| k.weight_bytes).sum();
    assert_eq!(
        matmul_bytes,
        gpu.weight_bytes_per_step(),
        "the matmuls read every weight once"
    );
    assert!(
        profile.kernels.iter().all(|k| match k.kernel {
            Kernel::Matmul { .. } => k.weight_bytes > 0,
            _ => k.weight_bytes == 0,
        }),
        "weights are counted where matmuls read them: {:?}",
        profile.kernels
    );
    assert!(profile.span > 0.0);
    assert!(
        profile
            .kernels
            .iter()
            .all(|k| k.seconds > 0.0 && k.seconds <= profile.span),
        "every dispatch has its own time, within the step's: {profile:?}"
    );
}

/// A cache that reserved room takes it at its first step and keeps it while its
/// sequence stays within it; a fork takes its own room at once (copying each layer's
/// positions into the larger buffers) and continues exactly as the original does.
#[test]
fn reserved_caches_take_their_room_once() {
    let (cpu, gpu) = load(&TestModelSpec::tiny());
    let per_position = cpu.config.kv_bytes_per_token() as u64;
    // Capacities are whole steps of a few dozen positions (for the binding offsets'
    // alignment), so a cache of `room` positions takes less than `room + 64`.
    let within = |bytes: u64, room: u64| {
        assert!(
            bytes >= room * per_position && bytes < (room + 64) * per_position,
            "{bytes} bytes for a room of {room} positions"
        );
    };
    fn req(tokens: &[u32]) -> Req<'_> {
        Req {
            tokens,
            steering: &[],
            capture: &[],
            logits: Logits::Last,
        }
    }
    let mut original = vec![gpu.new_cache()];
    original[0].reserve(100);
    step_gpu(&gpu, &mut original, &[req(&prompt(5, 1))]);
    let at_first_step = original[0].bytes();
    within(at_first_step, 100);

    let mut branch = vec![gpu.fork_cache(&original[0], 200).expect("fork")];
    within(branch[0].bytes(), 200);
    for t in 0..95u32 {
        let a = step_gpu(&gpu, &mut original, &[req(&[t % 50])]);
        let b = step_gpu(&gpu, &mut branch, &[req(&[t % 50])]);
        assert_eq!(
            a[0].logits, b[0].logits,
            "step {t}: the branch continues as the original"
        );
    }
    assert_eq!(original[0].len(), 100);
    assert_eq!(
        original[0].bytes(),
        at_first_step,
        "no growth within the room"
    );
}

#[test]
fn bad_batches_are_errors() {
    let (_, gpu) = load(&TestModelSpec::tiny());
    let mut cache = gpu.new_cache();
    let vocab = gpu.config.vocab as u32;
    let mut batch = [GpuSeqInput {
        cache: &mut cache,
        tokens: &[1, vocab],
        steering: &[],
        capture: &[],
        logits: Logits::Last,
    }];
    match gpu.forward(&mut batch) {
        Err(GpuError::Model(ModelError::TokenOutOfRange(t))) => assert_eq!(t, vocab),
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    let long = vec![1u32; gpu.config.context + 1];
    batch[0].tokens = &long;
    assert!(matches!(
        gpu.forward(&mut batch),
        Err(GpuError::Model(ModelError::ContextFull(..)))
    ));
    assert!(cache.is_empty(), "a refused step leaves the cache alone");
}

/// The default model (SmolLM2-135M Q4_1 with a Q8_0 embedding) on WebGPU against
/// llama.cpp's reference data, with oracle.rs's criteria: the same top-5 at the last
/// prompt position with logits within 1.0, and the same greedy choice wherever
/// llama.cpp's own margin is wide (above 1.0). Needs the default model (see
/// `acs_llama::testgen::default_model_for_tests`); without it the test fails.
#[test]
fn default_model_matches_llama_cpp_oracle() {
    let path = acs_llama::testgen::default_model_for_tests();
    let file = GgufFile::open(&path).expect("default model opens");
    let oracle = oracle();
    // Both matmul layouts: 576 columns are 18 blocks, so the lanes' sums are real.
    for layout in [MatmulLayout::ThreadPerRow, MatmulLayout::LanesPerRow] {
        let gpu = load_gpu(&file, layout);
        let step = |cache: &mut GpuCache, tokens: &[u32]| -> Vec<f32> {
            let mut batch = [GpuSeqInput {
                cache,
                tokens,
                steering: &[],
                capture: &[],
                logits: Logits::Last,
            }];
            gpu.forward(&mut batch)
                .expect("gpu forward")
                .remove(0)
                .logits
        };
        for p in oracle["prompts"].as_array().unwrap() {
            let prompt = ids(&p["ids"]);
            let mut cache = gpu.new_cache();
            let mut logits = step(&mut cache, &prompt);
            let want = top5_last(p);
            // The same five tokens; their order wherever llama.cpp's gap between
            // neighbours is wider than the differences allowed below ("The grass
            // is" has two 0.014 apart, which summation order alone can swap).
            let mut top5 = top_k_indices(&logits, 5);
            let rank = |id: usize| top5.iter().position(|&t| t == id);
            for pair in want.windows(2).filter(|w| w[0].1 - w[1].1 > 0.5) {
                assert!(
                    rank(pair[0].0) < rank(pair[1].0),
                    "{:?}: {} ranks below {}",
                    p["text"],
                    pair[0].0,
                    pair[1].0
                );
            }
            top5.sort_unstable();
            let mut want5: Vec<usize> = want.iter().map(|e| e.0).collect();
            want5.sort_unstable();
            assert_eq!(top5, want5, "top-5 of {:?}", p["text"]);
            let worst = want
                .iter()
                .fold(0f32, |m, &(id, l)| m.max((logits[id] - l).abs()));
            assert!(worst <= 1.0, "{:?}: top-5 logits off by {worst}", p["text"]);
            let greedy = ids(&p["greedy_ids"]);
            let mut checked = 0;
            for (i, s) in p["greedy_steps"].as_array().unwrap().iter().enumerate() {
                if s["margin"].as_f64().unwrap() > 1.0 {
                    let top1 = s["top1"].as_u64().unwrap() as usize;
                    assert_eq!(
                        top_k_indices(&logits, 1)[0],
                        top1,
                        "{:?} step {i}",
                        p["text"]
                    );
                    checked += 1;
                }
                logits = step(&mut cache, &greedy[i..i + 1]);
            }
            assert!(checked >= 5, "too few wide-margin steps checked: {checked}");
            eprintln!(
                "{:?} on {} ({layout:?}): the same top-5, largest logit difference {worst:.3}, {checked} wide-margin greedy steps agree",
                p["text"],
                gpu.adapter_info().name
            );
        }
    }
}
