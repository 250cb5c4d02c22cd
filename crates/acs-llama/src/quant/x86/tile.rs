//! The 32-wide formats' tile kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): `R` weight rows against `V`
//! activation vectors at a time.

use std::arch::x86_64::*;

use super::*;
use crate::cpu::x86::{Avx2Token, hsum_ps, load8f};
use crate::quant::GgmlType;
use crate::quant::activations::{GROUP, QuantizedActivations};
use crate::quant::format::blocks;
use crate::quant::formats::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};

/// `hsum(acc[r][v]) + k · off[r][lane + v]`: a tile's results.
#[inline]
#[target_feature(enable = "avx2")]
fn finish<const R: usize, const V: usize>(
    acc: [[__m256; V]; R],
    off: [__m256; R],
    k: f32,
    lane: usize,
) -> [[f32; V]; R] {
    std::array::from_fn(|r| {
        let mut o = [0f32; 8];
        // SAFETY: `o` is 8 writable floats; the store is unaligned.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), off[r]) };
        std::array::from_fn(|v| hsum_ps(acc[r][v]) + k * o[lane + v])
    })
}

/// One tile kernel of a format of 4- or 5-bit values with a scale and an offset or a
/// min (Q4_0, Q4_1, Q5_0, Q5_1): `$parts`, given block `$b`, is its scale, what
/// multiplies the activations' sums (the scale for the offset formats, the min
/// otherwise) and its values as bytes; `$k` scales the sums' term at the end (the
/// offset, or 1). `R` weight rows against `V` activation vectors (`V + x.lane <=
/// GROUP`), each weight block unpacked once for all `V` vectors and each activation
/// block loaded once for all `R` rows. Every (row, vector) pair sees the same
/// operations in the same order whatever the tile shape, so batched and single
/// results agree exactly.
macro_rules! nibble_tile {
    ($name:ident, $features:tt, $idot:ident, $block:ty, |$b:ident| $parts:expr, $k:expr) => {
        #[inline]
        #[target_feature(enable = $features)]
        pub(crate) fn $name<const R: usize, const V: usize>(
            rows: [&[u8]; R],
            x: Xs<'_>,
        ) -> [[f32; V]; R] {
            let rows: [&[$block]; R] = rows.map(blocks);
            let mut acc = [[_mm256_setzero_ps(); V]; R];
            let mut off = [_mm256_setzero_ps(); R];
            for i in 0..x.nb {
                let s8 = load8f(&x.sums[i * GROUP..]);
                for r in 0..R {
                    let $b = &rows[r][i];
                    let (d, m, w) = $parts;
                    off[r] = _mm256_fmadd_ps(m, s8, off[r]);
                    for v in 0..V {
                        let xb = &x.blocks[v * x.nb + i];
                        let p = $idot(w, load_x(xb));
                        let sc = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
                        acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][v]);
                    }
                }
            }
            finish(acc, off, $k, x.lane)
        }
    };
}

/// The 32-wide formats' tile kernels (see [`nibble_tile`]; Q8_0's below), compiled
/// once per instruction set.
macro_rules! tile_kernels {
    ($m:ident, $features:tt, $idot:ident) => {
        mod $m {
            use super::*;

            nibble_tile!(
                q4_0,
                $features,
                $idot,
                BlockQ4_0,
                |b| {
                    let d = _mm256_set1_ps(h2f(b.d));
                    (d, d, unpack_nibbles(load16(&b.qs)))
                },
                -8.0
            );
            nibble_tile!(
                q4_1,
                $features,
                $idot,
                BlockQ4_1,
                |b| {
                    let (d, m) = h2f_pair(b);
                    (d, m, unpack_nibbles(load16(&b.qs)))
                },
                1.0
            );
            nibble_tile!(
                q5_0,
                $features,
                $idot,
                BlockQ5_0,
                |b| {
                    let d = _mm256_set1_ps(h2f(b.d));
                    let w = _mm256_or_si256(unpack_nibbles(load16(&b.qs)), fifth_bits(b.qh));
                    (d, d, w)
                },
                -16.0
            );
            nibble_tile!(
                q5_1,
                $features,
                $idot,
                BlockQ5_1,
                |b| {
                    let (d, m) = h2f_pair(b);
                    let w = _mm256_or_si256(unpack_nibbles(load16(&b.qs)), fifth_bits(b.qh));
                    (d, m, w)
                },
                1.0
            );

            #[inline]
            #[target_feature(enable = $features)]
            pub(crate) fn q8_0<const R: usize, const V: usize>(
                rows: [&[u8]; R],
                x: Xs<'_>,
            ) -> [[f32; V]; R] {
                let rows: [&[BlockQ8_0]; R] = rows.map(blocks);
                let mut acc = [[_mm256_setzero_ps(); V]; R];
                for i in 0..x.nb {
                    for r in 0..R {
                        let b = &rows[r][i];
                        let d = _mm256_set1_ps(h2f(b.d));
                        let w = load32(&b.qs);
                        // |w| × (x with w's sign): the unsigned operand must be w.
                        let aw = _mm256_sign_epi8(w, w);
                        for v in 0..V {
                            let xb = &x.blocks[v * x.nb + i];
                            let p = $idot(aw, _mm256_sign_epi8(load_x(xb), w));
                            let sc = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
                            acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][v]);
                        }
                    }
                }
                finish(acc, [_mm256_setzero_ps(); R], 0.0, 0)
            }
        }
    };
}
tile_kernels!(vnni, "avx2,fma,f16c,avxvnni", mul_sum_us8_vnni);
tile_kernels!(plain, "avx2,fma,f16c", mul_sum_us8);

