//! The AVX2 and AVX-512 kernels of [`F32Ops`](super::F32Ops): heads of half floats
//! read once for up to four query heads that share them. Where the CPU has AVX-512,
//! heads of [`HEAD`] values take the 512-bit scores, as heads of 96, 128 and 256 do
//! for keys already in the caches (`hot`); heads of 64, 128 or 256 values (Llama's,
//! Qwen3's and Llama 3 8B's, Gemma 3's) take the 512-bit weighted sums; other widths
//! (a multiple of 8) and cases take the 256-bit ones.

use std::arch::x86_64::*;

use half::f16;

use crate::cpu::x86::{Avx2Token, hsum_ps, load8f};

/// The head width whose scores take the 512-bit kernel wherever they run (most small
/// Llama models'). Wider heads' scores take it only for keys read while they are in
/// the caches (`hot`): at 128 values it ran faster there but slower streaming a long
/// context from memory, one sequence's decode (docs/performance.md, 2026-12-07,
/// afternoon).
pub(super) const HEAD: usize = 64;

/// The values of a pass of the 512-bit weighted sums: four registers a head, so that
/// four heads' sums stay in registers.
const PASS: usize = 64;

/// Whether the kernels here serve heads `hd` wide.
pub(super) fn serves(hd: usize) -> bool {
    hd > 0 && hd.is_multiple_of(8)
}

/// Positions ahead of the one computing whose keys or values are asked for.
/// Each (sequence, key/value head) task streams a fresh stretch of the cache
/// (20 KB at 160 positions), too short for the hardware prefetcher to get ahead
/// of, and at eight sequences the caches no longer fit in the last-level cache.
/// The first `AHEAD` positions are asked for together before the loop starts:
/// a decode step's tasks are short (a few dozen positions after a short prompt),
/// and their first positions would otherwise load one at a time on demand.
const AHEAD: usize = 8;

/// Asks for the first [`AHEAD`] positions of a head's cache (positions `stride`
/// halves apart, `n` of them at most, `hd` halves each), before a loop that asks
/// [`AHEAD`] ahead.
#[inline(always)]
fn prefetch_first(h: &[f16], n: usize, stride: usize, hd: usize) {
    for t in 0..AHEAD.min(n) {
        prefetch_position(h, t * stride, hd);
    }
}

/// Asks for the cache lines of one position's head (`hd` halves from `at`), if it
/// exists.
#[inline(always)]
fn prefetch_position(h: &[f16], at: usize, hd: usize) {
    if let Some(p) = h.get(at..at + hd) {
        let p: *const i8 = p.as_ptr().cast();
        for line in (0..2 * hd).step_by(64) {
            // SAFETY: prefetching has no effect on memory; the address lies in `p`
            // (`hd` halves are `2 · hd` bytes). SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(line)) };
        }
    }
}

/// `$f::<G>(args)` for the number of query heads `G` (1 to 4) that `$heads` is.
macro_rules! by_heads {
    ($heads:expr, $f:ident($($arg:expr),*)) => {
        match $heads {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            _ => $f::<4>($($arg),*),
        }
    };
}

/// `$f::<G, D>(args)` for `G` query heads (1 to 4, `$heads`) of `D` registers of 16
/// values (`$regs`: 4, 6, 8 or 16, the widths [`dots`] gives the 512-bit kernel).
macro_rules! by_heads_and_registers {
    ($heads:expr, $regs:expr, $f:ident($($arg:expr),*)) => {
        match ($heads, $regs) {
            (1, 4) => $f::<1, 4>($($arg),*),
            (2, 4) => $f::<2, 4>($($arg),*),
            (3, 4) => $f::<3, 4>($($arg),*),
            (_, 4) => $f::<4, 4>($($arg),*),
            (1, 6) => $f::<1, 6>($($arg),*),
            (2, 6) => $f::<2, 6>($($arg),*),
            (3, 6) => $f::<3, 6>($($arg),*),
            (_, 6) => $f::<4, 6>($($arg),*),
            (1, 8) => $f::<1, 8>($($arg),*),
            (2, 8) => $f::<2, 8>($($arg),*),
            (3, 8) => $f::<3, 8>($($arg),*),
            (_, 8) => $f::<4, 8>($($arg),*),
            (1, _) => $f::<1, 16>($($arg),*),
            (2, _) => $f::<2, 16>($($arg),*),
            (3, _) => $f::<3, 16>($($arg),*),
            (_, _) => $f::<4, 16>($($arg),*),
        }
    };
}

