//! What the 256-bit panel kernels ([`packed`](super::packed) and
//! [`packed_k`](super::packed_k)) share: activations four at a time in every lane,
//! the steps that sum a group of a panel's values against them, the nibble groups
//! of the Q4_1 family's layout, a panel's values unpacked once for a long batch, and
//! the prefetch of the next panel.

use std::arch::x86_64::*;

use super::*;

/// Activations `at..at + 4` of a block in every 32-bit lane: the four values each
/// row's lane multiplies in one `vpdpbusd` of a packed panel.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn broadcast4(qs: &[i8; QK], at: usize) -> __m256i {
    let b = |k: usize| qs[at + k] as u8;
    _mm256_set1_epi32(i32::from_le_bytes([b(0), b(1), b(2), b(3)]))
}

/// Marks where a vector's running sum is complete for one step, so that a block's
/// steps run in the order the kernel writes them: a group's values against every
/// vector of the tile, then the next group's, each group's values live only while
/// its vectors use them. Left to itself, the compiler runs one vector's steps over
/// all of a block's groups first and so keeps every group's values live at once:
/// more registers than the 256-bit kernels have, spilled to the stack on every
/// block. A tile of one vector (`V`, the calling kernel's) has no such choice and
/// is left to the compiler.
#[inline]
#[target_feature(enable = "avx")]
pub(super) fn step_done<const V: usize>(mut s: __m256i) -> __m256i {
    if V == 1 {
        return s;
    }
    // SAFETY: the assembly is an empty comment. It names `s`'s register as read and
    // written and leaves it as it is; it touches no memory, no stack and no flags
    // (the options say so), so it has no effect on the program's state. As an
    // `asm!` block without `pure`, it keeps its place among the others, and each
    // waits for the step that makes its sum.
    unsafe {
        std::arch::asm!(
            "/* {0} */",
            inout(ymm_reg) s,
            options(nomem, nostack, preserves_flags)
        );
    }
    s
}

/// An activation block's two half sums as the two 16-bit words of every 32-bit
/// lane: what `vpmaddwd` meets a row's pair of half scales (or mins) with.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn half_sums_pair(xb: &BlockQ8) -> __m256i {
    let [s0, s1] = xb.sums.map(|s| i32::from(s as u16));
    _mm256_set1_epi32(s0 | s1 << 16)
}

/// Two neighbouring groups of four weight bytes per row (`w`: the first group's low
/// nibbles and high ones, then the second's) against the activations each meets
/// (`x`, in the same order), added to a vector's integer sums, with AVX-VNNI:
/// `vpdpbusd` widens to 32 bits as it adds.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
pub(super) fn q4_1_step_vnni(s: __m256i, w: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
    let s = add_mul_sum_us8_vnni(add_mul_sum_us8_vnni(s, w[0], x[0]), w[1], x[1]);
    add_mul_sum_us8_vnni(add_mul_sum_us8_vnni(s, w[2], x[2]), w[3], x[3])
}

/// A block's sums from [`q4_1_step_vnni`] are 32-bit already.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q4_1_widen_vnni(s: __m256i) -> __m256i {
    s
}

/// [`q4_1_step_vnni`] without VNNI. A `vpmaddubsw` pair sum of nibbles and
/// activations is at most 2 × 15 × 127 = 3810 in size, so a block's eight of them
/// (at most 30480) add up exactly in 16 bits, and one `vpmaddwd`
/// ([`q4_1_widen_plain`]) widens them: half the multiplier-port instructions of
/// widening each step. The integer sums are exact either way, so both give the
/// same sums.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q4_1_step_plain(s: __m256i, w: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
    _mm256_add_epi16(s, pair_sums(w, x))
}

/// The four `vpmaddubsw` of a step without VNNI, added in 16 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn pair_sums(w: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
    _mm256_add_epi16(
        maddubs_pair([w[0], w[1]], [x[0], x[1]]),
        maddubs_pair([w[2], w[3]], [x[2], x[3]]),
    )
}

/// Two `vpmaddubsw` (u8 weights × i8 activations, pair sums per 16-bit word) added
/// in 16 bits; each caller's bound on its values keeps the sum inside them.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn maddubs_pair(w: [__m256i; 2], x: [__m256i; 2]) -> __m256i {
    _mm256_add_epi16(
        _mm256_maddubs_epi16(w[0], x[0]),
        _mm256_maddubs_epi16(w[1], x[1]),
    )
}

/// Widens a block's 16-bit sums from [`q4_1_step_plain`] to 32 bits.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q4_1_widen_plain(s: __m256i) -> __m256i {
    _mm256_madd_epi16(s, _mm256_set1_epi16(1))
}

/// Group `g` of one block of a panel's nibbles (`q`: four groups of four bytes a row,
/// low nibbles values `4g..`, high ones `16 + 4g..`; with Q5's fifth bits where
/// `high` has them): the values it meets in the block's low half and in its high
/// half.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nibble_group(q: &[u8], high: Option<__m256i>, g: usize) -> (__m256i, __m256i) {
    let mask = _mm256_set1_epi8(0xF);
    let wg = load32(&q[32 * g..]);
    let mut wl = _mm256_and_si256(wg, mask);
    let mut wh = _mm256_and_si256(_mm256_srli_epi16(wg, 4), mask);
    if let Some(h) = high {
        wl = _mm256_or_si256(wl, fifth_bit(h, 2 * g as i32));
        wh = _mm256_or_si256(wh, fifth_bit(h, 2 * g as i32 + 1));
    }
    (wl, wh)
}

