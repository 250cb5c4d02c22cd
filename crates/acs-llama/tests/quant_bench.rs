//! Matmul throughput, in GB/s of weights read. Ignored by default; run with
//! `cargo test --release -p acs-llama --test quant_bench -- --ignored --nocapture`.

use std::time::Instant;

use acs_llama::quant::{GgmlType, matmul_q8, quantize_activations, quantize_row};

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

/// Median GB/s over several timed runs of `iters` matmuls cycling through `mats`.
fn bench(ty: GgmlType, rows: usize, cols: usize, batch: usize, n_mats: usize) -> f64 {
    let mats: Vec<Vec<u8>> = (0..n_mats)
        .map(|i| weights(ty, rows, cols, i as u32 + 1))
        .collect();
    let xs: Vec<_> = (0..batch)
        .map(|b| {
            quantize_activations(
                &(0..cols)
                    .map(|i| ((i + b) % 7) as f32 - 3.0)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let mut out = vec![0f32; rows * batch];
    let bytes = mats[0].len() as f64;
    let iters = ((2e8 / bytes) as usize).max(n_mats);
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..iters {
            matmul_q8(ty, &mats[i % n_mats], rows, cols, &xs, &mut out).unwrap();
        }
        rates.push(bytes * iters as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    rates[2]
}

#[test]
#[ignore = "benchmark"]
fn matmul_throughput() {
    for (ty, rows, cols) in [
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 49152, 576),
        (GgmlType::Q4_0, 1536, 576),
        (GgmlType::Q4_K, 1536, 768),
        (GgmlType::Q6_K, 1536, 768),
    ] {
        for batch in [1, 8] {
            // One matrix (cache-hot) and 64 distinct ones (streamed from DRAM).
            let hot = bench(ty, rows, cols, batch, 1);
            let n_cold = (64 * 1536 * 576 / (rows * cols)).max(1);
            let cold = bench(ty, rows, cols, batch, n_cold);
            println!(
                "{ty:?} {rows}x{cols} batch {batch}: {hot:.1} GB/s hot, {cold:.1} GB/s cold \
                 ({:.1} / {:.1} G weight-rows·vectors/s)",
                hot * batch as f64,
                cold * batch as f64
            );
        }
    }
}
