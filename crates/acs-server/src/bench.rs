//! `acs bench`: prefill and decode speed of the CPU forward pass, with llama.cpp on
//! the same file as the anchor when asked (`--llama-cpp`), run after ours so the two
//! never compete for the cores.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use acs_llama::model::{KvCache, Logits, Model, SeqInput};
use acs_llama::sample::argmax;

use std::sync::Arc;

use acs_core::{CompletionRequest, Endpoint};
use acs_engine::generation::model_info;
use acs_engine::{Engine, Event, SchedulerConfig, prepare};
use serde_json::json;

use crate::cli::CliError;
use crate::models;

/// Arguments of `acs bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The GGUF model (default: SmolLM2-135M-Instruct Q4_1, fetched with pip).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt tokens for the prefill measurement.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens decoded per sequence.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Repetitions; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Also run llama.cpp (llama-cpp-python) on the same file, with the same shapes.
    #[arg(long)]
    llama_cpp: bool,
    /// Also run the WebGPU backend (built with `--features webgpu`): decode speed and
    /// its weight bandwidth against the adapter's copy bandwidth (the roofline).
    #[cfg(feature = "webgpu")]
    #[arg(long)]
    webgpu: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn prompt(model: &Model, n: usize) -> Vec<u32> {
    let text = "The sky is blue because molecules in the air scatter blue light from the sun more than they scatter red light. ";
    let ids = model
        .tokenizer
        .encode(text, false, false)
        .expect("the bench text tokenizes");
    ids.iter().copied().cycle().take(n).collect()
}

fn prefill(model: &Model, ids: &[u32]) -> (KvCache, u32, f64) {
    let mut cache = model.new_cache();
    let t = Instant::now();
    let out = model
        .forward(&mut [SeqInput {
            cache: &mut cache,
            tokens: ids,
            steering: &[],
            capture: &[],
            logits: Logits::Last,
        }])
        .expect("prefill runs");
    let secs = t.elapsed().as_secs_f64();
    (cache, argmax(&out[0].logits), secs)
}

/// Decodes `steps` tokens greedily for `caches.len()` sequences in one batch; tokens/s.
fn decode(model: &Model, caches: &mut [KvCache], first: u32, steps: usize) -> f64 {
    let mut feed = vec![[first]; caches.len()];
    let t = Instant::now();
    for _ in 0..steps {
        let mut batch: Vec<SeqInput<'_>> = caches
            .iter_mut()
            .zip(&feed)
            .map(|(cache, f)| SeqInput {
                cache,
                tokens: f,
                steering: &[],
                capture: &[],
                logits: Logits::Last,
            })
            .collect();
        let out = model.forward(&mut batch).expect("decode runs");
        for (f, o) in feed.iter_mut().zip(out) {
            *f = [argmax(&o.logits)];
        }
    }
    (steps * caches.len()) as f64 / t.elapsed().as_secs_f64()
}