/// [`super::F32Ops::dots`] for heads of `hd` values ([`serves`]), four query heads
/// at a time at most, the 512-bit kernel for heads of [`HEAD`] values and, where the
/// keys are `hot` (in the caches), for heads of 96, 128 and 256 too; the caller
/// checked that `keys` holds every position.
pub(super) fn dots(
    t: Avx2Token,
    (q, heads): (&[f32], usize),
    (keys, stride): (&[f16], usize),
    hot: bool,
    scores: &mut [f32],
) {
    let (n, hd) = (scores.len() / heads, q.len() / heads);
    for (q, scores) in q.chunks(4 * hd).zip(scores.chunks_mut(4 * n)) {
        // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2,
        // FMA and F16C, and its `avx512` is set only when it found AVX-512 F too:
        // the features of the kernel called. Both read and write their slices
        // through checked slicing only.
        unsafe {
            let wide = hd == HEAD || hot && matches!(hd, 96 | 128 | 256);
            if t.avx512() && wide {
                by_heads_and_registers!(q.len() / hd, hd / 16, dots_512(q, keys, stride, scores))
            } else {
                by_heads!(q.len() / hd, dots_impl(q, keys, (stride, hd), scores))
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dots_impl<const G: usize>(
    q: &[f32],
    keys: &[f16],
    (stride, hd): (usize, usize),
    scores: &mut [f32],
) {
    let n = scores.len() / G;
    let q: [&[f32]; G] = std::array::from_fn(|h| &q[h * hd..(h + 1) * hd]);
    let key = |t: usize| &keys[t * stride..t * stride + hd];
    // One key `k` against the `G` query heads: per head, its products in eight lanes,
    // the even chunks of eight values summed in one register and the odd ones in
    // another, then the two added. The chunks go two at a time so that both sums stay
    // in registers (sums indexed by `l % 2` would live on the stack, every
    // multiply-add a load and a store). A macro, not a function or closure: LLVM
    // leaves either a call per key, its sums passed back through memory.
    macro_rules! position_sums {
        ($k:expr) => {{
            let k: &[f16] = $k;
            assert_eq!(k.len(), hd, "a key of the head's width");
            let chunks = hd / 8;
            let (k, q) = (k.as_ptr(), q.map(<[f32]>::as_ptr));
            let (mut even, mut odd) = ([_mm256_setzero_ps(); G], [_mm256_setzero_ps(); G]);
            for pair in 0..chunks / 2 {
                let l = 2 * pair;
                // SAFETY: `l + 1 < chunks`, so the sixteen halves from `8 * l` lie
                // within the key's `hd`; the loads are unaligned, and this function
                // enables F16C.
                let (k0, k1) = unsafe {
                    let half8 = |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(k.add(at).cast()));
                    (half8(8 * l), half8(8 * l + 8))
                };
                for h in 0..G {
                    // SAFETY: as for the key, the sixteen floats from `8 * l` lie
                    // within query head `h`'s `hd`.
                    let (q0, q1) = unsafe {
                        (
                            _mm256_loadu_ps(q[h].add(8 * l)),
                            _mm256_loadu_ps(q[h].add(8 * l + 8)),
                        )
                    };
                    even[h] = _mm256_fmadd_ps(q0, k0, even[h]);
                    odd[h] = _mm256_fmadd_ps(q1, k1, odd[h]);
                }
            }
            if chunks % 2 == 1 {
                let at = 8 * (chunks - 1);
                // SAFETY: the last eight halves and floats of the key and the heads.
                let kl = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(k.add(at).cast())) };
                for h in 0..G {
                    // SAFETY: as for the key.
                    let ql = unsafe { _mm256_loadu_ps(q[h].add(at)) };
                    even[h] = _mm256_fmadd_ps(ql, kl, even[h]);
                }
            }
            let sums: [__m256; G] = std::array::from_fn(|h| _mm256_add_ps(even[h], odd[h]));
            sums
        }};
    }
    prefetch_first(keys, n, stride, hd);
    let whole = n - n % 8;
    for t0 in (0..whole).step_by(8) {
        let mut eight = [[_mm256_setzero_ps(); 8]; G];
        for p in 0..8 {
            prefetch_position(keys, (t0 + p + AHEAD) * stride, hd);
            let sums = position_sums!(key(t0 + p));
            for (e, s) in eight.iter_mut().zip(sums) {
                e[p] = s;
            }
        }
        for (h, e) in eight.iter().enumerate() {
            let out: &mut [f32; 8] = (&mut scores[h * n + t0..][..8])
                .try_into()
                .expect("8 scores");
            // SAFETY: `out` is 8 writable floats; the store is unaligned.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), hsum8_ps(*e)) };
        }
    }
    for t in whole..n {
        prefetch_position(keys, (t + AHEAD) * stride, hd);
        for (h, s) in position_sums!(key(t)).into_iter().enumerate() {
            scores[h * n + t] = hsum_ps(s);
        }
    }
}

/// Eight positions' lane sums reduced together, each as [`hsum_ps`] reduces one —
/// `((x₀ + x₄) + (x₂ + x₆)) + ((x₁ + x₅) + (x₃ + x₇))`, so the same bits — in a
/// dozen shuffles and adds where [`hsum_ps`] takes five for each.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum8_ps(v: [__m256; 8]) -> __m256 {
    // x_k + x_{k+4}: positions p and p + 1, four lanes each.
    let s = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let (s01, s23, s45, s67) = (s(v[0], v[1]), s(v[2], v[3]), s(v[4], v[5]), s(v[6], v[7]));
    // s_0 + s_2 and s_1 + s_3 of positions p and p + 2 in the low 128-bit lane,
    // p + 1 and p + 3 in the high one.
    let u = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let (u0, u4) = (u(s01, s23), u(s45, s67));
    // (s_0 + s_2) + (s_1 + s_3): positions 0, 2, 4, 6 in the low lane, 1, 3, 5, 7
    // in the high one.
    let f = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(u0, u4),
        _mm256_shuffle_ps::<0b11_01_11_01>(u0, u4),
    );
    _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// [`super::F32Ops::append_halves`] with F16C, eight values at a time.
