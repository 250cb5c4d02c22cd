//! The 256-bit kernels of the Q4_1 family's and Q8_0's [`PackedMatrix`] panels
//! (eight rows, one per 32-bit lane; the K-quants' are in [`packed_k`](super::packed_k))
//! and the dispatcher of both panel widths.

use std::arch::x86_64::*;

use super::packed_512::{packed_512, unpack_512};
use super::packed_k::*;
use super::panel_steps::*;
use super::*;
use crate::cpu::x86::{Avx2Token, lanes};
use crate::quant::GgmlType;
use crate::quant::activations::{FLIPPED_PAST, QuantizedActivations};
use crate::quant::packed::{PANEL, PackedMatrix};

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

/// The Q8_0 panels' kernel without VNNI, on values stored signed: each step
/// multiplies |w| by the activations with w's signs (`vpmaddubsw` takes its
/// unsigned operand first, and these pair sums, at most 2 × 128 × 127, cannot
/// saturate) and widens at once (two of them could overflow 16 bits). A group's
/// values meet every vector before the next group's are loaded ([`step_done`]).
/// The integer sums are exact, so results equal the VNNI kernel's.
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
        let mut p = [_mm256_setzero_si256(); V];
        for g in 0..8 {
            let w = load32(&b[16 + 32 * g..]);
            let aw = _mm256_sign_epi8(w, w);
            for (v, p) in p.iter_mut().enumerate() {
                let xb = &x.blocks[v * x.nb + i];
                let sx = _mm256_sign_epi8(broadcast4(&xb.qs, 4 * g), w);
                let pairs = _mm256_maddubs_epi16(aw, sx);
                *p = _mm256_add_epi32(*p, _mm256_madd_epi16(pairs, ones));
                *p = step_done::<V>(*p);
            }
        }
        for (v, (acc, &p)) in acc.iter_mut().zip(&p).enumerate() {
            let xb = &x.blocks[v * x.nb + i];
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
/// [`packed_rows`]): the core's L2 less [`PANEL_ROOM`] left to the panels passing
/// over them, and at least that much. Each chunk unpacks every Q3_K, Q5_K and Q6_K
/// panel again, and a matrix of long rows (an FFN's down projection) fits few
/// vectors in a small chunk, so the unpacking serves more vectors in a larger one.
pub(crate) fn chunk_activation_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        crate::cpu::caches::level2().map_or(PANEL_ROOM, |l2| {
            l2.saturating_sub(PANEL_ROOM).max(PANEL_ROOM)
        })
    })
}

/// The part of L2 a chunk's activations leave to the panels: a 16-row panel of
/// 14,336-value rows unpacked (640 bytes a block of 32 values) takes 280 KiB.
const PANEL_ROOM: usize = 512 << 10;

/// Whether a batch of more than [`FLIPPED_PAST`] vectors meets `pm` with its flipped
/// activations ([`QuantizedActivations::hold_flipped`]): the 16-row Q3_K and Q6_K
/// panels, which a prefill unpacks as signed bytes.
pub(crate) fn reads_flipped(pm: &PackedMatrix) -> bool {
    pm.panel_rows == 2 * PANEL && matches!(pm.ty, GgmlType::Q3_K | GgmlType::Q6_K)
}

