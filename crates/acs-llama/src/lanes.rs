//! Reductions over f32 slices in eight independent lanes (plain arrays the compiler
//! turns into SIMD: SSE, AVX2 where a caller is compiled for it, SIMD128), where one
//! running value would serialise the loop. Shared by the sampler's loops over the
//! vocabulary, attention's softmax and the RMS norms. Inlined always, so that a caller
//! compiled for a wider instruction set gets them in its vectors.

/// Lanes of the partial results.
pub(crate) const LANES: usize = 8;

/// The largest value, ignoring NaN; negative infinity for none.
#[inline(always)]
pub(crate) fn max_of(v: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &x) in m.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    m.iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// The sum.
#[inline(always)]
pub(crate) fn sum_of(v: &[f32]) -> f32 {
    sum_map(v, |x| x)
}

/// `Σ f(v[i])`.
#[inline(always)]
pub(crate) fn sum_map(v: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut s = [0.0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (s, &x) in s.iter_mut().zip(c) {
            *s += f(x);
        }
    }
    s.iter().copied().chain(rest.iter().map(|&x| f(x))).sum()
}