pub(super) fn append_halves(_t: Avx2Token, src: &[f32], dst: &mut Vec<f16>) {
    // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2 and
    // F16C; `append_halves_impl` touches its slices through checked slicing only.
    unsafe { append_halves_impl(src, dst) }
}

#[target_feature(enable = "avx2,f16c")]
fn append_halves_impl(src: &[f32], dst: &mut Vec<f16>) {
    let (lo, hi) = (
        _mm256_set1_ps(-super::HALF_MAX),
        _mm256_set1_ps(super::HALF_MAX),
    );
    let mut chunks = src.chunks_exact(8);
    for c in &mut chunks {
        // max(lo, x) and min(hi, ·) return x when it is NaN, as `clamp` does.
        let x = _mm256_min_ps(hi, _mm256_max_ps(lo, load8f(c)));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let mut o = [f16::ZERO; 8];
        // SAFETY: `o` is 8 writable halves (16 bytes); the store is unaligned.
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), h) };
        dst.extend_from_slice(&o);
    }
    dst.extend(chunks.remainder().iter().map(|&x| super::to_half(x)));
}

/// [`super::F32Ops::softmax`] compiled for AVX2's eight-float vectors. An AVX-512
/// copy of the same code gains nothing, as its sums stay eight lanes wide
/// (docs/performance.md has the profile).
pub(super) fn softmax(_t: Avx2Token, scores: &mut [f32], scale: f32) {
    // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2;
    // `softmax_impl` touches its slice through safe indexing only.
    unsafe { softmax_impl(scores, scale) }
}

