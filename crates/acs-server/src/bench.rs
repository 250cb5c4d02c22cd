//! `acs bench`: prefill and decode speed of the CPU forward pass, with llama.cpp on
//! the same file as the anchor when asked (`--llama-cpp`), run after ours so the two
//! never compete for the cores.

use std::path::PathBuf;
use std::time::Instant;

use acs_llama::model::{KvCache, Logits, Model, SeqInput};
use acs_llama::sample::argmax;

use std::sync::Arc;

use acs_core::{CompletionRequest, Endpoint};
use acs_engine::generation::model_info;
use acs_engine::{Engine, Event, SchedulerConfig, prepare};
use serde_json::json;

use crate::bench_anchor;
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
    /// Prompt tokens of the engine's long-prompt shapes (one request, eight, and one
    /// with n=8).
    #[arg(long, default_value_t = 1024)]
    long_prompt_tokens: usize,
    /// Repetitions; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Sequences of the batched decode measurement.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Measure the forward pass alone, without the engine's shapes (whose runs take
    /// minutes on models of a billion parameters or more).
    #[arg(long)]
    forward_only: bool,
    /// Also run llama.cpp on the same file, with the same shapes: its `llama-bench`
    /// and `llama-batched-bench` where they are in `$LLAMA_BIN` or on the PATH, else
    /// llama-cpp-python.
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
    let before = cpu_times();
    let mut pre = Vec::new();
    let mut dec1 = Vec::new();
    let mut dec8 = Vec::new();
    let mut reads = Vec::new();
    let batch = a.batch.max(1);
    for _ in 0..a.repeat.max(1) {
        let (mut cache, first, secs) = prefill(&model, &ids);
        pre.push(a.prompt_tokens as f64 / secs);
        // Room for every step, as the engine reserves it: a cache that grew by
        // doubling would copy the whole prompt's keys and values within the timed
        // decode. The decode of several sequences forks them from the one prefill, as
        // a request's n choices share their prompt's positions.
        let room = ids.len() + a.decode_tokens;
        let one = cache.copy_prefix(cache.len(), room);
        dec1.push(decode(&model, &mut [one], first, a.decode_tokens));
        let mut several: Vec<KvCache> = (0..batch).map(|_| cache.fork(room)).collect();
        dec8.push(decode(&model, &mut several, first, a.decode_tokens));
        // The read that bounds this run's decode of one, seconds after it (on a shared
        // machine the memory's rate drifts from minute to minute), and after the
        // decodes rather than between them: it streams more than the caches hold, so
        // a decode after it would start with cold caches.
        reads.push(acs_llama::cpu::read_bandwidth());
    }
    let (p, d1, d8) = (median(pre), median(dec1), median(dec8));
    println!(
        "acs       prefill {p:8.1} tok/s | decode x1 {d1:7.1} tok/s | decode x{batch} {d8:7.1} tok/s"
    );
    // The CPU's roofline for batched decode: its matmuls' multiply-adds per second
    // against the machine's int8 peak (8 sequences read each weight once for eight
    // tokens, so their step is bound by arithmetic rather than by memory).
    if let Some(p) = acs_llama::cpu::int8_peak() {
        let (peak, instruction) = (p.macs_per_sec, p.instruction);
        let macs = model.config.matmul_macs_per_token() as f64;
        let (r1, r8) = (d1 * macs, d8 * macs);
        println!(
            "cpu       int8 peak {:7.1} G MAC/s ({instruction}, {threads} threads) | decode x1 {:5.1} G MAC/s ({:.0}%) | decode x{batch} {:5.1} G MAC/s ({:.0}%)",
            peak / 1e9,
            r1 / 1e9,
            100.0 * r1 / peak,
            r8 / 1e9,
            100.0 * r8 / peak
        );
    }
    // One sequence's decode of a model larger than the caches reads every weight once
    // a token: its ceiling is the bandwidth the threads get from memory.
    let (bw, bytes) = (median(reads), model.weight_bytes_per_token() as f64);
    println!(
        "memory    read {:5.1} GB/s ({threads} threads) | decode x1 reads {:5.1} GB/s of weights ({:.0}%; {:.0} MB a token)",
        bw / 1e9,
        d1 * bytes / 1e9,
        100.0 * d1 * bytes / bw,
        bytes / 1e6
    );
    if !a.forward_only {
        engine_bench(
            &model,
            a.decode_tokens,
            a.repeat,
            &prompt(&model, a.long_prompt_tokens),
        )?;
    }
    if let (Some(b), Some(e)) = (before, cpu_times()) {
        let share = 100.0 * e.steal.saturating_sub(b.steal) as f64
            / e.total.saturating_sub(b.total).max(1) as f64;
        println!(
            "host      {share:.1}% of the CPUs' time stolen by the hypervisor during these runs{}",
            if share > STEAL_NOTED {
                " (other guests' load: figures not comparable with a quiet machine's)"
            } else {
                ""
            }
        );
    }
    #[cfg(feature = "webgpu")]
    if a.webgpu {
        webgpu_bench(&path, &ids, a.decode_tokens, a.repeat)?;
    }
    if a.llama_cpp {
        let shapes = bench_anchor::Shapes {
            prompt: a.prompt_tokens,
            decode: a.decode_tokens,
            repeat: a.repeat,
            threads,
            batch,
        };
        match bench_anchor::run(&path, shapes) {
            Ok(text) => {
                print!("{text}");
                if let Some((lp, l1, l8)) = bench_anchor::parse_anchor(&text) {
                    println!(
                        "ratio     prefill {:8.2}x      | decode x1 {:7.2}x      | decode x{batch} {:7.2}x   (acs / llama.cpp)",
                        p / lp,
                        d1 / l1,
                        d8 / l8
                    );
                }
            }
            Err(e) => eprintln!("llama.cpp anchor failed: {e}"),
        }
    }
    Ok(())
}