/// Rows `rows` (whole panels) of a packed matrix against every vector of `qx`
/// (flipped too, where [`reads_flipped`]);
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
        assert!(
            !reads_flipped(pm) || qx.count <= FLIPPED_PAST || !qx.flipped.is_empty(),
            "{:?} panels need the batch's flipped activations",
            pm.ty
        );
        // A long batch (a prefill) runs in chunks of vectors whose activations stay
        // in L2 while every panel passes over them; each chunk streams the panels
        // once. Each (row, vector) pair still sees one kernel call's operations in
        // order, so the chunks change no result.
        let chunk = (chunk_activation_bytes() / (nb * size_of::<BlockQ8>())).max(8) / 8 * 8;
        let mut unpacked = Vec::new();
        for first in (0..qx.count).step_by(chunk) {
            let vectors = first..(first + chunk).min(qx.count);
            for r0 in rows.clone().step_by(width) {
                let this = panel(r0);
                // The next panel, whether this task's or the next one's (none past
                // the matrix's last).
                let next = (r0 / width + 1) * panel_bytes;
                let next = pm.data.get(next..next + panel_bytes).unwrap_or(&[]);
                // A chunk of more than one group of vectors unpacks the panel's values
                // once for all its groups, where they take work to unpack (such a
                // batch's activations are held flipped too, which unpacked Q3_K
                // and Q6_K values meet).
                // SAFETY: `avx512` is set only when runtime detection found AVX-512 F,
                // BW and VNNI (asserted above); the functions write only within the
                // 64-byte pieces of `unpacked` they prove in bounds.
                let unpacks = vectors.len() > FLIPPED_PAST
                    && unsafe { unpack_512(pm.ty, this, next, nb, &mut unpacked) };
                let values: &[u8] = if unpacks { &unpacked } else { &[] };
                // The high eight rows of a last panel past the matrix's rows (zeros)
                // are dropped.
                let high = r0 + PANEL < rows.end;
                for g in vectors.clone().step_by(8) {
                    // The chunk's first group of vectors asks for all of the next panel,
                    // unless the unpacking did.
                    let ahead = if g == first && !unpacks { next } else { &[] };
                    let nv = (vectors.end - g).min(8);
                    let x = Xs {
                        blocks: &qx.blocks[g * nb..(g + nv) * nb],
                        sums: &[],
                        lane: 0,
                        nb,
                        flipped: qx.flipped.get(g * nb..(g + nv) * nb).unwrap_or(&[]),
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
                    unsafe { group_512(pm.ty, this, ahead, values, x, nv, &mut emit) };
                }
            }
        }
        return;
    }
    let vnni = t.vnni() && pm.for_dpbusd();
    // A Q3_K, Q5_K or Q6_K batch of more vectors than this (three tiles or more)
    // unpacks each panel once (see `unpack_q6_k_panel`); fewer unpack as they go.
    const UNPACK_PAST_VECTORS: usize = 8;
    let unpacks = !vnni
        && qx.count > UNPACK_PAST_VECTORS
        && matches!(pm.ty, GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::Q6_K);
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
                    GgmlType::Q3_K => unpack_q3_k_panel(panel, ahead, nb, &mut unpacked),
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
                flipped: &[],
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
                    (GgmlType::Q3_K, false) if unpacks => {
                        tiles!(unpacked_q3_k_plain, nv, emit, panel, u, x)
                    }
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
/// AVX-512 kernel of that count (reading the panel's unpacked `values` where there
/// are some); its results to `emit`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
unsafe fn group_512(
    layout: GgmlType,
    panel: &[u8],
    ahead: &[u8],
    values: &[u8],
    x: Xs<'_>,
    nv: usize,
    emit: &mut impl FnMut(&[[f32; 16]]),
) {
    // SAFETY: the caller guarantees the kernels' features; they touch memory only
    // through bounds-checked slicing.
    unsafe {
        match nv {
            1 => emit(&packed_512::<1>(layout, panel, ahead, values, x)),
            2 => emit(&packed_512::<2>(layout, panel, ahead, values, x)),
            3 => emit(&packed_512::<3>(layout, panel, ahead, values, x)),
            4 => emit(&packed_512::<4>(layout, panel, ahead, values, x)),
            5 => emit(&packed_512::<5>(layout, panel, ahead, values, x)),
            6 => emit(&packed_512::<6>(layout, panel, ahead, values, x)),
            7 => emit(&packed_512::<7>(layout, panel, ahead, values, x)),
            _ => emit(&packed_512::<8>(layout, panel, ahead, values, x)),
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
