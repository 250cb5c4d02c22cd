//! The AVX-512 kernels of 16-row [`PackedMatrix`](crate::quant::packed::PackedMatrix)
//! panels: every lane runs the 256-bit kernels' operations in their order, so results
//! are identical, at twice the rows per instruction.

use std::arch::x86_64::*;

use super::*;
use crate::quant::GgmlType;

/// Sixty-four bytes of a 16-row panel: four of each row, row `k` in lane `k`.
#[inline]
#[target_feature(enable = "avx512f")]
fn load64(b: &[u8]) -> __m512i {
    let b = &b[..64];
    // SAFETY: `b` holds the 64 bytes read; the load is unaligned.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// A 16-row panel's f16 values of one kind (scales or mins) as 16 floats.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves16(b: &[u8]) -> __m512 {
    _mm512_cvtph_ps(load32(b))
}

/// Activations `at..at + 4` of a block in every lane of a 512-bit register.
#[inline]
#[target_feature(enable = "avx512f")]
fn broadcast4_512(qs: &[i8; QK], at: usize) -> __m512i {
    let b = |k: usize| qs[at + k] as u8;
    _mm512_set1_epi32(i32::from_le_bytes([b(0), b(1), b(2), b(3)]))
}

/// Sixteen lanes: the rows of a 16-row panel, in order.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes16(v: __m512) -> [f32; 16] {
    let mut o = [0f32; 16];
    // SAFETY: `o` is 16 writable floats; the store is unaligned.
    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    o
}

/// The level the AVX-512 kernels' prefetches fill: L2, not L1. A prefetch into L1
/// holds one of the core's few L1 miss buffers for the whole trip from memory, so
/// that a single sequence's decode, which streams every panel once, kept too few
/// lines in flight; into L2 it keeps as many as L2 tracks, and the block's loads
/// then take the lines from L2 (docs/performance.md, 2026-12-05, has the measurement).
const PANEL_HINT: i32 = _MM_HINT_T1;

/// Where the AVX-512 kernels' prefetches go: the next panel (`ahead`) when it is
/// whole, else nowhere. The first group of a chunk of vectors asks for the next
/// panel; the others find this one in the caches, and asking for its lines again
/// would take load-port slots that the broadcasts of their activations need.
#[inline]
fn next_panel(panel: &[u8], ahead: &[u8]) -> Option<*const u8> {
    (ahead.len() == panel.len()).then_some(ahead.as_ptr())
}

/// Asks for block `i` of the panel at `next` (blocks of `block` bytes), while
/// block `i` of this panel computes: the same offsets as the block's own loads,
/// so the addresses cost no arithmetic beyond theirs, where sharing out the next
/// panel's bytes evenly (`prefetch_share`, as the 256-bit kernels do) computed
/// each block's share with scalar instructions that compete with the vector ones
/// for ports (the `decode_step_matmuls` benchmark of `cargo bench -p acs-llama
/// --bench quant` measures it).
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_block(next: Option<*const u8>, i: usize, block: usize) {
    let Some(next) = next else { return };
    for at in (0..block).step_by(64) {
        // Prefetches never fault, whatever the address.
        _mm_prefetch::<PANEL_HINT>(next.wrapping_add(block * i + at).cast());
    }
}

/// Asks for the `len` bytes from `at` of the panel at `next`: the K-quant kernels ask
/// for each sub-block's share of the next super-block as they start the same
/// sub-block of theirs, a few lines at a time, where asking for a whole super-block
/// at its start (37 lines of Q4_K, 53 of Q6_K) outran the misses the core keeps in
/// flight.
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_part(next: Option<*const u8>, at: usize, len: usize) {
    let Some(next) = next else { return };
    for line in (at..at + len).step_by(64) {
        // Prefetches never fault, whatever the address.
        _mm_prefetch::<PANEL_HINT>(next.wrapping_add(line).cast());
    }
}

/// Whether the AVX-512 kernels keep two sums a vector (a block's low and high
/// halves, added at its end) rather than one: with the vectors' sums interleaved,
/// eight vectors give the `vpdpbusd` ports independent chains enough, and one sum
/// spares an addition; fewer vectors wait on the chains' latency with one.
#[inline]
const fn split_sums(vectors: usize) -> bool {
    vectors < 8
}

