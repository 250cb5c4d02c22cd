//! The formats' round trips, the SIMD kernels against the portable ones (bit for bit
//! where they promise it), batches against single vectors, and typed shape errors.

use super::activations::BlockQ8;
use super::*;
use crate::test_values::values;
#[cfg(target_arch = "x86_64")]
use {
    super::activations::{quantize_block_q8, quantize_vector},
    super::packed::PANEL,
    super::runner::dot_q8_dispatch,
    crate::cpu::isa::Isa,
    crate::cpu::x86::Avx2Token,
};

/// The format's portable dot of a row with 8-bit activation blocks.
fn portable_dot(ty: GgmlType, row: &[u8], x: &[BlockQ8]) -> f32 {
    (format::kernels(ty).unwrap().dot_q8)(row, x)
}

/// Writes `v` as a little-endian half float at the start of `b`.
#[cfg(target_arch = "x86_64")]
fn put_f16(b: &mut [u8], v: f32) {
    b[..2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
}

/// Allowed error of the 8-bit-activation dot: rounding 32 activations to 8 bits
/// costs at most half a step (amax/254) each, far below 1% of the norms' product.
fn dot_tolerance(x: &[f32], w: &[f32]) -> f32 {
    let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
    1e-2 * norm(x) * norm(w)
}

#[test]
fn quantize_dequantize_and_dot_every_type() {
    for &ty in GgmlType::SUPPORTED {
        for n in [256usize, 512, 768] {
            let w = values(n as u64 + ty.id() as u64, n);
            let x = values(7 + n as u64, n);
            let mut bytes = vec![0u8; ty.row_bytes(n).unwrap()];
            quantize_row(ty, &w, &mut bytes).unwrap();
            let mut back = vec![0f32; n];
            dequantize_row(ty, &bytes, &mut back).unwrap();
            let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let tol = match ty {
                GgmlType::F32 => 0.0,
                GgmlType::F16 => 1e-3 * amax,
                GgmlType::BF16 => 8e-3 * amax,
                GgmlType::Q8_0 => 0.02 * amax,
                GgmlType::Q6_K => 0.1 * amax,
                _ => 0.25 * amax,
            };
            for (a, b) in w.iter().zip(&back) {
                assert!((a - b).abs() <= tol, "{ty:?}: {a} vs {b}");
            }
            let exact: f32 = back.iter().zip(&x).map(|(a, b)| a * b).sum();
            let d = dot_row(ty, &bytes, &x).unwrap();
            assert!((d - exact).abs() <= 1e-4 * exact.abs().max(1.0), "{ty:?}");
            let qx = quantize_activations(&x);
            let fast = dot_row_q8(ty, &bytes, &qx).unwrap();
            let tol = dot_tolerance(&x, &back);
            assert!((fast - exact).abs() <= tol, "{ty:?}: {fast} vs {exact}");
            let slow = portable_dot(ty, &bytes, &qx.blocks);
            assert!((fast - slow).abs() <= 1e-4 * slow.abs().max(1.0), "{ty:?}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn simd_matches_scalar_on_random_bytes() {
    let Some(t) = Avx2Token::detect() else {
        println!("no AVX2 on this CPU: SIMD kernels not exercised");
        return;
    };
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ] {
        let n = 512;
        let mut bytes: Vec<u8> = values(ty.id() as u64, ty.row_bytes(n).unwrap())
            .iter()
            .map(|v| (v * 127.0) as i8 as u8)
            .collect();
        // Keep the f16 scales finite and small so sums are comparable.
        for b in bytes.chunks_exact_mut(ty.block_bytes()) {
            let at: &[usize] = match ty {
                GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                GgmlType::Q2_K => &[80, 82],
                GgmlType::Q3_K => &[108],
                _ => &[0],
            };
            for &a in at {
                let v = 0.01 + (b[a + 1] & 7) as f32 * 0.003;
                put_f16(&mut b[a..], v);
            }
        }
        let qx = quantize_activations(&values(99, n));
        let s = portable_dot(ty, &bytes, &qx.blocks);
        for t in [t, t.without_vnni()] {
            let v = dot_q8_dispatch(Isa::Avx2(t), ty, &bytes, &qx, 0);
            assert!(
                (s - v).abs() <= 1e-4 * s.abs().max(1.0),
                "{ty:?} {t:?}: {s} vs {v}"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn simd_quantizer_matches_scalar() {
    let Some(t) = Avx2Token::detect() else {
        return;
    };
    // Exact ties (x.5 steps) included: both paths round them to even.
    let mut xs = values(5, 32 * 40);
    xs[..32].copy_from_slice(&std::array::from_fn::<f32, 32, _>(|i| i as f32 * 0.5));
    xs[32..64].fill(0.0);
    for c in xs.chunks_exact(QK) {
        let v: &[f32; QK] = c.try_into().unwrap();
        let (a, b) = (
            quantize_block_q8(Isa::Portable, v),
            quantize_block_q8(Isa::Avx2(t), v),
        );
        assert_eq!(a.qs, b.qs);
        assert_eq!((a.d, a.sums, a.s), (b.d, b.sums, b.s));
    }
    // Whole vectors: groups of eight blocks, a partial group, a partial block.
    for len in [32 * 40, 32 * 13 + 7, 5, 32 * 8] {
        let x = &xs[xs.len() - len..];
        let mut a = vec![BlockQ8::default(); len.div_ceil(QK)];
        let mut b = a.clone();
        quantize_vector(Isa::Portable, x, &mut a);
        quantize_vector(Isa::Avx2(t), x, &mut b);
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.qs, b.qs, "{len} values");
            assert_eq!((a.d, a.sums, a.s), (b.d, b.sums, b.s), "{len} values");
        }
    }
}

#[test]
fn matmul_batches_agree_with_single_rows() {
    for (ty, batch) in [
        (GgmlType::Q4_1, 6),
        (GgmlType::Q4_1, 1),
        (GgmlType::Q4_1, 2),
        (GgmlType::Q4_1, 19),
        (GgmlType::Q4_0, 11),
        (GgmlType::Q8_0, 9),
        (GgmlType::Q8_0, 1),
        (GgmlType::F32, 6),
        (GgmlType::Q6_K, 6),
        (GgmlType::Q6_K, 5),
        (GgmlType::Q4_K, 6),
        (GgmlType::Q5_K, 7),
    ] {
        let (rows, cols) = (37, 256);
        let w = values(1, rows * cols);
        let rb = ty.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rb * rows];
        for (r, b) in w.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
            quantize_row(ty, r, b).unwrap();
        }
        let xs = values(2, cols * batch);
        let mut out = vec![0f32; rows * batch];
        matmul(ty, &bytes, rows, cols, &xs, &mut out).unwrap();
        for b in 0..batch {
            let x = &xs[b * cols..(b + 1) * cols];
            let qx = quantize_activations(x);
            for r in 0..rows {
                let row = &bytes[r * rb..(r + 1) * rb];
                let want = if ty.uses_q8_activations() {
                    dot_row_q8(ty, row, &qx).unwrap()
                } else {
                    dot_row(ty, row, x).unwrap()
                };
                assert_eq!(out[b * rows + r], want, "{ty:?} row {r} batch {b}");
            }
        }
    }
}

#[test]
fn matmul_many_matches_separate_matmuls() {
    let (cols, batch) = (128, 3);
    let xs = values(3, cols * batch);
    let mats: Vec<(GgmlType, usize, Vec<u8>)> = [
        (GgmlType::Q4_1, 70),
        (GgmlType::Q8_0, 9),
        (GgmlType::F16, 5),
    ]
    .into_iter()
    .map(|(ty, rows)| {
        let rb = ty.row_bytes(cols).unwrap();
        let w = values(rows as u64, rows * cols);
        let mut bytes = vec![0u8; rb * rows];
        for (r, b) in w.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
            quantize_row(ty, r, b).unwrap();
        }
        (ty, rows, bytes)
    })
    .collect();
    let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; m.1 * batch]).collect();
    let mut jobs: Vec<MatJob<'_>> = mats
        .iter()
        .zip(&mut outs)
        .map(|((ty, rows, w), out)| MatJob {
            ty: *ty,
            weights: w,
            packed: None,
            n_rows: *rows,
            out,
        })
        .collect();
    let mut scratch = QuantizedActivations::default();
    matmul_many(&mut jobs, cols, &xs, &mut scratch).unwrap();
    for ((ty, rows, w), got) in mats.iter().zip(&outs) {
        let mut want = vec![0f32; rows * batch];
        matmul(*ty, w, *rows, cols, &xs, &mut want).unwrap();
        assert_eq!(got, &want, "{ty:?}");
    }
}