#[target_feature(enable = "avx2")]
fn softmax_impl(scores: &mut [f32], scale: f32) {
    super::softmax_lanes(scores, scale)
}

/// A gated activation's two copies, for AVX-512 and for AVX2.
type Gated = [unsafe fn(&mut [f32], &[f32]); 2];

/// [`super::F32Ops::swiglu`] compiled for AVX2's eight-float vectors, or AVX-512's
/// sixteen where the CPU has them: the same operations on each value (the compiler
/// fuses none), so the same bits.
pub(super) fn swiglu(t: Avx2Token, gate: &mut [f32], up: &[f32]) {
    gated(t, [swiglu_512, swiglu_256], gate, up)
}

/// [`super::F32Ops::geglu`] compiled for AVX2 or AVX-512 (see [`swiglu`]).
pub(super) fn geglu(t: Avx2Token, gate: &mut [f32], up: &[f32]) {
    gated(t, [geglu_512, geglu_256], gate, up)
}

/// Runs the copy of a gated activation that this CPU takes.
fn gated(t: Avx2Token, [wide, narrow]: Gated, gate: &mut [f32], up: &[f32]) {
    let f = if t.avx512() { wide } else { narrow };
    // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2, and
    // reports AVX-512 only where it found that too, so `f`'s features are there;
    // both copies touch their slices through safe indexing only.
    unsafe { f(gate, up) }
}

#[target_feature(enable = "avx2")]
fn swiglu_256(gate: &mut [f32], up: &[f32]) {
    super::swiglu_lanes(gate, up)
}

#[target_feature(enable = "avx512f,avx2")]
fn swiglu_512(gate: &mut [f32], up: &[f32]) {
    super::swiglu_lanes(gate, up)
}

#[target_feature(enable = "avx2")]
fn geglu_256(gate: &mut [f32], up: &[f32]) {
    super::geglu_lanes(gate, up)
}

#[target_feature(enable = "avx512f,avx2")]
fn geglu_512(gate: &mut [f32], up: &[f32]) {
    super::geglu_lanes(gate, up)
}

/// [`super::F32Ops::weighted_sum`] for heads of `hd` values ([`serves`]), four
/// query heads at a time at most; the caller checked that `values` holds every
/// position.
pub(super) fn weighted_sum(
    t: Avx2Token,
    weights: &[f32],
    heads: usize,
    values: &[f16],
    stride: usize,
    out: &mut [f32],
) {
    let (n, hd) = (weights.len() / heads, out.len() / heads);
    for (weights, out) in weights.chunks(4 * n).zip(out.chunks_mut(4 * hd)) {
        let g = out.len() / hd;
        // The most eight-value pieces per pass that the G × C accumulators leave
        // registers for, beside the G weights and the values, and that divide the
        // head: three heads of four pieces (twelve accumulators) spill.
        let most = match g {
            1 => 8,
            2 => 4,
            _ => 2,
        };
        let c = [8, 4, 2, 1]
            .into_iter()
            .find(|&c| c <= most && (hd / 8).is_multiple_of(c))
            .unwrap_or(1);
        let sv = (stride, hd);
        // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2,
        // FMA and F16C, and its `avx512` is set only when it found AVX-512 F too:
        // the features of the kernel called. Each checks the bounds of what it
        // reads and writes.
        unsafe {
            if t.avx512() && matches!(hd, 64 | 128 | 256) {
                // `weighted_sum_512::<G, P>` for `g` heads of `P` passes.
                macro_rules! passes {
                    ($p:literal) => {
                        match g {
                            1 => weighted_sum_512::<1, $p>(weights, values, stride, out),
                            2 => weighted_sum_512::<2, $p>(weights, values, stride, out),
                            3 => weighted_sum_512::<3, $p>(weights, values, stride, out),
                            _ => weighted_sum_512::<4, $p>(weights, values, stride, out),
                        }
                    };
                }
                match hd / PASS {
                    1 => passes!(1),
                    2 => passes!(2),
                    _ => passes!(4),
                }
            } else {
                match (g, c) {
                    (1, 8) => weighted_sum_impl::<1, 8>(weights, values, sv, out),
                    (1, 4) => weighted_sum_impl::<1, 4>(weights, values, sv, out),
                    (1, 2) => weighted_sum_impl::<1, 2>(weights, values, sv, out),
                    (1, _) => weighted_sum_impl::<1, 1>(weights, values, sv, out),
                    (2, 4) => weighted_sum_impl::<2, 4>(weights, values, sv, out),
                    (2, 2) => weighted_sum_impl::<2, 2>(weights, values, sv, out),
                    (2, _) => weighted_sum_impl::<2, 1>(weights, values, sv, out),
                    (3, 2) => weighted_sum_impl::<3, 2>(weights, values, sv, out),
                    (3, _) => weighted_sum_impl::<3, 1>(weights, values, sv, out),
                    (_, 2) => weighted_sum_impl::<4, 2>(weights, values, sv, out),
                    _ => weighted_sum_impl::<4, 1>(weights, values, sv, out),
                }
            }
        }
    }
}