/// The eight blocks of super-block `sb` of each of a kernel's `V` vectors (`nb`
/// blocks each, vector after vector, in `blocks`), bounds-checked once a
/// super-block: indexing each block would check every vector's index again, scalar
/// work beside the `vpdpbusd`s in every block.
#[inline]
fn super_block<const V: usize>(blocks: &[BlockQ8], nb: usize, sb: usize) -> [&[BlockQ8; 8]; V] {
    std::array::from_fn(|v| blocks[v * nb + 8 * sb..][..8].try_into().expect("8 blocks"))
}

/// A vector's block sum from its two halves, or the one sum (see [`split_sums`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn sum_halves<const V: usize>(lo: __m512i, hi: __m512i) -> __m512i {
    if split_sums(V) {
        _mm512_add_epi32(lo, hi)
    } else {
        lo
    }
}

/// One block's weights (`$q`: Q8_0's values if `$q8`, else Q4_1's nibbles, with
/// Q5's fifth bits where `$high` has them, of a panel) against every one of the calling kernel's `V` vectors (`$xb`), as integer
/// sums: Q8_0's plus 128 times the vector's sum (its values are stored plus 128),
/// Q4_1's of the unsigned nibbles. A macro, so that each kernel has its own copy
/// inlined: a function that several kernels call is not inlined, and its call passes
/// the sums through memory on every block (docs/performance.md has the measurement).
///
/// Each group goes to every vector before the next group, so that the vectors'
/// sums, independent chains, lie side by side in the instruction stream. One
/// vector's whole block after another's put each vector's dependent `vpdpbusd`s
/// back to back, and the ports would wait on their latency. Eight vectors are
/// chains enough for one sum each; fewer keep two, the blocks' low and high halves
/// (see [`split_sums`]).
macro_rules! block_sums {
    ($q8:expr, $q:expr, $high:expr, $xb:expr) => {{
        let (q, high, xb): (&[u8], Option<__m512i>, &[&BlockQ8; V]) = ($q, $high, $xb);
        let mut lo = [_mm512_setzero_si512(); V];
        let mut hi = [_mm512_setzero_si512(); V];
        for g in 0..4 {
            // The weights to multiply with values 4g..4g + 4 and 16 + 4g..20 + 4g.
            let (wl, wh) = if $q8 {
                (load64(&q[64 * g..]), load64(&q[256 + 64 * g..]))
            } else {
                nibbles_512(load64(&q[64 * g..]), high, g)
            };
            for v in 0..V {
                lo[v] = _mm512_dpbusd_epi32(lo[v], wl, broadcast4_512(&xb[v].qs, 4 * g));
                let h = if split_sums(V) {
                    &mut hi[v]
                } else {
                    &mut lo[v]
                };
                *h = _mm512_dpbusd_epi32(*h, wh, broadcast4_512(&xb[v].qs, 16 + 4 * g));
            }
        }
        let sums: [__m512i; V] = std::array::from_fn(|v| sum_halves::<V>(lo[v], hi[v]));
        sums
    }};
}

/// [`packed_q4_1_vnni`] on a 16-row Q4_1 panel (Q5_1's where `Q5`; Q4_0's and
/// Q5_0's, which store no mins, where `OFFSET` is their `m = −OFFSET·d`), with
/// AVX-512: every lane runs the same operations in the same order as in the 256-bit
/// kernel, so results are identical, at twice the rows per instruction and with 32
/// registers for the sums of up to eight vectors.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn packed_q4_1_512<const V: usize, const Q5: bool, const OFFSET: u8>(
    panel: &[u8],
    ahead: &[u8],
    x: Xs<'_>,
) -> [[f32; 16]; V] {
    // Where the nibbles start, after the scales and any mins, and a block's bytes.
    let nibbles = if OFFSET > 0 { 32 } else { 64 };
    let bytes = nibbles + if Q5 { 320 } else { 256 };
    let mut acc = [_mm512_setzero_ps(); V];
    let next = next_panel(panel, ahead);
    for i in 0..x.nb {
        let b = &panel[bytes * i..bytes * i + bytes];
        prefetch_block(next, i, bytes);
        let d = halves16(b);
        let m = if OFFSET > 0 {
            _mm512_mul_ps(d, _mm512_set1_ps(-f32::from(OFFSET)))
        } else {
            halves16(&b[32..])
        };
        let xb: [&BlockQ8; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i]);
        let high = if Q5 {
            Some(load64(&b[nibbles + 256..]))
        } else {
            None
        };
        let sums = block_sums!(false, &b[nibbles..], high, &xb);
        for v in 0..V {
            let p = _mm512_cvtepi32_ps(sums[v]);
            acc[v] = _mm512_fmadd_ps(p, _mm512_mul_ps(d, _mm512_set1_ps(xb[v].d)), acc[v]);
            acc[v] = _mm512_fmadd_ps(m, _mm512_set1_ps(xb[v].s), acc[v]);
        }
    }
    std::array::from_fn(|v| lanes16(acc[v]))
}

