//! The 256-bit kernels of [`PackedMatrix`] panels (eight rows, one per 32-bit lane)
//! and the dispatcher of both panel widths.

use std::arch::x86_64::*;

use super::packed_512::packed_512;
use super::*;
use crate::cpu::x86::{Avx2Token, lanes};
use crate::quant::GgmlType;
use crate::quant::activations::QuantizedActivations;
use crate::quant::packed::{PANEL, PackedMatrix};

/// Activations `at..at + 4` of a block in every 32-bit lane: the four values each
/// row's lane multiplies in one `vpdpbusd` of a packed panel.
#[inline]
#[target_feature(enable = "avx2")]
fn broadcast4(qs: &[i8; QK], at: usize) -> __m256i {
    let b = |k: usize| qs[at + k] as u8;
    _mm256_set1_epi32(i32::from_le_bytes([b(0), b(1), b(2), b(3)]))
}

/// One group of four weight bytes per row (`wl`: low nibbles, `wh`: high ones)
/// against the activations they meet, added to a vector's integer sums, with
/// AVX-VNNI: `vpdpbusd` widens to 32 bits as it adds.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn q4_1_step_vnni(s: __m256i, wl: __m256i, wh: __m256i, xl: __m256i, xh: __m256i) -> __m256i {
    add_mul_sum_us8_vnni(add_mul_sum_us8_vnni(s, wl, xl), wh, xh)
}

/// A block's sums from [`q4_1_step_vnni`] are 32-bit already.
#[inline]
#[target_feature(enable = "avx2")]
fn q4_1_widen_vnni(s: __m256i) -> __m256i {
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
fn q4_1_step_plain(s: __m256i, wl: __m256i, wh: __m256i, xl: __m256i, xh: __m256i) -> __m256i {
    let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(wl, xl), _mm256_maddubs_epi16(wh, xh));
    _mm256_add_epi16(s, pairs)
}

/// Widens a block's 16-bit sums from [`q4_1_step_plain`] to 32 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn q4_1_widen_plain(s: __m256i) -> __m256i {
    _mm256_madd_epi16(s, _mm256_set1_epi16(1))
}

/// Group `g` of one block of a panel's nibbles (`q`: four groups of four bytes a row,
/// low nibbles values `4g..`, high ones `16 + 4g..`; with Q5's fifth bits where
/// `high` has them): the values it meets in the block's low half and in its high
/// half.
#[inline]
#[target_feature(enable = "avx2")]
fn nibble_group(q: &[u8], high: Option<__m256i>, g: usize) -> (__m256i, __m256i) {
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
        for g in 0..4 {
            let (wl, wh) = match values {
                Some(u) => unpacked_group(u, g),
                None => nibble_group(q, high, g),
            };
            for (s, qs) in sums.iter_mut().zip(xs) {
                *s = $step(*s, wl, wh, broadcast4(qs, 4 * g), broadcast4(qs, 16 + 4 * g));
            }
        }
        sums
    }};
}

/// Bit `shift` of each byte of a Q5 panel's fifth-bit words, as 16 (the value it adds)
/// or 0.
#[inline]
#[target_feature(enable = "avx2")]
fn fifth_bit(h: __m256i, shift: i32) -> __m256i {
    let bit = _mm256_and_si256(
        _mm256_srl_epi16(h, _mm_cvtsi32_si128(shift)),
        _mm256_set1_epi8(1),
    );
    _mm256_slli_epi16(bit, 4)
}

