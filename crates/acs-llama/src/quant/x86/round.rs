//! Activations rounded to 8-bit blocks with AVX2, bit for bit as the portable code
//! rounds them.

use std::arch::x86_64::*;

use crate::cpu::x86::{Avx2Token, hsum_epi32, lanes, load8f};
use crate::quant::QK;
use crate::quant::activations::{BlockQ8, block_q8};

/// Rounds 32 activations to 8 bits, ties to even, exactly as the scalar code does.
pub(crate) fn quantize_block(_t: Avx2Token, v: &[f32; QK]) -> BlockQ8 {
    // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2, FMA
    // and F16C; `quantize_block_impl` reads `v` and writes its own arrays only.
    unsafe { quantize_block_impl(v) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_block_impl(v: &[f32; QK]) -> BlockQ8 {
    let d = block_amax(v) / 127.0;
    round_block(v, d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// One vector's values rounded into `dst` (the last block zero-padded), exactly
/// as [`quantize_block`] rounds each block. Eight blocks' scales and their
/// inverses come from one vector division each, where two scalar divisions per
/// block (and a call per block) would dominate the rounding of a batch's inputs.
pub(crate) fn quantize_vector(_t: Avx2Token, x: &[f32], dst: &mut [BlockQ8]) {
    // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2, FMA
    // and F16C; the function reads `x` and writes `dst` through bounds-checked
    // slicing only.
    unsafe { quantize_vector_impl(x, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_vector_impl(x: &[f32], dst: &mut [BlockQ8]) {
    let whole = x.len() / QK * QK;
    let mut out = dst.iter_mut();
    for group in x[..whole].chunks(8 * QK) {
        let mut amax = [0f32; 8];
        for (a, v) in amax.iter_mut().zip(group.chunks_exact(QK)) {
            *a = block_amax(v.try_into().expect("whole blocks"));
        }
        let d = _mm256_div_ps(load8f(&amax), _mm256_set1_ps(127.0));
        let inv = _mm256_div_ps(_mm256_set1_ps(1.0), d);
        let id = _mm256_and_ps(inv, _mm256_cmp_ps::<_CMP_GT_OQ>(d, _mm256_setzero_ps()));
        let (d, id) = (lanes(d), lanes(id));
        for (k, v) in group.chunks_exact(QK).enumerate() {
            let v: &[f32; QK] = v.try_into().expect("whole blocks");
            *out.next().expect("a block per 32 values") = round_block(v, d[k], id[k]);
        }
    }
    let rest = &x[whole..];
    if !rest.is_empty() {
        let mut v = [0f32; QK];
        v[..rest.len()].copy_from_slice(rest);
        *out.next().expect("a block for the last values") = quantize_block_impl(&v);
    }
}

/// The largest magnitude of a block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_amax(v: &[f32; QK]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let m = (0..4).fold(_mm256_setzero_ps(), |m, k| {
        _mm256_max_ps(m, _mm256_andnot_ps(sign, load8f(&v[8 * k..])))
    });
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// A block rounded with scale `d` (its inverse `id`, 0 where `d` is).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_block(v: &[f32; QK], d: f32, id: f32) -> BlockQ8 {
    let id = _mm256_set1_ps(id);
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(load8f(&v[8 * k..]), id),
        );
        _mm256_cvtps_epi32(r)
    });
    let sums = [
        hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16,
        hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16,
    ];
    // Saturating packs interleave the 128-bit lanes; the permute restores order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut qs = [0i8; QK];
    // SAFETY: `qs` is 32 writable bytes; the store is unaligned.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), p) };
    block_q8(qs, d, sums)
}