/// [`packed_q8_0_vnni`] on a 16-row Q8_0 panel (see [`packed_q4_1_512`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn packed_q8_0_512<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 16]; V] {
    let mut acc = [_mm512_setzero_ps(); V];
    let next = next_panel(panel, ahead);
    for i in 0..x.nb {
        let b = &panel[544 * i..544 * i + 544];
        prefetch_block(next, i, 544);
        let d = halves16(b);
        let xb: [&BlockQ8; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i]);
        let sums = block_sums!(true, &b[32..], None, &xb);
        for v in 0..V {
            let offset = 128 * (i32::from(xb[v].sums[0]) + i32::from(xb[v].sums[1]));
            let p = _mm512_sub_epi32(sums[v], _mm512_set1_epi32(offset));
            let sc = _mm512_mul_ps(d, _mm512_set1_ps(xb[v].d));
            acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[v]);
        }
    }
    std::array::from_fn(|v| lanes16(acc[v]))
}

/// Group `g` (of four) of a 16-row panel's block from its 64 bytes of nibbles (`wg`):
/// the values it meets in the block's low half and in its high half, each a nibble,
/// with its fifth bit in place where the format has them (`high`, Q5's fifth-bit
/// words).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn nibbles_512(wg: __m512i, high: Option<__m512i>, g: usize) -> (__m512i, __m512i) {
    let mask = _mm512_set1_epi8(0xF);
    let wl = _mm512_and_si512(wg, mask);
    let wh = _mm512_and_si512(_mm512_srli_epi16(wg, 4), mask);
    match high {
        Some(h) => (
            _mm512_or_si512(wl, fifth_bit_512(h, 2 * g as u32)),
            _mm512_or_si512(wh, fifth_bit_512(h, 2 * g as u32 + 1)),
        ),
        None => (wl, wh),
    }
}

/// Bit `shift` of each byte of a 16-row Q5 panel's fifth-bit words, as 16 or 0.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn fifth_bit_512(h: __m512i, shift: u32) -> __m512i {
    let bit = _mm512_and_si512(
        _mm512_srl_epi16(h, _mm_cvtsi32_si128(shift as i32)),
        _mm512_set1_epi8(1),
    );
    _mm512_slli_epi16::<4>(bit)
}

/// Sixteen rows' 6-bit scales (or mins) of one sub-block, stored as bytes, as floats.
#[inline]
#[target_feature(enable = "avx512f")]
fn bytes16_ps(b: &[u8]) -> __m512 {
    let v = u128::from_le_bytes(b[..16].try_into().expect("16 bytes"));
    let v = _mm_set_epi64x((v >> 64) as i64, v as i64);
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
}

/// [`packed_q4_k_vnni`] on a 16-row Q4_K panel (Q5_K's where `Q5`; see
/// [`packed_q4_1_512`]), or, `UNPACKED`, on a Q5_K panel's values read from `values`
/// ([`unpack_512`]): the same values, so the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn packed_q4_k_512<const V: usize, const Q5: bool, const UNPACKED: bool>(
    panel: &[u8],
    ahead: &[u8],
    values: &[u8],
    x: Xs<'_>,
) -> [[f32; 16]; V] {
    // A sub-block's bytes (its nibbles, then Q5_K's fifth bits) and a super-block's.
    let sub = if Q5 { 320 } else { 256 };
    let bytes = 320 + 8 * sub;
    let mut acc = [_mm512_setzero_ps(); V];
    let next = next_panel(panel, ahead);
    for sb in 0..x.nb / 8 {
        let b = &panel[bytes * sb..bytes * sb + bytes];
        let d = halves16(b);
        let dmin = halves16(&b[32..]);
        let xsb = super_block::<V>(x.blocks, x.nb, sb);
        for j in 0..8 {
            prefetch_part(next, bytes * sb + bytes / 8 * j, bytes / 8);
            let i = 8 * sb + j;
            let sc = _mm512_mul_ps(d, bytes16_ps(&b[64 + 16 * j..]));
            let mn = _mm512_mul_ps(dmin, bytes16_ps(&b[192 + 16 * j..]));
            let xb: [&BlockQ8; V] = std::array::from_fn(|v| &xsb[v][j]);
            let q = &b[320 + sub * j..];
            let sums = if UNPACKED {
                block_sums!(true, &values[512 * i..][..512], None, &xb)
            } else {
                let high = if Q5 { Some(load64(&q[256..])) } else { None };
                block_sums!(false, q, high, &xb)
            };
            for v in 0..V {
                let p = _mm512_cvtepi32_ps(sums[v]);
                acc[v] = _mm512_fmadd_ps(p, _mm512_mul_ps(sc, _mm512_set1_ps(xb[v].d)), acc[v]);
                acc[v] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(xb[v].s), acc[v]);
            }
        }
    }
    std::array::from_fn(|v| lanes16(acc[v]))
}