/// [`q4_1_step_plain`] for 5-bit values, widened at once: a group's pair sums reach
/// 2 × 2 × 31 × 127, and four groups of them would overflow 16 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_step_plain(s: __m256i, wl: __m256i, wh: __m256i, xl: __m256i, xh: __m256i) -> __m256i {
    let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(wl, xl), _mm256_maddubs_epi16(wh, xh));
    _mm256_add_epi32(s, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Q4_1 panels of a [`PackedMatrix`] against `V` vectors (Q5_1's where `q5`; Q4_0's
/// and Q5_0's, which store no mins, where `offset` is their `m = −offset·d`),
/// compiled once per way of summing a block (`$step`, `$widen`): each lane of the
/// accumulators is one of the panel's eight rows. One accumulator per vector takes
/// both a block's scaled sum and its mins term: two per vector left four vectors
/// short of the 16 AVX2 registers (20 spills per block; 6 now). Every (row, vector)
/// pair sees the same operations in the same order whatever `V`, so batched and
/// single results agree exactly; and a made min is exact (−8d and −16d), so Q4_0
/// gives what Q4_1 with those mins would give.
macro_rules! packed_q4_1_kernel {
    ($name:ident, $features:tt, $step:ident, $widen:ident, q5: $q5:literal,
     offset: $offset:expr) => {
        #[inline]
        #[target_feature(enable = $features)]
        fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            let offset: Option<f32> = $offset;
            // Where the nibbles start, and a block's bytes (`PackedMatrix` has them).
            let nibbles = if offset.is_some() { 16 } else { 32 };
            let bytes = nibbles + if $q5 { 160 } else { 128 };
            let share = prefetch_stride(ahead, x.nb);
            let mut acc = [_mm256_setzero_ps(); V];
            for i in 0..x.nb {
                let b = &panel[bytes * i..bytes * i + bytes];
                prefetch_share(ahead, i, share);
                let high = if $q5 {
                    Some(load32(&b[nibbles + 128..]))
                } else {
                    None
                };
                let sums = nibble_sums!($step, &b[nibbles..], high, None, x, i);
                let d = _mm256_cvtph_ps(load16(b));
                let m = match offset {
                    Some(o) => _mm256_mul_ps(d, _mm256_set1_ps(-o)),
                    None => _mm256_cvtph_ps(load16(&b[16..])),
                };
                for (v, (acc, &s)) in acc.iter_mut().zip(&sums).enumerate() {
                    let xb = &x.blocks[v * x.nb + i];
                    let p = _mm256_cvtepi32_ps($widen(s));
                    *acc = _mm256_fmadd_ps(p, _mm256_mul_ps(d, _mm256_set1_ps(xb.d)), *acc);
                    *acc = _mm256_fmadd_ps(m, _mm256_set1_ps(xb.s), *acc);
                }
            }
            std::array::from_fn(|v| lanes(acc[v]))
        }
    };
}
packed_q4_1_kernel!(packed_q4_1_vnni, "avx2,fma,f16c,avxvnni", q4_1_step_vnni,
    q4_1_widen_vnni, q5: false, offset: None);
packed_q4_1_kernel!(packed_q4_1_plain, "avx2,fma,f16c", q4_1_step_plain,
    q4_1_widen_plain, q5: false, offset: None);
packed_q4_1_kernel!(packed_q4_0_vnni, "avx2,fma,f16c,avxvnni", q4_1_step_vnni,
    q4_1_widen_vnni, q5: false, offset: Some(8.0));
packed_q4_1_kernel!(packed_q4_0_plain, "avx2,fma,f16c", q4_1_step_plain,
    q4_1_widen_plain, q5: false, offset: Some(8.0));
packed_q4_1_kernel!(packed_q5_1_vnni, "avx2,fma,f16c,avxvnni", q4_1_step_vnni,
    q4_1_widen_vnni, q5: true, offset: None);
packed_q4_1_kernel!(packed_q5_1_plain, "avx2,fma,f16c", q5_step_plain,
    q4_1_widen_vnni, q5: true, offset: None);
packed_q4_1_kernel!(packed_q5_0_vnni, "avx2,fma,f16c,avxvnni", q4_1_step_vnni,
    q4_1_widen_vnni, q5: true, offset: Some(16.0));
packed_q4_1_kernel!(packed_q5_0_plain, "avx2,fma,f16c", q5_step_plain,
    q4_1_widen_vnni, q5: true, offset: Some(16.0));

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

/// Q4_K (and Q5_K) panels of a [`PackedMatrix`] against `V` vectors: per
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
        fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            packed_k4_kernel!(@body $step, $widen, $q5, panel, ahead, None, x)
        }
    };
    ($name:ident, $features:tt, $step:ident, $widen:ident, q5: $q5:literal,
     unpacked: $unpacked:ident) => {
        packed_k4_kernel!($name, $features, $step, $widen, q5: $q5);
        #[inline]
        #[target_feature(enable = $features)]
        fn $unpacked<const V: usize>(panel: &[u8], values: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
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
            let sums = match values {
                Some(u) => nibble_sums!($step, q, None, Some(&u[256 * i..256 * i + 256]), x, i),
                None => {
                    let high = if $q5 { Some(load32(&q[128..])) } else { None };
                    nibble_sums!($step, q, high, None, x, i)
                }
            };
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
fn unpack_q5_k_panel(panel: &[u8], ahead: &[u8], nb: usize, out: &mut Vec<u8>) {
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

/// One block's two-bit values of a Q2_K or Q3_K panel (`$q`: for each half, four
/// bytes a row, values `16h + 4f + e` at bits `2f` of byte `e`; with Q3_K's third
/// bits where `$third` has them, bit `4h + f` of byte `e`) against block `$i` of the
/// calling kernel's `V` vectors (`$x`), summed by `$step` into one sum per half and
/// vector. A macro, so that each kernel inlines its own.
macro_rules! two_bit_halves {
    ($step:ident, $q:expr, $third:expr, $x:expr, $i:expr) => {{
        let (q, third, x, i): (&[u8], Option<__m256i>, Xs<'_>, usize) = ($q, $third, $x, $i);
        let (two, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
        let shift = |n: usize| _mm_cvtsi32_si128(n as i32);
        let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
        let mut halves = [[_mm256_setzero_si256(); V]; 2];
        for (h, sums) in halves.iter_mut().enumerate() {
            let wg = load32(&q[32 * h..]);
            for f in 0..4 {
                let mut w = _mm256_and_si256(_mm256_srl_epi16(wg, shift(2 * f)), two);
                if let Some(hw) = third {
                    // Bit k of each byte to bit 2, in one 16-bit shift: a move of at
                    // most seven bits keeps each byte's bit in its byte.
                    let k = 4 * h + f;
                    let moved = if k >= 2 {
                        _mm256_srl_epi16(hw, shift(k - 2))
                    } else {
                        _mm256_sll_epi16(hw, shift(2 - k))
                    };
                    w = _mm256_or_si256(w, _mm256_and_si256(moved, four));
                }
                for (s, qs) in sums.iter_mut().zip(xs) {
                    *s = $step(*s, w, broadcast4(qs, 16 * h + 4 * f));
                }
            }
        }
        halves
    }};
}

/// Q3_K panels of a [`PackedMatrix`] against `V` vectors: per block of 32 values,
/// two halves of 16 (their scales differ), each four groups of four values a row
/// made from their two low bits and their third, summed (`$step`, `$widen`); the
/// `4 ×` offset of the stored values comes off each half in integers with the
/// activations' half sums, then the halves' scales `d·sc` (exact in f32). Every
/// (row, vector) pair sees the same operations in the same order whatever `V`.
macro_rules! packed_q3_k_kernel {
    ($name:ident, $features:tt, $step:ident, $widen:ident) => {
        #[inline]
        #[target_feature(enable = $features)]
        fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            super_blocks!(panel, ahead, x, 912, |b, d, j, i, acc| {
                let sc_lo = _mm256_mul_ps(d, sbytes8_ps(&b[16 + 16 * j..]));
                let sc_hi = _mm256_mul_ps(d, sbytes8_ps(&b[24 + 16 * j..]));
                let q = &b[144 + 96 * j..144 + 96 * j + 96];
                let halves = two_bit_halves!($step, q, Some(load32(&q[64..])), x, i);
                for v in 0..V {
                    let xb = &x.blocks[v * x.nb + i];
                    let half = |h: usize| {
                        let off = _mm256_set1_epi32(4 * i32::from(xb.sums[h]));
                        _mm256_cvtepi32_ps(_mm256_sub_epi32($widen(halves[h][v]), off))
                    };
                    let xd = _mm256_set1_ps(xb.d);
                    acc[v] = _mm256_fmadd_ps(half(0), _mm256_mul_ps(sc_lo, xd), acc[v]);
                    acc[v] = _mm256_fmadd_ps(half(1), _mm256_mul_ps(sc_hi, xd), acc[v]);
                }
            })
        }
    };
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
    q4_1_widen_plain
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

/// Q2_K panels of a [`PackedMatrix`] against `V` vectors: per block of 32 values, two
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
        fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
            super_blocks!(panel, ahead, x, 672, |b, d, j, i, acc| {
                let dmin = _mm256_cvtph_ps(load16(&b[16..]));
                let (sc_lo16, sc_hi16, mn_pair) = q2_k_scales(&b[32 + 16 * j..]);
                let f = _mm256_cvtepi32_ps;
                let q = &b[160 + 64 * j..160 + 64 * j + 64];
                let halves = two_bit_halves!($step, q, None, x, i);
                for v in 0..V {
                    let xb = &x.blocks[v * x.nb + i];
                    let (total, mins) = if $plain {
                        let total = _mm256_add_epi32(
                            _mm256_madd_epi16(halves[0][v], sc_lo16),
                            _mm256_madd_epi16(halves[1][v], sc_hi16),
                        );
                        let [s0, s1] = xb.sums.map(|s| i32::from(s as u16));
                        let mins = _mm256_madd_epi16(mn_pair, _mm256_set1_epi32(s0 | s1 << 16));
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

/// Q6_K panels of a [`PackedMatrix`] against `V` vectors, with AVX-VNNI: per block
/// of 32 values, the Q4_1 panels' groups ([`q6_k_group`]), a sum per half (their
/// scales differ), the `32 ×` offset of the stored values taken off each half in
/// integers with the activations' half sums. The halves then meet their integer
/// scales in f32, exactly (each product is under 2^23, their sum under 2^24), so the
/// block's integer total is what the kernel without VNNI sums in integers, and both
/// scale it by `d` alike. Every (row, vector) pair sees the same operations in the
/// same order whatever `V`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn packed_q6_k_vnni<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
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
/// 2 × 63 × 127, no saturation) meet their half's scale in the `vpmaddwd` that
/// widens them, so a block keeps one integer sum a vector, scaled already, and
/// the `32 ×` offset comes off it with one more `vpmaddwd` of the two halves'
/// scales and the activations' half sums. The integer total is exact (at most
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
        // Each row's two scales side by side, for the offsets.
        let sc_pair = _mm256_blend_epi16::<0xAA>(sc_lo, sc_hi);
        let q = &b[144 + 192 * j..144 + 192 * j + 192];
        let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
        let mut sums = [_mm256_setzero_si256(); V];
        for g in 0..4 {
            let (wl, wh) = if UNPACKED {
                unpacked_group(&values[256 * i..256 * i + 256], g)
            } else {
                q6_k_group(q, g)
            };
            for v in 0..V {
                let l = _mm256_maddubs_epi16(wl, broadcast4(xs[v], 4 * g));
                let h = _mm256_maddubs_epi16(wh, broadcast4(xs[v], 16 + 4 * g));
                let scaled =
                    _mm256_add_epi32(_mm256_madd_epi16(l, sc_lo), _mm256_madd_epi16(h, sc_hi));
                sums[v] = _mm256_add_epi32(sums[v], scaled);
            }
        }
        for v in 0..V {
            let xb = &x.blocks[v * x.nb + i];
            let [s0, s1] = xb.sums.map(|s| i32::from(s as u16));
            let off = _mm256_madd_epi16(sc_pair, _mm256_set1_epi32(s0 | s1 << 16));
            let total = _mm256_sub_epi32(sums[v], _mm256_slli_epi32::<5>(off));
            let dx = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
            acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), dx, acc[v]);
        }
    })
}

/// [`q6_k_plain`] unpacking each block's bits as it goes: one pass over the panel.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn packed_q6_k_plain<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
    q6_k_plain::<V, false>(panel, ahead, &[], x)
}

/// An 8-row Q6_K panel's values (`nb` blocks), unpacked once for the many tiles of
/// a long batch: for each block, the groups of [`q6_k_group`], the low halves'
/// four then the high halves', 256 bytes. Each tile then loads its weights where
/// it would unpack them (eleven instructions a group, shared by only four
/// vectors), and the registers those took hold sums.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_q6_k_panel(panel: &[u8], ahead: &[u8], nb: usize, out: &mut Vec<u8>) {
    unpack_panel(ahead, nb, out, |i, g| {
        q6_k_group(&panel[1680 * (i / 8) + 144 + 192 * (i % 8)..][..192], g)
    });
}

/// Group `g` of a block unpacked by [`unpack_panel`] (`u`, its 256 bytes): the
/// values it meets in the block's low half and in its high half.
#[inline]
#[target_feature(enable = "avx2")]
fn unpacked_group(u: &[u8], g: usize) -> (__m256i, __m256i) {
    (load32(&u[32 * g..]), load32(&u[128 + 32 * g..]))
}

/// Fills `out` with `nb` blocks of 256 bytes: block `i`'s group `g` (of four) from
/// `group(i, g)`, its low half's values at `32g`, its high half's at `128 + 32g`
/// (where [`unpacked_group`] reads them); the next panel (`ahead`) is asked for as
/// the super-blocks go.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_panel(
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

/// [`q6_k_plain`] on values unpacked by [`unpack_q6_k_panel`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpacked_q6_k_plain<const V: usize>(panel: &[u8], values: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
    q6_k_plain::<V, true>(panel, &[], values, x)
}

/// The Q8_0 panels' kernel without VNNI, on values stored signed: each step
/// multiplies |w| by the activations with w's signs (`vpmaddubsw` takes its
/// unsigned operand first, and these pair sums, at most 2 × 128 × 127, cannot
/// saturate) and widens at once (two of them could overflow 16 bits). The integer
/// sums are exact, so results equal the VNNI kernel's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn packed_q8_0_plain<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); V];
    let share = prefetch_stride(ahead, x.nb);
    for i in 0..x.nb {
        let b = &panel[272 * i..272 * i + 272];
        prefetch_share(ahead, i, share);
        let d = _mm256_cvtph_ps(load16(b));
        let w: [__m256i; 8] = std::array::from_fn(|g| load32(&b[16 + 32 * g..]));
        let aw: [__m256i; 8] = std::array::from_fn(|g| _mm256_sign_epi8(w[g], w[g]));
        for (v, acc) in acc.iter_mut().enumerate() {
            let xb = &x.blocks[v * x.nb + i];
            let mut p = _mm256_setzero_si256();
            for g in 0..8 {
                let sx = _mm256_sign_epi8(broadcast4(&xb.qs, 4 * g), w[g]);
                let pairs = _mm256_maddubs_epi16(aw[g], sx);
                p = _mm256_add_epi32(p, _mm256_madd_epi16(pairs, ones));
            }
            let sc = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, *acc);
        }
    }
    std::array::from_fn(|v| lanes(acc[v]))
}

