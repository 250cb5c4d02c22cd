//! Matrices repacked once at load time into panels of rows, the layout of the fastest
//! x86 kernels (`x86/packed.rs`, `x86/packed_512.rs`).

use super::formats::low_bits;
use super::formats::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, KBlock, unpack_scales_k4,
};
use super::{GgmlType, QK};
use crate::cpu::isa::Isa;

/// Rows per panel of a [`PackedMatrix`]: one per 32-bit lane of an AVX2 register.
pub(crate) const PANEL: usize = 8;

/// A Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or Q8_0 matrix rearranged once
/// at load time so that each 32-bit lane of a SIMD register holds a different row: one `vpdpbusd` then advances eight rows (16
/// with AVX-512) by four values each, and the rows' scales convert with one
/// instruction, so a block of eight rows costs a fraction of the instructions of
/// eight separate rows.
///
/// Layout: panels of `w` rows, eight (`PANEL`) for the 256-bit kernels and twice that for
/// the AVX-512 ones (one register's lanes); in each, block after block:
/// - Q4_1, `20w` bytes: the rows' f16 scales, their f16 mins, then for `g` in 0..4
///   the rows' quant bytes `4g..4g + 4` (low nibbles: values `4g..`, high nibbles:
///   values `16 + 4g..`);
/// - Q4_0, `18w` bytes: Q4_1's without the mins; its value `d·(q − 8)` is Q4_1's
///   `d·q + m` with the min `m = −8d`, which the kernels make in f32, so one set of
///   kernels serves both;
/// - Q5_1, `24w` bytes: Q4_1's panel of the low four bits, then the rows' fifth bits,
///   four bytes a row whose byte `e` holds, from the bottom, the bits of values
///   `4g + e` and `16 + 4g + e` for `g` in 0..4 (the values of Q4_1's group `g`);
/// - Q5_0, `22w` bytes: Q5_1's without the mins, `m = −16d` (as Q4_0's);
/// - Q4_K, `148w` bytes a super-block of 256 values: the rows' f16 `d`, their f16
///   `dmin`, for each sub-block `j` in 0..8 the rows' 6-bit scales as bytes, then the
///   same for the mins, then for each sub-block the rows' 16 quant bytes in Q4_1's
///   panel order (byte `k` holding the sub-block's values `k` and `16 + k`): the
///   Q4_1 kernels' loop, with each sub-block's scale `d·sc` and min `dmin·m` made in
///   f32 (exactly: an f16 times a 6-bit integer) rather than loaded;
/// - Q5_K, `180w` bytes a super-block: Q4_K's, each sub-block's 16 quant bytes a
///   row followed by the rows' fifth bits in Q5_1's order (`4w` bytes);
/// - Q2_K, `84w` bytes a super-block: the rows' f16 `d`, their f16 `dmin`, for
///   each group of 16 values the rows' scale and min bytes as stored, then for each
///   block `j` of 32 values, for `h` in 0..2, the rows' four bytes whose byte `e`
///   holds, two bits each from the bottom, values `16h + 4f + e` for `f` in 0..4;
/// - Q3_K, `114w` bytes a super-block: the rows' f16 `d`, for each group `t` of 16
///   values the rows' signed scales (`sc − 32`) as bytes, then for each block `j` of
///   32 values its values plus 4 (0..8): for `h` in 0..2 the rows' four bytes whose
///   byte `e` holds, two bits each from the bottom, the low bits of values
///   `16h + 4f + e` for `f` in 0..4, then the rows' four bytes whose byte `e` holds
///   at bit `4h + f` the third bit of the same value;
/// - Q6_K, `210w` bytes a super-block of 256 values: the rows' f16 `d`, for each
///   group `t` of 16 values the rows' signed 8-bit scales, then for each block `j` of
///   32 values: the four low bits of its values in Q4_1's panel order (`16w` bytes),
///   and their two high bits (`8w` bytes: for `h` in 0..2, the rows' four bytes
///   whose byte `e` holds, two bits each from the bottom, the high bits of values
///   `8h + e`, `16 + 8h + e`, `8h + 4 + e` and `20 + 8h + e`: the values of Q4_1
///   groups `2h` and `2h + 1` in their order). Each block's two halves keep their
///   own sums, as their scales differ;
/// - Q8_0, `34w` bytes: the rows' f16 scales, then for `g` in 0..8 the rows' values
///   `4g..4g + 4`: where the CPU has `vpdpbusd`, each plus 128 (unsigned, as it takes
///   its first operand; the kernel takes `128 × Σx` back off, exactly, in integers);
///   elsewhere as stored, signed (see `x86::packed_q8_0_plain`).
///
/// A last 16-row panel past the matrix's rows holds zeros there, whose results are
/// dropped. Whole 16-row panels let each of the AVX-512 kernel's loads be one
/// instruction, where two 8-row panels side by side take two loads and an insert
/// (`cargo bench -p acs-llama --bench quant` measures the kernels).
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    /// The matrix's format, which names the panels' layout.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) ty: GgmlType,
    /// Q8_0 values are stored plus 128, for `vpdpbusd`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) plus_128: bool,
    /// Rows per panel: [`PANEL`], or twice that for the AVX-512 kernels.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) panel_rows: usize,
    pub(crate) n_rows: usize,
    pub(crate) n_cols: usize,
    /// Only x86 has kernels for the layout so far (elsewhere `new` returns `None`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) data: Vec<u8>,
}

