//! The 256-bit kernels of K-quant [`PackedMatrix`](crate::quant::packed::PackedMatrix)
//! panels (Q2_K to Q6_K; eight rows, one per 32-bit lane): super-blocks of eight
//! blocks, each block's scales from the rows' 6-bit or 4-bit bytes.

use std::arch::x86_64::*;

use super::panel_steps::{
    broadcast4, half_sums_pair, maddubs_pair, nibble_group, nibble_sums, prefetch_share,
    prefetch_stride, q4_1_step_plain, q4_1_step_vnni, q4_1_widen_plain, q4_1_widen_vnni,
    q5_step_plain, step_done, unpack_panel, unpacked_group,
};
use super::*;
use crate::cpu::x86::lanes;

/// The K-quant panels' loop over a panel (`$panel`, super-blocks of `$bytes`, each
/// beginning with its rows' f16 `d`) against the calling kernel's `V` vectors
/// (`$x`): for each of a super-block's eight blocks `$j` (block `$i` of the
/// vectors), `$body` sees the super-block's bytes `$b` and `$d` and adds to the
/// vectors' accumulators `$acc`, whose lanes are the result. Each super-block asks
/// for its share of `$ahead`. A macro, so that each kernel inlines its own.
macro_rules! super_blocks {
    ($panel:expr, $ahead:expr, $x:expr, $bytes:expr,
     |$b:ident, $d:ident, $j:ident, $i:ident, $acc:ident| $body:block) => {{
        let (panel, ahead, x, bytes): (&[u8], &[u8], Xs<'_>, usize) = ($panel, $ahead, $x, $bytes);
        let share = prefetch_stride(ahead, x.nb / 8);
        let mut $acc = [_mm256_setzero_ps(); V];
        for sb in 0..x.nb / 8 {
            let $b = &panel[bytes * sb..bytes * sb + bytes];
            prefetch_share(ahead, sb, share);
            let $d = _mm256_cvtph_ps(load16($b));
            for $j in 0..8 {
                let $i = 8 * sb + $j;
                $body
            }
        }
        std::array::from_fn(|v| lanes($acc[v]))
    }};
}

/// Eight rows' 6-bit scales (or mins) of one sub-block, stored as bytes, as floats.
#[inline]
#[target_feature(enable = "avx2")]
fn bytes8_ps(b: &[u8]) -> __m256 {
    let v = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
}

/// Q4_K (and Q5_K) panels of a `PackedMatrix` against `V` vectors: per
/// super-block, its sub-blocks run the Q4_1 (Q5_1) panels' loop (`$step`,
/// `$widen`), with each sub-block's scale `d·sc` and min `dmin·m` made from the
/// rows' f16 `d`, `dmin` and 6-bit bytes. Every (row, vector) pair sees the same
/// operations in the same order whatever `V`. Where `unpacked:` names one, a
/// second kernel takes each block's values unpacked already (`values`, see
/// [`unpack_q5_k_panel`]) in place of the panel's bits: the same bytes, so the same
/// sums.
macro_rules! packed_k4_kernel {
    ($name:ident, $features:tt, $step:ident, $widen:ident, q5: $q5:literal) => {
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            packed_k4_kernel!(@body $step, $widen, $q5, panel, ahead, None, x)
        }
    };
    ($name:ident, $features:tt, $step:ident, $widen:ident, q5: $q5:literal,
     unpacked: $unpacked:ident) => {
        packed_k4_kernel!($name, $features, $step, $widen, q5: $q5);
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) fn $unpacked<const V: usize>(panel: &[u8], values: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            packed_k4_kernel!(@body $step, $widen, $q5, panel, &[], Some(values), x)
        }
    };
    (@body $step:ident, $widen:ident, $q5:literal, $panel:expr, $ahead:expr, $values:expr,
     $x:expr) => {{
        let (panel, ahead, values, x): (&[u8], &[u8], Option<&[u8]>, Xs<'_>) =
            ($panel, $ahead, $values, $x);
        // A sub-block's bytes, and a super-block's (`PackedMatrix` has the layout).
        let sub = if $q5 { 160 } else { 128 };
        super_blocks!(panel, ahead, x, 160 + 8 * sub, |b, d, j, i, acc| {
            let dmin = _mm256_cvtph_ps(load16(&b[16..]));
            let sc = _mm256_mul_ps(d, bytes8_ps(&b[32 + 8 * j..]));
            let mn = _mm256_mul_ps(dmin, bytes8_ps(&b[96 + 8 * j..]));
            let q = &b[160 + sub * j..160 + sub * (j + 1)];
            // Unpacked values carry their fifth bits; the panel's are read here.
            let (high, u) = match values {
                Some(u) => (None, Some(&u[256 * i..256 * i + 256])),
                None => ($q5.then(|| load32(&q[128..])), None),
            };
            let sums = nibble_sums!($step, q, high, u, x, i);
            for (v, (acc, &s)) in acc.iter_mut().zip(&sums).enumerate() {
                let xb = &x.blocks[v * x.nb + i];
                let p = _mm256_cvtepi32_ps($widen(s));
                *acc = _mm256_fmadd_ps(p, _mm256_mul_ps(sc, _mm256_set1_ps(xb.d)), *acc);
                *acc = _mm256_fnmadd_ps(mn, _mm256_set1_ps(xb.s), *acc);
            }
        })
    }};
}
packed_k4_kernel!(
    packed_q4_k_vnni,
    "avx2,fma,f16c,avxvnni",
    q4_1_step_vnni,
    q4_1_widen_vnni,
    q5: false
);
packed_k4_kernel!(
    packed_q4_k_plain,
    "avx2,fma,f16c",
    q4_1_step_plain,
    q4_1_widen_plain,
    q5: false
);
packed_k4_kernel!(
    packed_q5_k_vnni,
    "avx2,fma,f16c,avxvnni",
    q4_1_step_vnni,
    q4_1_widen_vnni,
    q5: true
);
packed_k4_kernel!(
    packed_q5_k_plain,
    "avx2,fma,f16c",
    q5_step_plain,
    q4_1_widen_vnni,
    q5: true,
    unpacked: unpacked_q5_k_plain
);