/// The Q8_0 panels' kernel with AVX-VNNI: the weights are stored plus 128, so each
/// block's integer sum is `Σ (w + 128) x`, and `128 × Σx` (the activations' block
/// sums, exact integers) comes off before the scales apply.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn packed_q8_0_vnni<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    let share = prefetch_stride(ahead, x.nb);
    for i in 0..x.nb {
        let b = &panel[272 * i..272 * i + 272];
        prefetch_share(ahead, i, share);
        let d = _mm256_cvtph_ps(load16(b));
        let w: [__m256i; 8] = std::array::from_fn(|g| load32(&b[16 + 32 * g..]));
        for (v, acc) in acc.iter_mut().enumerate() {
            let xb = &x.blocks[v * x.nb + i];
            let q = |at: usize| broadcast4(&xb.qs, at);
            let mut p = _mm256_setzero_si256();
            for (g, &wg) in w.iter().enumerate() {
                p = add_mul_sum_us8_vnni(p, wg, q(4 * g));
            }
            let offset = 128 * (i32::from(xb.sums[0]) + i32::from(xb.sums[1]));
            let p = _mm256_sub_epi32(p, _mm256_set1_epi32(offset));
            let sc = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, *acc);
        }
    }
    std::array::from_fn(|v| lanes(acc[v]))
}