impl PackedMatrix {
    /// Whether the `vpdpbusd` kernels can take this matrix: Q4_1, Q4_K and Q6_K panels
    /// are the same for every kernel, Q8_0 ones only when stored plus 128.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn for_dpbusd(&self) -> bool {
        self.ty != GgmlType::Q8_0 || self.plus_128
    }

    /// Bytes of one panel of `rows` rows and `nb` blocks of 32 values of `layout`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn panel_bytes(layout: GgmlType, rows: usize, nb: usize) -> usize {
        match layout {
            GgmlType::Q8_0 => 34 * rows * nb,
            GgmlType::Q5_1 => 24 * rows * nb,
            GgmlType::Q5_0 => 22 * rows * nb,
            GgmlType::Q4_0 => 18 * rows * nb,
            GgmlType::Q2_K => 84 * rows * nb / 8,
            GgmlType::Q3_K => 114 * rows * nb / 8,
            GgmlType::Q4_K => 148 * rows * nb / 8,
            GgmlType::Q5_K => 180 * rows * nb / 8,
            GgmlType::Q6_K => 210 * rows * nb / 8,
            _ => 20 * rows * nb,
        }
    }

    /// Repacks `weights` (`n_rows × n_cols` of `ty`) when this CPU has the kernels for
    /// the packed layout (AVX2) and the rows fill whole 8-row panels;
    /// `None` otherwise, and the matrix is used as stored.
    pub fn new(ty: GgmlType, weights: &[u8], n_rows: usize, n_cols: usize) -> Option<Self> {
        Self::pack(Isa::detect(), ty, weights, n_rows, n_cols)
    }

    /// [`PackedMatrix::new`] for the kernels of `isa`.
    pub(crate) fn pack(
        isa: Isa,
        ty: GgmlType,
        weights: &[u8],
        n_rows: usize,
        n_cols: usize,
    ) -> Option<Self> {
        let (plus_128, width) = panels(isa)?;
        match ty {
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_0 => {}
            _ => return None,
        }
        let rb = ty.row_bytes(n_cols).ok()?;
        if n_rows == 0 || !n_rows.is_multiple_of(PANEL) || weights.len() != rb * n_rows {
            return None;
        }
        let nb = n_cols / QK;
        let panel = Self::panel_bytes(ty, width, nb);
        let mut data = vec![0u8; n_rows.div_ceil(width) * panel];
        if matches!(
            ty,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
        ) {
            for (p, dst) in data.chunks_exact_mut(panel).enumerate() {
                let rows = p * width..((p + 1) * width).min(n_rows);
                match ty {
                    GgmlType::Q2_K => pack_q2_k(weights, rb, rows, width, dst),
                    GgmlType::Q3_K => pack_q3_k(weights, rb, rows, width, dst),
                    GgmlType::Q4_K => pack_k4::<BlockQ4K>(weights, rb, rows, width, dst),
                    GgmlType::Q5_K => pack_k4::<BlockQ5K>(weights, rb, rows, width, dst),
                    _ => pack_q6_k(weights, rb, rows, width, dst),
                }
            }
            return Some(PackedMatrix {
                ty,
                plus_128,
                panel_rows: width,
                n_rows,
                n_cols,
                data,
            });
        }
        let (src_block, dst_block) = (rb / nb, panel / nb);
        for (p, dst) in data.chunks_exact_mut(panel).enumerate() {
            let rows = p * width..((p + 1) * width).min(n_rows);
            for (i, out) in dst.chunks_exact_mut(dst_block).enumerate() {
                for (r, row) in rows.clone().enumerate() {
                    let at = row * rb + src_block * i;
                    let b = &weights[at..at + src_block];
                    // Scale, min (none in Q4_0's and Q5_0's panels), low nibbles and,
                    // for Q5, the fifth bits' word.
                    let q4 = match ty {
                        GgmlType::Q4_1 => {
                            let b: &BlockQ4_1 = bytemuck::from_bytes(b);
                            Some((b.d, Some(b.m), &b.qs, None))
                        }
                        GgmlType::Q4_0 => {
                            let b: &BlockQ4_0 = bytemuck::from_bytes(b);
                            Some((b.d, None, &b.qs, None))
                        }
                        GgmlType::Q5_1 => {
                            let b: &BlockQ5_1 = bytemuck::from_bytes(b);
                            Some((b.d, Some(b.m), &b.qs, Some(b.qh)))
                        }
                        GgmlType::Q5_0 => {
                            let b: &BlockQ5_0 = bytemuck::from_bytes(b);
                            Some((b.d, None, &b.qs, Some(b.qh)))
                        }
                        _ => None,
                    };
                    if let Some((d, m, qs, qh)) = q4 {
                        out[2 * r..2 * r + 2].copy_from_slice(&d.0);
                        // Where the nibbles start: after the mins, if the layout has them.
                        let mut nibbles = 2 * width;
                        if let Some(m) = m {
                            out[nibbles + 2 * r..][..2].copy_from_slice(&m.0);
                            nibbles += 2 * width;
                        }
                        for (g, q) in qs.chunks_exact(4).enumerate() {
                            let at = nibbles + 4 * width * g + 4 * r;
                            out[at..at + 4].copy_from_slice(q);
                        }
                        if let Some(qh) = qh {
                            let h = u32::from_le_bytes(qh);
                            let high = &mut out[nibbles + 16 * width..];
                            put_fifth_bits(high, r, |v| ((h >> v) & 1) as u8);
                        }
                    } else {
                        let b: &BlockQ8_0 = bytemuck::from_bytes(b);
                        out[2 * r..2 * r + 2].copy_from_slice(&b.d.0);
                        for (g, q) in b.qs.chunks_exact(4).enumerate() {
                            for (k, &v) in q.iter().enumerate() {
                                let at = 2 * width + 4 * width * g + 4 * r + k;
                                out[at] = if plus_128 { v ^ 0x80 } else { v };
                            }
                        }
                    }
                }
            }
        }
        Some(PackedMatrix {
            ty,
            plus_128,
            panel_rows: width,
            n_rows,
            n_cols,
            data,
        })
    }
}