/// One block of a panel's nibbles ([`nibble_group`]'s `$q` and `$high`, or where
/// `$values` is `Some`, the same groups unpacked already: the low halves' four then
/// the high halves', 256 bytes) against block `$i` of the calling kernel's `V`
/// vectors (`$x`), summed by `$step`: the Q4_1, Q5_1, Q4_K and Q5_K panels' inner
/// loop. A macro, so that each kernel inlines its own.
macro_rules! nibble_sums {
    ($step:ident, $q:expr, $high:expr, $values:expr, $x:expr, $i:expr) => {{
        let (q, high, values, x, i): (&[u8], Option<__m256i>, Option<&[u8]>, Xs<'_>, usize) =
            ($q, $high, $values, $x, $i);
        let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
        let mut sums = [_mm256_setzero_si256(); V];
        // Groups two at a time: a step without VNNI then widens its sums half as
        // often.
        for p in 0..2 {
            let g = 2 * p;
            let ((wl0, wh0), (wl1, wh1)) = match values {
                Some(u) => (unpacked_group(u, g), unpacked_group(u, g + 1)),
                None => (nibble_group(q, high, g), nibble_group(q, high, g + 1)),
            };
            for (s, qs) in sums.iter_mut().zip(xs) {
                let x = [
                    broadcast4(qs, 4 * g),
                    broadcast4(qs, 16 + 4 * g),
                    broadcast4(qs, 4 * g + 4),
                    broadcast4(qs, 20 + 4 * g),
                ];
                *s = $step(*s, [wl0, wh0, wl1, wh1], x);
                *s = step_done::<V>(*s);
            }
        }
        sums
    }};
}
pub(super) use nibble_sums;

/// Bit `shift` of each byte of a Q5 panel's fifth-bit words, as 16 (the value it adds)
/// or 0.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fifth_bit(h: __m256i, shift: i32) -> __m256i {
    let bit = _mm256_and_si256(
        _mm256_srl_epi16(h, _mm_cvtsi32_si128(shift)),
        _mm256_set1_epi8(1),
    );
    _mm256_slli_epi16(bit, 4)
}

/// [`q4_1_step_plain`] for 5-bit values, widened at once: a group's pair sums reach
/// 2 × 2 × 31 × 127, so a step's two groups (31496) fit in 16 bits and a block's
/// four would not.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q5_step_plain(s: __m256i, w: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
    _mm256_add_epi32(s, _mm256_madd_epi16(pair_sums(w, x), _mm256_set1_epi16(1)))
}

/// Bytes of `ahead` to ask for per block of a kernel's `nb`: whole cache lines,
/// computed once per call so that the blocks' loop divides nothing.
#[inline]
pub(super) fn prefetch_stride(ahead: &[u8], nb: usize) -> usize {
    ahead.len().div_ceil(nb.max(1)).next_multiple_of(64)
}

/// Asks for share `i` (`share` bytes, from [`prefetch_stride`]) of `ahead` (the
/// next panel of the 256-bit kernels) to come into the cache. At eight vectors a core
/// needs weights about as fast as one core streams them from DRAM, and with the
/// hardware prefetcher alone the loads and the arithmetic take turns (a cold panel
/// costs the sum of the two); spread over the blocks, these requests keep the memory
/// busy while the kernel computes.
#[inline]
#[target_feature(enable = "sse")]
pub(super) fn prefetch_share(ahead: &[u8], i: usize, share: usize) {
    let start = (i * share).min(ahead.len());
    let end = (start + share).min(ahead.len());
    for at in (start..end).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead[at..].as_ptr().cast());
    }
}

/// Group `g` of a block unpacked by [`unpack_panel`] (`u`, its 256 bytes): the
/// values it meets in the block's low half and in its high half.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpacked_group(u: &[u8], g: usize) -> (__m256i, __m256i) {
    (load32(&u[32 * g..]), load32(&u[128 + 32 * g..]))
}

/// Fills `out` with `nb` blocks of 256 bytes: block `i`'s group `g` (of four) from
/// `group(i, g)`, its low half's values at `32g`, its high half's at `128 + 32g`
/// (where [`unpacked_group`] reads them); the next panel (`ahead`) is asked for as
/// the super-blocks go.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_panel(
    ahead: &[u8],
    nb: usize,
    out: &mut Vec<u8>,
    group: impl Fn(usize, usize) -> (__m256i, __m256i),
) {
    out.clear();
    out.resize(256 * nb, 0);
    let share = prefetch_stride(ahead, nb / 8);
    for (i, o) in out.chunks_exact_mut(256).enumerate() {
        if i % 8 == 0 {
            prefetch_share(ahead, i / 8, share);
        }
        let o: &mut [u8; 256] = o.try_into().expect("256 bytes");
        for g in 0..4 {
            let (wl, wh) = group(i, g);
            // SAFETY: `o` is 256 writable bytes, so both 32-byte unaligned stores
            // (at 32g and 128 + 32g, g < 4) lie inside it.
            unsafe {
                _mm256_storeu_si256(o[32 * g..].as_mut_ptr().cast(), wl);
                _mm256_storeu_si256(o[128 + 32 * g..].as_mut_ptr().cast(), wh);
            }
        }
    }
}
