//! The f32 kernels against the portable code and the definitions.

use super::*;
#[cfg(target_arch = "x86_64")]
use crate::cpu::x86::Avx2Token;
#[cfg(target_arch = "x86_64")]
use crate::test_values::values;

/// The lane-wise softmax against the textbook one (libm's exp, a running sum), on
/// lengths around the lane count, and the same result from both instruction sets.
#[test]
fn softmax_matches_the_definition() {
    for n in [1, 2, 7, 8, 9, 15, 16, 17, 100, 1000] {
        let scores: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.9)
            .collect();
        let scale = 0.125;
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let e: Vec<f64> = scores
            .iter()
            .map(|&x| (f64::from(x * scale) - f64::from(max * scale)).exp())
            .collect();
        let sum: f64 = e.iter().sum();
        let mut got = scores.clone();
        F32Ops::detect().softmax(&mut got, scale);
        let mut portable = scores.clone();
        F32Ops(Isa::Portable).softmax(&mut portable, scale);
        assert_eq!(got, portable, "n = {n}: instruction sets differ");
        for (g, e) in got.iter().zip(&e) {
            assert!(
                (f64::from(*g) - e / sum).abs() < 1e-6,
                "n = {n}: {g} vs {}",
                e / sum
            );
        }
        let total: f32 = got.iter().sum();
        assert!((total - 1.0).abs() < 1e-5, "n = {n}: sums to {total}");
    }
}

/// KV cache values: the nearest half (ties to even), ±65504 past the finite range,
/// the same bits from F16C as from the portable conversion (lengths that leave
/// remainders past the eight-wide loop).
#[test]
fn cache_halves_round_to_nearest_and_saturate() {
    let cases = [
        (1.0f32, 0x3c00u16),
        (-2.0, 0xc000),
        (65504.0, 0x7bff),
        (65519.0, 0x7bff),
        (1e9, 0x7bff),
        (f32::INFINITY, 0x7bff),
        (f32::NEG_INFINITY, 0xfbff),
        // 1 + 2^-11 lies halfway between 1 and the next half: ties to even (1).
        (1.000_488_3, 0x3c00),
        // 1 + 3·2^-11 lies halfway between two odd/even neighbours: up to even.
        (1.001_464_8, 0x3c02),
        // The smallest subnormal half, and half of it (a tie, to even: zero).
        (5.960_464_5e-8, 0x0001),
        (2.980_232_2e-8, 0x0000),
    ];
    assert_eq!(HALF_MAX, f16::MAX.to_f32());
    for (x, bits) in cases {
        assert_eq!(to_half(x).to_bits(), bits, "{x:e}");
    }
    for n in [1, 7, 8, 9, 64, 67] {
        let xs: Vec<f32> = (0..n)
            .map(|i| match i % 5 {
                0 => i as f32 * 1.37e-6,
                1 => -(i as f32) * 1013.7,
                2 => 7e4 * i as f32,
                3 => (i as f32).sin() / 3.0,
                _ => -6.1e-5 / (i as f32 + 1.0),
            })
            .collect();
        let mut got = vec![f16::ONE];
        F32Ops::detect().append_halves(&xs, &mut got);
        let mut portable = vec![f16::ONE];
        F32Ops(Isa::Portable).append_halves(&xs, &mut portable);
        assert_eq!(got, portable, "n = {n}: instruction sets differ");
        assert_eq!(got.len(), n + 1, "appended after what was there");
        for (x, h) in xs.iter().zip(&got[1..]) {
            let back = h.to_f32();
            // Half a unit in the last place: 2^-11 relative, 2^-25 among subnormals.
            let ulp_half = (x.abs().min(65504.0) / 2048.0).max(2.0f32.powi(-25));
            assert!(
                (back - x.clamp(-65504.0, 65504.0)).abs() <= ulp_half,
                "{x:e} stored as {back:e}"
            );
        }
    }
}

