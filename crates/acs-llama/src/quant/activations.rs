//! Activation vectors rounded to 8-bit blocks of 32 (llama.cpp's Q8 activations): what
//! every block format's weights are dotted against, with integer multiply-adds.

use super::{QK, QuantError};
use crate::cpu::isa::Isa;

/// One block of 32 activations rounded to 8 bits: `x[i] ≈ d * qs[i]`.
///
/// The sums of the two 16-value halves let the kernels fold in the weight formats'
/// offsets (Q4_0's −8, Q4_1's and the K-quants' mins, Q6_K's −32) with one scalar
/// multiply per block instead of per value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BlockQ8 {
    /// The rounded values.
    pub(crate) qs: [i8; QK],
    /// The scale.
    pub(crate) d: f32,
    /// The sums of the two halves' values.
    pub(crate) sums: [i16; 2],
    /// `d * (sum of qs)`: the term a weight block's min or offset multiplies.
    pub(crate) s: f32,
}

/// Activation vectors per group of the batched kernels: each weight block is unpacked
/// once and dotted against this many vectors before the next block is loaded, which
/// is what makes a prefill (or a batched decode) cheaper per token than one vector at
/// a time. Eight keeps a tile's accumulators within the 16 AVX2 registers.
pub(crate) const GROUP: usize = 8;

/// Activation vectors rounded once to 8-bit blocks of 32, to be dotted against many
/// quantized weight rows ([`dot_row_q8`](super::dot_row_q8), [`matmul_q8`](super::matmul_q8),
/// [`matmul_many`](super::matmul_many)).
#[derive(Debug, Clone, Default)]
pub struct QuantizedActivations {
    /// Values per vector (before padding to whole blocks).
    pub(crate) len: usize,
    /// Vectors.
    pub(crate) count: usize,
    /// Blocks per vector.
    pub(crate) nb: usize,
    /// `count * nb` blocks, vector after vector.
    pub(crate) blocks: Vec<BlockQ8>,
    /// Every block's `s` again, regrouped so that a kernel folds one weight block's
    /// offset into a whole group of vectors with a single vector FMA: for each group
    /// of [`GROUP`] consecutive vectors, for each block index, the group's `GROUP`
    /// sums (zero past the last vector).
    pub(crate) sums: Vec<f32>,
    /// Every block's values again, widened to 16 bits: wasm SIMD multiplies 16-bit
    /// lanes (`i32x4.dot_i16x8_s`), and widening once here spares each weight row
    /// that this input meets from widening it again.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    pub(crate) wide: Vec<[i16; QK]>,
    /// Every block again with its values plus 128, unsigned bytes in `qs`'s bits, for
    /// batches of more than [`FLIPPED_PAST`] vectors that meet such panels
    /// ([`hold_flipped`](Self::hold_flipped)), else empty: the unsigned operand of
    /// `vpdpbusd` where a prefill's unpacked Q3_K and Q6_K weights are the signed
    /// one, so that the stored values' offset (−4, −32) is a weight's constant
    /// rather than each vector's. Whole blocks, so that a kernel reaches a vector's
    /// values and scale through one pointer.
    #[cfg(target_arch = "x86_64")]
    pub(crate) flipped: Vec<BlockQ8>,
}

/// The batches whose activations are also held flipped ([`QuantizedActivations`]'s
/// `flipped`): those of more vectors than this, as only they unpack Q3_K and Q6_K
/// panels.
#[cfg(target_arch = "x86_64")]
pub(crate) const FLIPPED_PAST: usize = GROUP;