/// An 8-row Q5_K panel's values (`nb` blocks), unpacked once for the many tiles of
/// a long batch, as [`unpack_q6_k_panel`] does Q6_K's: for each block, the groups
/// of [`nibble_group`] with their fifth bits, the low halves' four then the high
/// halves', 256 bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_q5_k_panel(panel: &[u8], ahead: &[u8], nb: usize, out: &mut Vec<u8>) {
    unpack_panel(ahead, nb, out, |i, g| {
        let q = &panel[1440 * (i / 8) + 160 + 160 * (i % 8)..][..160];
        nibble_group(q, Some(load32(&q[128..])), g)
    });
}

/// `s +` Σ u8 × i8 of four values of at most 3 bits per lane without VNNI, in 16
/// bits: a half-block's four steps reach 4 × 2 × 7 × 127, well inside them, and one
/// `vpmaddwd` ([`q4_1_widen_plain`]) widens the half's sums.
#[inline]
#[target_feature(enable = "avx2")]
fn small_step_plain(s: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi16(s, _mm256_maddubs_epi16(w, x))
}

/// Group `f` of half `h` of a Q2_K or Q3_K block's values (`q`: for each half,
/// four bytes a row, values `16h + 4f + e` at bits `2f` of byte `e`; with Q3_K's
/// third bits where `third` has them, bit `4h + f` of byte `e`), a byte each: the
/// two low bits, and the third at bit 2.
#[inline]
#[target_feature(enable = "avx2")]
fn two_bit_group(q: &[u8], third: Option<__m256i>, h: usize, f: usize) -> __m256i {
    let shift = |n: usize| _mm_cvtsi32_si128(n as i32);
    let wg = load32(&q[32 * h..]);
    let w = _mm256_and_si256(_mm256_srl_epi16(wg, shift(2 * f)), _mm256_set1_epi8(3));
    match third {
        Some(hw) => {
            // Bit k of each byte to bit 2, in one 16-bit shift: a move of at most
            // seven bits keeps each byte's bit in its byte.
            let k = 4 * h + f;
            let moved = if k >= 2 {
                _mm256_srl_epi16(hw, shift(k - 2))
            } else {
                _mm256_sll_epi16(hw, shift(2 - k))
            };
            _mm256_or_si256(w, _mm256_and_si256(moved, _mm256_set1_epi8(4)))
        }
        None => w,
    }
}