/// One panel of Q4_K or Q5_K rows `rows` (rows of `rb` bytes in `weights`) into
/// `dst`, in the layout [`PackedMatrix`] gives, `width` rows a panel.
fn pack_k4<B: KBlock + bytemuck::Pod>(
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    width: usize,
    dst: &mut [u8],
) {
    // Bytes of a sub-block's quants in the panel: the nibbles, and Q5_K's fifth bits.
    let sub = if B::FIFTH_BITS {
        20 * width
    } else {
        16 * width
    };
    for_each_super_block(
        weights,
        rb,
        rows,
        20 * width + 8 * sub,
        dst,
        |b: &B, r, out| {
            let (scales, qh, qs) = b.parts();
            out[2 * r..2 * r + 2].copy_from_slice(&scales.d.0);
            out[2 * width + 2 * r..][..2].copy_from_slice(&scales.dmin.0);
            let (sc, mn) = unpack_scales_k4(&scales.packed);
            for j in 0..8 {
                out[4 * width + j * width + r] = sc[j];
                out[12 * width + j * width + r] = mn[j];
            }
            for j in 0..8 {
                // Sub-block j's values: nibbles of bytes 32(j / 2).., low for even j.
                let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                let block = &mut out[20 * width + sub * j..][..sub];
                put_nibbles(block, width, r, |l| (q[l] >> (4 * (j % 2))) & 0xF);
                if let Some(qh) = qh {
                    // Value l's fifth bit is bit j of byte l.
                    put_fifth_bits(&mut block[16 * width..], r, |l| (qh[l] >> j) & 1);
                }
            }
        },
    );
}