pub fn run(a: BenchArgs) -> Result<(), CliError> {
    let path = models::resolve(a.model)?;
    let model = models::load(&path)?;
    let threads = acs_llama::threads();
    println!(
        "acs bench: {} ({} threads), prompt {} tokens, decode {} tokens, {} runs (medians)",
        path.display(),
        threads,
        a.prompt_tokens,
        a.decode_tokens,
        a.repeat
    );
    let ids = prompt(&model, a.prompt_tokens);
    let mut pre = Vec::new();
    let mut dec1 = Vec::new();
    let mut dec8 = Vec::new();
    for _ in 0..a.repeat.max(1) {
        let (cache, first, secs) = prefill(&model, &ids);
        pre.push(a.prompt_tokens as f64 / secs);
        dec1.push(decode(&model, &mut [cache.clone()], first, a.decode_tokens));
        let mut eight = vec![cache; 8];
        dec8.push(decode(&model, &mut eight, first, a.decode_tokens));
    }
    let (p, d1, d8) = (median(pre), median(dec1), median(dec8));
    println!(
        "acs       prefill {p:8.1} tok/s | decode x1 {d1:7.1} tok/s | decode x8 {d8:7.1} tok/s"
    );
    // The CPU's roofline for batched decode: its matmuls' multiply-adds per second
    // against the machine's int8 peak (8 sequences read each weight once for eight
    // tokens, so their step is bound by arithmetic rather than by memory).
    if let Some(p) = acs_llama::quant::int8_peak() {
        let (peak, instruction) = (p.macs_per_sec, p.instruction);
        let macs = model.config.matmul_macs_per_token() as f64;
        let (r1, r8) = (d1 * macs, d8 * macs);
        println!(
            "cpu       int8 peak {:7.1} G MAC/s ({instruction}, {threads} threads) | decode x1 {:5.1} G MAC/s ({:.0}%) | decode x8 {:5.1} G MAC/s ({:.0}%)",
            peak / 1e9,
            r1 / 1e9,
            100.0 * r1 / peak,
            r8 / 1e9,
            100.0 * r8 / peak
        );
    }
    engine_bench(&model, a.decode_tokens, a.repeat)?;
    #[cfg(feature = "webgpu")]
    if a.webgpu {
        webgpu_bench(&path, &ids, a.decode_tokens, a.repeat)?;
    }
    if a.llama_cpp {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/bench_llamacpp.py"
        );
        let out = Command::new("python3")
            .arg(script)
            .arg(&path)
            .args([
                a.prompt_tokens.to_string(),
                a.decode_tokens.to_string(),
                a.repeat.to_string(),
                threads.to_string(),
            ])
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                print!("{text}");
                if let Some((lp, l1, l8)) = parse_anchor(&text) {
                    println!(
                        "ratio     prefill {:8.2}x      | decode x1 {:7.2}x      | decode x8 {:7.2}x   (acs / llama.cpp)",
                        p / lp,
                        d1 / l1,
                        d8 / l8
                    );
                }
            }
            Ok(o) => eprintln!(
                "llama.cpp anchor failed (pip install llama-cpp-python): {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("llama.cpp anchor failed: {e}"),
        }
    }
    Ok(())
}

/// Reads the three figures of the anchor's `llama.cpp prefill … | decode x1 … | decode x8 …` line.
fn parse_anchor(text: &str) -> Option<(f64, f64, f64)> {
    let line = text.lines().find(|l| l.starts_with("llama.cpp"))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match nums.as_slice() {
        [p, d1, d8, ..] => Some((*p, *d1, *d8)),
        _ => None,
    }
}

