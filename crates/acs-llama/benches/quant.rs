//! Benchmarks of the CPU kernels: matmul throughput (GB/s of weights read and G MAC/s),
//! a decode step's matmuls, the forward pass on the default model, attention's tasks,
//! and attention's kernels over one long context.
//! `cargo bench -p acs-llama --bench quant` runs them all; name some to run only those:
//! `cargo bench -p acs-llama --bench quant -- decode_step_matmuls attention_tasks`.
//! Native only: the wasm kernels have their own (`crates/acs-web/tests/kernel_bench.rs`).

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    native::main();
}

/// The benchmarks time the native kernels and their thread team; a wasm32 build (the
/// workspace's wasm32 lints compile every target) has nothing to run.
#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::time::Instant;

    use acs_llama::quant::{
        GgmlType, MatJob, PackedMatrix, QuantizedActivations, matmul_many, matmul_q8, quantize_row,
    };

    fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let rb = ty.row_bytes(cols).unwrap();
        let mut out = vec![0u8; rb * rows];
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        let row: Vec<f32> = (0..cols)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect();
        for b in out.chunks_exact_mut(rb) {
            quantize_row(ty, &row, b).unwrap();
        }
        out
    }

    /// The median wall time, in seconds, of `runs` calls of `f`: on a shared machine the
    /// middle run is steadier than any one.
    fn median_secs(runs: usize, mut f: impl FnMut()) -> f64 {
        let mut times: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[runs / 2]
    }

    /// Best GB/s of several timed runs of `iters` matmuls cycling through `mats` (the best
    /// run is the one least disturbed by other processes on a shared machine). `packed`:
    /// through [`PackedMatrix`] panels, as the model runs them (the activations' rounding
    /// included), or `None` where this CPU has no panels for `ty`.
    fn bench(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        batch: usize,
        n_mats: usize,
        packed: bool,
    ) -> Option<f64> {
        let mats: Vec<Vec<u8>> = (0..n_mats)
            .map(|i| weights(ty, rows, cols, i as u32 + 1))
            .collect();
        let panels: Vec<PackedMatrix> = if packed {
            mats.iter()
                .map(|m| PackedMatrix::new(ty, m, rows, cols))
                .collect::<Option<_>>()?
        } else {
            Vec::new()
        };
        let flat: Vec<f32> = (0..batch * cols)
            .map(|i| ((i % cols + i / cols) % 7) as f32 - 3.0)
            .collect();
        let mut xs = QuantizedActivations::default();
        xs.quantize_from(&flat, cols).unwrap();
        let mut out = vec![0f32; rows * batch];
        let mut scratch = QuantizedActivations::default();
        let bytes = mats[0].len() as f64;
        // About 0.2 GB of weights per run, less for big batches (compute-bound).
        let iters = ((2e8 / bytes / batch.min(16) as f64) as usize).max(n_mats);
        let mut rates = Vec::new();
        for _ in 0..5 {
            // In one session, as a forward pass runs its matmuls: outside one, every call
            // would wake the helper threads, and their wake-ups would hide most of what
            // a second thread adds.
            let t = Instant::now();
            acs_llama::session(|| {
                for i in 0..iters {
                    let w = &mats[i % n_mats];
                    if packed {
                        let mut job = [MatJob {
                            ty,
                            weights: w,
                            packed: Some(&panels[i % n_mats]),
                            n_rows: rows,
                            out: &mut out,
                        }];
                        matmul_many(&mut job, cols, &flat, &mut scratch).unwrap();
                    } else {
                        matmul_q8(ty, w, rows, cols, &xs, &mut out).unwrap();
                    }
                }
            });
            rates.push(bytes * iters as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        Some(rates.into_iter().fold(0.0, f64::max))
    }

    pub fn matmul_throughput() {
        // `ACS_BENCH_FORMATS=Q2_K,Q3_K` measures only those formats,
        // `ACS_BENCH_BATCHES=128,512` those batches.
        let only = std::env::var("ACS_BENCH_FORMATS").ok();
        let batches: Vec<usize> = std::env::var("ACS_BENCH_BATCHES").map_or(vec![1, 8, 128], |b| {
            b.split(',')
                .map(|n| n.trim().parse().expect("a batch size"))
                .collect()
        });
        let chosen = |ty: GgmlType| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|f| f.trim() == format!("{ty:?}")))
        };
        for (ty, rows, cols) in [
            (GgmlType::Q4_1, 1536, 576),
            (GgmlType::Q4_1, 576, 1536),
            (GgmlType::Q8_0, 49152, 576),
            (GgmlType::Q4_0, 1536, 576),
            (GgmlType::Q4_K, 1536, 768),
            (GgmlType::Q6_K, 1536, 768),
            // The K formats of a 1B model's matrices: a square one and the FFN's
            // down projection (the widest rows).
            (GgmlType::Q2_K, 2048, 2048),
            (GgmlType::Q3_K, 2048, 2048),
            (GgmlType::Q5_K, 2048, 2048),
            (GgmlType::Q6_K, 2048, 2048),
            (GgmlType::Q3_K, 2048, 8192),
        ]
        .into_iter()
        .filter(|&(ty, ..)| chosen(ty))
        {
            // 1 and 8 (by default): decode steps; 128: a prefill.
            for &batch in &batches {
                for packed in [false, true] {
                    // One matrix (cache-hot) and 64 distinct ones (streamed from DRAM).
                    let n_cold = (64 * 1536 * 576 / (rows * cols)).max(1);
                    let (Some(hot), Some(cold)) = (
                        bench(ty, rows, cols, batch, 1, packed),
                        bench(ty, rows, cols, batch, n_cold, packed),
                    ) else {
                        continue;
                    };
                    // Multiply-adds per second: weights per byte × bytes/s × vectors.
                    let per_byte = cols as f64 / ty.row_bytes(cols).unwrap() as f64;
                    println!(
                        "{ty:?} {rows}x{cols} batch {batch}{}: {hot:.1} GB/s hot, {cold:.1} GB/s cold \
                     ({:.1} / {:.1} G MAC/s)",
                        if packed { " packed" } else { "" },
                        hot * per_byte * batch as f64,
                        cold * per_byte * batch as f64
                    );
                }
            }
        }
    }

    /// The format of [`decode_step_matmuls`]' matrices: the default model's.
    const STEP_TYPE: GgmlType = GgmlType::Q4_1;

    /// A matrix of [`decode_step_matmuls`]: its rows, their packed panels where this CPU
    /// has them, and their count.
    type Matrix = (Vec<u8>, Option<PackedMatrix>, usize);

    /// One matmul job of `m` into `out`.
    fn job<'a>((w, p, rows): &'a Matrix, out: &'a mut [f32]) -> MatJob<'a> {
        MatJob {
            ty: STEP_TYPE,
            weights: w,
            packed: p.as_ref(),
            n_rows: *rows,
            out,
        }
    }

    /// The Q4_1 matmuls of a decode step of the default model's shapes (30 blocks of
    /// queries, keys and values, attention output, gate and up, down: 66 MB of weights),
    /// on random weights, for one and for eight vectors, without the rest of the forward
    /// pass: medians of seven runs of 100 steps. `ACS_BENCH_BLOCKS=1` reuses one block's
    /// matrices for all 30 (cached weights), to tell the arithmetic from the reads.
    pub fn decode_step_matmuls() {
        let (d, kv, ffn) = (576, 192, 1536);
        let distinct: usize = std::env::var("ACS_BENCH_BLOCKS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30);
        let matrix = |rows: usize, cols: usize, seed: u32| -> Matrix {
            let w = weights(STEP_TYPE, rows, cols, seed);
            let p = PackedMatrix::new(STEP_TYPE, &w, rows, cols);
            (w, p, rows)
        };
        // q, k, v, attention output, gate, up, down.
        let shapes = [
            (d, d),
            (kv, d),
            (kv, d),
            (d, d),
            (ffn, d),
            (ffn, d),
            (d, ffn),
        ];
        let blocks: Vec<Vec<Matrix>> = (0..distinct.clamp(1, 30) as u32)
            .map(|b| {
                shapes
                    .iter()
                    .enumerate()
                    .map(|(i, &(rows, cols))| matrix(rows, cols, 7 * b + i as u32 + 1))
                    .collect()
            })
            .collect();
        for batch in [1, 8] {
            let xs_d: Vec<f32> = (0..batch * d)
                .map(|i| (i % 11) as f32 / 5.0 - 1.0)
                .collect();
            let xs_ffn: Vec<f32> = (0..batch * ffn)
                .map(|i| (i % 13) as f32 / 6.0 - 1.0)
                .collect();
            let mut outs: Vec<Vec<f32>> = shapes
                .iter()
                .map(|&(rows, _)| vec![0f32; rows * batch])
                .collect();
            let mut scratch = QuantizedActivations::default();
            let steps = 100;
            let secs = median_secs(7, || {
                acs_llama::session(|| {
                    for _ in 0..steps {
                        for b in 0..30 {
                            let m = &blocks[b % blocks.len()];
                            let mut outs = outs.iter_mut();
                            let mut next = || outs.next().expect("an output per matrix");
                            let mut qkv =
                                [job(&m[0], next()), job(&m[1], next()), job(&m[2], next())];
                            matmul_many(&mut qkv, d, &xs_d, &mut scratch).unwrap();
                            matmul_many(&mut [job(&m[3], next())], d, &xs_d, &mut scratch).unwrap();
                            let mut ffn_in = [job(&m[4], next()), job(&m[5], next())];
                            matmul_many(&mut ffn_in, d, &xs_d, &mut scratch).unwrap();
                            matmul_many(&mut [job(&m[6], next())], ffn, &xs_ffn, &mut scratch)
                                .unwrap();
                        }
                    }
                });
            });
            println!(
                "decode step's Q4_1 matmuls, {} distinct blocks, {batch} vector(s): {:.2} ms (median of 7)",
                blocks.len(),
                secs * 1e3 / steps as f64
            );
        }
    }

    /// Best-of-N wall times of the forward pass on the default model (the best run is the
    /// one least disturbed by other processes on a shared machine): prefill of 128 tokens,
    /// decode steps of one and of eight sequences. Skipped when the model is absent.
    pub fn forward_best_of() {
        use acs_llama::model::{Logits, Model, SeqInput};
        let Some(home) = std::env::var_os("HOME") else {
            return;
        };
        let path =
            std::path::Path::new(&home).join(".cache/acs/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if !path.exists() {
            println!("no model at {}", path.display());
            return;
        }
        let model = Model::open(&path).unwrap();
        let ids: Vec<u32> = (0..128u32).map(|i| 100 + i * 37 % 5000).collect();
        let step = |caches: &mut [acs_llama::model::KvCache], toks: &[u32]| {
            let mut batch: Vec<SeqInput<'_>> = caches
                .iter_mut()
                .map(|cache| SeqInput {
                    cache,
                    tokens: toks,
                    steering: &[],
                    capture: &[],
                    logits: Logits::Last,
                })
                .collect();
            model.forward(&mut batch).unwrap();
        };
        let (mut pre, mut d1, mut d8) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..7 {
            let mut c = [model.new_cache()];
            let t = Instant::now();
            step(&mut c, &ids);
            pre = pre.min(t.elapsed().as_secs_f64());
            let mut eight = vec![c[0].clone(); 8];
            for _ in 0..16 {
                let t = Instant::now();
                step(&mut c, &[42]);
                d1 = d1.min(t.elapsed().as_secs_f64());
                let t = Instant::now();
                step(&mut eight, &[42]);
                d8 = d8.min(t.elapsed().as_secs_f64());
            }
        }
        println!(
            "best of: prefill {:.1} tok/s | decode x1 {:.1} tok/s | decode x8 {:.1} tok/s",
            128.0 / pre,
            1.0 / d1,
            8.0 / d8
        );
    }

    /// Attention's kernels on one core, as a decode step of eight sequences of the default
    /// model runs them: 720 (sequence, layer, key/value head) tasks of three query heads
    /// each, scores, softmax and weighted sum over 40 and 160 cached positions of half
    /// floats (6 and 29 MB: read from the last-level cache or memory, as a step reads a
    /// cache it last touched a step ago). Medians of nine runs.
    pub fn attention_tasks() {
        use acs_llama::cpu::F32Ops;
        let ops = F32Ops::detect();
        let (tasks, group, hd) = (720, 3, 64);
        for n in [40, 160] {
            let caches: Vec<(Vec<half::f16>, Vec<half::f16>)> = (0..tasks)
                .map(|i| {
                    let xs: Vec<f32> = (0..n * hd)
                        .map(|j| ((i * 7 + j) as f32 * 0.01).sin())
                        .collect();
                    let (mut k, mut v) = (Vec::new(), Vec::new());
                    ops.append_halves(&xs, &mut k);
                    ops.append_halves(&xs, &mut v);
                    (k, v)
                })
                .collect();
            let q: Vec<f32> = (0..group * hd).map(|j| (j as f32 * 0.03).cos()).collect();
            let mut out = vec![0f32; group * hd];
            let secs = median_secs(9, || {
                for (k, v) in &caches {
                    let mut scores = vec![0f32; group * n];
                    ops.dots(&q, group, k, hd, &mut scores);
                    for row in scores.chunks_exact_mut(n) {
                        ops.softmax(row, 0.125);
                    }
                    out.fill(0.0);
                    ops.weighted_sum(&scores, group, v, hd, &mut out);
                }
                std::hint::black_box(&out);
            });
            println!(
                "attention, {n} positions, {group} query heads a task: {:.2} us a task (median of 9)",
                secs * 1e6 / tasks as f64
            );
        }
    }

    /// One long context's attention kernels on one core, each call over a key/value
    /// head's whole cache (`n × hd` halves, the same for keys and values), for
    /// SmolLM2's three query heads of 64, Gemma 3's four of 256 and the widths
    /// between: from L2 (128 KiB caches, as a prefill's attention reads them) and
    /// from memory (64 MiB, as a decode's after a long prompt). GB/s of keys or
    /// values read, and the softmax's time a score, medians of nine.
    pub fn long_context_kernels() {
        use acs_llama::cpu::F32Ops;
        let ops = F32Ops::detect();
        for (group, hd, n) in [
            (3, 64, 1024),
            (4, 256, 256),
            (1, 64, 2048),
            (2, 128, 512),
            (2, 128, 65536),
            (3, 64, 1 << 19),
            (2, 128, 1 << 18),
            (4, 256, 1 << 17),
        ] {
            let xs: Vec<f32> = (0..n * hd).map(|j| (j as f32 * 0.013).sin()).collect();
            let mut cache = Vec::new();
            ops.append_halves(&xs, &mut cache);
            let q: Vec<f32> = (0..group * hd).map(|j| (j as f32 * 0.03).cos()).collect();
            let mut scores = vec![0f32; group * n];
            let mut out = vec![0f32; group * hd];
            let passes = ((64 << 20) / (2 * n * hd)).max(1);
            let gb_s = |secs: f64| (2 * n * hd * passes) as f64 / secs / 1e9;
            let dots = gb_s(median_secs(9, || {
                for _ in 0..passes {
                    ops.dots(&q, group, &cache, hd, &mut scores);
                }
            }));
            let softmax_ns = median_secs(9, || {
                for _ in 0..passes {
                    for row in scores.chunks_exact_mut(n) {
                        ops.softmax(row, 0.125);
                    }
                }
            }) * 1e9
                / (group * n * passes) as f64;
            let sums = gb_s(median_secs(9, || {
                for _ in 0..passes {
                    ops.weighted_sum(&scores, group, &cache, hd, &mut out);
                    std::hint::black_box(&mut out);
                }
            }));
            println!(
                "{group} query heads of {hd}, {n} positions: scores {dots:.1} GB/s, \
                 softmax {softmax_ns:.2} ns a score, weighted sums {sums:.1} GB/s"
            );
        }
    }

    /// Each benchmark by the name that selects it.
    const BENCHES: [(&str, fn()); 5] = [
        ("matmul_throughput", matmul_throughput),
        ("decode_step_matmuls", decode_step_matmuls),
        ("forward_best_of", forward_best_of),
        ("attention_tasks", attention_tasks),
        ("long_context_kernels", long_context_kernels),
    ];

    /// Runs the benchmarks named on the command line, or all of them. Flags are skipped:
    /// `cargo bench` passes `--bench` to every bench target.
    pub fn main() {
        let names: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        if let Some(bad) = names.iter().find(|n| !BENCHES.iter().any(|(b, _)| b == n)) {
            let known: Vec<&str> = BENCHES.iter().map(|(b, _)| *b).collect();
            eprintln!("no benchmark {bad:?}; the benchmarks: {}", known.join(", "));
            std::process::exit(2);
        }
        for (name, bench) in BENCHES {
            if names.is_empty() || names.iter().any(|n| n == name) {
                println!("== {name}");
                bench();
            }
        }
    }
}
