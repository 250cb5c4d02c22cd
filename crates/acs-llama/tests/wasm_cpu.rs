//! The CPU backend's wasm SIMD128 kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
//! IQ4_XS and the K-quants Q2_K to Q6_K against 8-bit activations) against the portable f32 dot product, and
//! batched against single, in headless Chromium.
//!
//! Run: `wasm-pack test --headless --chrome crates/acs-llama --test wasm_cpu`.
#![cfg(target_arch = "wasm32")]

use acs_llama::quant::{
    GgmlType, QuantizedActivations, dot_row, dot_row_q8, matmul_q8, quantize_activations,
    quantize_row,
};
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

/// The formats of super-blocks of 256 values.
const BLOCKS_OF_256: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// Deterministic values in [-1, 1).
fn values(seed: u32, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// `x` rounded as the activations of a block-format matmul are: blocks of 32, each to
/// `d * round(x / d)` with `d = max|x| / 127`, ties to even.
fn rounded(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            b.iter()
                .map(move |v| d * (v * inv).round_ties_even().clamp(-127.0, 127.0))
        })
        .collect()
}

/// The super-block formats' SIMD dots against the f32 dot of the same weights with
/// the activations rounded as the kernels see them: only float summation order separates
/// the two (a value off by one in any sub-block would not pass).
#[wasm_bindgen_test]
fn super_block_dots_equal_the_rounded_f32_dot() {
    for ty in BLOCKS_OF_256 {
        for (seed, n) in [(11, 256), (12, 512), (13, 1536)] {
            let w = values(seed, n);
            let x = values(seed + 100, n);
            let mut row = vec![0u8; ty.row_bytes(n).unwrap()];
            quantize_row(ty, &w, &mut row).unwrap();
            let xr = rounded(&x);
            let exact = dot_row(ty, &row, &xr).unwrap();
            let fast = dot_row_q8(ty, &row, &quantize_activations(&x)).unwrap();
            let scale: f32 = w.iter().zip(&xr).map(|(a, b)| (a * b).abs()).sum();
            assert!(
                (exact - fast).abs() <= 1e-5 * scale,
                "{ty:?} n={n}: {exact} vs {fast}"
            );
        }
    }
}

#[wasm_bindgen_test]
fn simd_dots_agree_with_the_f32_dot() {
    let blocks_of_32 = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ];
    for ty in blocks_of_32.into_iter().chain(BLOCKS_OF_256) {
        for (seed, n) in [(1, 32), (2, 256), (3, 576), (4, 1536), (5, 512)] {
            if n % ty.block_size() != 0 {
                continue;
            }
            let w = values(seed, n);
            let x = values(seed + 100, n);
            let mut row = vec![0u8; ty.row_bytes(n).unwrap()];
            quantize_row(ty, &w, &mut row).unwrap();
            let exact = dot_row(ty, &row, &x).unwrap();
            let fast = dot_row_q8(ty, &row, &quantize_activations(&x)).unwrap();
            // Only the activations' rounding to 8 bits separates the two.
            let scale: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            assert!(
                (exact - fast).abs() <= 0.01 * scale,
                "{ty:?} n={n}: {exact} vs {fast}"
            );
        }
    }
}

/// A matmul takes up to four vectors per pass over a weight row; every vector's
/// result must be what its dot alone gives, to the bit, for batches that leave
/// every remainder.
#[wasm_bindgen_test]
fn batched_rows_equal_single_dots() {
    let rows = 7;
    let formats = [
        (GgmlType::Q8_0, 96),
        (GgmlType::Q4_0, 96),
        (GgmlType::Q4_1, 96),
        (GgmlType::Q5_0, 96),
        (GgmlType::Q5_1, 96),
        (GgmlType::IQ4_NL, 96),
        (GgmlType::IQ4_XS, 512),
        (GgmlType::Q2_K, 512),
        (GgmlType::Q3_K, 512),
        (GgmlType::Q4_K, 512),
        (GgmlType::Q5_K, 512),
        (GgmlType::Q6_K, 512),
    ];
    for (ty, cols) in formats {
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rb * rows];
        for (r, b) in values(5, rows * cols)
            .chunks_exact(cols)
            .zip(w.chunks_exact_mut(rb))
        {
            quantize_row(ty, r, b).unwrap();
        }
        for batch in 1..=9 {
            let xs = values(6 + batch as u32, cols * batch);
            let mut qx = QuantizedActivations::default();
            qx.quantize_from(&xs, cols).unwrap();
            let mut out = vec![0f32; rows * batch];
            matmul_q8(ty, &w, rows, cols, &qx, &mut out).unwrap();
            for (v, x) in xs.chunks_exact(cols).enumerate() {
                let one = quantize_activations(x);
                for r in 0..rows {
                    let alone = dot_row_q8(ty, &w[r * rb..(r + 1) * rb], &one).unwrap();
                    assert_eq!(
                        out[v * rows + r],
                        alone,
                        "{ty:?} batch {batch} vector {v} row {r}"
                    );
                }
            }
        }
    }
}