/// One panel of Q2_K rows `rows` (rows of `rb` bytes in `weights`) into `dst`, in
/// the layout [`PackedMatrix`] gives, `width` rows a panel.
fn pack_q2_k(
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    width: usize,
    dst: &mut [u8],
) {
    for_each_super_block(
        weights,
        rb,
        rows,
        84 * width,
        dst,
        |b: &BlockQ2K, r, out| {
            out[2 * r..2 * r + 2].copy_from_slice(&b.d.0);
            out[2 * width + 2 * r..][..2].copy_from_slice(&b.dmin.0);
            for t in 0..16 {
                out[4 * width + t * width + r] = b.scales[t];
            }
            for j in 0..8 {
                let block = &mut out[20 * width + 8 * width * j..][..8 * width];
                put_two_bits(block, width, r, |k| low_bits(&b.qs, 32 * j + k));
            }
        },
    );
}

/// One panel of Q3_K rows `rows` (rows of `rb` bytes in `weights`) into `dst`, in
/// the layout [`PackedMatrix`] gives, `width` rows a panel.
fn pack_q3_k(
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    width: usize,
    dst: &mut [u8],
) {
    for_each_super_block(
        weights,
        rb,
        rows,
        114 * width,
        dst,
        |b: &BlockQ3K, r, out| {
            out[2 * r..2 * r + 2].copy_from_slice(&b.d.0);
            for t in 0..16 {
                out[2 * width + t * width + r] = b.scale(t) as u8;
            }
            for j in 0..8 {
                // Block j's values, unsigned (0..8).
                let u = |k: usize| (b.value(32 * j + k) + 4) as u8;
                let block = &mut out[18 * width + 12 * width * j..][..12 * width];
                put_two_bits(block, width, r, |k| u(k) & 3);
                for e in 0..4 {
                    block[8 * width + 4 * r + e] = (0..8).fold(0u8, |acc, bit| {
                        let (h, f) = (bit / 4, bit % 4);
                        acc | (u(16 * h + 4 * f + e) >> 2) << bit
                    });
                }
            }
        },
    );
}