/// `C` eight-value pieces of each head per pass over the positions, so that the
/// `G × C` accumulators stay in the sixteen registers.
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_sum_impl<const G: usize, const C: usize>(
    weights: &[f32],
    values: &[f16],
    (stride, hd): (usize, usize),
    out: &mut [f32],
) {
    let n = weights.len() / G;
    assert!(
        weights.len() == G * n && out.len() == G * hd && hd.is_multiple_of(8 * C),
        "{G} heads of weights and outputs, {C} pieces of eight a pass"
    );
    super::assert_holds(values.len(), n, stride, hd, "values");
    if n == 0 {
        return;
    }
    // Positions a block: the passes over a block's values find them in L1 (16 KiB
    // of halves), where passes over a long context's whole cache would each bring
    // it from L2 or memory again. Between blocks the sums wait in `out`, so each
    // output value is still one chain of multiply-adds in position order.
    let block = (8192 / stride.max(1)).max(8);
    let (wp, vp) = (weights.as_ptr(), values.as_ptr());
    // One pass's positions over the `8 * C` values from `$at`, as a macro so that
    // each way of asking for values ahead is a loop of its own with no test inside:
    // - `ahead`: the first block's first pass asks for whole positions [`AHEAD`]
    //   ahead, as a short context's only block needs;
    // - `next`: every pass asks for the lines of its own values in the next block's
    //   positions, so that a long context's next block streams in while this one's
    //   passes run, spread evenly over them (one line a position a pass, two for
    //   passes of 64 values), as a core keeps only so many misses in flight.
    macro_rules! pass {
        ($acc:ident, $positions:expr, $at:expr, ahead: $ahead:expr, next: $next:expr) => {
            for t in $positions {
                if $ahead {
                    prefetch_position(values, (t + AHEAD) * stride, hd);
                }
                if $next {
                    for line in (0..8 * C).step_by(32) {
                        // SAFETY: prefetching has no effect on memory; the loop
                        // runs `next` only for `t + block < n`, whose values from
                        // `$at` lie within `values` (the assertion above).
                        unsafe {
                            let p = vp.add((t + block) * stride + $at + line);
                            _mm_prefetch::<_MM_HINT_T0>(p.cast());
                        }
                    }
                }
                // SAFETY: `t < n`, so `h * n + t < G * n`, the length of `weights`;
                // and `t * stride + $at + 8 * C <= (n - 1) * stride + hd`, which the
                // assertion above bounds by the length of `values`. The loads are
                // unaligned, and this function enables F16C.
                unsafe {
                    let w: [__m256; G] =
                        std::array::from_fn(|h| _mm256_broadcast_ss(&*wp.add(h * n + t)));
                    let v = vp.add(t * stride + $at);
                    for l in 0..C {
                        let vl = _mm256_cvtph_ps(_mm_loadu_si128(v.add(8 * l).cast()));
                        for (a, &wh) in $acc.iter_mut().zip(&w) {
                            a[l] = _mm256_fmadd_ps(wh, vl, a[l]);
                        }
                    }
                }
            }
        };
    }
    prefetch_first(values, n, stride, hd);
    for first in (0..n).step_by(block) {
        let end = (first + block).min(n);
        // The positions whose next block's position `t + block` exists, then the rest.
        let split = end.min(n.saturating_sub(block)).max(first);
        for pass in 0..hd / (8 * C) {
            let at = 8 * C * pass;
            let mut acc: [[__m256; C]; G] = std::array::from_fn(|h| {
                std::array::from_fn(|l| load8f(&out[h * hd + at + 8 * l..]))
            });
            if first == 0 && pass == 0 {
                pass!(acc, first..split, at, ahead: true, next: true);
                pass!(acc, split..end, at, ahead: true, next: false);
            } else {
                pass!(acc, first..split, at, ahead: false, next: true);
                pass!(acc, split..end, at, ahead: false, next: false);
            }
            for (h, a) in acc.iter().enumerate() {
                for (l, al) in a.iter().enumerate() {
                    let o: &mut [f32; 8] = (&mut out[h * hd + at + 8 * l..][..8])
                        .try_into()
                        .expect("8 floats");
                    // SAFETY: `o` is 8 writable floats; the store is unaligned.
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *al) };
                }
            }
        }
    }
}