/// One block of a Q2_K or Q3_K panel ([`two_bit_group`]'s `$q` and `$third`, or
/// where `$values` is `Some`, the same groups unpacked already: the low halves'
/// four then the high halves', 256 bytes) against block `$i` of the calling
/// kernel's `V` vectors (`$x`), summed by `$step` into one sum per half and vector.
/// A macro, so that each kernel inlines its own.
macro_rules! two_bit_halves {
    ($step:ident, $q:expr, $third:expr, $values:expr, $x:expr, $i:expr) => {{
        let (q, third, values, x, i): (&[u8], Option<__m256i>, Option<&[u8]>, Xs<'_>, usize) =
            ($q, $third, $values, $x, $i);
        let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
        let mut halves = [[_mm256_setzero_si256(); V]; 2];
        for (h, sums) in halves.iter_mut().enumerate() {
            for f in 0..4 {
                let w = match values {
                    Some(u) => load32(&u[128 * h + 32 * f..]),
                    None => two_bit_group(q, third, h, f),
                };
                for (s, qs) in sums.iter_mut().zip(xs) {
                    *s = $step(*s, w, broadcast4(qs, 16 * h + 4 * f));
                    *s = step_done::<V>(*s);
                }
            }
        }
        halves
    }};
}

/// An 8-row Q3_K panel's values (`nb` blocks), unpacked once for the many tiles of
/// a long batch, as [`unpack_q6_k_panel`] does Q6_K's: for each block, the groups
/// of [`two_bit_group`] with their third bits, the low halves' four then the high
/// halves', 256 bytes. The shifts that place the third bits are a third of a
/// block's work when each tile of four vectors repeats them. (Q2_K's two bits a
/// value cost less to take from the panel than four times the bytes cost to load.)
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_q3_k_panel(panel: &[u8], ahead: &[u8], nb: usize, out: &mut Vec<u8>) {
    unpack_panel(ahead, nb, out, |i, g| {
        let q = &panel[912 * (i / 8) + 144 + 96 * (i % 8)..][..96];
        let third = Some(load32(&q[64..]));
        (two_bit_group(q, third, 0, g), two_bit_group(q, third, 1, g))
    });
}

/// Q3_K panels of a `PackedMatrix` against `V` vectors: per block of 32 values,
/// two halves of 16 (their scales differ), each four groups of four values a row
/// made from their two low bits and their third, summed (`$step`, `$widen`); the
/// `4 ×` offset of the stored values comes off each half in integers with the
/// activations' half sums, then the halves meet their scales `d·sc` (exact in f32)
/// and their sum the vector's scale, one multiply-add a half and one a block. Every
/// (row, vector) pair sees the same operations in the same order whatever `V`.
macro_rules! packed_q3_k_kernel {
    ($name:ident, $features:tt, $step:ident, $widen:ident) => {
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            packed_q3_k_kernel!(@body $step, $widen, panel, ahead, None, x)
        }
    };
    ($name:ident, $features:tt, $step:ident, $widen:ident, unpacked: $unpacked:ident) => {
        packed_q3_k_kernel!($name, $features, $step, $widen);
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) fn $unpacked<const V: usize>(panel: &[u8], values: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            packed_q3_k_kernel!(@body $step, $widen, panel, &[], Some(values), x)
        }
    };
    (@body $step:ident, $widen:ident, $panel:expr, $ahead:expr, $values:expr, $x:expr) => {{
        let (panel, ahead, values, x): (&[u8], &[u8], Option<&[u8]>, Xs<'_>) =
            ($panel, $ahead, $values, $x);
        super_blocks!(panel, ahead, x, 912, |b, d, j, i, acc| {
            let sc_lo = _mm256_mul_ps(d, sbytes8_ps(&b[16 + 16 * j..]));
            let sc_hi = _mm256_mul_ps(d, sbytes8_ps(&b[24 + 16 * j..]));
            let q = &b[144 + 96 * j..144 + 96 * j + 96];
            // Unpacked values carry their third bits; the panel's are read here.
            let (third, u) = match values {
                Some(u) => (None, Some(&u[256 * i..256 * i + 256])),
                None => (Some(load32(&q[64..])), None),
            };
            let halves = two_bit_halves!($step, q, third, u, x, i);
            for v in 0..V {
                let xb = &x.blocks[v * x.nb + i];
                let half = |h: usize| {
                    let off = _mm256_set1_epi32(4 * i32::from(xb.sums[h]));
                    _mm256_cvtepi32_ps(_mm256_sub_epi32($widen(halves[h][v]), off))
                };
                let total = _mm256_fmadd_ps(half(0), sc_lo, _mm256_mul_ps(half(1), sc_hi));
                acc[v] = _mm256_fmadd_ps(total, _mm256_set1_ps(xb.d), acc[v]);
            }
        })
    }};
}
packed_q3_k_kernel!(
    packed_q3_k_vnni,
    "avx2,fma,f16c,avxvnni",
    q6_step_vnni,
    q4_1_widen_vnni
);
packed_q3_k_kernel!(
    packed_q3_k_plain,
    "avx2,fma,f16c",
    small_step_plain,
    q4_1_widen_plain,
    unpacked: unpacked_q3_k_plain
);