/// The formats that [`PackedMatrix`] repacks.
const PANEL_FORMATS: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
];

/// The AVX-512 kernels take 16-row panels; each lane must run what the 256-bit
/// kernel runs, to the bit, whatever the batch (40 rows: two panels of 16 and one
/// with 8 rows past the matrix); and the kernels without VNNI sum the same
/// integers, so they agree to the bit too.
#[cfg(target_arch = "x86_64")]
#[test]
fn wide_panels_match_narrow_panels_exactly() {
    let Some(t) = Avx2Token::detect() else {
        return;
    };
    for ty in PANEL_FORMATS {
        let (rows, cols) = (40, 256);
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rb * rows];
        for (r, b) in values(3, rows * cols)
            .chunks_exact(cols)
            .zip(w.chunks_exact_mut(rb))
        {
            quantize_row(ty, r, b).unwrap();
        }
        for batch in [1, 3, 8, 11] {
            let mut qx = QuantizedActivations::default();
            qx.quantize_from(&values(4, cols * batch), cols).unwrap();
            qx.hold_flipped();
            let run = |t| {
                let pm = PackedMatrix::pack(Isa::Avx2(t), ty, &w, rows, cols).unwrap();
                let mut out = vec![0f32; rows * batch];
                x86::packed::packed_rows(t, &pm, 0..rows, &qx, &mut |v, r0, lanes| {
                    out[v * rows + r0..][..PANEL].copy_from_slice(lanes);
                });
                out
            };
            let wide = run(t);
            assert_eq!(wide, run(t.without_avx512()), "{ty:?} batch {batch}");
            assert_eq!(wide, run(t.without_vnni()), "{ty:?} batch {batch}");
        }
    }
}