/// Bytes of `ahead` to ask for per block of a kernel's `nb`: whole cache lines,
/// computed once per call so that the blocks' loop divides nothing.
#[inline]
fn prefetch_stride(ahead: &[u8], nb: usize) -> usize {
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
fn prefetch_share(ahead: &[u8], i: usize, share: usize) {
    let start = (i * share).min(ahead.len());
    let end = (start + share).min(ahead.len());
    for at in (start..end).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead[at..].as_ptr().cast());
    }
}

/// One 256-bit panel kernel on `$nv` vectors (1 to 4, the most a tile takes), its
/// results to `$emit`.
macro_rules! tiles {
    ($kernel:ident, $nv:expr, $emit:ident, $panel:expr, $ahead:expr, $x:expr) => {
        match $nv {
            1 => $emit(&$kernel::<1>($panel, $ahead, $x)),
            2 => $emit(&$kernel::<2>($panel, $ahead, $x)),
            3 => $emit(&$kernel::<3>($panel, $ahead, $x)),
            _ => $emit(&$kernel::<4>($panel, $ahead, $x)),
        }
    };
}

/// Bytes of activations a chunk of vectors of the AVX-512 kernels holds (see
/// [`packed_rows`]): a quarter of the 2 MiB L2 of a core of the CPUs that have them,
/// the rest left to the panels passing over them.
pub(crate) const CHUNK_ACTIVATION_BYTES: usize = 512 << 10;