/// `vpshufb` controls that put, in each 32-bit lane `r`, source bytes `[a(r), b(r)]`
/// as two 16-bit words (a control byte with its high bit set writes zero).
const fn word_pairs(a: [u8; 8], b: [u8; 8]) -> [u8; 32] {
    let mut c = [0x80; 32];
    let mut r = 0;
    while r < 8 {
        c[4 * r] = a[r];
        c[4 * r + 2] = b[r];
        r += 1;
    }
    c
}

/// Row `r`'s byte of the low half (`r`) and of the high half (`8 + r`) of a Q2_K
/// block's scale bytes.
const Q2_LOW: [u8; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
const Q2_HIGH: [u8; 8] = [8, 9, 10, 11, 12, 13, 14, 15];

/// Eight rows' Q2_K scales and mins of one block (`b`: the low half's eight bytes,
/// then the high half's; a byte's low nibble is its scale, its high one its min), a
/// row a lane: each half's scale in both 16-bit halves of the lane (as `vpmaddwd`
/// meets a lane's two pair sums), and the row's two mins side by side. Three
/// shuffles of the sixteen bytes, both 128-bit halves of the register holding them.
#[inline]
#[target_feature(enable = "avx2")]
fn q2_k_scales(b: &[u8]) -> (__m256i, __m256i, __m256i) {
    const SC_LO: [u8; 32] = word_pairs(Q2_LOW, Q2_LOW);
    const SC_HI: [u8; 32] = word_pairs(Q2_HIGH, Q2_HIGH);
    const MINS: [u8; 32] = word_pairs(Q2_LOW, Q2_HIGH);
    let bytes = _mm256_broadcastsi128_si256(load16(b));
    let nibble = _mm256_set1_epi8(0xF);
    let scales = |ctl: &[u8; 32]| _mm256_and_si256(_mm256_shuffle_epi8(bytes, load32(ctl)), nibble);
    // A word holding one byte shifts its high nibble down alone.
    let mins = _mm256_srli_epi16(_mm256_shuffle_epi8(bytes, load32(&MINS)), 4);
    (scales(&SC_LO), scales(&SC_HI), mins)
}

/// Q2_K panels of a `PackedMatrix` against `V` vectors: per block of 32 values, two
/// halves of 16 (their scales and mins differ), each four groups of four 2-bit
/// values a row, summed by `$step`. A block then makes two integer totals, the
/// halves' sums times their 4-bit scales and the activations' half sums times the
/// halves' 4-bit mins, and scales them by `d` and `dmin`. Without VNNI (`plain`)
/// the halves' 16-bit sums meet their scales in the `vpmaddwd` that widens them, and
/// one more `vpmaddwd` makes the mins' total; with it, the totals are made in f32,
/// exactly (integers under 2^18): the same totals, so both kernels agree to the
/// bit. Every (row, vector) pair sees the same operations in the same order
/// whatever `V`.
macro_rules! packed_q2_k_kernel {
    ($name:ident, $features:tt, $step:ident, plain: $plain:literal) => {
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) fn $name<const V: usize>(
            panel: &[u8],
            ahead: &[u8],
            x: Xs<'_>,
        ) -> [[f32; 8]; V] {
            super_blocks!(panel, ahead, x, 672, |b, d, j, i, acc| {
                let dmin = _mm256_cvtph_ps(load16(&b[16..]));
                let (sc_lo16, sc_hi16, mn_pair) = q2_k_scales(&b[32 + 16 * j..]);
                let f = _mm256_cvtepi32_ps;
                let q = &b[160 + 64 * j..160 + 64 * j + 64];
                let halves = two_bit_halves!($step, q, None, None, x, i);
                for v in 0..V {
                    let xb = &x.blocks[v * x.nb + i];
                    let (total, mins) = if $plain {
                        let total = _mm256_add_epi32(
                            _mm256_madd_epi16(halves[0][v], sc_lo16),
                            _mm256_madd_epi16(halves[1][v], sc_hi16),
                        );
                        let mins = _mm256_madd_epi16(mn_pair, half_sums_pair(xb));
                        (f(total), f(mins))
                    } else {
                        // The lanes' low words as floats, and their high ones.
                        let low = |w| f(_mm256_blend_epi16::<0xAA>(w, _mm256_setzero_si256()));
                        let high = |w| f(_mm256_srli_epi32::<16>(w));
                        let (h0, h1) = (f(halves[0][v]), f(halves[1][v]));
                        let xsum = |h: usize| _mm256_set1_ps(f32::from(xb.sums[h]));
                        (
                            _mm256_fmadd_ps(h0, low(sc_lo16), _mm256_mul_ps(h1, low(sc_hi16))),
                            _mm256_fmadd_ps(
                                low(mn_pair),
                                xsum(0),
                                _mm256_mul_ps(high(mn_pair), xsum(1)),
                            ),
                        )
                    };
                    let xd = _mm256_set1_ps(xb.d);
                    acc[v] = _mm256_fmadd_ps(total, _mm256_mul_ps(d, xd), acc[v]);
                    acc[v] = _mm256_fnmadd_ps(mins, _mm256_mul_ps(dmin, xd), acc[v]);
                }
            })
        }
    };
}
packed_q2_k_kernel!(packed_q2_k_vnni, "avx2,fma,f16c,avxvnni", q6_step_vnni, plain: false);
packed_q2_k_kernel!(packed_q2_k_plain, "avx2,fma,f16c", small_step_plain, plain: true);