/// A batch longer than one chunk of the AVX-512 kernels' vectors (a prefill) gives
/// each vector what it gets alone, to the bit.
#[cfg(target_arch = "x86_64")]
#[test]
fn batches_past_one_chunk_match_single_vectors_exactly() {
    let Some(t) = Avx2Token::detect() else {
        return;
    };
    let (rows, cols) = (32, 256);
    let nb = cols / QK;
    let chunk = x86::packed::chunk_activation_bytes() / (nb * size_of::<BlockQ8>()) / 8 * 8;
    let batch = chunk + 11;
    let xs = values(21, cols * batch);
    let mut qx = QuantizedActivations::default();
    qx.quantize_from(&xs, cols).unwrap();
    qx.hold_flipped();
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rb * rows];
        for (r, b) in values(22, rows * cols)
            .chunks_exact(cols)
            .zip(w.chunks_exact_mut(rb))
        {
            quantize_row(ty, r, b).unwrap();
        }
        let pm = PackedMatrix::pack(Isa::Avx2(t), ty, &w, rows, cols).unwrap();
        let mut all = vec![0f32; rows * batch];
        x86::packed::packed_rows(t, &pm, 0..rows, &qx, &mut |v, r0, lanes| {
            all[v * rows + r0..][..PANEL].copy_from_slice(lanes);
        });
        for v in [0, chunk - 1, chunk, batch - 1] {
            let mut one = QuantizedActivations::default();
            one.quantize_from(&xs[v * cols..][..cols], cols).unwrap();
            let mut out = vec![0f32; rows];
            x86::packed::packed_rows(t, &pm, 0..rows, &one, &mut |_, r0, lanes| {
                out[r0..][..PANEL].copy_from_slice(lanes);
            });
            assert_eq!(out, all[v * rows..(v + 1) * rows], "{ty:?} vector {v}");
        }
    }
}