/// Rows `rows` (whole panels) of a packed matrix against every vector of `qx`;
/// `put_lanes(v, r0, values)` takes the eight rows `r0..r0 + 8` of vector `v`.
pub(crate) fn packed_rows(
    t: Avx2Token,
    pm: &PackedMatrix,
    rows: std::ops::Range<usize>,
    qx: &QuantizedActivations,
    put_lanes: &mut impl FnMut(usize, usize, &[f32; 8]),
) {
    let nb = qx.nb;
    let width = pm.panel_rows;
    let panel_bytes = PackedMatrix::panel_bytes(pm.ty, width, nb);
    let panel = |r0: usize| {
        let p = r0 / width;
        &pm.data[p * panel_bytes..(p + 1) * panel_bytes]
    };
    // Panels are the outer loop, so that a panel comes from memory once per call
    // and from L1 for the next group of vectors: a batch's step streams each
    // weight once, as a single sequence's does.
    if width == 2 * PANEL {
        assert!(
            t.avx512() && pm.for_dpbusd(),
            "16-row panels are packed for the AVX-512 kernels alone"
        );
        debug_assert!(rows.start.is_multiple_of(width), "whole panels");
        // A long batch (a prefill) runs in chunks of vectors whose activations stay
        // in L2 while every panel passes over them; each chunk streams the panels
        // once. Each (row, vector) pair still sees one kernel call's operations in
        // order, so the chunks change no result.
        let chunk = (CHUNK_ACTIVATION_BYTES / (nb * size_of::<BlockQ8>())).max(8) / 8 * 8;
        for first in (0..qx.count).step_by(chunk) {
            let vectors = first..(first + chunk).min(qx.count);
            for r0 in rows.clone().step_by(width) {
                let this = panel(r0);
                // The next panel, whether this task's or the next one's (none past
                // the matrix's last).
                let next = (r0 / width + 1) * panel_bytes;
                let next = pm.data.get(next..next + panel_bytes).unwrap_or(&[]);
                // The high eight rows of a last panel past the matrix's rows (zeros)
                // are dropped.
                let high = r0 + PANEL < rows.end;
                for g in vectors.clone().step_by(8) {
                    // The chunk's first group of vectors asks for all of the next panel.
                    let ahead = if g == first { next } else { &[] };
                    let nv = (vectors.end - g).min(8);
                    let x = Xs {
                        blocks: &qx.blocks[g * nb..(g + nv) * nb],
                        sums: &[],
                        lane: 0,
                        nb,
                    };
                    let mut emit = |o: &[[f32; 16]]| {
                        for (v, lanes) in o.iter().enumerate() {
                            let (lo, hi) = lanes.split_at(PANEL);
                            put_lanes(g + v, r0, lo.try_into().expect("8 lanes"));
                            if high {
                                put_lanes(g + v, r0 + PANEL, hi.try_into().expect("8 lanes"));
                            }
                        }
                    };
                    // SAFETY: `avx512` is set only when runtime detection found
                    // AVX-512 F, BW, VL and VNNI, on top of the AVX2, FMA and F16C
                    // every token proves (asserted above): what `group_512` needs.
                    unsafe { group_512(pm.ty, this, ahead, x, nv, &mut emit) };
                }
            }
        }
        return;
    }
    let vnni = t.vnni() && pm.for_dpbusd();
    // A Q5_K or Q6_K batch of more vectors than this (three tiles or more) unpacks
    // each panel once (see `unpack_q6_k_panel`); fewer unpack as they go.
    const UNPACK_PAST_VECTORS: usize = 8;
    let unpacks =
        !vnni && qx.count > UNPACK_PAST_VECTORS && matches!(pm.ty, GgmlType::Q5_K | GgmlType::Q6_K);
    let mut unpacked = Vec::new();
    let mut r0 = rows.start;
    while r0 < rows.end {
        // Four vectors per tile keep the accumulators and the unpacked weights
        // within the 16 AVX2 registers.
        let next = (r0 + PANEL) / PANEL * panel_bytes;
        let next_panel = pm.data.get(next..(next + panel_bytes).min(pm.data.len()));
        let panel = panel(r0);
        if unpacks {
            let ahead = next_panel.unwrap_or(&[]);
            // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2;
            // the functions touch memory only through bounds-checked slicing and
            // the stores whose bounds they prove.
            unsafe {
                match pm.ty {
                    GgmlType::Q5_K => unpack_q5_k_panel(panel, ahead, nb, &mut unpacked),
                    _ => unpack_q6_k_panel(panel, ahead, nb, &mut unpacked),
                }
            }
        }
        for g in (0..qx.count).step_by(4) {
            // The next panel comes in while this one computes (see `ahead_part`),
            // or came in as this one was unpacked.
            let ahead = if unpacks {
                &[]
            } else {
                ahead_part(next_panel, g / 4, qx.count.div_ceil(4))
            };
            let nv = (qx.count - g).min(4);
            let x = Xs {
                blocks: &qx.blocks[g * nb..(g + nv) * nb],
                sums: &[],
                lane: 0,
                nb,
            };
            let mut emit = |o: &[[f32; 8]]| {
                for (v, lanes) in o.iter().enumerate() {
                    put_lanes(g + v, r0, lanes);
                }
            };
            // SAFETY: an `Avx2Token` exists only after runtime detection found
            // AVX2, FMA and F16C, and its `vnni` flag only if AVX-VNNI was found
            // too: the features of the kernel called. The kernels touch memory
            // only through bounds-checked slicing and their own arrays.
            unsafe {
                let u = &unpacked[..];
                match (pm.ty, vnni) {
                    (GgmlType::Q5_K, false) if unpacks => {
                        tiles!(unpacked_q5_k_plain, nv, emit, panel, u, x)
                    }
                    (GgmlType::Q6_K, false) if unpacks => {
                        tiles!(unpacked_q6_k_plain, nv, emit, panel, u, x)
                    }
                    (GgmlType::Q8_0, false) if pm.plus_128 => {
                        unreachable!("Q8_0 panels for vpdpbusd on a CPU without it")
                    }
                    (GgmlType::Q8_0, true) => tiles!(packed_q8_0_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q8_0, false) => tiles!(packed_q8_0_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q4_0, true) => tiles!(packed_q4_0_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q4_0, false) => tiles!(packed_q4_0_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q5_0, true) => tiles!(packed_q5_0_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q5_0, false) => tiles!(packed_q5_0_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q5_1, true) => tiles!(packed_q5_1_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q5_1, false) => tiles!(packed_q5_1_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q2_K, true) => tiles!(packed_q2_k_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q2_K, false) => tiles!(packed_q2_k_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q3_K, true) => tiles!(packed_q3_k_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q3_K, false) => tiles!(packed_q3_k_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q4_K, true) => tiles!(packed_q4_k_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q4_K, false) => tiles!(packed_q4_k_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q5_K, true) => tiles!(packed_q5_k_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q5_K, false) => tiles!(packed_q5_k_plain, nv, emit, panel, ahead, x),
                    (GgmlType::Q6_K, true) => tiles!(packed_q6_k_vnni, nv, emit, panel, ahead, x),
                    (GgmlType::Q6_K, false) => tiles!(packed_q6_k_plain, nv, emit, panel, ahead, x),
                    (_, true) => tiles!(packed_q4_1_vnni, nv, emit, panel, ahead, x),
                    (_, false) => tiles!(packed_q4_1_plain, nv, emit, panel, ahead, x),
                }
            }
        }
        r0 += PANEL;
    }
}