/// Eight rows' signed 8-bit scales (Q6_K's, Q3_K's) of one group of 16 values, a
/// row a lane.
#[inline]
#[target_feature(enable = "avx2")]
fn sbytes8_epi32(b: &[u8]) -> __m256i {
    let v = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(v as i64))
}

/// [`sbytes8_epi32`] as floats.
#[inline]
#[target_feature(enable = "avx2")]
fn sbytes8_ps(b: &[u8]) -> __m256 {
    _mm256_cvtepi32_ps(sbytes8_epi32(b))
}

/// `s +` Σ u8 × i8 of four values per lane, with AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn q6_step_vnni(s: __m256i, w: __m256i, x: __m256i) -> __m256i {
    add_mul_sum_us8_vnni(s, w, x)
}

/// One block's Q6_K groups, unpacked: for each Q4_1 group `g` of the block's bytes
/// `q`, the values it meets in the low half (`.0`) and in the high half (`.1`),
/// each its four low bits with its two high bits added from their own bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn q6_k_group(q: &[u8], g: usize) -> (__m256i, __m256i) {
    let (mask, three) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
    let wg = load32(&q[32 * g..]);
    let hw = load32(&q[128 + 32 * (g / 2)..]);
    let shift = 4 * (g as i32 % 2);
    let high = |shift: i32| {
        let bits = _mm256_and_si256(_mm256_srl_epi16(hw, _mm_cvtsi32_si128(shift)), three);
        _mm256_slli_epi16(bits, 4)
    };
    let wl = _mm256_or_si256(_mm256_and_si256(wg, mask), high(shift));
    let wh = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(wg, 4), mask),
        high(shift + 2),
    );
    (wl, wh)
}