/// Sixteen rows' signed 8-bit scales of one Q6_K group of 16 values, as floats.
#[inline]
#[target_feature(enable = "avx512f")]
fn sbytes16_ps(b: &[u8]) -> __m512 {
    let v = u128::from_le_bytes(b[..16].try_into().expect("16 bytes"));
    let v = _mm_set_epi64x((v >> 64) as i64, v as i64);
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
}

/// Group `g` (of four) of a 16-row Q6_K panel's block (`q`, its 384 bytes),
/// unpacked: the values it meets in the block's low half and in its high half, each
/// its four low bits with its two high bits in place.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn q6_k_group_512(q: &[u8], g: usize) -> (__m512i, __m512i) {
    let (mask, bits45) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(0x30));
    let wg = load64(&q[64 * g..]);
    let hw = load64(&q[256 + 64 * (g / 2)..]);
    // Group g's high bits sit at bits 0-1 (low half) and 2-3 (high half) of each
    // byte for even g, at 4-5 and 6-7 for odd g; each moves to bits 4-5 with an
    // immediate shift, the bytes' other bits masked off (what a shift carries
    // across a byte lands outside bits 4-5).
    let (hl, hh) = if g.is_multiple_of(2) {
        (_mm512_slli_epi16::<4>(hw), _mm512_slli_epi16::<2>(hw))
    } else {
        (hw, _mm512_srli_epi16::<2>(hw))
    };
    // (low nibble) | (high bits): 0xEC is `(a & c) | b`.
    let wl = _mm512_ternarylogic_epi32::<0xEC>(wg, _mm512_and_si512(hl, bits45), mask);
    let wh = _mm512_ternarylogic_epi32::<0xEC>(
        _mm512_srli_epi16::<4>(wg),
        _mm512_and_si512(hh, bits45),
        mask,
    );
    (wl, wh)
}

/// The bytes of a block of [`unpack_panel_512`]'s values, with (`SIGNED`) or without
/// its halves' offsets.
const fn unpacked_block(signed: bool) -> usize {
    if signed { 640 } else { 512 }
}