/// Every packed kernel this CPU can run (AVX-512, 256-bit with and without VNNI)
/// against the row kernels, on random bytes: large weights and activations of one
/// sign are where 16-bit sums would saturate.
#[cfg(target_arch = "x86_64")]
#[test]
fn packed_kernels_match_row_kernels_on_random_bytes() {
    let Some(t) = Avx2Token::detect() else {
        return;
    };
    let (rows, cols) = (24, 256);
    let mut qx = QuantizedActivations::default();
    // Eleven vectors: the AVX-512 kernels unpack Q3_K, Q5_K and Q6_K panels past eight.
    let xs: Vec<f32> = values(11, cols * 11)
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % 3 == 0 { 127.0 } else { v * 127.0 })
        .collect();
    qx.quantize_from(&xs, cols).unwrap();
    qx.hold_flipped();
    for ty in PANEL_FORMATS {
        let rb = ty.row_bytes(cols).unwrap();
        let mut w: Vec<u8> = values(12 + u64::from(ty.id()), rb * rows)
            .iter()
            .map(|v| (v * 127.0) as i8 as u8)
            .collect();
        // Finite, modest scales (and mins): random f16 bits may be NaN.
        let at: &[usize] = match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            _ => &[0],
        };
        for block in w.chunks_exact_mut(ty.block_bytes()) {
            for &a in at {
                let v = 0.01 + f32::from(block[a + 1] & 7) * 0.003;
                put_f16(&mut block[a..], v);
            }
        }
        let expect: Vec<f32> = (0..qx.count)
            .flat_map(|v| {
                let (w, qx) = (&w, &qx);
                (0..rows)
                    .map(move |r| dot_q8_dispatch(Isa::Portable, ty, &w[r * rb..][..rb], qx, v))
            })
            .collect();
        for k in [t, t.without_avx512(), t.without_vnni()] {
            let pm = PackedMatrix::pack(Isa::Avx2(k), ty, &w, rows, cols).unwrap();
            let mut out = vec![0f32; rows * qx.count];
            x86::packed::packed_rows(k, &pm, 0..rows, &qx, &mut |v, r0, lanes| {
                out[v * rows + r0..][..PANEL].copy_from_slice(lanes);
            });
            for (i, (a, b)) in expect.iter().zip(&out).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                    "{ty:?} {k:?} entry {i}: scalar {a}, packed {b}"
                );
            }
        }
    }
}

#[test]
fn packed_matches_plain_and_batches_exactly() {
    for ty in PANEL_FORMATS {
        packed_case(ty);
    }
}

fn packed_case(ty: GgmlType) {
    let (rows, cols, batch) = (24, 512, 9);
    let rb = ty.row_bytes(cols).unwrap();
    let mut w = vec![0u8; rb * rows];
    for (r, b) in values(8, rows * cols)
        .chunks_exact(cols)
        .zip(w.chunks_exact_mut(rb))
    {
        quantize_row(ty, r, b).unwrap();
    }
    let Some(pm) = PackedMatrix::new(ty, &w, rows, cols) else {
        println!("no packed kernels on this CPU");
        return;
    };
    let xs = values(9, cols * batch);
    let run = |packed: Option<&PackedMatrix>, xs: &[f32]| {
        let mut out = vec![0f32; rows * (xs.len() / cols)];
        let mut job = [MatJob {
            ty,
            weights: &w,
            packed,
            n_rows: rows,
            out: &mut out,
        }];
        matmul_many(&mut job, cols, xs, &mut QuantizedActivations::default()).unwrap();
        out
    };
    let (plain, packed) = (run(None, &xs), run(Some(&pm), &xs));
    for (a, b) in plain.iter().zip(&packed) {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "{ty:?}: {a} vs {b}"
        );
    }
    for (v, x) in xs.chunks_exact(cols).enumerate() {
        assert_eq!(run(Some(&pm), x), packed[v * rows..(v + 1) * rows]);
    }
}

#[test]
fn shape_errors_are_typed() {
    let mut out = [0f32; 2];
    assert!(matches!(
        matmul(GgmlType::Q4_1, &[0; 40], 2, 32, &[0.0; 31], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        matmul(GgmlType::Q4_1, &[0; 39], 2, 32, &[0.0; 32], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert_eq!(
        dot_row(GgmlType::Q8_1, &[0; 36], &[0.0; 32]),
        Err(QuantError::Unsupported(GgmlType::Q8_1))
    );
}