/// Q6_K panels of a `PackedMatrix` against `V` vectors, with AVX-VNNI: per block
/// of 32 values, the Q4_1 panels' groups ([`q6_k_group`]), a sum per half (their
/// scales differ), the `32 ×` offset of the stored values taken off each half in
/// integers with the activations' half sums. The halves then meet their integer
/// scales in f32, exactly (each product is under 2^23, their sum under 2^24), so the
/// block's integer total is what the kernel without VNNI sums in integers, and both
/// scale it by `d` alike. Every (row, vector) pair sees the same operations in the
/// same order whatever `V`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) fn packed_q6_k_vnni<const V: usize>(
    panel: &[u8],
    ahead: &[u8],
    x: Xs<'_>,
) -> [[f32; 8]; V] {
    super_blocks!(panel, ahead, x, 1680, |b, d, j, i, acc| {
        let sc_lo = sbytes8_ps(&b[16 + 16 * j..]);
        let sc_hi = sbytes8_ps(&b[24 + 16 * j..]);
        let q = &b[144 + 192 * j..144 + 192 * j + 192];
        let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
        let mut lo = [_mm256_setzero_si256(); V];
        let mut hi = [_mm256_setzero_si256(); V];
        for g in 0..4 {
            let (wl, wh) = q6_k_group(q, g);
            for v in 0..V {
                lo[v] = q6_step_vnni(lo[v], wl, broadcast4(xs[v], 4 * g));
                hi[v] = q6_step_vnni(hi[v], wh, broadcast4(xs[v], 16 + 4 * g));
                lo[v] = step_done::<V>(lo[v]);
                hi[v] = step_done::<V>(hi[v]);
            }
        }
        for v in 0..V {
            let xb = &x.blocks[v * x.nb + i];
            let off = |k: usize| _mm256_set1_epi32(32 * i32::from(xb.sums[k]));
            let pl = _mm256_cvtepi32_ps(_mm256_sub_epi32(lo[v], off(0)));
            let ph = _mm256_cvtepi32_ps(_mm256_sub_epi32(hi[v], off(1)));
            let total = _mm256_fmadd_ps(pl, sc_lo, _mm256_mul_ps(ph, sc_hi));
            let dx = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
            acc[v] = _mm256_fmadd_ps(total, dx, acc[v]);
        }
    })
}