/// Fills `out` with a 16-row panel's values (`nb` blocks, super-blocks of `sb_bytes`
/// bytes), unpacked once for the many groups of vectors of a prefill's chunk, where
/// each group would unpack them again: block `i`'s group `g` (of four) from
/// `group(super-block, j, g)` for its block `j` of the super-block, the values it
/// meets in the block's low half at `64g` and in its high half at `256 + 64g` of the
/// block's bytes ([`unpacked_block`]), a byte a value (where `block_sums!` with `$q8`
/// reads them). `SIGNED` values are signed bytes, the signed operand of `vpdpbusd`
/// against activations flipped to unsigned (`x + 128`), and each half's offset
/// follows at 512 and 576, a row's `−128 ×` the sum of its values: what the flip
/// adds, for its sums to start from. The next panel (`ahead`) is asked for as the
/// blocks go, as the kernels ask for it.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn unpack_panel_512<const SIGNED: bool>(
    (panel, ahead): (&[u8], &[u8]),
    (nb, sb_bytes): (usize, usize),
    out: &mut Vec<u8>,
    group: impl Fn(&[u8], usize, usize) -> (__m512i, __m512i),
) {
    let block = unpacked_block(SIGNED);
    out.clear();
    out.resize(block * nb, 0);
    let next = next_panel(panel, ahead);
    let flip = _mm512_set1_epi8(-128);
    for (i, o) in out.chunks_exact_mut(block).enumerate() {
        let (sb, j) = (i / 8, i % 8);
        prefetch_part(next, sb_bytes * sb + sb_bytes / 8 * j, sb_bytes / 8);
        let b = &panel[sb_bytes * sb..][..sb_bytes];
        let (values, offsets) = o.split_at_mut(512);
        let mut sums = [_mm512_setzero_si512(); 2];
        for g in 0..4 {
            let (wl, wh) = group(b, j, g);
            // SAFETY: `values` is 512 writable bytes, so both 64-byte unaligned stores
            // (at 64g and 256 + 64g, g < 4) lie inside it.
            unsafe {
                _mm512_storeu_si512(values[64 * g..].as_mut_ptr().cast(), wl);
                _mm512_storeu_si512(values[256 + 64 * g..].as_mut_ptr().cast(), wh);
            }
            if SIGNED {
                // 128 × four values of each row, from an all-128 unsigned operand.
                sums[0] = _mm512_dpbusd_epi32(sums[0], flip, wl);
                sums[1] = _mm512_dpbusd_epi32(sums[1], flip, wh);
            }
        }
        if SIGNED {
            let offsets: &mut [u8; 128] = offsets.try_into().expect("128 bytes");
            for (h, sum) in sums.into_iter().enumerate() {
                let offset = _mm512_sub_epi32(_mm512_setzero_si512(), sum);
                // SAFETY: `offsets` is 128 writable bytes, so the 64-byte unaligned
                // store at 64h (h < 2) lies inside it.
                unsafe { _mm512_storeu_si512(offsets[64 * h..].as_mut_ptr().cast(), offset) };
            }
        }
    }
}

/// One block's unpacked signed values (`$u`, a block of [`unpack_panel_512`] with
/// offsets) against every one of the calling kernel's `V` flipped vectors (`$xb`):
/// one integer sum per half and vector, each started from the weights' offset, so
/// the sums of the values against the vectors as rounded. A macro for the reason
/// [`block_sums!`] is one.
macro_rules! signed_halves_512 {
    ($u:expr, $xb:expr) => {{
        let (u, xb): (&[u8], &[&BlockQ8; V]) = ($u, $xb);
        let mut lo = [load64(&u[512..]); V];
        let mut hi = [load64(&u[576..]); V];
        for g in 0..4 {
            let (wl, wh) = (load64(&u[64 * g..]), load64(&u[256 + 64 * g..]));
            for v in 0..V {
                let xl = broadcast4_512(&xb[v].qs, 4 * g);
                let xh = broadcast4_512(&xb[v].qs, 16 + 4 * g);
                lo[v] = _mm512_dpbusd_epi32(lo[v], xl, wl);
                hi[v] = _mm512_dpbusd_epi32(hi[v], xh, wh);
            }
        }
        [lo, hi]
    }};
}