/// One 16-row panel of `layout` against `nv` vectors (`x`, at most eight), with the
/// AVX-512 kernel of that count; its results to `emit`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
unsafe fn group_512(
    layout: GgmlType,
    panel: &[u8],
    ahead: &[u8],
    x: Xs<'_>,
    nv: usize,
    emit: &mut impl FnMut(&[[f32; 16]]),
) {
    // SAFETY: the caller guarantees the kernels' features; they touch memory only
    // through bounds-checked slicing.
    unsafe {
        match nv {
            1 => emit(&packed_512::<1>(layout, panel, ahead, x)),
            2 => emit(&packed_512::<2>(layout, panel, ahead, x)),
            3 => emit(&packed_512::<3>(layout, panel, ahead, x)),
            4 => emit(&packed_512::<4>(layout, panel, ahead, x)),
            5 => emit(&packed_512::<5>(layout, panel, ahead, x)),
            6 => emit(&packed_512::<6>(layout, panel, ahead, x)),
            7 => emit(&packed_512::<7>(layout, panel, ahead, x)),
            _ => emit(&packed_512::<8>(layout, panel, ahead, x)),
        }
    }
}

/// Part `part` of `parts` of the next panel's bytes, in whole cache lines: each
/// group of vectors asks for its share while it computes, so that a batch of
/// several groups spreads the next panel's loads over all of them. Asked for by
/// the first group alone, a wide panel (the Q8_0 output matrix's) would have to
/// arrive faster than one core streams, and the kernel would wait for it.
fn ahead_part(next: Option<&[u8]>, part: usize, parts: usize) -> &[u8] {
    let Some(next) = next else { return &[] };
    let share = prefetch_stride(next, parts);
    let start = (part * share).min(next.len());
    &next[start..(start + share).min(next.len())]
}