/// One tile of a matrix of a [`TILED`] format (see `tile_kernels`).
#[inline]
pub(crate) fn tile<const R: usize, const V: usize>(
    t: Avx2Token,
    ty: GgmlType,
    rows: [&[u8]; R],
    x: Xs<'_>,
) -> [[f32; V]; R] {
    debug_assert!(x.lane + V <= GROUP);
    // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2, FMA
    // and F16C, and its `vnni` flag is set only if AVX-VNNI was found too: the
    // features of the kernel called. The kernels touch memory only through
    // bounds-checked slicing (and `finish`'s store into its own array).
    unsafe {
        match (ty, t.vnni()) {
            (GgmlType::Q4_0, true) => vnni::q4_0(rows, x),
            (GgmlType::Q4_0, false) => plain::q4_0(rows, x),
            (GgmlType::Q4_1, true) => vnni::q4_1(rows, x),
            (GgmlType::Q4_1, false) => plain::q4_1(rows, x),
            (GgmlType::Q5_0, true) => vnni::q5_0(rows, x),
            (GgmlType::Q5_0, false) => plain::q5_0(rows, x),
            (GgmlType::Q5_1, true) => vnni::q5_1(rows, x),
            (GgmlType::Q5_1, false) => plain::q5_1(rows, x),
            (GgmlType::Q8_0, true) => vnni::q8_0(rows, x),
            (GgmlType::Q8_0, false) => plain::q8_0(rows, x),
            _ => unreachable!("tile kernels exist for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 only"),
        }
    }
}

/// Rows per stretch of [`matmul_rows`]: 32 rows of 1536 Q4_0 columns are 27 KiB,
/// within a core's L1 data cache.
const STRETCH: usize = 32;

/// The formats with tile kernels.
pub(crate) const TILED: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// Rows `rows` of a matrix of a [`TILED`] format against every vector of `qx`, in
/// tiles; `put(v, r, value)` takes each result. `false` (and nothing done) for
/// other formats.
pub(crate) fn matmul_rows(
    t: Avx2Token,
    ty: GgmlType,
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    qx: &QuantizedActivations,
    put: &mut impl FnMut(usize, usize, f32),
) -> bool {
    if !TILED.contains(&ty) {
        return false;
    }
    let nb = qx.nb;
    // Stretches of rows outside, groups of vectors inside: a stretch comes from
    // memory once and stays in cache for the next group, so a batch of any size
    // streams each weight once.
    for r0 in rows.clone().step_by(STRETCH) {
        let stretch = r0..(r0 + STRETCH).min(rows.end);
        for g in (0..qx.count).step_by(GROUP) {
            let nv = (qx.count - g).min(GROUP);
            let x = Xs {
                blocks: &qx.blocks[g * nb..(g + nv) * nb],
                sums: qx.group_sums(g),
                lane: 0,
                nb,
                flipped: &[],
            };
            let w = Rows {
                t,
                ty,
                weights,
                rb,
                g,
            };
            // Few vectors: several rows per tile, for independent accumulator chains
            // and fewer passes over the activations.
            match nv {
                1 => w.run::<4, 1>(stretch.clone(), x, put),
                2 => w.run::<2, 2>(stretch.clone(), x, put),
                3 => w.run::<1, 3>(stretch.clone(), x, put),
                4 => w.run::<1, 4>(stretch.clone(), x, put),
                5 => w.run::<1, 5>(stretch.clone(), x, put),
                6 => w.run::<1, 6>(stretch.clone(), x, put),
                7 => w.run::<1, 7>(stretch.clone(), x, put),
                _ => w.run::<1, 8>(stretch.clone(), x, put),
            }
        }
    }
    true
}

/// A matrix and the first vector of the group being tiled.
struct Rows<'a> {
    t: Avx2Token,
    ty: GgmlType,
    weights: &'a [u8],
    rb: usize,
    g: usize,
}

impl Rows<'_> {
    fn row(&self, r: usize) -> &[u8] {
        &self.weights[r * self.rb..(r + 1) * self.rb]
    }

    /// Tiles of `R` rows (then single rows) by the group's `V` vectors.
    #[inline]
    fn run<const R: usize, const V: usize>(
        &self,
        rows: std::ops::Range<usize>,
        x: Xs<'_>,
        put: &mut impl FnMut(usize, usize, f32),
    ) {
        let mut r = rows.start;
        while r + R <= rows.end {
            let o = tile::<R, V>(self.t, self.ty, std::array::from_fn(|k| self.row(r + k)), x);
            for (k, vals) in o.iter().enumerate() {
                for (v, &val) in vals.iter().enumerate() {
                    put(self.g + v, r + k, val);
                }
            }
            r += R;
        }
        for r in r..rows.end {
            let o = tile::<1, V>(self.t, self.ty, [self.row(r)], x);
            for (v, &val) in o[0].iter().enumerate() {
                put(self.g + v, r, val);
            }
        }
    }
}