impl QuantizedActivations {
    /// Values per vector (before padding to whole blocks).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the vectors are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many vectors are held.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Re-quantizes the vectors of `n_cols` values laid end to end in `xs` into this
    /// buffer, reusing its allocations (the forward pass rounds each input once and
    /// feeds it to several matrices).
    pub fn quantize_from(&mut self, xs: &[f32], n_cols: usize) -> Result<(), QuantError> {
        if n_cols == 0 || !xs.len().is_multiple_of(n_cols) {
            return Err(QuantError::Length {
                what: "activations",
                expected: n_cols,
                actual: xs.len(),
            });
        }
        let nb = n_cols.div_ceil(QK);
        let count = xs.len() / n_cols;
        (self.len, self.count, self.nb) = (n_cols, count, nb);
        self.blocks.clear();
        self.blocks.resize(count * nb, BlockQ8::default());
        let isa = Isa::detect();
        let round = |v: usize, dst: &mut [BlockQ8]| {
            quantize_vector(isa, &xs[v * n_cols..(v + 1) * n_cols], dst)
        };
        if count * nb >= PARALLEL_ROUNDING {
            // One task per vector: a prefill's rounding would otherwise be serial
            // work between parallel matmuls, with the other cores waiting.
            crate::cpu::team::for_each_chunk_mut(&mut self.blocks, nb, round);
        } else {
            for (v, dst) in self.blocks.chunks_exact_mut(nb).enumerate() {
                round(v, dst);
            }
        }
        self.sums.clear();
        self.sums.resize(count.div_ceil(GROUP) * nb * GROUP, 0.0);
        for (v, blocks) in self.blocks.chunks_exact(nb).enumerate() {
            let base = (v / GROUP) * nb * GROUP + v % GROUP;
            for (i, b) in blocks.iter().enumerate() {
                self.sums[base + i * GROUP] = b.s;
            }
        }
        #[cfg(target_arch = "x86_64")]
        self.flipped.clear();
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            self.wide.clear();
            self.wide
                .extend(self.blocks.iter().map(|b| b.qs.map(i16::from)));
        }
        Ok(())
    }

    /// Holds the blocks flipped too ([`QuantizedActivations`]'s `flipped`), where the
    /// batch has more than [`FLIPPED_PAST`] vectors: for the matrices that read them,
    /// as every other format's would only pay for the copy.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn hold_flipped(&mut self) {
        if self.count > FLIPPED_PAST && self.flipped.is_empty() {
            let flip = |b: &BlockQ8| BlockQ8 {
                qs: b.qs.map(|q| (q as u8 ^ 0x80) as i8),
                ..*b
            };
            self.flipped.extend(self.blocks.iter().map(flip));
        }
    }

    /// The blocks of vector `v`.
    pub(crate) fn vector(&self, v: usize) -> &[BlockQ8] {
        &self.blocks[v * self.nb..(v + 1) * self.nb]
    }

    /// The regrouped sums of the group that holds vector `v`.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn group_sums(&self, v: usize) -> &[f32] {
        let at = (v / GROUP) * self.nb * GROUP;
        &self.sums[at..at + self.nb * GROUP]
    }
}

/// Blocks below which a batch's activations are rounded on the calling thread: a
/// decode step's few vectors round in about the time that handing half of them to
/// another core costs.
const PARALLEL_ROUNDING: usize = 256;

/// Rounds one vector into its blocks of 8-bit values (the last block zero-padded).
pub(crate) fn quantize_vector(isa: Isa, x: &[f32], dst: &mut [BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = isa {
        return super::x86::round::quantize_vector(t, x, dst);
    }
    for (c, b) in x.chunks(QK).zip(dst) {
        let mut v = [0f32; QK];
        v[..c.len()].copy_from_slice(c);
        *b = quantize_block_q8(isa, &v);
    }
}

/// Rounds 32 activations to 8 bits, ties to even (as llama.cpp's SIMD quantizers do);
/// the SIMD and scalar paths give identical blocks.
pub(crate) fn quantize_block_q8(isa: Isa, v: &[f32; QK]) -> BlockQ8 {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = isa {
        return super::x86::round::quantize_block(t, v);
    }
    let _ = isa;
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, &x) in qs.iter_mut().zip(v) {
        // |x * id| <= 127 (up to rounding), and `as` saturates NaN to 0.
        *q = (x * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    let half = |r: &[i8]| r.iter().map(|&q| i16::from(q)).sum::<i16>();
    block_q8(qs, d, [half(&qs[..16]), half(&qs[16..])])
}

pub(crate) fn block_q8(qs: [i8; QK], d: f32, sums: [i16; 2]) -> BlockQ8 {
    BlockQ8 {
        qs,
        d,
        sums,
        s: d * f32::from(sums[0] + sums[1]),
    }
}

/// Rounds an activation vector to 8-bit blocks of 32 (llama.cpp's Q8 activations).
pub fn quantize_activations(x: &[f32]) -> QuantizedActivations {
    let mut q = QuantizedActivations::default();
    if !x.is_empty() {
        q.quantize_from(x, x.len())
            .expect("one vector of its own length");
    }
    q
}