/// [`packed_q6_k_vnni`] without VNNI: each group's `vpmaddubsw` pair sums (at most
/// 2 × 63 × 127, no saturation) add to the next group's in 16 bits
/// ([`maddubs_pair`]: two groups' 4 × 63 × 127 = 32004 fit), and the two groups'
/// sums meet their half's scale in the `vpmaddwd` that widens them (one for two
/// groups, not one for each: the multiplier ports are what a long batch waits on).
/// So a block keeps one integer sum a vector, scaled already, and the `32 ×` offset
/// comes off it with one more `vpmaddwd` of the two halves' scales and the
/// activations' half sums. The integer total is exact (at most
/// 2 × 16 × 32 × 127 × 128 in size), the one [`packed_q6_k_vnni`] makes. With
/// `UNPACKED`, each block's groups come ready from `values` (see
/// [`unpack_q6_k_panel`]) instead of being unpacked from the panel's bits: the same
/// bytes, so the same sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_plain<const V: usize, const UNPACKED: bool>(
    panel: &[u8],
    ahead: &[u8],
    values: &[u8],
    x: Xs<'_>,
) -> [[f32; 8]; V] {
    // The low 16 bits of each 32-bit lane, twice: a row's scale beside itself.
    let twice = _mm256_setr_epi8(
        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
        13, 12, 13,
    );
    super_blocks!(panel, ahead, x, 1680, |b, d, j, i, acc| {
        let sc_lo = _mm256_shuffle_epi8(sbytes8_epi32(&b[16 + 16 * j..]), twice);
        let sc_hi = _mm256_shuffle_epi8(sbytes8_epi32(&b[24 + 16 * j..]), twice);
        // Each row's two scales side by side, times the 32 of the offsets (at most
        // 128 × 32 in size, inside 16 bits): once a block, not once a vector.
        let sc_pair = _mm256_slli_epi16::<5>(_mm256_blend_epi16::<0xAA>(sc_lo, sc_hi));
        let q = &b[144 + 192 * j..144 + 192 * j + 192];
        let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
        let mut sums = [_mm256_setzero_si256(); V];
        for p in 0..2 {
            let g = 2 * p;
            let ((wl0, wh0), (wl1, wh1)) = if UNPACKED {
                let u = &values[256 * i..256 * i + 256];
                (unpacked_group(u, g), unpacked_group(u, g + 1))
            } else {
                (q6_k_group(q, g), q6_k_group(q, g + 1))
            };
            for v in 0..V {
                let (lo, hi) = (4 * g, 16 + 4 * g);
                let l = maddubs_pair(
                    [wl0, wl1],
                    [broadcast4(xs[v], lo), broadcast4(xs[v], lo + 4)],
                );
                let h = maddubs_pair(
                    [wh0, wh1],
                    [broadcast4(xs[v], hi), broadcast4(xs[v], hi + 4)],
                );
                let scaled =
                    _mm256_add_epi32(_mm256_madd_epi16(l, sc_lo), _mm256_madd_epi16(h, sc_hi));
                sums[v] = _mm256_add_epi32(sums[v], scaled);
                sums[v] = step_done::<V>(sums[v]);
            }
        }
        for v in 0..V {
            let xb = &x.blocks[v * x.nb + i];
            let off = _mm256_madd_epi16(sc_pair, half_sums_pair(xb));
            let total = _mm256_sub_epi32(sums[v], off);
            let dx = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
            acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), dx, acc[v]);
        }
    })
}

/// [`q6_k_plain`] unpacking each block's bits as it goes: one pass over the panel.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn packed_q6_k_plain<const V: usize>(
    panel: &[u8],
    ahead: &[u8],
    x: Xs<'_>,
) -> [[f32; 8]; V] {
    q6_k_plain::<V, false>(panel, ahead, &[], x)
}

/// An 8-row Q6_K panel's values (`nb` blocks), unpacked once for the many tiles of
/// a long batch: for each block, the groups of [`q6_k_group`], the low halves'
/// four then the high halves', 256 bytes. Each tile then loads its weights where
/// it would unpack them (eleven instructions a group, shared by only four
/// vectors), and the registers those took hold sums.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_q6_k_panel(panel: &[u8], ahead: &[u8], nb: usize, out: &mut Vec<u8>) {
    unpack_panel(ahead, nb, out, |i, g| {
        q6_k_group(&panel[1680 * (i / 8) + 144 + 192 * (i % 8)..][..192], g)
    });
}

/// [`q6_k_plain`] on values unpacked by [`unpack_q6_k_panel`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn unpacked_q6_k_plain<const V: usize>(
    panel: &[u8],
    values: &[u8],
    x: Xs<'_>,
) -> [[f32; 8]; V] {
    q6_k_plain::<V, true>(panel, &[], values, x)
}