/// [`packed_q6_k_vnni`] on a 16-row Q6_K panel (see [`packed_q4_1_512`]), its values
/// unpacked from the panel's bits as it goes, or, `UNPACKED`, read from `values`
/// (from [`unpack_512`]) as signed bytes against the flipped activations: the same
/// integer sums either way, so the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn packed_q6_k_512<const V: usize, const UNPACKED: bool>(
    panel: &[u8],
    ahead: &[u8],
    values: &[u8],
    x: Xs<'_>,
) -> [[f32; 16]; V] {
    let mut acc = [_mm512_setzero_ps(); V];
    let next = next_panel(panel, ahead);
    for sb in 0..x.nb / 8 {
        let b = &panel[3360 * sb..3360 * sb + 3360];
        let d = halves16(b);
        // Unpacked values meet the flipped activations (the same scales).
        let xsb = super_block::<V>(if UNPACKED { x.flipped } else { x.blocks }, x.nb, sb);
        for j in 0..8 {
            prefetch_part(next, 3360 * sb + 420 * j, 420);
            let i = 8 * sb + j;
            let sc_lo = sbytes16_ps(&b[32 + 32 * j..]);
            let sc_hi = sbytes16_ps(&b[48 + 32 * j..]);
            let q = &b[288 + 384 * j..288 + 384 * j + 384];
            let xb: [&BlockQ8; V] = std::array::from_fn(|v| &xsb[v][j]);
            let [lo, hi] = if UNPACKED {
                signed_halves_512!(
                    &values[unpacked_block(true) * i..][..unpacked_block(true)],
                    &xb
                )
            } else {
                // Each half's sum starts from its offset, `-32 ×` the activations'
                // sum, as the integers come out the same as taking it off at the
                // end, one instruction fewer a half.
                let off = |v: usize, k: usize| _mm512_set1_epi32(-32 * i32::from(xb[v].sums[k]));
                let mut lo: [__m512i; V] = std::array::from_fn(|v| off(v, 0));
                let mut hi: [__m512i; V] = std::array::from_fn(|v| off(v, 1));
                for g in 0..4 {
                    let (wl, wh) = q6_k_group_512(q, g);
                    for v in 0..V {
                        lo[v] = _mm512_dpbusd_epi32(lo[v], wl, broadcast4_512(&xb[v].qs, 4 * g));
                        hi[v] =
                            _mm512_dpbusd_epi32(hi[v], wh, broadcast4_512(&xb[v].qs, 16 + 4 * g));
                    }
                }
                [lo, hi]
            };
            for v in 0..V {
                let (pl, ph) = (_mm512_cvtepi32_ps(lo[v]), _mm512_cvtepi32_ps(hi[v]));
                // The block's integer total, exact in f32 (see `packed_q6_k_vnni`).
                let total = _mm512_fmadd_ps(pl, sc_lo, _mm512_mul_ps(ph, sc_hi));
                let dx = _mm512_mul_ps(d, _mm512_set1_ps(xb[v].d));
                acc[v] = _mm512_fmadd_ps(total, dx, acc[v]);
            }
        }
    }
    std::array::from_fn(|v| lanes16(acc[v]))
}

/// Values `16h + 4f..16h + 4f + 4` of a 16-row Q2_K or Q3_K panel's block, from its
/// half's 64 bytes of two-bit values (`wg`) and, for Q3_K, its third bits (`third`);
/// the layout is [`two_bit_halves_512!`]'s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn two_bit_values_512(wg: __m512i, third: Option<__m512i>, h: usize, f: usize) -> __m512i {
    let shift = |n: usize| _mm_cvtsi32_si128(n as i32);
    let w = _mm512_and_si512(_mm512_srl_epi16(wg, shift(2 * f)), _mm512_set1_epi8(3));
    match third {
        Some(hw) => {
            let bit = _mm512_and_si512(_mm512_srl_epi16(hw, shift(4 * h + f)), _mm512_set1_epi8(1));
            _mm512_or_si512(w, _mm512_slli_epi16::<2>(bit))
        }
        None => w,
    }
}

/// Group `g` (of four) of a 16-row Q3_K panel's block (`q`, its 192 bytes),
/// unpacked: the values it meets in the block's low half and in its high half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn q3_k_group_512(q: &[u8], g: usize) -> (__m512i, __m512i) {
    let third = Some(load64(&q[128..]));
    (
        two_bit_values_512(load64(q), third, 0, g),
        two_bit_values_512(load64(&q[64..]), third, 1, g),
    )
}

/// One block's two-bit values of a 16-row Q2_K or Q3_K panel (`$q`: for each half,
/// four bytes a row, values `16h + 4f + e` at bits `2f` of byte `e`; with Q3_K's
/// third bits where `$third` has them, bit `4h + f` of byte `e`) against every one of
/// the calling kernel's `V` vectors (`$xb`): one integer sum per half and vector, in
/// the 256-bit kernels' order.
macro_rules! two_bit_halves_512 {
    ($q:expr, $third:expr, $xb:expr) => {{
        let (q, third, xb): (&[u8], Option<__m512i>, &[&BlockQ8; V]) = ($q, $third, $xb);
        let mut halves = [[_mm512_setzero_si512(); V]; 2];
        for (h, sums) in halves.iter_mut().enumerate() {
            let wg = load64(&q[64 * h..]);
            for f in 0..4 {
                let w = two_bit_values_512(wg, third, h, f);
                for v in 0..V {
                    let x = broadcast4_512(&xb[v].qs, 16 * h + 4 * f);
                    sums[v] = _mm512_dpbusd_epi32(sums[v], w, x);
                }
            }
        }
        halves
    }};
}