/// Stolen time (in percent) above which `acs bench` says its figures are a busy
/// host's: stolen time slows the engine's batched runs most, as a step of eight waits
/// at each of its parallel loops for a descheduled core, so the speedups it reports
/// come out low.
const STEAL_NOTED: f64 = 2.0;

/// The CPUs' time since boot, in ticks: all of it, and what the hypervisor gave to
/// other guests (steal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    total: u64,
    steal: u64,
}

/// This machine's [`CpuTimes`], where `/proc/stat` exists (Linux).
fn cpu_times() -> Option<CpuTimes> {
    parse_cpu_line(std::fs::read_to_string("/proc/stat").ok()?.lines().next()?)
}

/// `/proc/stat`'s first line, `cpu  user nice system idle iowait irq softirq steal
/// guest guest_nice`: the total is the first eight (guest time is inside user's).
fn parse_cpu_line(line: &str) -> Option<CpuTimes> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    (ticks.len() == 8).then(|| CpuTimes {
        total: ticks.iter().sum(),
        steal: ticks[7],
    })
}

/// What one engine run measured.
struct EngineRun {
    /// Generated tokens per second, all requests together.
    tokens_per_sec: f64,
    /// Prompts prefilled.
    prefills: u64,
    /// Prompt tokens prefilled since it started.
    prefill_tokens: u64,
    /// Most KV cache memory the running sequences held at once.
    kv_bytes_peak: u64,
}

/// An engine with 1 GiB of KV memory, and nothing in its prompt cache.
fn fresh_engine(model: &Arc<Model>) -> Engine {
    Engine::start(
        Arc::clone(model),
        SchedulerConfig::with_kv_bytes(model, 1 << 30),
    )
}