/// Sixteen floats of `v` from `at`.
#[inline]
#[target_feature(enable = "avx512f")]
fn load16f(v: &[f32], at: usize) -> __m512 {
    let v: &[f32; 16] = v[at..at + 16].try_into().expect("16 floats");
    // SAFETY: `v` is 16 readable floats; the load is unaligned.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// Sixteen half floats of `h` from `at` as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn load16h(h: &[f16], at: usize) -> __m512 {
    let h: &[f16; 16] = h[at..at + 16].try_into().expect("16 halves");
    // SAFETY: `h` is 16 readable halves (32 bytes); the load is unaligned.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(h.as_ptr().cast()) })
}

/// One key against `G` query heads of `D` registers of 16 values: per head, its
/// products in 16 lanes, lane `l` summing those of values `l`, `l + 16`, `l + 32`, …
/// in that order. Lanes 0–7 are `dots_impl`'s even sum and lanes 8–15 its odd one,
/// bit for bit (the same multiply-adds in the same order).
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn key_sums<const G: usize, const D: usize>(q: &[f32], k: &[f16]) -> [__m512; G] {
    let mut sums = [_mm512_setzero_ps(); G];
    // Each register of the key meets every head before the next is widened, so that
    // a wide head's key needs one register at a time, not `D`.
    for j in 0..D {
        let kj = load16h(k, 16 * j);
        for (h, s) in sums.iter_mut().enumerate() {
            *s = _mm512_fmadd_ps(load16f(q, 16 * (h * D + j)), kj, *s);
        }
    }
    sums
}

/// Two keys' sums `a` and `b` (see [`key_sums`]) with lanes `l` and `l + 8`
/// added: `[a₀..₈ | b₀..₈]`, each half what `dots_impl` sums for one key.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_pair(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
    )
}

/// Eight keys' scores of one head from their [`fold_pair`]s (keys 0 and 1, 2
/// and 3, …): the sums of [`hsum_ps`], pair for pair —
/// `((x₀ + x₄) + (x₂ + x₆)) + ((x₁ + x₅) + (x₃ + x₇))` — eight at a time.
#[inline]
#[target_feature(enable = "avx512f")]
fn scores8(p: [__m512; 4]) -> __m256 {
    // x_j + x_{j+4}: [s_a | s_b | s_c | s_d] and [s_e | … | s_h], four lanes each.
    let s = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    let (s1, s2) = (s(p[0], p[1]), s(p[2], p[3]));
    // s_0 + s_2 and s_1 + s_3, keys of `s1` then of `s2` in each 128-bit lane.
    let u = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(s1, s2),
        _mm512_shuffle_ps::<0b11_10_11_10>(s1, s2),
    );
    // (s_0 + s_2) + (s_1 + s_3): lane 4k holds key k's score, lane 4k + 1 key
    // 4 + k's.
    let f = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(u, u),
        _mm512_shuffle_ps::<0b11_01_11_01>(u, u),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f))
}