/// [`packed_q3_k_vnni`] on a 16-row Q3_K panel (see [`packed_q4_1_512`]), its values
/// unpacked from the panel's bits as it goes, or, `UNPACKED`, read from `values` as
/// signed bytes against the flipped activations (as [`packed_q6_k_512`] does): the
/// same integer sums either way, so the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn packed_q3_k_512<const V: usize, const UNPACKED: bool>(
    panel: &[u8],
    ahead: &[u8],
    values: &[u8],
    x: Xs<'_>,
) -> [[f32; 16]; V] {
    let mut acc = [_mm512_setzero_ps(); V];
    let next = next_panel(panel, ahead);
    for sb in 0..x.nb / 8 {
        let b = &panel[1824 * sb..1824 * sb + 1824];
        let d = halves16(b);
        let xsb = super_block::<V>(if UNPACKED { x.flipped } else { x.blocks }, x.nb, sb);
        for j in 0..8 {
            prefetch_part(next, 1824 * sb + 228 * j, 228);
            let i = 8 * sb + j;
            let sc_lo = _mm512_mul_ps(d, sbytes16_ps(&b[32 + 32 * j..]));
            let sc_hi = _mm512_mul_ps(d, sbytes16_ps(&b[48 + 32 * j..]));
            let q = &b[288 + 192 * j..288 + 192 * j + 192];
            let xb: [&BlockQ8; V] = std::array::from_fn(|v| &xsb[v][j]);
            let halves = if UNPACKED {
                signed_halves_512!(
                    &values[unpacked_block(true) * i..][..unpacked_block(true)],
                    &xb
                )
            } else {
                two_bit_halves_512!(q, Some(load64(&q[128..])), &xb)
            };
            for v in 0..V {
                let half = |h: usize| {
                    if UNPACKED {
                        return _mm512_cvtepi32_ps(halves[h][v]);
                    }
                    let off = _mm512_set1_epi32(4 * i32::from(xb[v].sums[h]));
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(halves[h][v], off))
                };
                let total = _mm512_fmadd_ps(half(0), sc_lo, _mm512_mul_ps(half(1), sc_hi));
                acc[v] = _mm512_fmadd_ps(total, _mm512_set1_ps(xb[v].d), acc[v]);
            }
        }
    }
    std::array::from_fn(|v| lanes16(acc[v]))
}

/// Sixteen rows' Q2_K scale and min bytes of one group of 16 values, as floats: the
/// scales (low nibbles) and the mins (high ones).
#[inline]
#[target_feature(enable = "avx512f")]
fn nibbles16_ps(b: &[u8]) -> (__m512, __m512) {
    let v = u128::from_le_bytes(b[..16].try_into().expect("16 bytes"));
    let bytes = _mm512_cvtepu8_epi32(_mm_set_epi64x((v >> 64) as i64, v as i64));
    let low = _mm512_and_si512(bytes, _mm512_set1_epi32(0xF));
    let high = _mm512_srli_epi32::<4>(bytes);
    (_mm512_cvtepi32_ps(low), _mm512_cvtepi32_ps(high))
}

/// [`packed_q2_k_vnni`] on a 16-row Q2_K panel (see [`packed_q4_1_512`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn packed_q2_k_512<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 16]; V] {
    let mut acc = [_mm512_setzero_ps(); V];
    let next = next_panel(panel, ahead);
    for sb in 0..x.nb / 8 {
        let b = &panel[1344 * sb..1344 * sb + 1344];
        let d = halves16(b);
        let dmin = halves16(&b[32..]);
        let xsb = super_block::<V>(x.blocks, x.nb, sb);
        for j in 0..8 {
            prefetch_part(next, 1344 * sb + 168 * j, 168);
            let (sc_lo, mn_lo) = nibbles16_ps(&b[64 + 32 * j..]);
            let (sc_hi, mn_hi) = nibbles16_ps(&b[80 + 32 * j..]);
            let q = &b[320 + 128 * j..320 + 128 * j + 128];
            let xb: [&BlockQ8; V] = std::array::from_fn(|v| &xsb[v][j]);
            let halves = two_bit_halves_512!(q, None, &xb);
            for v in 0..V {
                let half = |h: usize| _mm512_cvtepi32_ps(halves[h][v]);
                let xsum = |h: usize| _mm512_set1_ps(f32::from(xb[v].sums[h]));
                // The block's two integer totals, exact in f32 (see `packed_q2_k_plain`).
                let total = _mm512_fmadd_ps(half(0), sc_lo, _mm512_mul_ps(half(1), sc_hi));
                let mins = _mm512_fmadd_ps(mn_lo, xsum(0), _mm512_mul_ps(mn_hi, xsum(1)));
                let xd = _mm512_set1_ps(xb[v].d);
                acc[v] = _mm512_fmadd_ps(total, _mm512_mul_ps(d, xd), acc[v]);
                acc[v] = _mm512_fnmadd_ps(mins, _mm512_mul_ps(dmin, xd), acc[v]);
            }
        }
    }
    std::array::from_fn(|v| lanes16(acc[v]))
}

