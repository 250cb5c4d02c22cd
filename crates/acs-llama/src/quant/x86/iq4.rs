//! The IQ4_NL and IQ4_XS kernels: each block's 4-bit indices looked up in the
//! 16-value table by one byte shuffle, then multiplied against the activations as
//! signed bytes (the sign moved onto the activations, since `vpmaddubsw` takes one
//! operand unsigned); one row against up to four vectors (`k_quants.rs` dispatches
//! them over a matrix's rows).

use std::arch::x86_64::*;

use super::*;
use crate::cpu::x86::{Avx2Token, hsum_ps};
use crate::quant::format::blocks;
use crate::quant::formats::{BlockIq4Nl, BlockIq4Xs, IQ4_VALUES};

/// The table in both 128-bit halves, for `vpshufb`.
#[inline]
#[target_feature(enable = "avx2")]
fn table() -> __m256i {
    let t = IQ4_VALUES.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load16(&t))
}

/// A block's 32 values (low nibbles of `qs` first) from the table.
#[inline]
#[target_feature(enable = "avx2")]
fn values(table: __m256i, qs: &[u8]) -> __m256i {
    _mm256_shuffle_epi8(table, unpack_nibbles(load16(qs)))
}

/// Σ w·x over 32 signed bytes each, as 8 i32 partial sums. No pair of products
/// saturates the 16-bit step: |w| and |x| are at most 127.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_signed(w: __m256i, x: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// An IQ4_NL row against `V` vectors.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_nl<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let t = table();
    let mut acc = [_mm256_setzero_ps(); V];
    for (i, b) in blocks::<BlockIq4Nl>(row).iter().enumerate() {
        let w = values(t, &b.qs);
        let d = h2f(b.d);
        for (acc, x) in acc.iter_mut().zip(x) {
            let p = _mm256_cvtepi32_ps(dot_signed(w, load_x(&x[i])));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x[i].d), p, *acc);
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]))
}

/// An IQ4_XS row against `V` vectors.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
    let t = table();
    let mut acc = [_mm256_setzero_ps(); V];
    for (i, b) in blocks::<BlockIq4Xs>(row).iter().enumerate() {
        let d = h2f(b.d);
        for j in 0..8 {
            let w = values(t, &b.qs[16 * j..]);
            let ds = d * b.scale(j) as f32;
            for (acc, x) in acc.iter_mut().zip(x) {
                let xb = &x[8 * i + j];
                let p = _mm256_cvtepi32_ps(dot_signed(w, load_x(xb)));
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(ds * xb.d), p, *acc);
            }
        }
    }
    std::array::from_fn(|v| hsum_ps(acc[v]))
}

safe_entry!(dot_iq4_nl => iq4_nl);
safe_entry!(dot_iq4_xs => iq4_xs);