/// Attention over a cache of halves, for 1 to 5 query heads per key/value head and
/// heads of several widths:
/// both instruction sets, against f64 sums of the same (already rounded) values;
/// each head's result the same bits as that head's alone, and the scores and
/// weighted sums of a cache in two parts the same bits as of one.
#[test]
fn dots_and_weighted_sums_read_halves() {
    // Llama's heads of 64 and the other families' (96, 128, 256), and one of 40.
    // 45 positions: a 256-wide head's weighted sums run in two blocks of positions,
    // each pass of the first asking for the second's values; 300: every width's run
    // in three blocks or more.
    for (hd, n) in [64, 40, 96, 128, 256]
        .into_iter()
        .flat_map(|hd| [(hd, 45), (hd, 300)])
    {
        let xs: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.11).sin() * 3.0).collect();
        let mut cache = Vec::new();
        F32Ops(Isa::Portable).append_halves(&xs, &mut cache);
        for heads in 1..=5 {
            let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.37).cos()).collect();
            let w: Vec<f32> = (0..heads * n).map(|i| 1.0 / (i as f32 + 2.0)).collect();
            for ops in [F32Ops::detect(), F32Ops(Isa::Portable)] {
                let mut scores = vec![0f32; heads * n];
                ops.dots(&q, heads, &cache, hd, &mut scores);
                let mut out = vec![0f32; heads * hd];
                ops.weighted_sum(&w, heads, &cache, hd, &mut out);
                // The positions in two parts, summed by two calls: the same bits.
                for split in [1, 5, n - 1] {
                    let part = |range: std::ops::Range<usize>| -> Vec<f32> {
                        (0..heads)
                            .flat_map(|h| w[h * n + range.start..h * n + range.end].to_vec())
                            .collect()
                    };
                    let mut parts = vec![0f32; heads * hd];
                    let (early, late) = cache.split_at(split * hd);
                    ops.weighted_sum(&part(0..split), heads, early, hd, &mut parts);
                    ops.weighted_sum(&part(split..n), heads, late, hd, &mut parts);
                    assert_eq!(parts, out, "{heads} heads, split at {split}");
                    // And the scores of the two parts are the whole's, whichever
                    // positions a kernel reduces together.
                    let mut early_scores = vec![0f32; heads * split];
                    let mut late_scores = vec![0f32; heads * (n - split)];
                    ops.dots(&q, heads, early, hd, &mut early_scores);
                    ops.dots(&q, heads, late, hd, &mut late_scores);
                    for h in 0..heads {
                        let joined = [
                            &early_scores[h * split..(h + 1) * split],
                            &late_scores[h * (n - split)..(h + 1) * (n - split)],
                        ]
                        .concat();
                        assert_eq!(joined, scores[h * n..(h + 1) * n], "split at {split}");
                    }
                }
                for h in 0..heads {
                    let mut alone = vec![0f32; n];
                    ops.dots(&q[h * hd..(h + 1) * hd], 1, &cache, hd, &mut alone);
                    assert_eq!(alone, scores[h * n..(h + 1) * n], "{heads} heads, head {h}");
                    let mut alone = vec![0f32; hd];
                    ops.weighted_sum(&w[h * n..(h + 1) * n], 1, &cache, hd, &mut alone);
                    assert_eq!(alone, out[h * hd..(h + 1) * hd], "{heads} heads, head {h}");
                    for t in 0..n {
                        let want: f64 = (0..hd)
                            .map(|e| {
                                f64::from(q[h * hd + e]) * f64::from(cache[t * hd + e].to_f32())
                            })
                            .sum();
                        assert!(
                            (f64::from(scores[h * n + t]) - want).abs() < 1e-4,
                            "{h} {t}"
                        );
                    }
                    for e in 0..hd {
                        let want: f64 = (0..n)
                            .map(|t| {
                                f64::from(w[h * n + t]) * f64::from(cache[t * hd + e].to_f32())
                            })
                            .sum();
                        assert!((f64::from(out[h * hd + e]) - want).abs() < 1e-4, "{h} {e}");
                    }
                }
            }
        }
    }
}

/// The AVX-512 attention kernels give the 256-bit ones' bits (the scores of hot
/// keys too), for heads of every width they take (64, 96, 128 and 256 values), 1 to
/// 5 query heads and position counts around their groups of eight keys (and, for the
/// wider heads, past one block of the weighted sums' positions), with positions
/// further apart than one head and a nonzero output to add to.
#[cfg(target_arch = "x86_64")]
#[test]
fn wide_attention_matches_narrow_attention_exactly() {
    let Some(t) = Avx2Token::detect() else {
        return;
    };
    let (wide, narrow) = (F32Ops(Isa::Avx2(t)), F32Ops(Isa::Avx2(t.without_avx512())));
    let shapes = [64, 96, 128, 256]
        .into_iter()
        .flat_map(|hd| [(hd, hd), (hd, hd + 16)]);
    for (hd, stride) in shapes {
        for n in [1, 7, 8, 9, 16, 23, 40, 70] {
            let mut cache = Vec::new();
            F32Ops(Isa::Portable).append_halves(&values(21, n * stride), &mut cache);
            for heads in 1..=5 {
                let q = values(22 + heads as u64, heads * hd);
                let w = values(23, heads * n);
                let run = |ops: F32Ops| {
                    let mut scores = vec![0f32; heads * n];
                    ops.dots(&q, heads, &cache, stride, &mut scores);
                    let mut hot = vec![0f32; heads * n];
                    ops.dots_hot(&q, heads, &cache, stride, &mut hot);
                    assert_eq!(hot, scores, "heads of {hd}: hot keys' scores");
                    let mut out = values(24, heads * hd);
                    ops.weighted_sum(&w, heads, &cache, stride, &mut out);
                    (scores, out)
                };
                assert_eq!(
                    run(wide),
                    run(narrow),
                    "heads of {hd}, stride {stride}, {n} keys, {heads} heads"
                );
            }
        }
    }
}

/// SwiGLU and GeGLU give the same bits on every instruction set (AVX-512's
/// sixteen-float copy, AVX2's eight, the portable loop), on lengths around both
/// vector widths and values past the range where `exp` saturates.
#[cfg(target_arch = "x86_64")]
#[test]
fn gated_activations_agree_on_every_instruction_set() {
    let Some(t) = Avx2Token::detect() else {
        return;
    };
    let isas = [Isa::Avx2(t), Isa::Avx2(t.without_avx512()), Isa::Portable];
    for n in [1, 7, 8, 15, 16, 17, 33, 100] {
        let mut gate = values(31, n);
        gate.iter_mut().step_by(3).for_each(|g| *g *= 200.0);
        let up = values(32, n);
        let run = |isa: Isa, f: fn(F32Ops, &mut [f32], &[f32])| {
            let mut g = gate.clone();
            f(F32Ops(isa), &mut g, &up);
            g.into_iter().map(f32::to_bits).collect::<Vec<_>>()
        };
        for (name, f) in [
            ("swiglu", F32Ops::swiglu as fn(F32Ops, &mut [f32], &[f32])),
            ("geglu", F32Ops::geglu),
        ] {
            let want = run(Isa::Portable, f);
            for isa in isas {
                assert_eq!(run(isa, f), want, "{name} of {n} values on {isa:?}");
            }
        }
    }
}
