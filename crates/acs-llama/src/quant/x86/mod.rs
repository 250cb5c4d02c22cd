//! The x86-64 kernels of the block formats, named by their operands: `tile` (Q4_0, Q4_1
//! and Q8_0 rows against groups of vectors), `k_quants` (Q4_K, Q5_K, Q6_K), `packed`
//! and `packed_512` (the repacked panels of [`PackedMatrix`](super::PackedMatrix) in
//! 256- and 512-bit registers) and `round` (activations to 8 bits).
//!
//! Each weight block's 4-, 5-, 6- or 8-bit values are widened to bytes in registers and
//! multiplied against the activation bytes, with `vpdpbusd` (u8 × i8, four products
//! summed into each i32) where the CPU has it, else `vpmaddubsw` + `vpmaddwd`; then
//! scaled in f32 per block. Offsets and mins use the activation block sums.

use std::arch::x86_64::*;

use super::QK;
use super::activations::BlockQ8;
use super::format::Half;
use super::formats::BlockQ4_1;
use crate::cpu::x86::{load16, load32};

pub(crate) mod k_quants;
pub(crate) mod packed;
mod packed_512;
pub(crate) mod round;
pub(crate) mod tile;

#[inline(always)]
pub(super) fn load_x(x: &BlockQ8) -> __m256i {
    // SAFETY: `qs` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(x.qs.as_ptr().cast()) }
}

/// Σ u8 × i8 over 32 lanes, as 8 i32 partial sums.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mul_sum_us8(ax: __m256i, sy: __m256i) -> __m256i {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_madd_epi16(dot, _mm256_set1_epi16(1))
}

/// [`mul_sum_us8`] in one instruction.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
pub(super) fn mul_sum_us8_vnni(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy)
}

/// `acc +` [`mul_sum_us8`]`(ax, sy)` in one instruction, accumulating in place
/// (the integer sums are exact, so the order of additions does not change a
/// result).
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
pub(super) fn add_mul_sum_us8_vnni(acc: __m256i, ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, ax, sy)
}

/// The 32 nibbles of 16 bytes, low nibbles in the first 16 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_nibbles(q: __m128i) -> __m256i {
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

/// A half float, converted by the F16C unit.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) fn h2f(h: Half) -> f32 {
    let bits = u16::from_le_bytes(h.0);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// A Q4_1 block's scale and min (side by side in the block), converted together and
/// each broadcast to all lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn h2f_pair(b: &BlockQ4_1) -> (__m256, __m256) {
    let bits = i32::from_le_bytes([b.d.0[0], b.d.0[1], b.m.0[0], b.m.0[1]]);
    let both = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    (
        _mm256_broadcastss_ps(both),
        _mm256_broadcastss_ps(_mm_movehdup_ps(both)),
    )
}

/// The activations side of a tile: `V` consecutive vectors of `nb` blocks and the
/// regrouped sums of their group, whose lane `lane` is the first vector's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Xs<'a> {
    pub(crate) blocks: &'a [BlockQ8],
    pub(crate) sums: &'a [f32],
    pub(crate) lane: usize,
    pub(crate) nb: usize,
}

const _: () = assert!(QK == 32);