/// [`dots_impl`] in 512-bit registers for heads of `16 D` values, the same bits: a
/// key's values take half the registers, and eight keys' sums are reduced together
/// (a dozen shuffles and adds for eight scores where [`hsum_ps`] takes five for one).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn dots_512<const G: usize, const D: usize>(
    q: &[f32],
    keys: &[f16],
    stride: usize,
    scores: &mut [f32],
) {
    let (n, hd) = (scores.len() / G, 16 * D);
    prefetch_first(keys, n, stride, hd);
    let key = |t: usize| &keys[t * stride..t * stride + hd];
    let whole = n - n % 8;
    for t0 in (0..whole).step_by(8) {
        let mut pairs = [[_mm512_setzero_ps(); 4]; G];
        for (m, pair) in (0..4).map(|m| (m, t0 + 2 * m)) {
            prefetch_position(keys, (pair + AHEAD) * stride, hd);
            prefetch_position(keys, (pair + 1 + AHEAD) * stride, hd);
            let (a, b) = (
                key_sums::<G, D>(q, key(pair)),
                key_sums::<G, D>(q, key(pair + 1)),
            );
            for h in 0..G {
                pairs[h][m] = fold_pair(a[h], b[h]);
            }
        }
        for (h, p) in pairs.into_iter().enumerate() {
            let out: &mut [f32; 8] = (&mut scores[h * n + t0..][..8])
                .try_into()
                .expect("8 scores");
            // SAFETY: `out` is 8 writable floats; the store is unaligned.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), scores8(p)) };
        }
    }
    for t in whole..n {
        let a = key_sums::<G, D>(q, key(t));
        for (h, a) in a.into_iter().enumerate() {
            let halves = _mm256_add_ps(
                _mm512_castps512_ps256(a),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))),
            );
            scores[h * n + t] = hsum_ps(halves);
        }
    }
}

/// [`weighted_sum_impl`] in 512-bit registers for heads of `P` passes of [`PASS`]
/// values, the same bits (each output value the same chain of multiply-adds): a
/// position's values are four registers a pass, and every head's pass stays in
/// registers. A wider head runs its passes over a block of positions whose values
/// stay in L1 (16 KiB of halves) from one pass to the next, as [`weighted_sum_impl`]
/// does; between blocks the sums wait in `out`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn weighted_sum_512<const G: usize, const P: usize>(
    weights: &[f32],
    values: &[f16],
    stride: usize,
    out: &mut [f32],
) {
    let hd = P * PASS;
    let n = weights.len() / G;
    let block = if P == 1 {
        n.max(1)
    } else {
        (8192 / stride.max(1)).max(8)
    };
    prefetch_first(values, n, stride, hd);
    for first in (0..n).step_by(block) {
        let end = (first + block).min(n);
        for at in (0..hd).step_by(PASS) {
            let mut acc: [[__m512; 4]; G] = std::array::from_fn(|h| {
                std::array::from_fn(|c| load16f(out, h * hd + at + 16 * c))
            });
            for t in first..end {
                if P == 1 || first + at == 0 {
                    prefetch_position(values, (t + AHEAD) * stride, hd);
                }
                if P > 1 {
                    // Each pass asks for its own values of the next block's
                    // positions, so that a long context's next block streams in
                    // while this one's passes run.
                    prefetch_position(values, (t + block) * stride + at, PASS);
                }
                let v = &values[t * stride + at..][..PASS];
                let v: [__m512; 4] = std::array::from_fn(|c| load16h(v, 16 * c));
                for (h, a) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(weights[h * n + t]);
                    for (a, &v) in a.iter_mut().zip(&v) {
                        *a = _mm512_fmadd_ps(w, v, *a);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (c, &a) in a.iter().enumerate() {
                    let o: &mut [f32; 16] = (&mut out[h * hd + at + 16 * c..][..16])
                        .try_into()
                        .expect("16 floats");
                    // SAFETY: `o` is 16 writable floats; the store is unaligned.
                    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
                }
            }
        }
    }
}