/// One panel of Q6_K rows `rows` (rows of `rb` bytes in `weights`) into `dst`, in
/// the layout [`PackedMatrix`] gives, `width` rows a panel.
fn pack_q6_k(
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    width: usize,
    dst: &mut [u8],
) {
    for_each_super_block(
        weights,
        rb,
        rows,
        210 * width,
        dst,
        |b: &BlockQ6K, r, out| {
            out[2 * r..2 * r + 2].copy_from_slice(&b.d.0);
            for t in 0..16 {
                out[2 * width + t * width + r] = b.scales[t];
            }
            for j in 0..8 {
                // Block j's values, unsigned (0..64).
                let q = |k: usize| (b.value(32 * j + k) + 32) as u8;
                let block = &mut out[18 * width + 24 * width * j..][..24 * width];
                put_nibbles(block, width, r, |k| q(k) & 0xF);
                for h in 0..2 {
                    for e in 0..4 {
                        let high = [8 * h + e, 16 + 8 * h + e, 8 * h + 4 + e, 20 + 8 * h + e]
                            .iter()
                            .enumerate()
                            .fold(0u8, |acc, (n, &k)| acc | ((q(k) >> 4) << (2 * n)));
                        block[16 * width + 4 * width * h + 4 * r + e] = high;
                    }
                }
            }
        },
    );
}

/// `pack(block, r, out)` for each super-block `B` of each of a panel's rows `rows`
/// (rows of `rb` bytes in `weights`, `r` counted from the panel's first), `out` being
/// the super-block's `panel_block` bytes of `dst`.
fn for_each_super_block<B: bytemuck::Pod>(
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    panel_block: usize,
    dst: &mut [u8],
    mut pack: impl FnMut(&B, usize, &mut [u8]),
) {
    let size = size_of::<B>();
    for (sb, out) in dst.chunks_exact_mut(panel_block).enumerate() {
        for (r, row) in rows.clone().enumerate() {
            let at = row * rb + sb * size;
            pack(bytemuck::from_bytes(&weights[at..at + size]), r, out);
        }
    }
}

/// Row `r`'s four bytes of a block's fifth bits (`bit(k)`, 0 or 1, of value `k`) in
/// the Q5 panels' order (`high` starting at a panel's fifth-bit words): byte `e`
/// holds the bits of values `4g + e` and `16 + 4g + e` at bits `2g` and `2g + 1`.
fn put_fifth_bits(high: &mut [u8], r: usize, bit: impl Fn(usize) -> u8) {
    for e in 0..4 {
        high[4 * r + e] = (0..4).fold(0u8, |acc, g| {
            acc | bit(4 * g + e) << (2 * g) | bit(16 + 4 * g + e) << (2 * g + 1)
        });
    }
}

/// Row `r`'s eight bytes of a block of 32 two-bit values (`value(k)`, 0..4), as the
/// Q2_K panels hold them (`block` holding a panel's `8 · width` bytes).
fn put_two_bits(block: &mut [u8], width: usize, r: usize, value: impl Fn(usize) -> u8) {
    for h in 0..2 {
        for e in 0..4 {
            block[4 * width * h + 4 * r + e] =
                (0..4).fold(0u8, |acc, f| acc | value(16 * h + 4 * f + e) << (2 * f));
        }
    }
}

/// Row `r`'s sixteen bytes of a block of 32 four-bit values (`value(k)`, 0..16) in
/// Q4_1's panel order: byte `k` holds values `k` and `16 + k`, in groups of four a row
/// (`block` holding a panel's `16 · width` bytes).
fn put_nibbles(block: &mut [u8], width: usize, r: usize, value: impl Fn(usize) -> u8) {
    for k in 0..16 {
        let (g, e) = (k / 4, k % 4);
        block[4 * width * g + 4 * r + e] = value(k) | (value(16 + k) << 4);
    }
}

/// Whether there are kernels for [`PackedMatrix`] panels here (`None` if not), and if
/// so whether their Q8_0 values are stored plus 128, for `vpdpbusd`, and how many rows
/// a panel holds: one register's 32-bit lanes.
fn panels(isa: Isa) -> Option<(bool, usize)> {
    match isa {
        Isa::Portable => None,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => Some((t.dpbusd(), if t.avx512() { 2 * PANEL } else { PANEL })),
    }
}