/// Aggregate throughput of the engine: `concurrent` requests of `prompt` (the
/// contract's `prompt`: a text, token ids, or several prompts' ids) each with `n`
/// choices. Its prefills and KV peak are the engine's since it started.
fn engine_run(
    engine: &Engine,
    model: &Arc<Model>,
    concurrent: usize,
    n: usize,
    max_tokens: usize,
    prompt: &serde_json::Value,
) -> Result<EngineRun, CliError> {
    let info = model_info(model, "bench", 0);
    // End-of-generation tokens are banned, so every sequence runs to max_tokens and the
    // batch keeps its size: steady-state throughput, as batched benchmarks measure it.
    let tok = &model.tokenizer;
    let no_eog: serde_json::Map<String, serde_json::Value> = (0..tok.vocab_size() as u32)
        .filter(|&id| tok.is_eog(id))
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    let body = json!({"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "n": n, "seed": 1, "logit_bias": no_eog});
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
    let stats = engine.stats();
    drop(tickets);
    Ok(EngineRun {
        tokens_per_sec: generated as f64 / secs,
        prefills: stats.prefills,
        prefill_tokens: stats.prefill_tokens,
        kv_bytes_peak: stats.kv_bytes_peak,
    })
}

/// Medians of `repeat` runs each; the runs of one shape alternate with the others',
/// so that a slow spell of a shared machine does not land on one shape alone. Three
/// shapes repeat one request, eight, and one with n=8 on a long prompt (`long`), where
/// sharing the prompt's prefill and KV cache matters: the n=8 run's KV peak is printed
/// beside what eight copies would take. The last is one request of eight prompts that
/// begin with the long one, each with 16 tokens of its own (a shared preamble): the
/// tokens it prefilled are printed beside the prompts' total.
fn engine_bench(
    model: &Arc<Model>,
    max_tokens: usize,
    repeat: usize,
    long: &[u32],
) -> Result<(), CliError> {
    let short = json!("The sky is");
    let preambled: Vec<Vec<u32>> = (0..8)
        .map(|i| {
            let own = long.iter().copied().cycle().skip(16 * i).take(16);
            long.iter().copied().chain(own).collect()
        })
        .collect();
    let preambled_tokens: usize = preambled.iter().map(Vec::len).sum();
    let long_len = long.len();
    let (long, preambled) = (json!(long), json!(preambled));
    let shapes = [
        (1, 1, &short),
        (8, 1, &short),
        (32, 1, &short),
        (1, 8, &short),
        (1, 1, &long),
        (8, 1, &long),
        (1, 8, &long),
        (1, 1, &preambled),
    ];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    // The long prompt's one request again, on the engine that ran it: its prompt is
    // kept, so this one branches from it instead of prefilling.
    let mut again = Vec::new();
    // Each shape's last run, for its prefills (eight requests of one prompt share one,
    // as the n = 8 choices of one request do) and its KV peak.
    let mut last = Vec::new();
    for _ in 0..repeat.max(1) {
        last.clear();
        for (i, &(concurrent, n, prompt)) in shapes.iter().enumerate() {
            let engine = fresh_engine(model);
            let r = engine_run(&engine, model, concurrent, n, max_tokens, prompt)?;
            runs[i].push(r.tokens_per_sec);
            if i == 4 {
                let warm = engine_run(&engine, model, 1, 1, max_tokens, prompt)?;
                again.push((warm.tokens_per_sec, warm.prefills - r.prefills));
            }
            last.push(r);
        }
    }
    let [one, x8, x32, n8, long_one, long_x8, long_n8, shared] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| median(runs[i].clone()));
    // Each speedup is the median of its runs' ratios to the one-request run of the
    // same round, seconds apart: a slow spell of a shared machine then slows both
    // sides of a ratio, where a ratio of medians can pair a fast spell's run with a
    // slow one's.
    let speedup = |i: usize, base: usize| {
        median(
            runs[i]
                .iter()
                .zip(&runs[base])
                .map(|(r, b)| r / b)
                .collect(),
        )
    };
    println!(
        "engine    requests x1 {one:7.1} tok/s | x8 {x8:7.1} tok/s ({:.2}x, {} prefill) | x32 {x32:7.1} tok/s ({:.2}x) | one request n=8 {n8:7.1} tok/s, {} prefill",
        speedup(1, 0),
        last[1].prefills,
        speedup(2, 0),
        last[3].prefills
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let copies = 8 * (long_len + max_tokens) as u64 * model.config.kv_bytes_per_token() as u64;
    println!(
        "engine    {long_len}-token prompt: requests x1 {long_one:7.1} tok/s | x8 {long_x8:7.1} tok/s ({:.2}x, {} prefill) | one request n=8 {long_n8:7.1} tok/s, KV peak {:.1} MiB (eight copies of the prompt: {:.1} MiB)",
        speedup(5, 4),
        last[5].prefills,
        mib(last[6].kv_bytes_peak),
        mib(copies)
    );
    let prefills = again.last().map_or(0, |&(_, p)| p);
    let warm = median(again.into_iter().map(|(t, _)| t).collect());
    println!(
        "engine    {long_len}-token prompt again (kept in the prompt cache): request x1 {warm:7.1} tok/s ({:.2}x the first, {prefills} prefill)",
        warm / long_one
    );
    println!(
        "engine    8 prompts beginning with the {long_len}-token one, 16 tokens each of their own, one request: {shared:7.1} tok/s, {} of their {preambled_tokens} tokens prefilled",
        last[7].prefill_tokens
    );
    Ok(())
}

/// The WebGPU backend on the best adapter found: decode tokens/s for 1 and 8
/// sequences after the same prefill, and the weight bytes those steps read per second
/// as a fraction of the adapter's copy bandwidth (read + write of a 256 MiB copy);
/// then, where the adapter has timestamp queries, where one decode step's time goes,
/// kernel by kernel (medians of `repeat` profiled steps).
#[cfg(feature = "webgpu")]
fn webgpu_bench(
    path: &std::path::Path,
    ids: &[u32],
    steps: usize,
    repeat: usize,
) -> Result<(), CliError> {
    use acs_llama::webgpu::{GpuCache, GpuError, GpuModel, GpuSeqInput, StepProfile};
    let fail = |e: GpuError| CliError::Api(acs_core::ApiError::internal(e.to_string()));
    let file = acs_llama::gguf::GgufFile::open(path)
        .map_err(|e| CliError::Api(acs_core::ApiError::internal(e.to_string())))?;
    let gpu = GpuModel::new(&file).map_err(fail)?;
    let info = gpu.adapter_info();
    let copy = gpu.copy_bandwidth(256 << 20, 5).map_err(fail)?;
    fn inputs<'a>(caches: &'a mut [GpuCache], feed: &'a [Vec<u32>]) -> Vec<GpuSeqInput<'a>> {
        caches
            .iter_mut()
            .zip(feed)
            .map(|(cache, f)| GpuSeqInput {
                cache,
                tokens: f,
                steering: &[],
                capture: &[],
                logits: Logits::Last,
            })
            .collect()
    }
    let next = |feed: &mut [Vec<u32>], out: Vec<acs_llama::model::SeqOutput>| {
        for (f, o) in feed.iter_mut().zip(out) {
            *f = vec![argmax(&o.logits)];
        }
    };
    // `n` sequences that share the prompt's one prefill (as a request's n choices
    // do), decoding `steps` tokens; then `profiled` steps more, each timed kernel by
    // kernel.
    let decode = |n: usize, profiled: usize| -> Result<(f64, Vec<StepProfile>), CliError> {
        // Room for the prompt and every step, as the engine reserves it.
        let room = ids.len() + steps + profiled;
        let mut first = gpu.new_cache();
        first.reserve(room);
        let out = gpu
            .forward(&mut inputs(
                std::slice::from_mut(&mut first),
                &[ids.to_vec()],
            ))
            .map_err(fail)?;
        let mut caches = vec![first];
        for _ in 1..n {
            caches.push(gpu.fork_cache(&caches[0], room).map_err(fail)?);
        }
        let mut feed = vec![vec![argmax(&out[0].logits)]; n];
        let t = Instant::now();
        for _ in 0..steps {
            let out = gpu.forward(&mut inputs(&mut caches, &feed)).map_err(fail)?;
            next(&mut feed, out);
        }
        let tps = (steps * n) as f64 / t.elapsed().as_secs_f64();
        let mut profiles = Vec::new();
        for _ in 0..profiled {
            match gpu.profile(&mut inputs(&mut caches, &feed)) {
                Ok((out, p)) => {
                    next(&mut feed, out);
                    profiles.push(p);
                }
                Err(GpuError::NoTimestamps(_)) => break,
                Err(e) => return Err(fail(e)),
            }
        }
        Ok((tps, profiles))
    };
    let mut d1 = Vec::new();
    let mut d8 = Vec::new();
    let mut profiles = [Vec::new(), Vec::new()];
    let runs = repeat.max(1);
    for r in 0..runs {
        // The last run's profiles are the report's.
        let profiled = if r + 1 == runs { runs } else { 0 };
        let (tps, p) = decode(1, profiled)?;
        d1.push(tps);
        profiles[0] = p;
        let (tps, p) = decode(8, profiled)?;
        d8.push(tps);
        profiles[1] = p;
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
    for (n, tps, p) in [(1, d1, &profiles[0]), (8, d8, &profiles[1])] {
        print_profile(n, n as f64 / tps, p, copy);
    }
    if profiles[0].is_empty() {
        println!("webgpu    no kernel profile: the adapter has no timestamp queries");
    }
    Ok(())
}

/// Where decode steps of `n` sequences spend their time on the device, kernel by
/// kernel (each a median over `profiles`), and the bandwidth each matmul reads its
/// weights at; against `wall`, the seconds an unprofiled step took from the host's
/// side (encoding, submission and the read-back included).
#[cfg(feature = "webgpu")]
fn print_profile(n: usize, wall: f64, profiles: &[acs_llama::webgpu::StepProfile], copy: f64) {
    use acs_llama::webgpu::Kernel;
    use std::collections::BTreeMap;
    let Some(last) = profiles.last() else {
        return;
    };
    // Per kernel: its seconds in each step, its dispatches and weight bytes a step.
    let mut rows: BTreeMap<Kernel, (Vec<f64>, usize, u64)> = BTreeMap::new();
    for (i, p) in profiles.iter().enumerate() {
        for k in &p.kernels {
            let row = rows.entry(k.kernel).or_default();
            row.0.resize(i + 1, 0.0);
            row.0[i] += k.seconds;
            if i + 1 == profiles.len() {
                row.1 += 1;
                row.2 += k.weight_bytes;
            }
        }
    }
    let span = median(profiles.iter().map(|p| p.span).collect());
    let busy = median(
        profiles
            .iter()
            .map(|p| p.kernels.iter().map(|k| k.seconds).sum())
            .collect(),
    );
    println!(
        "webgpu    profile x{n} (device timestamps, a pass per dispatch, median of {}): step {:.3} ms on the device, kernels {:.3} ms ({:.0}%), {} dispatches; {:.3} ms a step from the host",
        profiles.len(),
        span * 1e3,
        busy * 1e3,
        100.0 * busy / span,
        last.kernels.len(),
        wall * 1e3
    );
    let mut rows: Vec<(Kernel, f64, usize, u64)> = rows
        .into_iter()
        .map(|(k, (t, count, bytes))| (k, median(t), count, bytes))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (kernel, t, count, bytes) in rows {
        let mut line = format!(
            "webgpu      {:<26} {count:4} dispatch{} {:9.3} ms {:5.1}%",
            kernel.to_string(),
            if count == 1 { "  " } else { "es" },
            t * 1e3,
            100.0 * t / span
        );
        if bytes > 0 {
            let bw = bytes as f64 / t;
            line += &format!(
                " | weights at {:.2} GB/s = {:.1}% of copy bandwidth",
                bw / 1e9,
                100.0 * bw / copy
            );
        }
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_gives_total_and_stolen_ticks() {
        let line = "cpu  4705 150 1120 16250 520 0 30 2000 0 0";
        assert_eq!(
            parse_cpu_line(line),
            Some(CpuTimes {
                total: 4705 + 150 + 1120 + 16250 + 520 + 30 + 2000,
                steal: 2000
            })
        );
        // A kernel too old to count steal, a per-CPU line, or garbage: nothing.
        assert_eq!(parse_cpu_line("cpu  4705 150 1120 16250 520 0 30"), None);
        assert_eq!(
            parse_cpu_line("cpu0 4705 150 1120 16250 520 0 30 2000"),
            None
        );
        assert_eq!(parse_cpu_line("cpu  a b c d e f g h"), None);
    }
}
