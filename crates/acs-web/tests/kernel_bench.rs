//! The wasm CPU backend's matmul kernels, single-threaded: G multiply-adds per
//! second for one vector and for four, per weight format. A benchmark, so ignored by
//! the test runs; run it with
//! `wasm-pack test --node --release crates/acs-web --test kernel_bench -- --include-ignored`.
#![cfg(target_arch = "wasm32")]

use acs_llama::quant::{GgmlType, MatJob, QuantizedActivations, matmul_many, quantize_row};
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

/// `rows` copies of one quantized row of `cols` values.
fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).expect("whole blocks");
    let row: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let mut out = vec![0u8; rb * rows];
    for b in out.chunks_exact_mut(rb) {
        quantize_row(ty, &row, b).expect("a supported format");
    }
    out
}

#[wasm_bindgen_test]
#[ignore]
fn matmul_throughput() {
    // The default model's shapes for the 32-wide formats; the K-quants need rows of
    // whole 256-value super-blocks.
    let shapes = [
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q8_0, 1536, 576),
        (GgmlType::Q4_K, 1536, 768),
        (GgmlType::Q5_K, 1536, 768),
        (GgmlType::Q6_K, 1536, 768),
    ];
    for (ty, rows, cols) in shapes {
        let weights = matrix(ty, rows, cols);
        for batch in [1usize, 4] {
            let xs: Vec<f32> = (0..batch * cols)
                .map(|i| ((i % cols + i / cols) % 7) as f32 - 3.0)
                .collect();
            let mut out = vec![0f32; rows * batch];
            let mut scratch = QuantizedActivations::default();
            let macs = rows * cols * batch;
            let iters = (100_000_000 / macs).max(1);
            let mut best = 0f64;
            for _ in 0..3 {
                let t = js_sys::Date::now();
                for _ in 0..iters {
                    let mut job = [MatJob {
                        ty,
                        weights: &weights,
                        packed: None,
                        n_rows: rows,
                        out: &mut out,
                    }];
                    matmul_many(&mut job, cols, &xs, &mut scratch).expect("valid shapes");
                }
                let secs = (js_sys::Date::now() - t) / 1000.0;
                best = best.max((macs * iters) as f64 / secs / 1e9);
            }
            console_log!("{ty:?} {rows} x {cols}, {batch} vector(s): {best:.2} G MAC/s");
        }
    }
}
