//! The x86-64 kernels of the block formats, named by their operands: `tile` (Q4_0, Q4_1,
//! Q5_0, Q5_1 and Q8_0 rows against groups of vectors), `k_quants` (Q2_K to Q6_K), `iq4`
//! (IQ4_NL, IQ4_XS), `packed`, `packed_k` and `packed_512` (the repacked panels of
//! [`PackedMatrix`](super::PackedMatrix) in 256- and 512-bit registers: the Q4_1
//! family's, Q8_0's and the dispatcher; the K-quants'; both widths' in 512 bits), with
//! `panel_steps` what the 256-bit ones share, and `round` (activations to 8 bits).
//!
//! Each weight block's 4-, 5-, 6- or 8-bit values are widened to bytes in registers and
//! multiplied against the activation bytes, with `vpdpbusd` (u8 × i8, four products
//! summed into each i32) where the CPU has it, else `vpmaddubsw` + `vpmaddwd`; then
//! scaled in f32 per block. Offsets and mins use the activation block sums.

use std::arch::x86_64::*;

use super::QK;
use super::activations::BlockQ8;
use super::format::Half;
use super::formats::{BlockQ4_1, BlockQ5_1};
use crate::cpu::x86::{load16, load32};

/// `$name(token, row, x)`: the safe entry of kernel `$imp` on one row against one
/// vector, its features proven by the token.
macro_rules! safe_entry {
    ($name:ident => $imp:ident) => {
        #[inline]
        pub(crate) fn $name(_t: Avx2Token, row: &[u8], x: &[BlockQ8]) -> f32 {
            // SAFETY: an `Avx2Token` exists only after runtime detection found
            // AVX2, FMA and F16C, the features `$imp` is compiled for; `$imp`
            // reads `row` and `x` only through bounds-checked slicing.
            unsafe { $imp::<1>(row, [x])[0] }
        }
    };
}

pub(crate) mod iq4;
pub(crate) mod k_quants;
pub(crate) mod packed;
mod packed_512;
mod packed_k;
mod panel_steps;
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

/// The fifth bits of a Q5 block (bit `i` of the little-endian `qh` is value `i`'s) as
/// 16 in the bytes whose bit is set, 0 elsewhere: byte `i` of a broadcast picks the
/// byte of `qh` that holds bit `i`, and an OR with every bit but that one's makes the
/// byte all ones exactly when the bit is set.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fifth_bits(qh: [u8; 4]) -> __m256i {
    let which_byte = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), which_byte);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// A half float, converted by the F16C unit.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) fn h2f(h: Half) -> f32 {
    let bits = u16::from_le_bytes(h.0);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// A block whose scale and min lie side by side at its start.
pub(super) trait ScaleMin {
    /// The scale and the min.
    fn scale_min(&self) -> (Half, Half);
}

impl ScaleMin for BlockQ4_1 {
    #[inline(always)]
    fn scale_min(&self) -> (Half, Half) {
        (self.d, self.m)
    }
}

impl ScaleMin for BlockQ5_1 {
    #[inline(always)]
    fn scale_min(&self) -> (Half, Half) {
        (self.d, self.m)
    }
}

/// A block's scale and min, converted together (one 32-bit load: they are side by
/// side) and each broadcast to all lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn h2f_pair(b: &impl ScaleMin) -> (__m256, __m256) {
    let (d, m) = b.scale_min();
    let bits = i32::from_le_bytes([d.0[0], d.0[1], m.0[0], m.0[1]]);
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
    /// The blocks with their values flipped to unsigned bytes, where the kernel
    /// reads them (a prefill's unpacked Q3_K and Q6_K panels), else empty.
    pub(crate) flipped: &'a [BlockQ8],
}

const _: () = assert!(QK == 32);