/// Aggregate throughput of the engine: `concurrent` requests of one prompt each, or
/// one request with `n` choices; returns (generated tokens/s, prefills run).
fn engine_run(
    model: &Arc<Model>,
    concurrent: usize,
    n: usize,
    max_tokens: usize,
) -> Result<(f64, u64), CliError> {
    let engine = Engine::start(
        Arc::clone(model),
        SchedulerConfig::with_kv_bytes(model, 1 << 30),
    );
    let info = model_info(model, "bench", 0);
    // End-of-generation tokens are banned, so every sequence runs to max_tokens and the
    // batch keeps its size: steady-state throughput, as batched benchmarks measure it.
    let tok = &model.tokenizer;
    let no_eog: serde_json::Map<String, serde_json::Value> = (0..tok.vocab_size() as u32)
        .filter(|&id| tok.is_eog(id))
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    let body = json!({"model": "bench", "prompt": "The sky is", "max_tokens": max_tokens, "n": n, "seed": 1, "logit_bias": no_eog});
    let req = CompletionRequest::from_value(&body, Endpoint::Completions)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    let mut tickets = Vec::new();
    for i in 0..concurrent {
        let mut g = prepare(&req, model, &info, &Default::default(), i as u64)?;
        g.seed = i as u64;
        let tx = tx.clone();
        tickets.push(engine.submit(g, Box::new(move |e| tx.send(e).is_ok()))?);
    }
    drop(tx);
    let mut generated = 0u64;
    for e in rx {
        if let Event::Done(f) = e {
            generated += f.usage.completion_tokens;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let prefills = engine.stats().prefills;
    drop(tickets);
    Ok((generated as f64 / secs, prefills))
}

/// Medians of `repeat` runs each; the runs of one shape alternate with the others',
/// so that a slow spell of a shared machine does not land on one shape alone.
fn engine_bench(model: &Arc<Model>, max_tokens: usize, repeat: usize) -> Result<(), CliError> {
    let shapes = [(1, 1), (8, 1), (32, 1), (1, 8)];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    // Prefills of the one request with n = 8 (its choices share one).
    let mut prefills = 0;
    for _ in 0..repeat.max(1) {
        for (i, &(concurrent, n)) in shapes.iter().enumerate() {
            let (r, p) = engine_run(model, concurrent, n, max_tokens)?;
            runs[i].push(r);
            if n == 8 {
                prefills = p;
            }
        }
    }
    let [one, x8, x32, n8] = [0, 1, 2, 3].map(|i| median(runs[i].clone()));
    println!(
        "engine    requests x1 {one:7.1} tok/s | x8 {x8:7.1} tok/s ({:.2}x) | x32 {x32:7.1} tok/s ({:.2}x) | one request n=8 {n8:7.1} tok/s, {prefills} prefill",
        x8 / one,
        x32 / one
    );
    Ok(())
}

/// The WebGPU backend on the best adapter found: decode tokens/s for 1 and 8
/// sequences after the same prefill, and the weight bytes those steps read per second
/// as a fraction of the adapter's copy bandwidth (read + write of a 256 MiB copy).
#[cfg(feature = "webgpu")]
fn webgpu_bench(
    path: &std::path::Path,
    ids: &[u32],
    steps: usize,
    repeat: usize,
) -> Result<(), CliError> {
    use acs_llama::webgpu::{GpuCache, GpuModel, GpuSeqInput};
    let fail =
        |e: acs_llama::webgpu::GpuError| CliError::Api(acs_core::ApiError::internal(e.to_string()));
    let file = acs_llama::gguf::GgufFile::open(path)
        .map_err(|e| CliError::Api(acs_core::ApiError::internal(e.to_string())))?;
    let gpu = GpuModel::new(&file).map_err(fail)?;
    let info = gpu.adapter_info();
    let copy = gpu.copy_bandwidth(256 << 20, 5).map_err(fail)?;
    let step = |caches: &mut [GpuCache], feed: &[Vec<u32>], logits| {
        let mut batch: Vec<GpuSeqInput<'_>> = caches
            .iter_mut()
            .zip(feed)
            .map(|(cache, f)| GpuSeqInput {
                cache,
                tokens: f,
                steering: &[],
                capture: &[],
                logits,
            })
            .collect();
        gpu.forward(&mut batch)
    };
    let decode = |n: usize| -> Result<f64, CliError> {
        let mut caches: Vec<GpuCache> = (0..n).map(|_| gpu.new_cache()).collect();
        let prompts = vec![ids.to_vec(); n];
        let out = step(&mut caches, &prompts, Logits::Last).map_err(fail)?;
        let mut feed: Vec<Vec<u32>> = out.iter().map(|o| vec![argmax(&o.logits)]).collect();
        let t = Instant::now();
        for _ in 0..steps {
            let out = step(&mut caches, &feed, Logits::Last).map_err(fail)?;
            for (f, o) in feed.iter_mut().zip(out) {
                *f = vec![argmax(&o.logits)];
            }
        }
        Ok((steps * n) as f64 / t.elapsed().as_secs_f64())
    };
    let mut d1 = Vec::new();
    let mut d8 = Vec::new();
    for _ in 0..repeat.max(1) {
        d1.push(decode(1)?);
        d8.push(decode(8)?);
    }
    let (d1, d8) = (median(d1), median(d8));
    let w = gpu.weight_bytes_per_step() as f64;
    let gbs = |x: f64| x / 1e9;
    println!(
        "webgpu    {} ({:?}, {:?}): copy bandwidth {:.2} GB/s, weights {:.1} MB per step",
        info.name,
        info.backend,
        info.device_type,
        gbs(copy),
        w / 1e6
    );
    for (n, tps) in [(1usize, d1), (8, d8)] {
        let bw = w * tps / n as f64;
        println!(
            "webgpu    decode x{n} {tps:8.1} tok/s | weights read at {:.2} GB/s = {:.1}% of copy bandwidth",
            gbs(bw),
            100.0 * bw / copy
        );
    }
    Ok(())
}