/// Where a format's panels take work to unpack (Q3_K's third bits and offset, Q5_K's
/// fifth bits, Q6_K's high bits and offset), `panel`'s values unpacked into `out`
/// once for the many groups of vectors of a prefill's chunk, as [`packed_512`] reads
/// them; whether this format has them. (Q2_K's values unpacked once measured no
/// faster than unpacked as the kernel goes.)
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) fn unpack_512(
    layout: GgmlType,
    panel: &[u8],
    ahead: &[u8],
    nb: usize,
    out: &mut Vec<u8>,
) -> bool {
    let panels = (panel, ahead);
    match layout {
        GgmlType::Q6_K => unpack_panel_512::<true>(panels, (nb, 3360), out, |b, j, g| {
            // The stored values less their offset of 32, as signed bytes.
            let (wl, wh) = q6_k_group_512(&b[288 + 384 * j..][..384], g);
            let offset = _mm512_set1_epi8(32);
            (_mm512_sub_epi8(wl, offset), _mm512_sub_epi8(wh, offset))
        }),
        GgmlType::Q3_K => unpack_panel_512::<true>(panels, (nb, 1824), out, |b, j, g| {
            // The stored values less their offset of 4, as signed bytes.
            let q = &b[288 + 192 * j..][..192];
            let (wl, wh) = q3_k_group_512(q, g);
            let offset = _mm512_set1_epi8(4);
            (_mm512_sub_epi8(wl, offset), _mm512_sub_epi8(wh, offset))
        }),
        GgmlType::Q5_K => unpack_panel_512::<false>(panels, (nb, 2880), out, |b, j, g| {
            let q = &b[320 + 320 * j..][..320];
            nibbles_512(load64(&q[64 * g..]), Some(load64(&q[256..])), g)
        }),
        _ => return false,
    }
    true
}

/// The AVX-512 kernel of the format; a Q3_K, Q5_K or Q6_K panel's values come from
/// `values` where it holds them ([`unpack_512`]), as every other format ignores it.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
#[inline]
pub(super) unsafe fn packed_512<const V: usize>(
    layout: GgmlType,
    panel: &[u8],
    ahead: &[u8],
    values: &[u8],
    x: Xs<'_>,
) -> [[f32; 16]; V] {
    // SAFETY: the caller guarantees the kernels' features.
    unsafe {
        match layout {
            GgmlType::Q8_0 => packed_q8_0_512::<V>(panel, ahead, x),
            GgmlType::Q2_K => packed_q2_k_512::<V>(panel, ahead, x),
            GgmlType::Q3_K if values.is_empty() => {
                packed_q3_k_512::<V, false>(panel, ahead, values, x)
            }
            GgmlType::Q3_K => packed_q3_k_512::<V, true>(panel, ahead, values, x),
            GgmlType::Q4_K => packed_q4_k_512::<V, false, false>(panel, ahead, values, x),
            GgmlType::Q5_K if values.is_empty() => {
                packed_q4_k_512::<V, true, false>(panel, ahead, values, x)
            }
            GgmlType::Q5_K => packed_q4_k_512::<V, true, true>(panel, ahead, values, x),
            GgmlType::Q6_K if values.is_empty() => {
                packed_q6_k_512::<V, false>(panel, ahead, values, x)
            }
            GgmlType::Q6_K => packed_q6_k_512::<V, true>(panel, ahead, values, x),
            GgmlType::Q4_0 => packed_q4_1_512::<V, false, 8>(panel, ahead, x),
            GgmlType::Q5_0 => packed_q4_1_512::<V, true, 16>(panel, ahead, x),
            GgmlType::Q5_1 => packed_q4_1_512::<V, true, 0>(panel, ahead, x),
            GgmlType::Q4_1 => packed_q4_1_512::<V, false, 0>(panel, ahead, x),
            _ => unreachable!("no panels of {layout:?}"),
        }
    }
}
