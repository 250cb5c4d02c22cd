//! ggml weight formats: the block layouts GGUF files store, how to expand them, and the
//! dot products that make CPU inference fast.
//!
//! The hot loop of a CPU forward pass is "one quantized weight row · one activation
//! vector", repeated for every row of every matrix, every token. Expanding each row to
//! f32 first would triple the memory traffic, so the fast path follows llama.cpp: the
//! activation vector is rounded once per matmul to 8-bit blocks of 32
//! ([`QuantizedActivations`]) and every weight block is dotted against it with integer
//! multiply-adds (AVX2 where the CPU has it, portable scalar code elsewhere, e.g. wasm).
//!
//! Block layouts are exactly ggml's (`ggml-common.h`); all multi-byte fields are
//! little-endian, scales are IEEE half floats.

use half::{bf16, f16};

/// Values per activation block (and per block of the 32-wide weight formats).
const QK: usize = 32;

/// A ggml tensor element type, numbered as in `ggml.h` (the number GGUF stores).
///
/// Every type ggml defines is listed so that a file's tensor sizes can be computed even
/// when the type has no kernel here; [`GgmlType::is_supported`] says which ones do.
// ggml's own spellings (Q4_K, IQ2_XXS), so names match llama.cpp's logs and docs.
#[allow(missing_docs, non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// (type, ggml id, values per block, bytes per block), from `ggml.c`'s type traits.
const TYPE_TABLE: [(GgmlType, u32, usize, usize); 34] = [
    (GgmlType::F32, 0, 1, 4),
    (GgmlType::F16, 1, 1, 2),
    (GgmlType::Q4_0, 2, 32, 18),
    (GgmlType::Q4_1, 3, 32, 20),
    (GgmlType::Q5_0, 6, 32, 22),
    (GgmlType::Q5_1, 7, 32, 24),
    (GgmlType::Q8_0, 8, 32, 34),
    (GgmlType::Q8_1, 9, 32, 36),
    (GgmlType::Q2_K, 10, 256, 84),
    (GgmlType::Q3_K, 11, 256, 110),
    (GgmlType::Q4_K, 12, 256, 144),
    (GgmlType::Q5_K, 13, 256, 176),
    (GgmlType::Q6_K, 14, 256, 210),
    (GgmlType::Q8_K, 15, 256, 292),
    (GgmlType::IQ2_XXS, 16, 256, 66),
    (GgmlType::IQ2_XS, 17, 256, 74),
    (GgmlType::IQ3_XXS, 18, 256, 98),
    (GgmlType::IQ1_S, 19, 256, 50),
    (GgmlType::IQ4_NL, 20, 32, 18),
    (GgmlType::IQ3_S, 21, 256, 110),
    (GgmlType::IQ2_S, 22, 256, 82),
    (GgmlType::IQ4_XS, 23, 256, 136),
    (GgmlType::I8, 24, 1, 1),
    (GgmlType::I16, 25, 1, 2),
    (GgmlType::I32, 26, 1, 4),
    (GgmlType::I64, 27, 1, 8),
    (GgmlType::F64, 28, 1, 8),
    (GgmlType::IQ1_M, 29, 256, 56),
    (GgmlType::BF16, 30, 1, 2),
    (GgmlType::TQ1_0, 34, 256, 54),
    (GgmlType::TQ2_0, 35, 256, 66),
    (GgmlType::MXFP4, 39, 32, 17),
    (GgmlType::NVFP4, 40, 64, 36),
    (GgmlType::Q1_0, 41, 128, 18),
];

// The table is in the enum's order, one row per variant (the last variant closes it),
// so a type's row is at its discriminant.
const _: () = {
    let mut i = 0;
    while i < TYPE_TABLE.len() {
        assert!(TYPE_TABLE[i].0 as usize == i);
        i += 1;
    }
    assert!(GgmlType::Q1_0 as usize == TYPE_TABLE.len() - 1);
};

impl GgmlType {
    /// The types this module can dequantize and dot.
    pub const SUPPORTED: [GgmlType; 9] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// This type's row of [`TYPE_TABLE`], by index: the matmuls ask for block sizes
    /// per task, where a search of the table showed in profiles.
    fn entry(self) -> (GgmlType, u32, usize, usize) {
        TYPE_TABLE[self as usize]
    }

    /// The type with ggml's number `id`, or `None` for a number ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPE_TABLE.into_iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// ggml's number for this type, as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Values per block (1 for plain number types).
    pub fn block_size(self) -> usize {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// Whether [`dequantize_row`], [`dot_row`] and [`matmul`] handle this type.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Whether [`matmul`] rounds activations to 8 bits for this type (all block
    /// formats); float weights are dotted against the exact f32 activations.
    pub fn uses_q8_activations(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of one row of `n_cols` values; rows must hold whole blocks.
    pub fn row_bytes(self, n_cols: usize) -> Result<usize, QuantError> {
        let block = self.block_size();
        if !n_cols.is_multiple_of(block) {
            return Err(QuantError::RaggedRow {
                ty: self,
                n_cols,
                block,
            });
        }
        (n_cols / block)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::Overflow)
    }
}

/// Why a quantized-data operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no dequantizer or dot kernel here.
    #[error("ggml type {0:?} is not supported")]
    Unsupported(GgmlType),
    /// A row length that does not split into whole blocks.
    #[error("row length {n_cols} is not a multiple of the {ty:?} block size {block}")]
    RaggedRow {
        /// The weight type.
        ty: GgmlType,
        /// The requested row length.
        n_cols: usize,
        /// The type's block size.
        block: usize,
    },
    /// A buffer whose length does not match the shape.
    #[error("{what} has length {actual}, expected {expected}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A size that does not fit in `usize`.
    #[error("tensor size overflows usize")]
    Overflow,
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::Length {
            what,
            expected,
            actual,
        })
    }
}

#[inline(always)]
fn le_f16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 6-bit scale and min of sub-block `j` from a Q4_K / Q5_K packed scale array
/// (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn unpack_scales_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, q);
    }
    (sc, mn)
}

/// Expands one row of `ty` (`bytes` = whole blocks) into `out`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("row bytes", ty.row_bytes(out.len())?, bytes.len())?;
    let bs = ty.block_size();
    let bb = ty.block_bytes();
    for (blk, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
        dequantize_block(ty, blk, y);
    }
    Ok(())
}

/// Expands one block; `b` and `y` have the type's block sizes.
fn dequantize_block(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    match ty {
        GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => y[0] = le_f16(b, 0),
        GgmlType::BF16 => y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        GgmlType::Q8_0 => {
            let d = le_f16(b, 0);
            for (v, &q) in y.iter_mut().zip(&b[2..34]) {
                *v = d * f32::from(q as i8);
            }
        }
        GgmlType::Q4_0 => {
            let d = le_f16(b, 0);
            for (j, &q) in b[2..18].iter().enumerate() {
                y[j] = d * f32::from((q & 0xF) as i8 - 8);
                y[j + 16] = d * f32::from((q >> 4) as i8 - 8);
            }
        }
        GgmlType::Q4_1 => {
            let (d, m) = (le_f16(b, 0), le_f16(b, 2));
            for (j, &q) in b[4..20].iter().enumerate() {
                y[j] = d * f32::from(q & 0xF) + m;
                y[j + 16] = d * f32::from(q >> 4) + m;
            }
        }
        GgmlType::Q4_K => {
            let (d, dmin) = (le_f16(b, 0), le_f16(b, 2));
            let (sc, mn) = unpack_scales_k4(&b[4..16]);
            let qs = &b[16..144];
            for j in 0..4 {
                let q = &qs[32 * j..32 * j + 32];
                let (d1, m1) = (d * f32::from(sc[2 * j]), dmin * f32::from(mn[2 * j]));
                let (d2, m2) = (
                    d * f32::from(sc[2 * j + 1]),
                    dmin * f32::from(mn[2 * j + 1]),
                );
                for l in 0..32 {
                    y[64 * j + l] = d1 * f32::from(q[l] & 0xF) - m1;
                    y[64 * j + 32 + l] = d2 * f32::from(q[l] >> 4) - m2;
                }
            }
        }
        GgmlType::Q5_K => {
            let (d, dmin) = (le_f16(b, 0), le_f16(b, 2));
            let (sc, mn) = unpack_scales_k4(&b[4..16]);
            let qh = &b[16..48];
            let qs = &b[48..176];
            for j in 0..4 {
                let q = &qs[32 * j..32 * j + 32];
                let (d1, m1) = (d * f32::from(sc[2 * j]), dmin * f32::from(mn[2 * j]));
                let (d2, m2) = (
                    d * f32::from(sc[2 * j + 1]),
                    dmin * f32::from(mn[2 * j + 1]),
                );
                for l in 0..32 {
                    let h1 = ((qh[l] >> (2 * j)) & 1) << 4;
                    let h2 = ((qh[l] >> (2 * j + 1)) & 1) << 4;
                    y[64 * j + l] = d1 * f32::from((q[l] & 0xF) | h1) - m1;
                    y[64 * j + 32 + l] = d2 * f32::from((q[l] >> 4) | h2) - m2;
                }
            }
        }
        GgmlType::Q6_K => {
            let d = le_f16(b, 208);
            for (e, v) in y.iter_mut().enumerate() {
                *v = d * f32::from(b[192 + e / 16] as i8) * f32::from(q6k_value(b, e));
            }
        }
        _ => unreachable!("dequantize_block is only called for supported types"),
    }
}

/// The signed 6-bit value of element `e` (0..256) of a Q6_K block.
#[inline(always)]
fn q6k_value(b: &[u8], e: usize) -> i8 {
    let (half, p) = (e / 128, e % 128);
    let (g, l) = (p / 32, p % 32);
    let ql = b[64 * half + (g & 1) * 32 + l];
    let qh = b[128 + 32 * half + l];
    let lo = (ql >> (4 * (g >> 1))) & 0xF;
    let hi = (qh >> (2 * g)) & 3;
    (lo | (hi << 4)) as i8 - 32
}

/// Dot product of one weight row with an f32 vector, exact up to f32 rounding.
///
/// The row is expanded one block at a time on the stack, never as a whole. This is the
/// reference path (and the path for float weights); [`dot_row_q8`] is the fast one.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("row bytes", ty.row_bytes(x.len())?, row.len())?;
    Ok(dot_row_f32_unchecked(ty, row, x))
}

fn dot_row_f32_unchecked(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    match ty {
        GgmlType::F32 => row
            .chunks_exact(4)
            .zip(x)
            .map(|(b, &x)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * x)
            .sum(),
        _ => {
            // Float types have block size 1; expand them 256 values at a time so the
            // multiply-add loop below runs over a slice the compiler can vectorise.
            let bs = ty.block_size();
            let per = if bs == 1 { 256 } else { bs };
            let chunk_bytes = per / bs * ty.block_bytes();
            let mut buf = [0f32; 256];
            let mut acc = 0f32;
            for (b, xs) in row.chunks(chunk_bytes).zip(x.chunks(per)) {
                let y = &mut buf[..xs.len()];
                for (blk, yv) in b.chunks_exact(ty.block_bytes()).zip(y.chunks_exact_mut(bs)) {
                    dequantize_block(ty, blk, yv);
                }
                acc += y.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
            }
            acc
        }
    }
}

/// One block of 32 activations rounded to 8 bits: `x[i] ≈ d * qs[i]`.
///
/// The sums of the two 16-value halves let the kernels fold in the weight formats'
/// offsets (Q4_0's −8, Q4_1's and the K-quants' mins, Q6_K's −32) with one scalar
/// multiply per block instead of per value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BlockQ8 {
    qs: [i8; QK],
    d: f32,
    sums: [i16; 2],
    /// `d * (sum of qs)`: the term a weight block's min or offset multiplies.
    s: f32,
}

/// Activation vectors per group of the batched kernels: each weight block is unpacked
/// once and dotted against this many vectors before the next block is loaded, which
/// is what makes a prefill (or a batched decode) cheaper per token than one vector at
/// a time. Eight keeps a tile's accumulators within the 16 AVX2 registers.
const GROUP: usize = 8;

/// Activation vectors rounded once to 8-bit blocks of 32, to be dotted against many
/// quantized weight rows ([`dot_row_q8`], [`matmul_q8`], [`matmul_many`]).
#[derive(Debug, Clone, Default)]
pub struct QuantizedActivations {
    /// Values per vector (before padding to whole blocks).
    len: usize,
    /// Vectors.
    count: usize,
    /// Blocks per vector.
    nb: usize,
    /// `count * nb` blocks, vector after vector.
    blocks: Vec<BlockQ8>,
    /// Every block's `s` again, regrouped so that a kernel folds one weight block's
    /// offset into a whole group of vectors with a single vector FMA: for each group
    /// of [`GROUP`] consecutive vectors, for each block index, the group's `GROUP`
    /// sums (zero past the last vector).
    sums: Vec<f32>,
    /// Every block's values again, widened to 16 bits: wasm SIMD multiplies 16-bit
    /// lanes (`i32x4.dot_i16x8_s`), and widening once here spares each weight row
    /// that this input meets from widening it again.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    wide: Vec<[i16; QK]>,
}

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
            crate::team::for_each_chunk_mut(&mut self.blocks, nb, round);
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
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            self.wide.clear();
            self.wide
                .extend(self.blocks.iter().map(|b| b.qs.map(i16::from)));
        }
        Ok(())
    }

    /// The blocks of vector `v`.
    fn vector(&self, v: usize) -> &[BlockQ8] {
        &self.blocks[v * self.nb..(v + 1) * self.nb]
    }

    /// The regrouped sums of the group that holds vector `v`.
    #[cfg(target_arch = "x86_64")]
    fn group_sums(&self, v: usize) -> &[f32] {
        let at = (v / GROUP) * self.nb * GROUP;
        &self.sums[at..at + self.nb * GROUP]
    }
}

/// Blocks below which a batch's activations are rounded on the calling thread: a
/// decode step's eight vectors of 576 values (144 blocks) take 2.4 µs on one core,
/// about what handing half of them to another core costs (before rounding was
/// vectorised, at 40 ns a block, it took 5.8 µs on one thread and 8.0 µs on two).
const PARALLEL_ROUNDING: usize = 256;

/// Rounds one vector into its blocks of 8-bit values (the last block zero-padded).
fn quantize_vector(isa: Isa, x: &[f32], dst: &mut [BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = isa {
        return x86::quantize_vector(t, x, dst);
    }
    for (c, b) in x.chunks(QK).zip(dst) {
        let mut v = [0f32; QK];
        v[..c.len()].copy_from_slice(c);
        *b = quantize_block_q8(isa, &v);
    }
}

/// Rounds 32 activations to 8 bits, ties to even (as llama.cpp's SIMD quantizers do);
/// the SIMD and scalar paths give identical blocks.
fn quantize_block_q8(isa: Isa, v: &[f32; QK]) -> BlockQ8 {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = isa {
        return x86::quantize_block(t, v);
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

fn block_q8(qs: [i8; QK], d: f32, sums: [i16; 2]) -> BlockQ8 {
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

/// Which instruction set the kernels may use, decided by runtime detection (which std
/// caches, so asking again is a couple of loads).
#[derive(Debug, Clone, Copy)]
enum Isa {
    Scalar,
    /// Holding this value proves AVX2, FMA and F16C were detected on this CPU.
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2Token),
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = x86::Avx2Token::detect() {
            return Isa::Avx2(t);
        }
        Isa::Scalar
    }

    /// Whether there are kernels for [`PackedMatrix`] panels here (`None` if not), and
    /// if so whether their Q8_0 values are stored plus 128, for `vpdpbusd`, and how
    /// many rows a panel holds.
    fn panels(self) -> Option<(bool, usize)> {
        match self {
            Isa::Scalar => None,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(t) => Some((t.dpbusd(), t.panel_rows())),
        }
    }
}

/// Fast dot product of one quantized weight row with quantized activations (the
/// first vector of `qx`).
///
/// Float weight types (F32, F16, BF16) are accepted too, against the 8-bit values, but
/// [`matmul`] keeps f32 activations for them.
pub fn dot_row_q8(ty: GgmlType, row: &[u8], qx: &QuantizedActivations) -> Result<f32, QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("row bytes", ty.row_bytes(qx.len)?, row.len())?;
    if qx.count == 0 {
        return Ok(0.0);
    }
    Ok(dot_q8_dispatch(Isa::detect(), ty, row, qx, 0))
}

/// One weight row against vector `v` of `qx`; `row` must hold exactly `qx.nb` blocks'
/// worth of values.
#[inline]
fn dot_q8_dispatch(isa: Isa, ty: GgmlType, row: &[u8], qx: &QuantizedActivations, v: usize) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                let x = x86::Xs {
                    blocks: qx.vector(v),
                    sums: qx.group_sums(v),
                    lane: v % GROUP,
                    nb: qx.nb,
                };
                x86::tile::<1, 1>(t, ty, [row], x)[0][0]
            }
            GgmlType::Q4_K => x86::dot_q4_k(t, row, qx.vector(v)),
            GgmlType::Q5_K => x86::dot_q5_k(t, row, qx.vector(v)),
            GgmlType::Q6_K => x86::dot_q6_k(t, row, qx.vector(v)),
            _ => scalar::dot(ty, row, qx.vector(v)),
        },
        Isa::Scalar => {
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            if let Some(d) = wasm::dot(ty, row, qx.vector(v)) {
                return d;
            }
            scalar::dot(ty, row, qx.vector(v))
        }
    }
}

/// `out[b * n_rows + r] = W[r] · xs[b * n_cols ..][..n_cols]` for a row-major weight
/// matrix `W` of `n_rows × n_cols` values of type `ty`, for a batch of activation
/// vectors laid end to end in `xs`.
///
/// Block formats round each activation vector to 8 bits first (as llama.cpp does);
/// each weight row is read once for the whole batch, which is what makes batched
/// decoding cheaper per token than one vector at a time.
pub fn matmul(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    xs: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let mut job = [MatJob {
        ty,
        weights,
        packed: None,
        n_rows,
        out,
    }];
    matmul_many(&mut job, n_cols, xs, &mut QuantizedActivations::default())
}

/// One weight matrix of a [`matmul_many`] call and where its results go
/// (`out[b * n_rows + r]`, as in [`matmul`]).
#[derive(Debug)]
pub struct MatJob<'a> {
    /// The weights' format.
    pub ty: GgmlType,
    /// Row-major `n_rows × n_cols` weights.
    pub weights: &'a [u8],
    /// The same weights rearranged by [`PackedMatrix::new`], used instead of
    /// `weights` when present.
    pub packed: Option<&'a PackedMatrix>,
    /// Rows (outputs per vector).
    pub n_rows: usize,
    /// `batch × n_rows` results.
    pub out: &'a mut [f32],
}

/// Rows per panel of a [`PackedMatrix`]: one per 32-bit lane of an AVX2 register.
const PANEL: usize = 8;

/// A Q4_1 or Q8_0 matrix rearranged once at load time so that each 32-bit lane of a
/// SIMD register holds a different row: one `vpdpbusd` then advances eight rows (16
/// with AVX-512) by four values each, and the rows' scales convert with one
/// instruction, so a block of eight rows costs a fraction of the instructions of
/// eight separate rows.
///
/// Layout: panels of `w` rows, [`PANEL`] for the 256-bit kernels and twice that for
/// the AVX-512 ones (one register's lanes); in each, block after block:
/// - Q4_1, `20w` bytes: the rows' f16 scales, their f16 mins, then for `g` in 0..4
///   the rows' quant bytes `4g..4g + 4` (low nibbles: values `4g..`, high nibbles:
///   values `16 + 4g..`);
/// - Q8_0, `34w` bytes: the rows' f16 scales, then for `g` in 0..8 the rows' values
///   `4g..4g + 4`: where the CPU has `vpdpbusd`, each plus 128 (unsigned, as it takes
///   its first operand; the kernel takes `128 × Σx` back off, exactly, in integers);
///   elsewhere as stored, signed (see `x86::packed_q8_0_plain`).
///
/// A last 16-row panel past the matrix's rows holds zeros there, whose results are
/// dropped. Whole 16-row panels let each of the AVX-512 kernel's loads be one
/// instruction, where two 8-row panels side by side took two loads and an insert:
/// the Q4_1 kernel alone at eight vectors, with its weights in L1, ran a median 9%
/// faster on a 2-core Xeon (fifteen alternating runs).
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    ty: GgmlType,
    /// Q8_0 values are stored plus 128, for `vpdpbusd`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    plus_128: bool,
    /// Rows per panel: [`PANEL`], or twice that for the AVX-512 kernels.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    panel_rows: usize,
    n_rows: usize,
    n_cols: usize,
    /// Only x86 has kernels for the layout so far (elsewhere `new` returns `None`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    data: Vec<u8>,
}

impl PackedMatrix {
    /// Whether the `vpdpbusd` kernels can take this matrix: Q4_1 panels are the same
    /// for every kernel, Q8_0 ones only when stored plus 128.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn for_dpbusd(&self) -> bool {
        self.ty == GgmlType::Q4_1 || self.plus_128
    }

    /// Bytes of one block of a panel of `rows` rows.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn block_bytes(ty: GgmlType, rows: usize) -> usize {
        match ty {
            GgmlType::Q8_0 => 34 * rows,
            _ => 20 * rows,
        }
    }

    /// Repacks `weights` (`n_rows × n_cols` of `ty`) when this CPU has the kernels for
    /// the packed layout (AVX2; Q4_1 and Q8_0) and the rows fill whole 8-row panels;
    /// `None` otherwise, and the matrix is used as stored.
    pub fn new(ty: GgmlType, weights: &[u8], n_rows: usize, n_cols: usize) -> Option<Self> {
        Self::pack(Isa::detect(), ty, weights, n_rows, n_cols)
    }

    /// [`PackedMatrix::new`] for the kernels of `isa`.
    fn pack(isa: Isa, ty: GgmlType, weights: &[u8], n_rows: usize, n_cols: usize) -> Option<Self> {
        let (plus_128, width) = isa.panels()?;
        if !matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0) {
            return None;
        }
        let rb = ty.row_bytes(n_cols).ok()?;
        if n_rows == 0 || !n_rows.is_multiple_of(PANEL) || weights.len() != rb * n_rows {
            return None;
        }
        let nb = n_cols / QK;
        let (src_block, dst_block) = (rb / nb, Self::block_bytes(ty, width));
        let mut data = vec![0u8; n_rows.div_ceil(width) * nb * dst_block];
        for (p, dst) in data.chunks_exact_mut(nb * dst_block).enumerate() {
            let rows = p * width..((p + 1) * width).min(n_rows);
            for (i, out) in dst.chunks_exact_mut(dst_block).enumerate() {
                for (r, row) in rows.clone().enumerate() {
                    let at = row * rb + src_block * i;
                    let b = &weights[at..at + src_block];
                    out[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
                    if ty == GgmlType::Q4_1 {
                        let m = 2 * width + 2 * r;
                        out[m..m + 2].copy_from_slice(&b[2..4]);
                        for g in 0..4 {
                            let at = 4 * width * (g + 1) + 4 * r;
                            out[at..at + 4].copy_from_slice(&b[4 + 4 * g..8 + 4 * g]);
                        }
                    } else {
                        for g in 0..8 {
                            for k in 0..4 {
                                let v = b[2 + 4 * g + k];
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

/// Several matrices against the same activations in one parallel pass: the vectors
/// are rounded to 8 bits once (into `scratch`, reused across calls) and the rows of
/// all matrices are shared out to the cores together, so Q, K and V (or gate and up)
/// cost one fork-join instead of three.
pub fn matmul_many(
    jobs: &mut [MatJob<'_>],
    n_cols: usize,
    xs: &[f32],
    scratch: &mut QuantizedActivations,
) -> Result<(), QuantError> {
    if n_cols == 0 || !xs.len().is_multiple_of(n_cols) {
        return Err(QuantError::Length {
            what: "activations",
            expected: n_cols,
            actual: xs.len(),
        });
    }
    let batch = xs.len() / n_cols;
    for j in jobs.iter() {
        if !j.ty.is_supported() {
            return Err(QuantError::Unsupported(j.ty));
        }
        check_matrix(j.ty, j.weights, j.n_rows, n_cols, batch, j.out.len())?;
        if let Some(p) = j.packed
            && (p.n_rows, p.n_cols) != (j.n_rows, n_cols)
        {
            return Err(QuantError::Length {
                what: "packed matrix rows",
                expected: j.n_rows,
                actual: p.n_rows,
            });
        }
    }
    if jobs.iter().any(|j| j.ty.uses_q8_activations()) {
        scratch.quantize_from(xs, n_cols)?;
    } else {
        *scratch = QuantizedActivations::default();
    }
    run_jobs(jobs, n_cols, batch, xs, scratch);
    Ok(())
}

/// [`matmul`] with activations already quantized (by [`QuantizedActivations::quantize_from`]),
/// so that one rounding can serve many calls. Block formats only.
pub fn matmul_q8(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    qx: &QuantizedActivations,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if !ty.is_supported() || !ty.uses_q8_activations() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("quantized activations", n_cols, qx.len)?;
    check_matrix(ty, weights, n_rows, n_cols, qx.count, out.len())?;
    let mut job = [MatJob {
        ty,
        weights,
        packed: None,
        n_rows,
        out,
    }];
    run_jobs(&mut job, n_cols, qx.count, &[], qx);
    Ok(())
}

/// Validates a matmul's shapes and returns the bytes per weight row.
fn check_matrix(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    batch: usize,
    out_len: usize,
) -> Result<usize, QuantError> {
    let rb = ty.row_bytes(n_cols)?;
    let total = rb.checked_mul(n_rows).ok_or(QuantError::Overflow)?;
    check_len("weights", total, weights.len())?;
    let out_total = n_rows.checked_mul(batch).ok_or(QuantError::Overflow)?;
    check_len("output", out_total, out_len)?;
    Ok(rb)
}

/// About this many weight bytes per task: enough work to amortise scheduling, small
/// enough that two cores balance even on the K and V projections of a decode step.
const TASK_BYTES: usize = 16 * 1024;

/// A job's output, shared by the tasks that fill it in parallel.
#[derive(Debug, Clone, Copy)]
struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a `SharedOut` stands for an `&'a mut [f32]` (which is Send and Sync) lent to
// one parallel region; the only access through it is `write`, whose contract keeps
// the threads on disjoint entries.
unsafe impl Send for SharedOut<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    fn new(out: &'a mut [f32]) -> Self {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Stores `v` at entry `i` (bounds-checked).
    ///
    /// # Safety
    /// No other thread may access entry `i` while the borrow this came from lasts.
    unsafe fn write(self, i: usize, v: f32) {
        assert!(i < self.len, "output index {i} out of {}", self.len);
        // SAFETY: `i < len` keeps the store inside the borrowed slice, and the caller
        // guarantees that no other thread touches entry `i`.
        unsafe { self.ptr.add(i).write(v) }
    }

    /// Stores `v` at entries `i .. i + 8` (bounds-checked): a panel's eight rows of
    /// one vector, which lie side by side in the output.
    ///
    /// # Safety
    /// No other thread may access those entries while the borrow this came from lasts.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    unsafe fn write_lanes(self, i: usize, v: &[f32; 8]) {
        assert!(
            i + 8 <= self.len,
            "output entries {i}..+8 out of {}",
            self.len
        );
        // SAFETY: `i + 8 <= len` keeps the stores inside the borrowed slice, `v` is a
        // separate array (no overlap), and the caller guarantees no other thread
        // touches these entries.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), 8) }
    }
}

/// One job as its tasks see it.
#[derive(Debug, Clone, Copy)]
struct Part<'a> {
    ty: GgmlType,
    weights: &'a [u8],
    /// Read by the x86 kernels only (there are no packed matrices elsewhere).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    packed: Option<&'a PackedMatrix>,
    n_rows: usize,
    /// Bytes per row.
    rb: usize,
    /// Rows per task.
    per: usize,
    /// Index of the job's first task.
    first: usize,
    out: SharedOut<'a>,
}

/// Runs validated jobs: each job's rows are cut into tasks of about [`TASK_BYTES`],
/// and the tasks of all jobs are spread over the cores together.
fn run_jobs(
    jobs: &mut [MatJob<'_>],
    n_cols: usize,
    batch: usize,
    xs: &[f32],
    qx: &QuantizedActivations,
) {
    if batch == 0 {
        return;
    }
    let isa = Isa::detect();
    let mut n_tasks = 0;
    let parts: Vec<Part<'_>> = jobs
        .iter_mut()
        .map(|j| {
            let rb = j.ty.row_bytes(n_cols).expect("validated shape");
            // Whole panels per task when packed, of either width (8 rows, or 16 for
            // AVX-512).
            let per = (TASK_BYTES / rb.max(1)).clamp(2 * PANEL, 4096) / (2 * PANEL) * (2 * PANEL);
            let first = n_tasks;
            n_tasks += j.n_rows.div_ceil(per);
            Part {
                ty: j.ty,
                weights: j.weights,
                packed: j.packed,
                n_rows: j.n_rows,
                rb,
                per,
                first,
                out: SharedOut::new(j.out),
            }
        })
        .collect();
    let task = |t: usize| {
        // The job whose tasks hold `t`: the last one starting at or before it.
        let p = parts
            .iter()
            .rev()
            .find(|p| p.first <= t)
            .expect("task 0 belongs to the first job");
        let r0 = (t - p.first) * p.per;
        let rows = r0..(r0 + p.per).min(p.n_rows);
        let (out, n_rows) = (p.out, p.n_rows);
        let put = |v: usize, r: usize, val: f32| {
            // SAFETY: `r` is one of this task's rows, and the tasks partition each
            // job's rows, so entry (v, r) is written by this task alone.
            unsafe { out.write(v * n_rows + r, val) }
        };
        run_task(isa, p, rows, n_cols, xs, qx, put);
    };
    crate::team::run(n_tasks, task);
}

/// A kernel of one weight row against `V` consecutive vectors of a batch (those from
/// `g`), for [`rows_by_four`].
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
trait RowKernel {
    fn row<const V: usize>(&self, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V];
}

/// Rows `rows` against every vector of `qx`, up to four vectors per pass over a row,
/// so that each of a row's blocks is unpacked once per four vectors rather than once
/// per vector; `put(v, r, value)` takes each result.
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
fn rows_by_four(
    kernel: &impl RowKernel,
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    qx: &QuantizedActivations,
    put: &mut impl FnMut(usize, usize, f32),
) {
    for r in rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for g in (0..qx.count).step_by(4) {
            let mut emit = |vals: &[f32]| {
                for (k, &val) in vals.iter().enumerate() {
                    put(g + k, r, val);
                }
            };
            match qx.count - g {
                1 => emit(&kernel.row::<1>(row, qx, g)),
                2 => emit(&kernel.row::<2>(row, qx, g)),
                3 => emit(&kernel.row::<3>(row, qx, g)),
                _ => emit(&kernel.row::<4>(row, qx, g)),
            }
        }
    }
}

/// Rows `rows` of one matrix against every vector: batched tile kernels where the
/// format has them, else one dot per (row, vector).
fn run_task(
    isa: Isa,
    p: &Part<'_>,
    rows: std::ops::Range<usize>,
    n_cols: usize,
    xs: &[f32],
    qx: &QuantizedActivations,
    mut put: impl FnMut(usize, usize, f32),
) {
    let (ty, weights, rb) = (p.ty, p.weights, p.rb);
    let batch = if ty.uses_q8_activations() {
        qx.count
    } else {
        xs.len() / n_cols
    };
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = isa {
        if let Some(pm) = p.packed {
            let (out, n_rows) = (p.out, p.n_rows);
            let mut put_lanes = |v: usize, r0: usize, lanes: &[f32; 8]| {
                // SAFETY: a packed job's tasks hold whole panels, so rows r0..r0 + 8
                // are this task's alone (the tasks partition each job's rows).
                unsafe { out.write_lanes(v * n_rows + r0, lanes) }
            };
            return x86::packed_rows(t, pm, rows, qx, &mut put_lanes);
        }
        if x86::matmul_rows(t, ty, weights, rb, rows.clone(), qx, &mut put) {
            return;
        }
        if x86::k_quant_rows(t, ty, weights, rb, rows.clone(), qx, &mut put) {
            return;
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if wasm::matmul_rows(ty, weights, rb, rows.clone(), qx, &mut put) {
        return;
    }
    for r in rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for v in 0..batch {
            let val = if ty.uses_q8_activations() {
                dot_q8_dispatch(isa, ty, row, qx, v)
            } else {
                dot_row_f32_unchecked(ty, row, &xs[v * n_cols..(v + 1) * n_cols])
            };
            put(v, r, val);
        }
    }
}

/// The f32 vector helpers of the forward pass (attention's scores and weighted sums),
/// bound once to the instruction set detected, as they run on slices of one head.
#[derive(Debug, Clone, Copy)]
pub struct F32Ops(Isa);

impl F32Ops {
    /// The helpers for this CPU.
    pub fn detect() -> Self {
        F32Ops(Isa::detect())
    }

    /// `scores[h][t] = q[h] · keys[t * stride..][..head_dim]` for every query head
    /// `h` and position `t`: the attention scores of `heads` query heads that share
    /// one key/value head, against a cache (of half floats) whose positions are
    /// `stride` apart. `q` holds the heads side by side, `scores` one row of
    /// positions per head. The heads go through the keys together, so each key is
    /// read and widened once for all of them; each score is summed as it would be
    /// alone.
    pub fn dots(self, q: &[f32], heads: usize, keys: &[f16], stride: usize, scores: &mut [f32]) {
        let (hd, n) = (q.len() / heads.max(1), scores.len() / heads.max(1));
        assert!(
            heads > 0 && q.len() == heads * hd && scores.len() == heads * n,
            "{heads} heads of queries and scores"
        );
        if n == 0 {
            return;
        }
        assert!(
            (n - 1) * stride + hd <= keys.len(),
            "keys too short for {n} positions"
        );
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0
            && hd == x86::HEAD
        {
            return x86::dots(t, q, heads, keys, stride, scores);
        }
        for (qh, sh) in q.chunks_exact(hd).zip(scores.chunks_exact_mut(n)) {
            for (t, s) in sh.iter_mut().enumerate() {
                let k = &keys[t * stride..t * stride + hd];
                // Eight running sums the compiler can keep in vector lanes.
                let mut acc = [0f32; 8];
                let (cq, ck) = (qh.chunks_exact(8), k.chunks_exact(8));
                let tail: f32 = cq
                    .remainder()
                    .iter()
                    .zip(ck.remainder())
                    .map(|(a, &b)| a * half_to_f32(b))
                    .sum();
                for (a, b) in cq.zip(ck) {
                    for l in 0..8 {
                        acc[l] += a[l] * half_to_f32(b[l]);
                    }
                }
                *s = acc.iter().sum::<f32>() + tail;
            }
        }
    }

    /// `out[h] += Σ_t weights[h][t] · values[t * stride..][..head_dim]`: the attention
    /// output of `heads` query heads that share one key/value head, from a cache of
    /// half floats (`weights` one row of positions per head, `out` the heads side by
    /// side). As in [`F32Ops::dots`], each value is widened once for all the heads.
    /// Each output value is one chain of multiply-adds from its value in `out`, in
    /// position order, so a cache in two parts summed by two calls gives the same bits
    /// as one call over both.
    pub fn weighted_sum(
        self,
        weights: &[f32],
        heads: usize,
        values: &[f16],
        stride: usize,
        out: &mut [f32],
    ) {
        let (hd, n) = (out.len() / heads.max(1), weights.len() / heads.max(1));
        assert!(
            heads > 0 && out.len() == heads * hd && weights.len() == heads * n,
            "{heads} heads of weights and outputs"
        );
        if n == 0 {
            return;
        }
        assert!(
            (n - 1) * stride + hd <= values.len(),
            "values too short for {n} positions"
        );
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0
            && hd == x86::HEAD
        {
            return x86::weighted_sum(t, weights, heads, values, stride, out);
        }
        for (wh, oh) in weights.chunks_exact(n).zip(out.chunks_exact_mut(hd)) {
            for (t, &w) in wh.iter().enumerate() {
                let v = &values[t * stride..t * stride + hd];
                for (o, &x) in oh.iter_mut().zip(v) {
                    *o += w * half_to_f32(x);
                }
            }
        }
    }

    /// Appends `src` to `dst` as half floats, rounded to nearest even and saturated
    /// at ±65504 (so that no key or value becomes infinite); NaN stays NaN. F16C
    /// rounds as [`f16::from_f32`] does, so every target stores the same bits.
    pub fn append_halves(self, src: &[f32], dst: &mut Vec<f16>) {
        dst.reserve(src.len());
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::append_halves(t, src, dst);
        }
        dst.extend(src.iter().map(|&x| to_half(x)));
    }

    /// `scores = softmax(scale · scores)` in place: one head's attention weights.
    pub fn softmax(self, scores: &mut [f32], scale: f32) {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::softmax(t, scores, scale);
        }
        softmax_lanes(scores, scale);
    }

    /// `gate[i] = silu(gate[i]) · up[i]`: the MLP's gated activation. The same
    /// arithmetic on every target (no fused multiply-adds), so results do not depend
    /// on the instruction set; AVX2 only makes the vectors twice as wide.
    pub fn swiglu(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "gate and up of one width");
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.0 {
            return x86::swiglu(t, gate, up);
        }
        swiglu_lanes(gate, up);
    }
}

/// A machine's int8 multiply-add rate, measured by [`int8_peak`].
#[derive(Debug, Clone, Copy)]
pub struct Int8Peak {
    /// Multiply-adds per second, on every thread of the forward pass.
    pub macs_per_sec: f64,
    /// The instruction issued: `vpdpbusd` (VNNI) or `vpmaddubsw` (AVX2).
    pub instruction: &'static str,
}

/// This machine's int8 multiply-add rate with every thread of the forward pass issuing
/// the block-format kernels' multiplying instruction on registers alone: `vpdpbusd`
/// (AVX-512 VNNI, else AVX-VNNI), else AVX2's `vpmaddubsw` (whose 16-bit pair sums the
/// kernels still widen, so there it is a looser ceiling). `acs bench` sets its decode
/// rates against it. `None` without AVX2.
pub fn int8_peak() -> Option<Int8Peak> {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = Isa::detect() {
        // Eight loops per thread, so that a helper that starts late still gets its
        // share; about 20 ms in all at a few G instructions per second.
        let (loops, iters) = (8 * crate::team::threads(), 500_000u64);
        let (macs, instruction) = x86::int8_macs(t);
        let start = std::time::Instant::now();
        crate::team::session(|| crate::team::run(loops, |_| x86::int8_spin(t, iters)));
        let secs = start.elapsed().as_secs_f64();
        return Some(Int8Peak {
            macs_per_sec: (loops as u64 * iters * macs) as f64 / secs,
            instruction,
        });
    }
    None
}

/// The body of [`F32Ops::softmax`], inlined into each instruction set's copy.
#[inline(always)]
fn softmax_lanes(scores: &mut [f32], scale: f32) {
    use crate::lanes::{LANES, max_of};
    let max = max_of(scores) * scale;
    let mut sums = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, x) in sums.iter_mut().zip(c) {
            *x = crate::exp::exp(*x * scale - max);
            *s += *x;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for x in chunks.into_remainder() {
        *x = crate::exp::exp(*x * scale - max);
        sum += *x;
    }
    for x in scores.iter_mut() {
        *x /= sum;
    }
}

/// The largest finite half float, where KV cache values saturate.
const HALF_MAX: f32 = 65504.0;

/// The half float nearest `x` (ties to even), saturated at ±[`HALF_MAX`]: a KV cache
/// value.
pub fn to_half(x: f32) -> f16 {
    f16::from_f32(x.clamp(-HALF_MAX, HALF_MAX))
}

/// `h` as f32 (exact): by table in wasm, which has no conversion instruction.
#[inline(always)]
fn half_to_f32(h: f16) -> f32 {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return wasm::f16_table()[usize::from(h.to_bits())];
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    h.to_f32()
}

/// The body of [`F32Ops::swiglu`], inlined into each instruction set's copy.
#[inline(always)]
fn swiglu_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + crate::exp::exp(-*g)) * u;
    }
}

/// Portable kernels: plain integer loops that compile everywhere (wasm included) and
/// serve as the reference the SIMD kernels are tested against.
mod scalar {
    use super::*;

    #[inline(always)]
    fn idot(w: &[i8; QK], x: &[i8; QK]) -> i32 {
        w.iter()
            .zip(x)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum()
    }

    #[inline(always)]
    fn idot_u(w: &[u8; QK], x: &[i8; QK]) -> i32 {
        w.iter()
            .zip(x)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum()
    }

    pub(super) fn dot(ty: GgmlType, row: &[u8], x: &[BlockQ8]) -> f32 {
        match ty {
            GgmlType::Q8_0 => row
                .chunks_exact(34)
                .zip(x)
                .map(|(b, xb)| {
                    let w: &[i8; QK] = &std::array::from_fn(|i| b[2 + i] as i8);
                    le_f16(b, 0) * xb.d * idot(w, &xb.qs) as f32
                })
                .sum(),
            GgmlType::Q4_0 => row
                .chunks_exact(18)
                .zip(x)
                .map(|(b, xb)| {
                    let w = nibbles(&b[2..18]);
                    le_f16(b, 0) * (xb.d * idot_u(&w, &xb.qs) as f32 - 8.0 * xb.s)
                })
                .sum(),
            GgmlType::Q4_1 => row
                .chunks_exact(20)
                .zip(x)
                .map(|(b, xb)| {
                    let w = nibbles(&b[4..20]);
                    le_f16(b, 0) * xb.d * idot_u(&w, &xb.qs) as f32 + le_f16(b, 2) * xb.s
                })
                .sum(),
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let bb = ty.block_bytes();
                row.chunks_exact(bb)
                    .zip(x.chunks_exact(8))
                    .map(|(b, xs)| {
                        let (d, dmin) = (le_f16(b, 0), le_f16(b, 2));
                        let (sc, mn) = unpack_scales_k4(&b[4..16]);
                        let (qh, qs) = if ty == GgmlType::Q5_K {
                            (Some(&b[16..48]), &b[48..176])
                        } else {
                            (None, &b[16..144])
                        };
                        let mut acc = 0f32;
                        for (s, xb) in xs.iter().enumerate() {
                            let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
                            let shift = 4 * (s % 2);
                            let w: [u8; QK] = std::array::from_fn(|l| {
                                let h = qh.map_or(0, |h| ((h[l] >> s) & 1) << 4);
                                ((q[l] >> shift) & 0xF) | h
                            });
                            acc += xb.d * d * f32::from(sc[s]) * idot_u(&w, &xb.qs) as f32
                                - dmin * f32::from(mn[s]) * xb.s;
                        }
                        acc
                    })
                    .sum()
            }
            GgmlType::Q6_K => row
                .chunks_exact(210)
                .zip(x.chunks_exact(8))
                .map(|(b, xs)| {
                    let d = le_f16(b, 208);
                    let mut acc = 0f32;
                    for (s, xb) in xs.iter().enumerate() {
                        let mut isum = 0i32;
                        for (h, xh) in xb.qs.chunks_exact(16).enumerate() {
                            let e0 = 32 * s + 16 * h;
                            let part: i32 = xh
                                .iter()
                                .enumerate()
                                .map(|(i, &q)| i32::from(q6k_value(b, e0 + i)) * i32::from(q))
                                .sum();
                            isum += i32::from(b[192 + e0 / 16] as i8) * part;
                        }
                        acc += d * xb.d * isum as f32;
                    }
                    acc
                })
                .sum(),
            // Float weights: expand each block of 32 and dot with the rounded values.
            _ => {
                let per = QK * ty.block_bytes();
                row.chunks(per)
                    .zip(x)
                    .map(|(b, xb)| {
                        let mut y = [0f32; QK];
                        for (blk, v) in b.chunks_exact(ty.block_bytes()).zip(&mut y) {
                            dequantize_block(ty, blk, std::slice::from_mut(v));
                        }
                        let s: f32 = y.iter().zip(&xb.qs).map(|(a, &q)| a * f32::from(q)).sum();
                        s * xb.d
                    })
                    .sum()
            }
        }
    }

    /// The 32 nibbles of a 16-byte Q4 block in value order: low nibbles then high.
    #[inline(always)]
    fn nibbles(q: &[u8]) -> [u8; QK] {
        std::array::from_fn(|i| if i < 16 { q[i] & 0xF } else { q[i - 16] >> 4 })
    }
}

/// WebAssembly SIMD128 kernels, the browser's CPU backend: the dot products of the
/// 8- and 4-bit formats and of the K-quants (Q4_K, Q5_K, Q6_K) with 8-bit
/// activations, 16 lanes at a time (widened to 16 bits and multiplied pairwise into
/// 32-bit sums). Compiled in when the build enables `simd128`, as
/// `.cargo/config.toml` does for every wasm32 build; wasm has no runtime feature
/// detection, and every browser ACS targets runs SIMD128.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;
    use std::sync::OnceLock;

    use super::*;

    /// Every f16 as f32: wasm has no f16 conversion instruction, and the software
    /// one costs more per block than the block's 32 multiplies.
    pub(super) fn f16_table() -> &'static [f32] {
        static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
        TABLE.get_or_init(|| (0..=u16::MAX).map(|h| f16::from_bits(h).to_f32()).collect())
    }

    /// The little-endian f16 at `b[at..at + 2]`, by table.
    #[inline(always)]
    fn le_f16(table: &[f32], b: &[u8], at: usize) -> f32 {
        table[usize::from(u16::from_le_bytes([b[at], b[at + 1]]))]
    }

    /// `b[at..at + 16]` as a vector.
    #[inline(always)]
    fn load(b: &[u8], at: usize) -> v128 {
        let s: &[u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
        // SAFETY: `s` is 16 readable bytes, and `v128_load` needs no alignment.
        unsafe { v128_load(s.as_ptr().cast()) }
    }

    /// Half `h` (0 or 1) of a block's 32 activation values.
    #[inline(always)]
    fn load_x(x: &BlockQ8, h: usize) -> v128 {
        let s: &[i8; 16] = x.qs[16 * h..16 * h + 16].try_into().expect("16 values");
        // SAFETY: as in `load`.
        unsafe { v128_load(s.as_ptr().cast()) }
    }

    /// Four partial sums of `a[i] * b[i]` over 16 signed bytes.
    #[inline(always)]
    fn dot16(a: v128, b: v128) -> v128 {
        i32x4_add(
            i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), i16x8_extend_low_i8x16(b)),
            i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), i16x8_extend_high_i8x16(b)),
        )
    }

    /// `acc + isum * scale`, lane-wise.
    #[inline(always)]
    fn add_scaled(acc: v128, isum: v128, scale: f32) -> v128 {
        f32x4_add(
            acc,
            f32x4_mul(f32x4_convert_i32x4(isum), f32x4_splat(scale)),
        )
    }

    /// Values `32s..32s + 32` (sub-block `s`) of a Q4_K or Q5_K super-block as two
    /// vectors of 16: `qs` holds the nibbles (sub-blocks `2j` and `2j + 1` share
    /// bytes `32j..`, low nibbles and high), `qh` Q5_K's fifth bits (bit `s` of byte
    /// `l` for value `l`). Values 0..31 are valid signed bytes.
    #[inline(always)]
    fn k4_values(qs: &[u8], qh: Option<&[u8]>, s: usize) -> [v128; 2] {
        std::array::from_fn(|h| {
            let q = load(qs, 32 * (s / 2) + 16 * h);
            let w = if s.is_multiple_of(2) {
                v128_and(q, u8x16_splat(0x0F))
            } else {
                u8x16_shr(q, 4)
            };
            match qh {
                Some(qh) => {
                    let bit = v128_and(u8x16_shr(load(qh, 16 * h), s as u32), u8x16_splat(1));
                    v128_or(w, i8x16_shl(bit, 4))
                }
                None => w,
            }
        })
    }

    /// Values `32s..32s + 32` (sub-block `s`) of a Q6_K super-block as two vectors
    /// of 16 signed values (-32..31): four low bits from `ql`, two high ones from
    /// `qh`, laid out as [`super::q6k_value`] reads them.
    #[inline(always)]
    fn q6_values(b: &[u8], s: usize) -> [v128; 2] {
        let (half, g) = (s / 4, s % 4);
        std::array::from_fn(|h| {
            let ql = load(b, 64 * half + (g & 1) * 32 + 16 * h);
            let qh = load(b, 128 + 32 * half + 16 * h);
            let lo = v128_and(u8x16_shr(ql, 4 * (g as u32 >> 1)), u8x16_splat(0x0F));
            let hi = v128_and(u8x16_shr(qh, 2 * g as u32), u8x16_splat(3));
            i8x16_sub(v128_or(lo, i8x16_shl(hi, 4)), i8x16_splat(32))
        })
    }

    /// Q6_K's integer sum of sub-block `s` of super-block `b`: `halves` are its two
    /// halves' four partial sums, and each half of 16 values has its own scale (a
    /// signed byte from `b[192..208]`).
    #[inline(always)]
    fn q6_scaled(halves: [v128; 2], b: &[u8], s: usize) -> v128 {
        let sc = |h: usize| i32x4_splat(i32::from(b[192 + 2 * s + h] as i8));
        i32x4_add(i32x4_mul(halves[0], sc(0)), i32x4_mul(halves[1], sc(1)))
    }

    /// One weight row of `ty` against `x`, for Q8_0, Q4_0, Q4_1 and the K-quants Q4_K,
    /// Q5_K and Q6_K; `None` for the other formats (the portable code serves them).
    pub(super) fn dot(ty: GgmlType, row: &[u8], x: &[BlockQ8]) -> Option<f32> {
        let mut acc = f32x4_splat(0.0);
        // The per-block terms outside the integer dot (a Q4 block's offset or min).
        let mut extra = 0f32;
        let low = u8x16_splat(0x0F);
        let t = f16_table();
        match ty {
            GgmlType::Q8_0 => {
                for (b, xb) in row.chunks_exact(34).zip(x) {
                    let i = i32x4_add(
                        dot16(load(b, 2), load_x(xb, 0)),
                        dot16(load(b, 18), load_x(xb, 1)),
                    );
                    acc = add_scaled(acc, i, le_f16(t, b, 0) * xb.d);
                }
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                // Q4_0: value = d * (nibble - 8); Q4_1: value = d * nibble + m.
                let (bb, q0) = if ty == GgmlType::Q4_0 {
                    (18, 2)
                } else {
                    (20, 4)
                };
                for (b, xb) in row.chunks_exact(bb).zip(x) {
                    let q = load(b, q0);
                    // Nibbles 0..15 are valid signed bytes: low ones are values 0..16,
                    // high ones 16..32.
                    let i = i32x4_add(
                        dot16(v128_and(q, low), load_x(xb, 0)),
                        dot16(u8x16_shr(q, 4), load_x(xb, 1)),
                    );
                    let d = le_f16(t, b, 0);
                    acc = add_scaled(acc, i, d * xb.d);
                    extra += if ty == GgmlType::Q4_0 {
                        -8.0 * d * xb.s
                    } else {
                        le_f16(t, b, 2) * xb.s
                    };
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                for (b, xs) in row.chunks_exact(ty.block_bytes()).zip(x.chunks_exact(8)) {
                    let (d, dmin) = (le_f16(t, b, 0), le_f16(t, b, 2));
                    let (sc, mn) = unpack_scales_k4(&b[4..16]);
                    let (qh, qs) = k4_parts(ty, b);
                    for (s, xb) in xs.iter().enumerate() {
                        let w = k4_values(qs, qh, s);
                        let i = i32x4_add(dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1)));
                        acc = add_scaled(acc, i, d * f32::from(sc[s]) * xb.d);
                        extra -= dmin * f32::from(mn[s]) * xb.s;
                    }
                }
            }
            GgmlType::Q6_K => {
                for (b, xs) in row.chunks_exact(210).zip(x.chunks_exact(8)) {
                    let d = le_f16(t, b, 208);
                    for (s, xb) in xs.iter().enumerate() {
                        let w = q6_values(b, s);
                        let halves = [dot16(w[0], load_x(xb, 0)), dot16(w[1], load_x(xb, 1))];
                        acc = add_scaled(acc, q6_scaled(halves, b, s), d * xb.d);
                    }
                }
            }
            _ => return None,
        }
        Some(finish([acc], [extra])[0])
    }

    /// Values `8k..8k + 8` of a block's widened activations.
    #[inline(always)]
    fn load_wide(x: &[i16; QK], k: usize) -> v128 {
        let s: &[i16; 8] = x[8 * k..8 * k + 8].try_into().expect("8 values");
        // SAFETY: `s` is 16 readable bytes, and `v128_load` needs no alignment.
        unsafe { v128_load(s.as_ptr().cast()) }
    }

    /// A block's 32 weights (two vectors of 16 signed bytes) widened to 16 bits:
    /// values `8k..8k + 8` in vector `k`, as [`load_wide`] reads the activations.
    #[inline(always)]
    fn widen(a: v128, b: v128) -> [v128; 4] {
        [
            i16x8_extend_low_i8x16(a),
            i16x8_extend_high_i8x16(a),
            i16x8_extend_low_i8x16(b),
            i16x8_extend_high_i8x16(b),
        ]
    }

    /// Four partial sums of a block's 32 widened weights times its 32 activations.
    #[inline(always)]
    fn dot32(w: &[v128; 4], x: &[i16; QK]) -> v128 {
        let d = |k: usize| i32x4_dot_i16x8(w[k], load_wide(x, k));
        i32x4_add(i32x4_add(d(0), d(1)), i32x4_add(d(2), d(3)))
    }

    /// A Q4_K or Q5_K super-block's fifth bits (Q5_K only) and nibbles.
    #[inline(always)]
    fn k4_parts(ty: GgmlType, b: &[u8]) -> (Option<&[u8]>, &[u8]) {
        if ty == GgmlType::Q5_K {
            (Some(&b[16..48]), &b[48..176])
        } else {
            (None, &b[16..144])
        }
    }

    /// Four partial sums of 16 widened weights times widened activations `8k..8k + 16`.
    #[inline(always)]
    fn dot16_wide(w: &[v128; 4], x: &[i16; QK], k: usize) -> v128 {
        i32x4_add(
            i32x4_dot_i16x8(w[k], load_wide(x, k)),
            i32x4_dot_i16x8(w[k + 1], load_wide(x, k + 1)),
        )
    }

    /// Whether [`tile`] serves `ty`: the formats [`dot`] serves (the portable code
    /// serves the others).
    fn has_kernel(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }

    /// One weight row of a format that [`has_kernel`] serves against vectors
    /// `g..g + V` of `qx`: each block's weights are loaded, unpacked and widened once
    /// for all of them, and the activations come widened already. Each vector sees
    /// the float operations of [`dot`], in its order (the integer sums are exact in
    /// any order), so batched and single results agree exactly.
    #[inline(always)]
    fn tile<const V: usize>(
        ty: GgmlType,
        row: &[u8],
        qx: &QuantizedActivations,
        g: usize,
    ) -> [f32; V] {
        let nb = qx.nb;
        let blocks: [&[BlockQ8]; V] = std::array::from_fn(|v| qx.vector(g + v));
        let wide: [&[[i16; QK]]; V] = std::array::from_fn(|v| &qx.wide[(g + v) * nb..][..nb]);
        let mut acc = [f32x4_splat(0.0); V];
        // The per-block terms outside the integer dot (a Q4 block's offset or min).
        let mut extra = [0f32; V];
        let t = f16_table();
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                for (i, b) in row.chunks_exact(ty.block_bytes()).enumerate() {
                    let (d, dmin) = (le_f16(t, b, 0), le_f16(t, b, 2));
                    let (sc, mn) = unpack_scales_k4(&b[4..16]);
                    let (qh, qs) = k4_parts(ty, b);
                    for s in 0..8 {
                        let [w0, w1] = k4_values(qs, qh, s);
                        let w = widen(w0, w1);
                        for (((acc, extra), x), xw) in
                            acc.iter_mut().zip(&mut extra).zip(blocks).zip(wide)
                        {
                            let xb = &x[8 * i + s];
                            *acc = add_scaled(
                                *acc,
                                dot32(&w, &xw[8 * i + s]),
                                d * f32::from(sc[s]) * xb.d,
                            );
                            *extra -= dmin * f32::from(mn[s]) * xb.s;
                        }
                    }
                }
            }
            GgmlType::Q6_K => {
                for (i, b) in row.chunks_exact(210).enumerate() {
                    let d = le_f16(t, b, 208);
                    for s in 0..8 {
                        let [w0, w1] = q6_values(b, s);
                        let w = widen(w0, w1);
                        for ((acc, x), xw) in acc.iter_mut().zip(blocks).zip(wide) {
                            let (xb, xw) = (&x[8 * i + s], &xw[8 * i + s]);
                            let halves = [dot16_wide(&w, xw, 0), dot16_wide(&w, xw, 2)];
                            *acc = add_scaled(*acc, q6_scaled(halves, b, s), d * xb.d);
                        }
                    }
                }
            }
            GgmlType::Q8_0 => {
                for (i, b) in row.chunks_exact(34).enumerate() {
                    let w = widen(load(b, 2), load(b, 18));
                    let d = le_f16(t, b, 0);
                    for ((acc, x), xw) in acc.iter_mut().zip(blocks).zip(wide) {
                        *acc = add_scaled(*acc, dot32(&w, &xw[i]), d * x[i].d);
                    }
                }
            }
            _ => {
                // Q4_0: value = d * (nibble - 8); Q4_1: value = d * nibble + m.
                let (bb, q0) = if ty == GgmlType::Q4_0 {
                    (18, 2)
                } else {
                    (20, 4)
                };
                let low = u8x16_splat(0x0F);
                for (i, b) in row.chunks_exact(bb).enumerate() {
                    let q = load(b, q0);
                    // Nibbles 0..15 are valid signed bytes: low ones are values 0..16,
                    // high ones 16..32.
                    let w = widen(v128_and(q, low), u8x16_shr(q, 4));
                    let d = le_f16(t, b, 0);
                    let m = if bb == 18 { -8.0 * d } else { le_f16(t, b, 2) };
                    for (((acc, extra), x), xw) in
                        acc.iter_mut().zip(&mut extra).zip(blocks).zip(wide)
                    {
                        let xb = &x[i];
                        *acc = add_scaled(*acc, dot32(&w, &xw[i]), d * xb.d);
                        *extra += m * xb.s;
                    }
                }
            }
        }
        finish(acc, extra)
    }

    /// Each vector's lanes summed as [`dot`] sums them, plus its scalar terms.
    #[inline(always)]
    fn finish<const V: usize>(acc: [v128; V], extra: [f32; V]) -> [f32; V] {
        std::array::from_fn(|v| {
            let a = acc[v];
            let lanes = f32x4_extract_lane::<0>(a)
                + f32x4_extract_lane::<1>(a)
                + f32x4_extract_lane::<2>(a)
                + f32x4_extract_lane::<3>(a);
            lanes + extra[v]
        })
    }

    /// [`tile`] for a format that [`has_kernel`] serves.
    struct Tile(GgmlType);

    impl super::RowKernel for Tile {
        #[inline(always)]
        fn row<const V: usize>(&self, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V] {
            tile(self.0, row, qx, g)
        }
    }

    /// Rows `rows` against every vector of a batch (two or more), up to four vectors
    /// per pass over a row (more would not fit the 16 SIMD registers that V8 maps
    /// wasm's onto on x86); `false` for the formats [`tile`] does not serve and for a
    /// lone vector, which [`dot`] serves (in headless Chromium a decode of one
    /// sequence ran no faster through the widened activations, slower in some runs;
    /// one of 4 choices ran about half again as fast).
    pub(super) fn matmul_rows(
        ty: GgmlType,
        weights: &[u8],
        rb: usize,
        rows: std::ops::Range<usize>,
        qx: &QuantizedActivations,
        put: &mut impl FnMut(usize, usize, f32),
    ) -> bool {
        if !has_kernel(ty) || qx.count < 2 {
            return false;
        }
        super::rows_by_four(&Tile(ty), weights, rb, rows, qx, put);
        true
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 kernels. Each weight block's 4-, 5-, 6- or 8-bit values are widened to
    //! bytes in registers and multiplied against the activation bytes, with AVX-VNNI's
    //! `vpdpbusd` (u8 × i8, four products summed into each i32) where the CPU has it,
    //! else `vpmaddubsw` + `vpmaddwd`; then scaled in f32 per block. Offsets and mins
    //! use the activation block sums.

    use super::{BlockQ8, GROUP, GgmlType, PANEL, QK, QuantizedActivations, unpack_scales_k4};
    use half::f16;
    use std::arch::x86_64::*;

    /// Proof that AVX2, FMA and F16C are available (and AVX-VNNI when `vnni` is set):
    /// only [`Avx2Token::detect`] makes one, from runtime detection.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Avx2Token {
        vnni: bool,
        /// AVX-512 F, BW, VL and VNNI: 16-row packed panels in 512-bit registers.
        avx512: bool,
    }

    impl Avx2Token {
        pub(super) fn detect() -> Option<Self> {
            (is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"))
            .then(|| Avx2Token {
                vnni: is_x86_feature_detected!("avxvnni"),
                avx512: is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni"),
            })
        }

        /// Whether the packed kernels use `vpdpbusd` (AVX-VNNI, or AVX-512 VNNI): then
        /// Q8_0 panels hold their values
        /// plus 128, which `vpmaddubsw` cannot take (its 16-bit pair sums of those,
        /// up to 2 × 255 × 127, would saturate).
        pub(super) fn dpbusd(self) -> bool {
            self.vnni || self.avx512
        }

        /// Rows per panel of the packed matrices: one register's 32-bit lanes.
        pub(super) fn panel_rows(self) -> usize {
            if self.avx512 { 2 * PANEL } else { PANEL }
        }

        /// The same proof without AVX-VNNI or AVX-512 (always sound: it claims less),
        /// so tests cover the `vpmaddubsw` path on CPUs that have both.
        #[cfg(test)]
        pub(super) fn without_vnni(self) -> Self {
            Avx2Token {
                vnni: false,
                avx512: false,
            }
        }

        /// The same proof without AVX-512, so tests cover the 256-bit packed kernels.
        #[cfg(test)]
        pub(super) fn without_avx512(self) -> Self {
            Avx2Token {
                avx512: false,
                ..self
            }
        }
    }

    macro_rules! safe_entry {
        ($name:ident => $imp:ident) => {
            #[inline]
            pub(super) fn $name(_t: Avx2Token, row: &[u8], x: &[BlockQ8]) -> f32 {
                // SAFETY: an `Avx2Token` exists only after runtime detection found
                // AVX2, FMA and F16C, the features `$imp` is compiled for; `$imp`
                // reads `row` and `x` only through bounds-checked slicing.
                unsafe { $imp::<1>(row, [x])[0] }
            }
        };
    }
    safe_entry!(dot_q4_k => q4_k);
    safe_entry!(dot_q5_k => q5_k);
    safe_entry!(dot_q6_k => q6_k);

    #[inline(always)]
    fn load16(b: &[u8]) -> __m128i {
        let b: &[u8; 16] = b[..16].try_into().expect("16 bytes");
        // SAFETY: `b` is 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
    }

    #[inline(always)]
    fn load32(b: &[u8]) -> __m256i {
        let b: &[u8; 32] = b[..32].try_into().expect("32 bytes");
        // SAFETY: `b` is 32 readable bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    #[inline(always)]
    fn load_x(x: &BlockQ8) -> __m256i {
        // SAFETY: `qs` is 32 readable bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(x.qs.as_ptr().cast()) }
    }

    #[inline(always)]
    fn load8f(v: &[f32]) -> __m256 {
        let v: &[f32; 8] = v[..8].try_into().expect("8 floats");
        // SAFETY: `v` is 8 readable floats; the load is unaligned.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    /// Σ u8 × i8 over 32 lanes, as 8 i32 partial sums.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mul_sum_us8(ax: __m256i, sy: __m256i) -> __m256i {
        let dot = _mm256_maddubs_epi16(ax, sy);
        _mm256_madd_epi16(dot, _mm256_set1_epi16(1))
    }

    /// [`mul_sum_us8`] in one instruction.
    #[inline]
    #[target_feature(enable = "avx2,avxvnni")]
    fn mul_sum_us8_vnni(ax: __m256i, sy: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy)
    }

    /// `acc +` [`mul_sum_us8`]`(ax, sy)` in one instruction, accumulating in place
    /// (the integer sums are exact, so the order of additions does not change a
    /// result).
    #[inline]
    #[target_feature(enable = "avx2,avxvnni")]
    fn add_mul_sum_us8_vnni(acc: __m256i, ax: __m256i, sy: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, ax, sy)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum_ps(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        _mm_cvtsi128_si32(s)
    }

    /// The 32 nibbles of 16 bytes, low nibbles in the first 16 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn unpack_nibbles(q: __m128i) -> __m256i {
        let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
        _mm256_and_si256(both, _mm256_set1_epi8(0xF))
    }

    /// A little-endian f16 at `b[at..]`, converted by the F16C unit.
    #[inline]
    #[target_feature(enable = "f16c")]
    fn h2f(b: &[u8], at: usize) -> f32 {
        let bits = u16::from_le_bytes([b[at], b[at + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// The two little-endian f16s at the start of `b` (Q4_1's scale and min), each
    /// broadcast to all lanes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn h2f_pair(b: &[u8]) -> (__m256, __m256) {
        let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let both = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        (
            _mm256_broadcastss_ps(both),
            _mm256_broadcastss_ps(_mm_movehdup_ps(both)),
        )
    }

    /// The activations side of a tile: `V` consecutive vectors of `nb` blocks and the
    /// regrouped sums of their group, whose lane `lane` is the first vector's.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Xs<'a> {
        pub(super) blocks: &'a [BlockQ8],
        pub(super) sums: &'a [f32],
        pub(super) lane: usize,
        pub(super) nb: usize,
    }

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

    /// The 32-wide formats' tile kernels, compiled once per instruction set: `R`
    /// weight rows against `V` activation vectors (`V + x.lane <= GROUP`), each weight
    /// block unpacked once for all `V` vectors and each activation block loaded once
    /// for all `R` rows. Every (row, vector) pair sees the same operations in the same
    /// order whatever the tile shape, so batched and single results agree exactly.
    macro_rules! tile_kernels {
        ($m:ident, $features:tt, $idot:ident) => {
            mod $m {
                use super::*;

                #[inline]
                #[target_feature(enable = $features)]
                pub(super) fn q4_0<const R: usize, const V: usize>(
                    rows: [&[u8]; R],
                    x: Xs<'_>,
                ) -> [[f32; V]; R] {
                    let mut acc = [[_mm256_setzero_ps(); V]; R];
                    let mut off = [_mm256_setzero_ps(); R];
                    for i in 0..x.nb {
                        let s8 = load8f(&x.sums[i * GROUP..]);
                        for r in 0..R {
                            let b = &rows[r][18 * i..18 * i + 18];
                            let d = _mm256_set1_ps(h2f(b, 0));
                            let w = unpack_nibbles(load16(&b[2..]));
                            off[r] = _mm256_fmadd_ps(d, s8, off[r]);
                            for v in 0..V {
                                let xb = &x.blocks[v * x.nb + i];
                                let p = $idot(w, load_x(xb));
                                let sc = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
                                acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][v]);
                            }
                        }
                    }
                    finish(acc, off, -8.0, x.lane)
                }

                #[inline]
                #[target_feature(enable = $features)]
                pub(super) fn q4_1<const R: usize, const V: usize>(
                    rows: [&[u8]; R],
                    x: Xs<'_>,
                ) -> [[f32; V]; R] {
                    let mut acc = [[_mm256_setzero_ps(); V]; R];
                    let mut off = [_mm256_setzero_ps(); R];
                    for i in 0..x.nb {
                        let s8 = load8f(&x.sums[i * GROUP..]);
                        for r in 0..R {
                            let b = &rows[r][20 * i..20 * i + 20];
                            let (d, m) = h2f_pair(b);
                            let w = unpack_nibbles(load16(&b[4..]));
                            off[r] = _mm256_fmadd_ps(m, s8, off[r]);
                            for v in 0..V {
                                let xb = &x.blocks[v * x.nb + i];
                                let p = $idot(w, load_x(xb));
                                let sc = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
                                acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][v]);
                            }
                        }
                    }
                    finish(acc, off, 1.0, x.lane)
                }

                #[inline]
                #[target_feature(enable = $features)]
                pub(super) fn q8_0<const R: usize, const V: usize>(
                    rows: [&[u8]; R],
                    x: Xs<'_>,
                ) -> [[f32; V]; R] {
                    let mut acc = [[_mm256_setzero_ps(); V]; R];
                    for i in 0..x.nb {
                        for r in 0..R {
                            let b = &rows[r][34 * i..34 * i + 34];
                            let d = _mm256_set1_ps(h2f(b, 0));
                            let w = load32(&b[2..]);
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

    /// One tile of a Q4_0, Q4_1 or Q8_0 matrix (see `tile_kernels`).
    #[inline]
    pub(super) fn tile<const R: usize, const V: usize>(
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
            match (ty, t.vnni) {
                (GgmlType::Q4_0, true) => vnni::q4_0(rows, x),
                (GgmlType::Q4_0, false) => plain::q4_0(rows, x),
                (GgmlType::Q4_1, true) => vnni::q4_1(rows, x),
                (GgmlType::Q4_1, false) => plain::q4_1(rows, x),
                (GgmlType::Q8_0, true) => vnni::q8_0(rows, x),
                (GgmlType::Q8_0, false) => plain::q8_0(rows, x),
                _ => unreachable!("tile kernels exist for Q4_0, Q4_1 and Q8_0 only"),
            }
        }
    }

    /// Rows per stretch of [`matmul_rows`]: 32 rows of 1536 Q4_0 columns are 27 KiB,
    /// within a core's L1 data cache.
    const STRETCH: usize = 32;

    /// Rows `rows` of a Q4_0, Q4_1 or Q8_0 matrix against every vector of `qx`, in
    /// tiles; `put(v, r, value)` takes each result. `false` (and nothing done) for
    /// other formats.
    pub(super) fn matmul_rows(
        t: Avx2Token,
        ty: GgmlType,
        weights: &[u8],
        rb: usize,
        rows: std::ops::Range<usize>,
        qx: &QuantizedActivations,
        put: &mut impl FnMut(usize, usize, f32),
    ) -> bool {
        if !matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) {
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

    /// Activations `at..at + 4` of a block in every 32-bit lane: the four values each
    /// row's lane multiplies in one `vpdpbusd` of a packed panel.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn broadcast4(qs: &[i8; QK], at: usize) -> __m256i {
        let b = |k: usize| qs[at + k] as u8;
        _mm256_set1_epi32(i32::from_le_bytes([b(0), b(1), b(2), b(3)]))
    }

    /// The eight lanes (one per row of a panel) as floats.
    #[inline]
    #[target_feature(enable = "avx")]
    fn lanes(v: __m256) -> [f32; 8] {
        let mut o = [0f32; 8];
        // SAFETY: `o` is 8 writable floats; the store is unaligned.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
        o
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

    /// Q4_1 panels of a [`super::PackedMatrix`] against `V` vectors, compiled once per
    /// way of summing a block (`$step`, `$widen`): each lane of the accumulators is one
    /// of the panel's eight rows. One accumulator per vector takes both a block's
    /// scaled sum and its mins term: two per vector left four vectors short of the 16
    /// AVX2 registers (20 spills per block; 6 now). Every (row, vector) pair sees the
    /// same operations in the same order whatever `V`, so batched and single results
    /// agree exactly.
    macro_rules! packed_q4_1_kernel {
        ($name:ident, $features:tt, $step:ident, $widen:ident) => {
            #[inline]
            #[target_feature(enable = $features)]
            fn $name<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 8]; V] {
                let mask = _mm256_set1_epi8(0xF);
                let share = prefetch_stride(ahead, x.nb);
                let mut acc = [_mm256_setzero_ps(); V];
                for i in 0..x.nb {
                    let b = &panel[160 * i..160 * i + 160];
                    prefetch_share(ahead, i, share);
                    let xs: [&[i8; QK]; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i].qs);
                    let mut sums = [_mm256_setzero_si256(); V];
                    for g in 0..4 {
                        let wg = load32(&b[32 + 32 * g..]);
                        let wl = _mm256_and_si256(wg, mask);
                        let wh = _mm256_and_si256(_mm256_srli_epi16(wg, 4), mask);
                        for (s, qs) in sums.iter_mut().zip(xs) {
                            *s = $step(
                                *s,
                                wl,
                                wh,
                                broadcast4(qs, 4 * g),
                                broadcast4(qs, 16 + 4 * g),
                            );
                        }
                    }
                    let d = _mm256_cvtph_ps(load16(b));
                    let m = _mm256_cvtph_ps(load16(&b[16..]));
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
    packed_q4_1_kernel!(
        packed_q4_1_vnni,
        "avx2,fma,f16c,avxvnni",
        q4_1_step_vnni,
        q4_1_widen_vnni
    );
    packed_q4_1_kernel!(
        packed_q4_1_plain,
        "avx2,fma,f16c",
        q4_1_step_plain,
        q4_1_widen_plain
    );

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

    /// Bytes of `ahead` to ask for per block of a kernel's `nb`: whole cache lines,
    /// computed once per call so that the blocks' loop divides nothing.
    #[inline]
    fn prefetch_stride(ahead: &[u8], nb: usize) -> usize {
        ahead.len().div_ceil(nb.max(1)).next_multiple_of(64)
    }

    /// Asks for share `i` (`share` bytes, from [`prefetch_stride`]) of `ahead` (the
    /// next panel of the 256-bit kernels) to come into the cache. At eight vectors a core
    /// needs about 10 GB/s of weights, about what one core streams from DRAM, and the
    /// hardware prefetcher alone let the loads and the arithmetic take turns (a cold
    /// panel cost the sum of the two); spread over the blocks, these requests keep the
    /// memory busy while the kernel computes.
    #[inline]
    #[target_feature(enable = "sse")]
    fn prefetch_share(ahead: &[u8], i: usize, share: usize) {
        let start = (i * share).min(ahead.len());
        let end = (start + share).min(ahead.len());
        for at in (start..end).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead[at..].as_ptr().cast());
        }
    }

    /// Where the AVX-512 kernels' prefetches go: the next panel (`ahead`) when it is
    /// whole, else this one again (asking for lines already in L1 is nearly free, and
    /// keeps the kernel's loop free of branches).
    #[inline]
    fn next_panel(panel: &[u8], ahead: &[u8]) -> *const u8 {
        if ahead.len() == panel.len() {
            ahead.as_ptr()
        } else {
            panel.as_ptr()
        }
    }

    /// Asks for block `i` of the panel at `next` (blocks of `BLOCK` bytes), while
    /// block `i` of this panel computes: the same offsets as the block's own loads,
    /// so the addresses cost no arithmetic beyond theirs, where sharing out the next
    /// panel's bytes evenly (`prefetch_share`, as the 256-bit kernels do) computed
    /// each block's share with scalar instructions that compete with the vector ones
    /// for ports. `quant_bench`'s `decode_step_matmuls` (medians of three alternating
    /// runs): one vector 2.14 → 1.78 ms, eight 4.87 → 4.54.
    #[inline]
    #[target_feature(enable = "sse")]
    fn prefetch_block<const BLOCK: usize>(next: *const u8, i: usize) {
        for at in (0..BLOCK).step_by(64) {
            // Prefetches never fault, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(BLOCK * i + at).cast());
        }
    }

    /// Whether the AVX-512 kernels keep two sums a vector (a block's low and high
    /// halves, added at its end) rather than one: with the vectors' sums interleaved,
    /// eight vectors give the `vpdpbusd` ports independent chains enough, and one sum
    /// spares an addition (the Q8_0 kernel alone: 96–109 G MAC/s with two, 114 with
    /// one); fewer vectors wait on the chains' latency with one (at one vector 36–37
    /// against 38–42).
    #[inline]
    const fn split_sums(vectors: usize) -> bool {
        vectors < 8
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

    /// One block of a panel (`b`, Q8_0's bytes if `Q8`, else Q4_1's) against every
    /// vector, as integer sums: Q8_0's plus 128 times the vector's sum (its values
    /// are stored plus 128), Q4_1's of the unsigned nibbles.
    ///
    /// Each group goes to every vector before the next group, so that the vectors'
    /// sums, independent chains, lie side by side in the instruction stream. One
    /// vector's whole block after another's put each vector's dependent `vpdpbusd`s
    /// back to back, and the ports waited on their latency: on a 2-core Xeon
    /// (AVX-512 VNNI), the Q4_1 kernel alone on L1-resident panels went from
    /// 106–107 to 119–123 G MAC/s a core at eight vectors, 81–83 to 86–94 at four,
    /// the same at one (Q8_0: 78–86 → 114 at eight, 74–79 → 88–97 at four, 34–35 →
    /// 38–42 at one); a decode step of eight sequences from 14.7 to 13.4 ms and from
    /// 15.0 to 14.0 (two sets of eight alternating runs of 100 steps, medians).
    /// Eight vectors are chains enough for one sum each; fewer keep two, the blocks'
    /// low and high halves (see [`split_sums`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn block_sums<const V: usize, const Q8: bool>(b: &[u8], xb: &[&BlockQ8; V]) -> [__m512i; V] {
        let mask = _mm512_set1_epi8(0xF);
        let mut lo = [_mm512_setzero_si512(); V];
        let mut hi = [_mm512_setzero_si512(); V];
        for g in 0..4 {
            // The weights to multiply with values 4g..4g + 4 and 16 + 4g..20 + 4g.
            let (wl, wh) = if Q8 {
                (load64(&b[32 + 64 * g..]), load64(&b[288 + 64 * g..]))
            } else {
                let wg = load64(&b[64 + 64 * g..]);
                let high = _mm512_srli_epi16(wg, 4);
                (_mm512_and_si512(wg, mask), _mm512_and_si512(high, mask))
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
        std::array::from_fn(|v| sum_halves::<V>(lo[v], hi[v]))
    }

    /// [`packed_q4_1_vnni`] on a 16-row Q4_1 panel, with AVX-512: every lane runs the
    /// same operations in the same order as in the 256-bit kernel, so results are
    /// identical, at twice the rows per instruction and with 32 registers for the
    /// sums of up to eight vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn packed_q4_1_512<const V: usize>(panel: &[u8], ahead: &[u8], x: Xs<'_>) -> [[f32; 16]; V] {
        let mut acc = [_mm512_setzero_ps(); V];
        let next = next_panel(panel, ahead);
        for i in 0..x.nb {
            let b = &panel[320 * i..320 * i + 320];
            prefetch_block::<320>(next, i);
            let d = halves16(b);
            let m = halves16(&b[32..]);
            let xb: [&BlockQ8; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i]);
            let sums = block_sums::<V, false>(b, &xb);
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
            prefetch_block::<544>(next, i);
            let d = halves16(b);
            let xb: [&BlockQ8; V] = std::array::from_fn(|v| &x.blocks[v * x.nb + i]);
            let sums = block_sums::<V, true>(b, &xb);
            for v in 0..V {
                let offset = 128 * (i32::from(xb[v].sums[0]) + i32::from(xb[v].sums[1]));
                let p = _mm512_sub_epi32(sums[v], _mm512_set1_epi32(offset));
                let sc = _mm512_mul_ps(d, _mm512_set1_ps(xb[v].d));
                acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[v]);
            }
        }
        std::array::from_fn(|v| lanes16(acc[v]))
    }

    /// Rows `rows` (whole panels) of a packed matrix against every vector of `qx`;
    /// `put_lanes(v, r0, values)` takes the eight rows `r0..r0 + 8` of vector `v`.
    pub(super) fn packed_rows(
        t: Avx2Token,
        pm: &super::PackedMatrix,
        rows: std::ops::Range<usize>,
        qx: &QuantizedActivations,
        put_lanes: &mut impl FnMut(usize, usize, &[f32; 8]),
    ) {
        let nb = qx.nb;
        let width = pm.panel_rows;
        let panel_bytes = nb * super::PackedMatrix::block_bytes(pm.ty, width);
        let panel = |r0: usize| {
            let p = r0 / width;
            &pm.data[p * panel_bytes..(p + 1) * panel_bytes]
        };
        // Panels are the outer loop, so that a panel comes from memory once per call
        // and from L1 for the next group of vectors: a batch's step streams each
        // weight once, as a single sequence's does.
        if width == 2 * PANEL {
            assert!(
                t.avx512 && pm.for_dpbusd(),
                "16-row panels are packed for the AVX-512 kernels alone"
            );
            debug_assert!(rows.start.is_multiple_of(width), "whole panels");
            let q8 = pm.ty == GgmlType::Q8_0;
            for r0 in rows.clone().step_by(width) {
                let this = panel(r0);
                // The next panel, whether this task's or the next one's (none past
                // the matrix's last: the kernel then asks for this one again).
                let next = (r0 / width + 1) * panel_bytes;
                let next = pm.data.get(next..next + panel_bytes).unwrap_or(&[]);
                // The high eight rows of a last panel past the matrix's rows (zeros)
                // are dropped.
                let high = r0 + PANEL < rows.end;
                for g in (0..qx.count).step_by(8) {
                    // The first group of vectors asks for all of the next panel.
                    let ahead = if g == 0 { next } else { &[] };
                    let nv = (qx.count - g).min(8);
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
                    // every token proves: the features of the kernels called. They
                    // touch memory only through bounds-checked slicing.
                    unsafe {
                        match nv {
                            1 => emit(&packed_512::<1>(q8, this, ahead, x)),
                            2 => emit(&packed_512::<2>(q8, this, ahead, x)),
                            3 => emit(&packed_512::<3>(q8, this, ahead, x)),
                            4 => emit(&packed_512::<4>(q8, this, ahead, x)),
                            5 => emit(&packed_512::<5>(q8, this, ahead, x)),
                            6 => emit(&packed_512::<6>(q8, this, ahead, x)),
                            7 => emit(&packed_512::<7>(q8, this, ahead, x)),
                            _ => emit(&packed_512::<8>(q8, this, ahead, x)),
                        }
                    }
                }
            }
            return;
        }
        let mut r0 = rows.start;
        while r0 < rows.end {
            // Four vectors per tile keep the accumulators and the unpacked weights
            // within the 16 AVX2 registers.
            let next = (r0 + PANEL) / PANEL * panel_bytes;
            let next_panel = pm.data.get(next..(next + panel_bytes).min(pm.data.len()));
            let panel = panel(r0);
            for g in (0..qx.count).step_by(4) {
                // The next panel comes in while this one computes (see `ahead_part`).
                let ahead = ahead_part(next_panel, g / 4, qx.count.div_ceil(4));
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
                    let vnni = t.vnni && pm.for_dpbusd();
                    match (pm.ty == GgmlType::Q8_0, nv, vnni) {
                        (false, 1, true) => emit(&packed_q4_1_vnni::<1>(panel, ahead, x)),
                        (false, 2, true) => emit(&packed_q4_1_vnni::<2>(panel, ahead, x)),
                        (false, 3, true) => emit(&packed_q4_1_vnni::<3>(panel, ahead, x)),
                        (false, _, true) => emit(&packed_q4_1_vnni::<4>(panel, ahead, x)),
                        (false, 1, false) => emit(&packed_q4_1_plain::<1>(panel, ahead, x)),
                        (false, 2, false) => emit(&packed_q4_1_plain::<2>(panel, ahead, x)),
                        (false, 3, false) => emit(&packed_q4_1_plain::<3>(panel, ahead, x)),
                        (false, _, false) => emit(&packed_q4_1_plain::<4>(panel, ahead, x)),
                        (true, 1, true) => emit(&packed_q8_0_vnni::<1>(panel, ahead, x)),
                        (true, 2, true) => emit(&packed_q8_0_vnni::<2>(panel, ahead, x)),
                        (true, 3, true) => emit(&packed_q8_0_vnni::<3>(panel, ahead, x)),
                        (true, _, true) => emit(&packed_q8_0_vnni::<4>(panel, ahead, x)),
                        (true, _, false) if pm.plus_128 => {
                            unreachable!("Q8_0 panels for vpdpbusd on a CPU without it")
                        }
                        (true, 1, false) => emit(&packed_q8_0_plain::<1>(panel, ahead, x)),
                        (true, 2, false) => emit(&packed_q8_0_plain::<2>(panel, ahead, x)),
                        (true, 3, false) => emit(&packed_q8_0_plain::<3>(panel, ahead, x)),
                        (true, _, false) => emit(&packed_q8_0_plain::<4>(panel, ahead, x)),
                    }
                }
            }
            r0 += PANEL;
        }
    }

    /// Part `part` of `parts` of the next panel's bytes, in whole cache lines: each
    /// group of vectors asks for its share while it computes, so that a batch of
    /// several groups spreads the next panel's loads over all of them. Asked for by
    /// the first group alone, the next panel of the Q8_0 output matrix (4896 bytes at
    /// the default model's width) came in at twice the rate one core sustains, and
    /// the kernel waited for it.
    fn ahead_part(next: Option<&[u8]>, part: usize, parts: usize) -> &[u8] {
        let Some(next) = next else { return &[] };
        let share = prefetch_stride(next, parts);
        let start = (part * share).min(next.len());
        &next[start..(start + share).min(next.len())]
    }

    /// The AVX-512 kernel of the format.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
    #[inline]
    unsafe fn packed_512<const V: usize>(
        q8: bool,
        panel: &[u8],
        ahead: &[u8],
        x: Xs<'_>,
    ) -> [[f32; 16]; V] {
        // SAFETY: the caller guarantees the kernels' features.
        unsafe {
            if q8 {
                packed_q8_0_512::<V>(panel, ahead, x)
            } else {
                packed_q4_1_512::<V>(panel, ahead, x)
            }
        }
    }

    /// Rounds 32 activations to 8 bits, ties to even, exactly as the scalar code does.
    pub(super) fn quantize_block(_t: Avx2Token, v: &[f32; QK]) -> BlockQ8 {
        // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2, FMA
        // and F16C; `quantize_block_impl` reads `v` and writes its own arrays only.
        unsafe { quantize_block_impl(v) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn quantize_block_impl(v: &[f32; QK]) -> BlockQ8 {
        let d = block_amax(v) / 127.0;
        round_block(v, d, if d > 0.0 { 1.0 / d } else { 0.0 })
    }

    /// One vector's values rounded into `dst` (the last block zero-padded), exactly
    /// as [`quantize_block`] rounds each block. Eight blocks' scales and their
    /// inverses come from one vector division each: block by block, the two scalar
    /// divisions (and the call per block) made rounding a batch's inputs cost 40 ns
    /// a block, 6 µs of each matmul of eight vectors.
    pub(super) fn quantize_vector(_t: Avx2Token, x: &[f32], dst: &mut [BlockQ8]) {
        // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2, FMA
        // and F16C; the function reads `x` and writes `dst` through bounds-checked
        // slicing only.
        unsafe { quantize_vector_impl(x, dst) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn quantize_vector_impl(x: &[f32], dst: &mut [BlockQ8]) {
        let whole = x.len() / QK * QK;
        let mut out = dst.iter_mut();
        for group in x[..whole].chunks(8 * QK) {
            let mut amax = [0f32; 8];
            for (a, v) in amax.iter_mut().zip(group.chunks_exact(QK)) {
                *a = block_amax(v.try_into().expect("whole blocks"));
            }
            let d = _mm256_div_ps(load8f(&amax), _mm256_set1_ps(127.0));
            let inv = _mm256_div_ps(_mm256_set1_ps(1.0), d);
            let id = _mm256_and_ps(inv, _mm256_cmp_ps::<_CMP_GT_OQ>(d, _mm256_setzero_ps()));
            let (d, id) = (lanes(d), lanes(id));
            for (k, v) in group.chunks_exact(QK).enumerate() {
                let v: &[f32; QK] = v.try_into().expect("whole blocks");
                *out.next().expect("a block per 32 values") = round_block(v, d[k], id[k]);
            }
        }
        let rest = &x[whole..];
        if !rest.is_empty() {
            let mut v = [0f32; QK];
            v[..rest.len()].copy_from_slice(rest);
            *out.next().expect("a block for the last values") = quantize_block_impl(&v);
        }
    }

    /// The largest magnitude of a block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn block_amax(v: &[f32; QK]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let m = (0..4).fold(_mm256_setzero_ps(), |m, k| {
            _mm256_max_ps(m, _mm256_andnot_ps(sign, load8f(&v[8 * k..])))
        });
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// A block rounded with scale `d` (its inverse `id`, 0 where `d` is).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn round_block(v: &[f32; QK], d: f32, id: f32) -> BlockQ8 {
        let id = _mm256_set1_ps(id);
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(load8f(&v[8 * k..]), id),
            );
            _mm256_cvtps_epi32(r)
        });
        let sums = [
            hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16,
            hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16,
        ];
        // Saturating packs interleave the 128-bit lanes; the permute restores order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut qs = [0i8; QK];
        // SAFETY: `qs` is 32 writable bytes; the store is unaligned.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), p) };
        super::block_q8(qs, d, sums)
    }

    /// The head width the attention kernels are unrolled for (most Llama models').
    pub(super) const HEAD: usize = 64;

    /// Independent chains of [`int8_spin`]: enough to cover the instruction's
    /// latency on both of its ports.
    const CHAINS: usize = 12;

    /// Multiply-adds per turn of [`int8_spin`]'s loop, and the instruction it issues.
    pub(super) fn int8_macs(t: Avx2Token) -> (u64, &'static str) {
        let (lanes, name) = if t.avx512 {
            (64, "vpdpbusd zmm")
        } else if t.vnni {
            (32, "vpdpbusd ymm")
        } else {
            (32, "vpmaddubsw ymm")
        };
        (CHAINS as u64 * lanes, name)
    }

    /// `iters` turns of [`CHAINS`] independent int8 multiply-adds, in the widest
    /// form the CPU has.
    pub(super) fn int8_spin(t: Avx2Token, iters: u64) {
        // SAFETY: `avx512` is set only when runtime detection found AVX-512 F, BW, VL
        // and VNNI, and `vnni` only when it found AVX-VNNI, with the AVX2 every token
        // proves: the features of the function called. None touches memory.
        let sum = unsafe {
            if t.avx512 {
                spin512(iters)
            } else if t.vnni {
                spin256(iters)
            } else {
                spin_maddubs(iters)
            }
        };
        std::hint::black_box(sum);
    }

    #[target_feature(enable = "avx2")]
    fn spin_maddubs(iters: u64) -> i32 {
        let b = std::hint::black_box(_mm256_set1_epi8(5));
        let mut acc = std::hint::black_box([_mm256_set1_epi8(3); CHAINS]);
        for _ in 0..iters {
            for r in acc.iter_mut() {
                // Each chain feeds its 16-bit sums back as bytes: only the rate counts.
                *r = _mm256_maddubs_epi16(*r, b);
            }
        }
        acc.iter().fold(0, |s, &r| s ^ hsum_epi32(r))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn spin512(iters: u64) -> i32 {
        // Opaque operands, so that nothing is computed ahead of the loop.
        let (a, b) = std::hint::black_box((_mm512_set1_epi8(3), _mm512_set1_epi8(5)));
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..iters {
            for r in acc.iter_mut() {
                *r = _mm512_dpbusd_epi32(*r, a, b);
            }
        }
        acc.iter().fold(0, |s, &r| s ^ _mm512_reduce_add_epi32(r))
    }

    #[target_feature(enable = "avx2,avxvnni")]
    fn spin256(iters: u64) -> i32 {
        let (a, b) = std::hint::black_box((_mm256_set1_epi8(3), _mm256_set1_epi8(5)));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        for _ in 0..iters {
            for r in acc.iter_mut() {
                *r = _mm256_dpbusd_avx_epi32(*r, a, b);
            }
        }
        acc.iter().fold(0, |s, &r| s ^ hsum_epi32(r))
    }

    /// Eight half floats of `h` from `at` as f32.
    #[inline(always)]
    fn load8h(h: &[f16], at: usize) -> __m256 {
        let h: &[f16; 8] = h[at..at + 8].try_into().expect("8 halves");
        // SAFETY: `h` is 8 readable halves (16 bytes); the load is unaligned, and
        // callers enable F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())) }
    }

    /// Positions ahead of the one computing whose keys or values are asked for.
    /// Each (sequence, key/value head) task streams a fresh stretch of the cache
    /// (20 KB at 160 positions), too short for the hardware prefetcher to get ahead
    /// of, and at eight sequences the caches no longer fit in the last-level cache.
    /// The first `AHEAD` positions are asked for together before the loop starts:
    /// a decode step's tasks are short (a few dozen positions after a short prompt),
    /// and their first positions were otherwise loaded one at a time on demand
    /// (attention of eight sequences 1.00 → 0.91 ms a step, of one 0.21 → 0.18).
    const AHEAD: usize = 8;

    /// Asks for the first [`AHEAD`] positions of a head's cache (positions `stride`
    /// halves apart, `n` of them at most), before a loop that asks [`AHEAD`] ahead.
    #[inline(always)]
    fn prefetch_first(h: &[f16], n: usize, stride: usize) {
        for t in 0..AHEAD.min(n) {
            prefetch_position(h, t * stride);
        }
    }

    /// Asks for the cache lines of one position's head (`HEAD` halves from `at`), if
    /// it exists.
    #[inline(always)]
    fn prefetch_position(h: &[f16], at: usize) {
        if let Some(p) = h.get(at..at + HEAD) {
            let p: *const i8 = p.as_ptr().cast();
            // SAFETY: prefetching has no effect on memory; both addresses lie in `p`
            // (`HEAD` halves are 128 bytes). SSE is part of x86-64.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.add(64));
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

    /// [`super::F32Ops::dots`] for heads of [`HEAD`] values, four query heads at a
    /// time at most; the caller checked that `keys` holds every position.
    pub(super) fn dots(
        t: Avx2Token,
        q: &[f32],
        heads: usize,
        keys: &[f16],
        stride: usize,
        scores: &mut [f32],
    ) {
        let n = scores.len() / heads;
        for (q, scores) in q.chunks(4 * HEAD).zip(scores.chunks_mut(4 * n)) {
            // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2,
            // FMA and F16C, and its `avx512` is set only when it found AVX-512 F too:
            // the features of the kernel called. Both read and write their slices
            // through checked slicing only.
            unsafe {
                if t.avx512 {
                    by_heads!(q.len() / HEAD, dots_512(q, keys, stride, scores))
                } else {
                    by_heads!(q.len() / HEAD, dots_impl(q, keys, stride, scores))
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn dots_impl<const G: usize>(q: &[f32], keys: &[f16], stride: usize, scores: &mut [f32]) {
        let n = scores.len() / G;
        prefetch_first(keys, n, stride);
        for t in 0..n {
            prefetch_position(keys, (t + AHEAD) * stride);
            let k = &keys[t * stride..t * stride + HEAD];
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for l in 0..HEAD / 8 {
                let kl = load8h(k, 8 * l);
                for (h, a) in acc.iter_mut().enumerate() {
                    a[l % 2] = _mm256_fmadd_ps(load8f(&q[h * HEAD + 8 * l..]), kl, a[l % 2]);
                }
            }
            for (h, a) in acc.iter().enumerate() {
                scores[h * n + t] = hsum_ps(_mm256_add_ps(a[0], a[1]));
            }
        }
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

    /// [`super::F32Ops::softmax`] compiled for AVX2's eight-float vectors.
    pub(super) fn softmax(_t: Avx2Token, scores: &mut [f32], scale: f32) {
        // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2;
        // `softmax_impl` touches its slice through safe indexing only.
        unsafe { softmax_impl(scores, scale) }
    }

    #[target_feature(enable = "avx2")]
    fn softmax_impl(scores: &mut [f32], scale: f32) {
        super::softmax_lanes(scores, scale)
    }

    /// [`super::F32Ops::swiglu`] compiled for AVX2's eight-float vectors.
    pub(super) fn swiglu(_t: Avx2Token, gate: &mut [f32], up: &[f32]) {
        // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2;
        // `swiglu_impl` touches its slices through safe indexing only.
        unsafe { swiglu_impl(gate, up) }
    }

    #[target_feature(enable = "avx2")]
    fn swiglu_impl(gate: &mut [f32], up: &[f32]) {
        super::swiglu_lanes(gate, up)
    }

    /// [`super::F32Ops::weighted_sum`] for heads of [`HEAD`] values, four query heads
    /// at a time at most; the caller checked that `values` holds every position.
    pub(super) fn weighted_sum(
        t: Avx2Token,
        weights: &[f32],
        heads: usize,
        values: &[f16],
        stride: usize,
        out: &mut [f32],
    ) {
        let n = weights.len() / heads;
        for (weights, out) in weights.chunks(4 * n).zip(out.chunks_mut(4 * HEAD)) {
            // SAFETY: an `Avx2Token` exists only after runtime detection found AVX2,
            // FMA and F16C, and its `avx512` is set only when it found AVX-512 F too:
            // the features of the kernel called. Both touch their slices through
            // checked slicing only.
            unsafe {
                if t.avx512 {
                    by_heads!(
                        out.len() / HEAD,
                        weighted_sum_512(weights, values, stride, out)
                    )
                } else {
                    match out.len() / HEAD {
                        1 => weighted_sum_impl::<1, 8>(weights, values, stride, out),
                        2 => weighted_sum_impl::<2, 4>(weights, values, stride, out),
                        3 => weighted_sum_impl::<3, 4>(weights, values, stride, out),
                        _ => weighted_sum_impl::<4, 2>(weights, values, stride, out),
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
        stride: usize,
        out: &mut [f32],
    ) {
        let n = weights.len() / G;
        prefetch_first(values, n, stride);
        for pass in 0..HEAD / (8 * C) {
            let at = 8 * C * pass;
            let mut acc: [[__m256; C]; G] = std::array::from_fn(|h| {
                std::array::from_fn(|l| load8f(&out[h * HEAD + at + 8 * l..]))
            });
            for t in 0..n {
                if pass == 0 {
                    prefetch_position(values, (t + AHEAD) * stride);
                }
                let v = &values[t * stride + at..t * stride + at + 8 * C];
                let w: [__m256; G] = std::array::from_fn(|h| _mm256_set1_ps(weights[h * n + t]));
                for l in 0..C {
                    let vl = load8h(v, 8 * l);
                    for (a, &wh) in acc.iter_mut().zip(&w) {
                        a[l] = _mm256_fmadd_ps(wh, vl, a[l]);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (l, al) in a.iter().enumerate() {
                    let o: &mut [f32; 8] = (&mut out[h * HEAD + at + 8 * l..][..8])
                        .try_into()
                        .expect("8 floats");
                    // SAFETY: `o` is 8 writable floats; the store is unaligned.
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *al) };
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

    /// One key against `G` query heads: per head, its 64 products in 16 lanes, lane
    /// `l` summing those of values `l`, `l + 16`, `l + 32`, `l + 48` in that order.
    /// Lanes 0–7 are [`dots_impl`]'s first accumulator and lanes 8–15 its second,
    /// bit for bit (the same multiply-adds in the same order).
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    fn key_sums<const G: usize>(q: &[f32], k: &[f16]) -> [__m512; G] {
        let k: [__m512; 4] = std::array::from_fn(|j| load16h(k, 16 * j));
        std::array::from_fn(|h| {
            k.iter()
                .enumerate()
                .fold(_mm512_setzero_ps(), |a, (j, &kj)| {
                    _mm512_fmadd_ps(load16f(q, h * HEAD + 16 * j), kj, a)
                })
        })
    }

    /// Two keys' sums `a` and `b` (see [`key_sums`]) with lanes `l` and `l + 8`
    /// added: `[a₀..₈ | b₀..₈]`, each half what [`dots_impl`] gives [`hsum_ps`].
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

    /// [`dots_impl`] in 512-bit registers, the same bits: a key's 64 values are four
    /// registers, not eight, and eight keys' sums are reduced together (a dozen
    /// shuffles and adds for eight scores where [`hsum_ps`] takes five for one).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn dots_512<const G: usize>(q: &[f32], keys: &[f16], stride: usize, scores: &mut [f32]) {
        let n = scores.len() / G;
        prefetch_first(keys, n, stride);
        let key = |t: usize| &keys[t * stride..t * stride + HEAD];
        let whole = n - n % 8;
        for t0 in (0..whole).step_by(8) {
            let mut pairs = [[_mm512_setzero_ps(); 4]; G];
            for (m, pair) in (0..4).map(|m| (m, t0 + 2 * m)) {
                prefetch_position(keys, (pair + AHEAD) * stride);
                prefetch_position(keys, (pair + 1 + AHEAD) * stride);
                let (a, b) = (key_sums::<G>(q, key(pair)), key_sums::<G>(q, key(pair + 1)));
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
            let a = key_sums::<G>(q, key(t));
            for (h, a) in a.into_iter().enumerate() {
                let halves = _mm256_add_ps(
                    _mm512_castps512_ps256(a),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))),
                );
                scores[h * n + t] = hsum_ps(halves);
            }
        }
    }

    /// [`weighted_sum_impl`] in 512-bit registers, the same bits (each output value
    /// the same chain of multiply-adds): a position's 64 values are four registers,
    /// and every head's whole output stays in registers for one pass.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn weighted_sum_512<const G: usize>(
        weights: &[f32],
        values: &[f16],
        stride: usize,
        out: &mut [f32],
    ) {
        let n = weights.len() / G;
        prefetch_first(values, n, stride);
        let mut acc: [[__m512; 4]; G] =
            std::array::from_fn(|h| std::array::from_fn(|c| load16f(out, h * HEAD + 16 * c)));
        for t in 0..n {
            prefetch_position(values, (t + AHEAD) * stride);
            let v = &values[t * stride..t * stride + HEAD];
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
                let o: &mut [f32; 16] = (&mut out[h * HEAD + 16 * c..][..16])
                    .try_into()
                    .expect("16 floats");
                // SAFETY: `o` is 16 writable floats; the store is unaligned.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
            }
        }
    }

    /// Shared body of Q4_K and Q5_K, one super-block of a row against `V` vectors'
    /// eight blocks each (`qh` holds Q5_K's fifth bits): the scales and each group's
    /// values are unpacked once for all the vectors. Adds each vector's scaled sums to
    /// its `acc` and returns its mins term.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn k4_super_block<const V: usize>(
        b: &[u8],
        qs: &[u8],
        qh: Option<&[u8]>,
        xs: [&[BlockQ8]; V],
        acc: &mut [__m256; V],
    ) -> [f32; V] {
        let (d, dmin) = (h2f(b, 0), h2f(b, 2));
        let (sc, mn) = unpack_scales_k4(&b[4..16]);
        let hbits = qh.map(load32);
        let mask = _mm256_set1_epi8(0xF);
        let mut mins = [0f32; V];
        for j in 0..4 {
            let q = load32(&qs[32 * j..]);
            let lo = _mm256_and_si256(q, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            for (k, mut w) in [(0, lo), (1, hi)] {
                let s = 2 * j + k;
                if let Some(h) = hbits {
                    let bit = _mm256_set1_epi8(1 << s);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
                    w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
                }
                for ((acc, mins), x) in acc.iter_mut().zip(&mut mins).zip(xs) {
                    let xb = &x[s];
                    let p = mul_sum_us8(w, load_x(xb));
                    let ds = d * f32::from(sc[s]) * xb.d;
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(p), *acc);
                    *mins += dmin * f32::from(mn[s]) * xb.s;
                }
            }
        }
        mins
    }

    /// The blocks of super-block `i` (eight of 32 values) of each vector.
    #[inline(always)]
    fn super_blocks<const V: usize>(x: [&[BlockQ8]; V], i: usize) -> [&[BlockQ8]; V] {
        x.map(|x| &x[8 * i..8 * i + 8])
    }

    /// A Q4_K row against `V` vectors (one vector: its dot product); every vector sees
    /// the same operations in the same order whatever `V`.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q4_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
        let mut acc = [_mm256_setzero_ps(); V];
        let mut mins = [0f32; V];
        for (i, b) in row.chunks_exact(144).enumerate() {
            let m = k4_super_block(b, &b[16..144], None, super_blocks(x, i), &mut acc);
            for (total, m) in mins.iter_mut().zip(m) {
                *total += m;
            }
        }
        std::array::from_fn(|v| hsum_ps(acc[v]) - mins[v])
    }

    /// A Q5_K row against `V` vectors (see [`q4_k`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q5_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
        let mut acc = [_mm256_setzero_ps(); V];
        let mut mins = [0f32; V];
        for (i, b) in row.chunks_exact(176).enumerate() {
            let qh = Some(&b[16..48]);
            let m = k4_super_block(b, &b[48..176], qh, super_blocks(x, i), &mut acc);
            for (total, m) in mins.iter_mut().zip(m) {
                *total += m;
            }
        }
        std::array::from_fn(|v| hsum_ps(acc[v]) - mins[v])
    }

    /// A Q6_K row against `V` vectors (see [`q4_k`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q6_k<const V: usize>(row: &[u8], x: [&[BlockQ8]; V]) -> [f32; V] {
        let mut acc = [_mm256_setzero_ps(); V];
        let mut corr = [0f32; V];
        let m4 = _mm256_set1_epi8(0xF);
        let m2 = _mm256_set1_epi8(0x30);
        for (i, b) in row.chunks_exact(210).enumerate() {
            let xs = super_blocks(x, i);
            let d = h2f(b, 208);
            let scales = &b[192..208];
            for half in 0..2 {
                let ql0 = load32(&b[64 * half..]);
                let ql1 = load32(&b[64 * half + 32..]);
                let qh = load32(&b[128 + 32 * half..]);
                // The unsigned 6-bit values (signed value + 32) of the four groups.
                let groups = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_and_si256(qh, m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                    ),
                ];
                for (g, w) in groups.into_iter().enumerate() {
                    let s = 4 * half + g;
                    let (sa, sb) = (scales[2 * s] as i8, scales[2 * s + 1] as i8);
                    let sc = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(sb)),
                        _mm_set1_epi16(i16::from(sa)),
                    );
                    for ((acc, corr), x) in acc.iter_mut().zip(&mut corr).zip(xs) {
                        let xb = &x[s];
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, load_x(xb)), sc);
                        let dd = d * xb.d;
                        *acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(p), *acc);
                        let off = i32::from(sa) * i32::from(xb.sums[0])
                            + i32::from(sb) * i32::from(xb.sums[1]);
                        *corr += dd * off as f32;
                    }
                }
            }
        }
        std::array::from_fn(|v| hsum_ps(acc[v]) - 32.0 * corr[v])
    }

    /// The K-quant kernel of a format (Q4_K, Q5_K or Q6_K) on one row against `V`
    /// vectors; the token proves the kernels' features.
    struct KQuant {
        _t: Avx2Token,
        ty: GgmlType,
    }

    impl super::RowKernel for KQuant {
        #[inline]
        fn row<const V: usize>(&self, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V] {
            let x = std::array::from_fn(|k| qx.vector(g + k));
            // SAFETY: an `Avx2Token` (`_t`) exists only after runtime detection found
            // AVX2, FMA and F16C, the kernels' features; they read `row` and the
            // blocks only through bounds-checked slicing.
            unsafe {
                match self.ty {
                    GgmlType::Q4_K => q4_k(row, x),
                    GgmlType::Q5_K => q5_k(row, x),
                    _ => q6_k(row, x),
                }
            }
        }
    }

    /// Rows `rows` of a Q4_K, Q5_K or Q6_K matrix against every vector of `qx`, up to
    /// four vectors per pass over a row, so that a batch unpacks each super-block's
    /// scales and values once per four vectors rather than once per vector; `false`
    /// (and nothing done) for other formats.
    pub(super) fn k_quant_rows(
        t: Avx2Token,
        ty: GgmlType,
        weights: &[u8],
        rb: usize,
        rows: std::ops::Range<usize>,
        qx: &QuantizedActivations,
        put: &mut impl FnMut(usize, usize, f32),
    ) -> bool {
        if !matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
            return false;
        }
        super::rows_by_four(&KQuant { _t: t, ty }, weights, rb, rows, qx, put);
        true
    }

    #[cfg(test)]
    pub(super) fn token() -> Option<Avx2Token> {
        Avx2Token::detect()
    }

    const _: () = assert!(QK == 32);
}

/// Rounds one row of f32 values into `ty`'s layout (`out` = the row's bytes).
///
/// Simple round-to-nearest quantizers, not ggml's error-minimising ones: they exist
/// to write test models and to round-trip-test the dequantizers and dot kernels.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    check_len("row bytes", ty.row_bytes(x.len())?, out.len())?;
    let bs = ty.block_size();
    for (v, b) in x
        .chunks_exact(bs)
        .zip(out.chunks_exact_mut(ty.block_bytes()))
    {
        quantize_block(ty, v, b);
    }
    Ok(())
}

fn put_f16(b: &mut [u8], v: f32) {
    b[..2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

fn quantize_block(ty: GgmlType, v: &[f32], b: &mut [u8]) {
    let amax = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    match ty {
        GgmlType::F32 => b.copy_from_slice(&v[0].to_le_bytes()),
        GgmlType::F16 => put_f16(b, v[0]),
        GgmlType::BF16 => b.copy_from_slice(&bf16::from_f32(v[0]).to_le_bytes()),
        GgmlType::Q8_0 => {
            let d = amax(v) / 127.0;
            put_f16(b, d);
            let id = inv(f16::from_f32(d).to_f32());
            for (q, &x) in b[2..].iter_mut().zip(v) {
                *q = (x * id).round().clamp(-127.0, 127.0) as i8 as u8;
            }
        }
        GgmlType::Q4_0 => {
            // ggml's choice: the value of largest magnitude maps to −8 exactly.
            let m = v
                .iter()
                .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
            let d = m / -8.0;
            put_f16(b, d);
            let id = inv(f16::from_f32(d).to_f32());
            let q = |x: f32| ((x * id + 8.0).round().clamp(0.0, 15.0)) as u8;
            for j in 0..16 {
                b[2 + j] = q(v[j]) | (q(v[j + 16]) << 4);
            }
        }
        GgmlType::Q4_1 => {
            let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (hi - lo) / 15.0;
            put_f16(b, d);
            put_f16(&mut b[2..], lo);
            let (id, lo) = (inv(f16::from_f32(d).to_f32()), f16::from_f32(lo).to_f32());
            let q = |x: f32| (((x - lo) * id).round().clamp(0.0, 15.0)) as u8;
            for j in 0..16 {
                b[4 + j] = q(v[j]) | (q(v[j + 16]) << 4);
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => quantize_k4(ty == GgmlType::Q5_K, v, b),
        GgmlType::Q6_K => {
            let scales: Vec<f32> = v.chunks_exact(16).map(|c| amax(c) / 31.0).collect();
            let d = scales.iter().fold(0f32, |m, &s| m.max(s)) / 127.0;
            let dh = f16::from_f32(d).to_f32();
            b.fill(0);
            put_f16(&mut b[208..], d);
            for (e, &x) in v.iter().enumerate() {
                let sc = (scales[e / 16] * inv(dh)).round().clamp(0.0, 127.0) as i8;
                b[192 + e / 16] = sc as u8;
                let q = ((x * inv(dh * f32::from(sc))).round().clamp(-32.0, 31.0)) as i8;
                let u = (q + 32) as u8;
                let (half, p) = (e / 128, e % 128);
                let (g, l) = (p / 32, p % 32);
                b[64 * half + (g & 1) * 32 + l] |= (u & 0xF) << (4 * (g >> 1));
                b[128 + 32 * half + l] |= (u >> 4) << (2 * g);
            }
        }
        _ => unreachable!("quantize_block is only called for supported types"),
    }
}

/// Q4_K / Q5_K: per sub-block of 32 an affine map `x ≈ d·sc·q − dmin·m` with 6-bit
/// `sc` and `m`, quantized against the super-block's `d` and `dmin`.
fn quantize_k4(five_bits: bool, v: &[f32], b: &mut [u8]) {
    let levels = if five_bits { 31.0 } else { 15.0 };
    let mut scale = [0f32; 8];
    let mut minv = [0f32; 8];
    for (s, c) in v.chunks_exact(32).enumerate() {
        let lo = c.iter().copied().fold(0f32, f32::min);
        let hi = c.iter().copied().fold(f32::NEG_INFINITY, f32::max).max(lo);
        scale[s] = (hi - lo) / levels;
        minv[s] = -lo;
    }
    let d = scale.iter().fold(0f32, |m, &s| m.max(s)) / 63.0;
    let dmin = minv.iter().fold(0f32, |m, &s| m.max(s)) / 63.0;
    b.fill(0);
    put_f16(b, d);
    put_f16(&mut b[2..], dmin);
    let (dh, dminh) = (f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32());
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for s in 0..8 {
        sc[s] = (scale[s] * inv(dh)).round().clamp(0.0, 63.0) as u8;
        mn[s] = (minv[s] * inv(dminh)).round().clamp(0.0, 63.0) as u8;
    }
    let packed = &mut b[4..16];
    for j in 0..8 {
        if j < 4 {
            packed[j] |= sc[j];
            packed[j + 4] |= mn[j];
        } else {
            packed[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            packed[j - 4] |= (sc[j] >> 4) << 6;
            packed[j] |= (mn[j] >> 4) << 6;
        }
    }
    let qs_at = if five_bits { 48 } else { 16 };
    for (s, c) in v.chunks_exact(32).enumerate() {
        let step = dh * f32::from(sc[s]);
        let off = dminh * f32::from(mn[s]);
        for (l, &x) in c.iter().enumerate() {
            let q = ((x + off) * inv(step)).round().clamp(0.0, levels) as u8;
            b[qs_at + 32 * (s / 2) + l] |= (q & 0xF) << (4 * (s % 2));
            if five_bits {
                b[16 + l] |= (q >> 4) << s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64-driven uniform values in [-1, 1), with a few outliers per row as
    /// real weights have.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                let u = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                if i % 97 == 5 { u * 4.0 } else { u }
            })
            .collect()
    }

    #[test]
    fn table_lists_every_type_once() {
        for (i, e) in TYPE_TABLE.iter().enumerate() {
            assert_eq!(GgmlType::from_id(e.1), Some(e.0));
            assert_eq!(e.0.id(), e.1);
            assert!(TYPE_TABLE[i + 1..].iter().all(|o| o.0 != e.0 && o.1 != e.1));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Ok(288));
        assert!(GgmlType::Q4_K.row_bytes(300).is_err());
    }

    /// Allowed error of the 8-bit-activation dot: rounding 32 activations to 8 bits
    /// costs at most half a step (amax/254) each, far below 1% of the norms' product.
    fn dot_tolerance(x: &[f32], w: &[f32]) -> f32 {
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        1e-2 * norm(x) * norm(w)
    }

    #[test]
    fn quantize_dequantize_and_dot_every_type() {
        for ty in GgmlType::SUPPORTED {
            for n in [256usize, 512, 768] {
                let w = values(n as u64 + ty.id() as u64, n);
                let x = values(7 + n as u64, n);
                let mut bytes = vec![0u8; ty.row_bytes(n).unwrap()];
                quantize_row(ty, &w, &mut bytes).unwrap();
                let mut back = vec![0f32; n];
                dequantize_row(ty, &bytes, &mut back).unwrap();
                let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = match ty {
                    GgmlType::F32 => 0.0,
                    GgmlType::F16 => 1e-3 * amax,
                    GgmlType::BF16 => 8e-3 * amax,
                    GgmlType::Q8_0 => 0.02 * amax,
                    GgmlType::Q6_K => 0.1 * amax,
                    _ => 0.25 * amax,
                };
                for (a, b) in w.iter().zip(&back) {
                    assert!((a - b).abs() <= tol, "{ty:?}: {a} vs {b}");
                }
                let exact: f32 = back.iter().zip(&x).map(|(a, b)| a * b).sum();
                let d = dot_row(ty, &bytes, &x).unwrap();
                assert!((d - exact).abs() <= 1e-4 * exact.abs().max(1.0), "{ty:?}");
                let qx = quantize_activations(&x);
                let fast = dot_row_q8(ty, &bytes, &qx).unwrap();
                let tol = dot_tolerance(&x, &back);
                assert!((fast - exact).abs() <= tol, "{ty:?}: {fast} vs {exact}");
                let slow = scalar::dot(ty, &bytes, &qx.blocks);
                assert!((fast - slow).abs() <= 1e-4 * slow.abs().max(1.0), "{ty:?}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_matches_scalar_on_random_bytes() {
        let Some(t) = x86::token() else {
            println!("no AVX2 on this CPU: SIMD kernels not exercised");
            return;
        };
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let n = 512;
            let mut bytes: Vec<u8> = values(ty.id() as u64, ty.row_bytes(n).unwrap())
                .iter()
                .map(|v| (v * 127.0) as i8 as u8)
                .collect();
            // Keep the f16 scales finite and small so sums are comparable.
            for b in bytes.chunks_exact_mut(ty.block_bytes()) {
                let at: &[usize] = match ty {
                    GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                    GgmlType::Q6_K => &[208],
                    _ => &[0],
                };
                for &a in at {
                    let v = 0.01 + (b[a + 1] & 7) as f32 * 0.003;
                    put_f16(&mut b[a..], v);
                }
            }
            let qx = quantize_activations(&values(99, n));
            let s = scalar::dot(ty, &bytes, &qx.blocks);
            for t in [t, t.without_vnni()] {
                let v = dot_q8_dispatch(Isa::Avx2(t), ty, &bytes, &qx, 0);
                assert!(
                    (s - v).abs() <= 1e-4 * s.abs().max(1.0),
                    "{ty:?} {t:?}: {s} vs {v}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_quantizer_matches_scalar() {
        let Some(t) = x86::token() else {
            return;
        };
        // Exact ties (x.5 steps) included: both paths round them to even.
        let mut xs = values(5, 32 * 40);
        xs[..32].copy_from_slice(&std::array::from_fn::<f32, 32, _>(|i| i as f32 * 0.5));
        xs[32..64].fill(0.0);
        for c in xs.chunks_exact(QK) {
            let v: &[f32; QK] = c.try_into().unwrap();
            let (a, b) = (
                quantize_block_q8(Isa::Scalar, v),
                quantize_block_q8(Isa::Avx2(t), v),
            );
            assert_eq!(a.qs, b.qs);
            assert_eq!((a.d, a.sums, a.s), (b.d, b.sums, b.s));
        }
        // Whole vectors: groups of eight blocks, a partial group, a partial block.
        for len in [32 * 40, 32 * 13 + 7, 5, 32 * 8] {
            let x = &xs[xs.len() - len..];
            let mut a = vec![BlockQ8::default(); len.div_ceil(QK)];
            let mut b = a.clone();
            quantize_vector(Isa::Scalar, x, &mut a);
            quantize_vector(Isa::Avx2(t), x, &mut b);
            for (a, b) in a.iter().zip(&b) {
                assert_eq!(a.qs, b.qs, "{len} values");
                assert_eq!((a.d, a.sums, a.s), (b.d, b.sums, b.s), "{len} values");
            }
        }
    }

    #[test]
    fn matmul_batches_agree_with_single_rows() {
        for (ty, batch) in [
            (GgmlType::Q4_1, 6),
            (GgmlType::Q4_1, 1),
            (GgmlType::Q4_1, 2),
            (GgmlType::Q4_1, 19),
            (GgmlType::Q4_0, 11),
            (GgmlType::Q8_0, 9),
            (GgmlType::Q8_0, 1),
            (GgmlType::F32, 6),
            (GgmlType::Q6_K, 6),
            (GgmlType::Q6_K, 5),
            (GgmlType::Q4_K, 6),
            (GgmlType::Q5_K, 7),
        ] {
            let (rows, cols) = (37, 256);
            let w = values(1, rows * cols);
            let rb = ty.row_bytes(cols).unwrap();
            let mut bytes = vec![0u8; rb * rows];
            for (r, b) in w.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
                quantize_row(ty, r, b).unwrap();
            }
            let xs = values(2, cols * batch);
            let mut out = vec![0f32; rows * batch];
            matmul(ty, &bytes, rows, cols, &xs, &mut out).unwrap();
            for b in 0..batch {
                let x = &xs[b * cols..(b + 1) * cols];
                let qx = quantize_activations(x);
                for r in 0..rows {
                    let row = &bytes[r * rb..(r + 1) * rb];
                    let want = if ty.uses_q8_activations() {
                        dot_row_q8(ty, row, &qx).unwrap()
                    } else {
                        dot_row(ty, row, x).unwrap()
                    };
                    assert_eq!(out[b * rows + r], want, "{ty:?} row {r} batch {b}");
                }
            }
        }
    }

    #[test]
    fn matmul_many_matches_separate_matmuls() {
        let (cols, batch) = (128, 3);
        let xs = values(3, cols * batch);
        let mats: Vec<(GgmlType, usize, Vec<u8>)> = [
            (GgmlType::Q4_1, 70),
            (GgmlType::Q8_0, 9),
            (GgmlType::F16, 5),
        ]
        .into_iter()
        .map(|(ty, rows)| {
            let rb = ty.row_bytes(cols).unwrap();
            let w = values(rows as u64, rows * cols);
            let mut bytes = vec![0u8; rb * rows];
            for (r, b) in w.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
                quantize_row(ty, r, b).unwrap();
            }
            (ty, rows, bytes)
        })
        .collect();
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; m.1 * batch]).collect();
        let mut jobs: Vec<MatJob<'_>> = mats
            .iter()
            .zip(&mut outs)
            .map(|((ty, rows, w), out)| MatJob {
                ty: *ty,
                weights: w,
                packed: None,
                n_rows: *rows,
                out,
            })
            .collect();
        let mut scratch = QuantizedActivations::default();
        matmul_many(&mut jobs, cols, &xs, &mut scratch).unwrap();
        for ((ty, rows, w), got) in mats.iter().zip(&outs) {
            let mut want = vec![0f32; rows * batch];
            matmul(*ty, w, *rows, cols, &xs, &mut want).unwrap();
            assert_eq!(got, &want, "{ty:?}");
        }
    }

    /// The lane-wise softmax against the textbook one (libm's exp, a running sum), on
    /// lengths around the lane count, and the same result from both instruction sets.
    #[test]
    fn softmax_matches_the_definition() {
        for n in [1, 2, 7, 8, 9, 15, 16, 17, 100, 1000] {
            let scores: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.9)
                .collect();
            let scale = 0.125;
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let e: Vec<f64> = scores
                .iter()
                .map(|&x| (f64::from(x * scale) - f64::from(max * scale)).exp())
                .collect();
            let sum: f64 = e.iter().sum();
            let mut got = scores.clone();
            F32Ops::detect().softmax(&mut got, scale);
            let mut portable = scores.clone();
            F32Ops(Isa::Scalar).softmax(&mut portable, scale);
            assert_eq!(got, portable, "n = {n}: instruction sets differ");
            for (g, e) in got.iter().zip(&e) {
                assert!(
                    (f64::from(*g) - e / sum).abs() < 1e-6,
                    "n = {n}: {g} vs {}",
                    e / sum
                );
            }
            let total: f32 = got.iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "n = {n}: sums to {total}");
        }
    }

    /// The int8 peak is measured wherever the block kernels have SIMD (AVX2), with the
    /// instruction they multiply with.
    #[test]
    fn int8_peak_is_measured_where_there_are_int8_kernels() {
        #[cfg(target_arch = "x86_64")]
        let expect = x86::token().map(|t| x86::int8_macs(t).1);
        #[cfg(not(target_arch = "x86_64"))]
        let expect: Option<&str> = None;
        let got = int8_peak();
        assert_eq!(got.map(|p| p.instruction), expect);
        if let Some(p) = got {
            // Any AVX2 core does billions of multiply-adds a second.
            assert!(p.macs_per_sec.is_finite() && p.macs_per_sec > 1e9, "{p:?}");
        }
    }

    /// KV cache values: the nearest half (ties to even), ±65504 past the finite range,
    /// the same bits from F16C as from the portable conversion (lengths that leave
    /// remainders past the eight-wide loop).
    #[test]
    fn cache_halves_round_to_nearest_and_saturate() {
        let cases = [
            (1.0f32, 0x3c00u16),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65519.0, 0x7bff),
            (1e9, 0x7bff),
            (f32::INFINITY, 0x7bff),
            (f32::NEG_INFINITY, 0xfbff),
            // 1 + 2^-11 lies halfway between 1 and the next half: ties to even (1).
            (1.000_488_3, 0x3c00),
            // 1 + 3·2^-11 lies halfway between two odd/even neighbours: up to even.
            (1.001_464_8, 0x3c02),
            // The smallest subnormal half, and half of it (a tie, to even: zero).
            (5.960_464_5e-8, 0x0001),
            (2.980_232_2e-8, 0x0000),
        ];
        assert_eq!(HALF_MAX, f16::MAX.to_f32());
        for (x, bits) in cases {
            assert_eq!(to_half(x).to_bits(), bits, "{x:e}");
        }
        for n in [1, 7, 8, 9, 64, 67] {
            let xs: Vec<f32> = (0..n)
                .map(|i| match i % 5 {
                    0 => i as f32 * 1.37e-6,
                    1 => -(i as f32) * 1013.7,
                    2 => 7e4 * i as f32,
                    3 => (i as f32).sin() / 3.0,
                    _ => -6.1e-5 / (i as f32 + 1.0),
                })
                .collect();
            let mut got = vec![f16::ONE];
            F32Ops::detect().append_halves(&xs, &mut got);
            let mut portable = vec![f16::ONE];
            F32Ops(Isa::Scalar).append_halves(&xs, &mut portable);
            assert_eq!(got, portable, "n = {n}: instruction sets differ");
            assert_eq!(got.len(), n + 1, "appended after what was there");
            for (x, h) in xs.iter().zip(&got[1..]) {
                let back = h.to_f32();
                // Half a unit in the last place: 2^-11 relative, 2^-25 among subnormals.
                let ulp_half = (x.abs().min(65504.0) / 2048.0).max(2.0f32.powi(-25));
                assert!(
                    (back - x.clamp(-65504.0, 65504.0)).abs() <= ulp_half,
                    "{x:e} stored as {back:e}"
                );
            }
        }
    }

    /// Attention over a cache of halves, for 1 to 5 query heads per key/value head:
    /// both instruction sets, against f64 sums of the same (already rounded) values;
    /// each head's result the same bits as that head's alone, and the weighted sums
    /// of a cache in two parts the same bits as of one.
    #[test]
    fn dots_and_weighted_sums_read_halves() {
        let hd = 64;
        let n = 13;
        let xs: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.11).sin() * 3.0).collect();
        let mut cache = Vec::new();
        F32Ops(Isa::Scalar).append_halves(&xs, &mut cache);
        for heads in 1..=5 {
            let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.37).cos()).collect();
            let w: Vec<f32> = (0..heads * n).map(|i| 1.0 / (i as f32 + 2.0)).collect();
            for ops in [F32Ops::detect(), F32Ops(Isa::Scalar)] {
                let mut scores = vec![0f32; heads * n];
                ops.dots(&q, heads, &cache, hd, &mut scores);
                let mut out = vec![0f32; heads * hd];
                ops.weighted_sum(&w, heads, &cache, hd, &mut out);
                // The positions in two parts, summed by two calls: the same bits.
                for split in [1, 5, n - 1] {
                    let part = |range: std::ops::Range<usize>| -> Vec<f32> {
                        (0..heads)
                            .flat_map(|h| w[h * n + range.start..h * n + range.end].to_vec())
                            .collect()
                    };
                    let mut parts = vec![0f32; heads * hd];
                    let (early, late) = cache.split_at(split * hd);
                    ops.weighted_sum(&part(0..split), heads, early, hd, &mut parts);
                    ops.weighted_sum(&part(split..n), heads, late, hd, &mut parts);
                    assert_eq!(parts, out, "{heads} heads, split at {split}");
                }
                for h in 0..heads {
                    let mut alone = vec![0f32; n];
                    ops.dots(&q[h * hd..(h + 1) * hd], 1, &cache, hd, &mut alone);
                    assert_eq!(alone, scores[h * n..(h + 1) * n], "{heads} heads, head {h}");
                    let mut alone = vec![0f32; hd];
                    ops.weighted_sum(&w[h * n..(h + 1) * n], 1, &cache, hd, &mut alone);
                    assert_eq!(alone, out[h * hd..(h + 1) * hd], "{heads} heads, head {h}");
                    for t in 0..n {
                        let want: f64 = (0..hd)
                            .map(|e| {
                                f64::from(q[h * hd + e]) * f64::from(cache[t * hd + e].to_f32())
                            })
                            .sum();
                        assert!(
                            (f64::from(scores[h * n + t]) - want).abs() < 1e-4,
                            "{h} {t}"
                        );
                    }
                    for e in 0..hd {
                        let want: f64 = (0..n)
                            .map(|t| {
                                f64::from(w[h * n + t]) * f64::from(cache[t * hd + e].to_f32())
                            })
                            .sum();
                        assert!((f64::from(out[h * hd + e]) - want).abs() < 1e-4, "{h} {e}");
                    }
                }
            }
        }
    }

    /// The AVX-512 attention kernels give the 256-bit ones' bits, for 1 to 5 query
    /// heads and position counts around their groups of eight keys, with positions
    /// further apart than one head (a stride of 80 values) and a nonzero output to
    /// add to.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_attention_matches_narrow_attention_exactly() {
        let Some(t) = x86::token() else {
            return;
        };
        let (wide, narrow) = (F32Ops(Isa::Avx2(t)), F32Ops(Isa::Avx2(t.without_avx512())));
        let hd = 64;
        for stride in [hd, 80] {
            for n in [1, 7, 8, 9, 16, 23, 40] {
                let mut cache = Vec::new();
                F32Ops(Isa::Scalar).append_halves(&values(21, n * stride), &mut cache);
                for heads in 1..=5 {
                    let q = values(22 + heads as u64, heads * hd);
                    let w = values(23, heads * n);
                    let run = |ops: F32Ops| {
                        let mut scores = vec![0f32; heads * n];
                        ops.dots(&q, heads, &cache, stride, &mut scores);
                        let mut out = values(24, heads * hd);
                        ops.weighted_sum(&w, heads, &cache, stride, &mut out);
                        (scores, out)
                    };
                    assert_eq!(
                        run(wide),
                        run(narrow),
                        "stride {stride}, {n} keys, {heads} heads"
                    );
                }
            }
        }
    }

    /// The AVX-512 kernels take 16-row panels; each lane must run what the 256-bit
    /// kernel runs, to the bit, whatever the batch (40 rows: two panels of 16 and one
    /// with 8 rows past the matrix); and the kernels without VNNI sum the same
    /// integers, so they agree to the bit too.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_panels_match_narrow_panels_exactly() {
        let Some(t) = x86::token() else {
            return;
        };
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (rows, cols) = (40, 256);
            let rb = ty.row_bytes(cols).unwrap();
            let mut w = vec![0u8; rb * rows];
            for (r, b) in values(3, rows * cols)
                .chunks_exact(cols)
                .zip(w.chunks_exact_mut(rb))
            {
                quantize_row(ty, r, b).unwrap();
            }
            for batch in [1, 3, 8, 11] {
                let mut qx = QuantizedActivations::default();
                qx.quantize_from(&values(4, cols * batch), cols).unwrap();
                let run = |t| {
                    let pm = PackedMatrix::pack(Isa::Avx2(t), ty, &w, rows, cols).unwrap();
                    let mut out = vec![0f32; rows * batch];
                    x86::packed_rows(t, &pm, 0..rows, &qx, &mut |v, r0, lanes| {
                        out[v * rows + r0..][..PANEL].copy_from_slice(lanes);
                    });
                    out
                };
                let wide = run(t);
                assert_eq!(wide, run(t.without_avx512()), "{ty:?} batch {batch}");
                assert_eq!(wide, run(t.without_vnni()), "{ty:?} batch {batch}");
            }
        }
    }

    /// Every packed kernel this CPU can run (AVX-512, 256-bit with and without VNNI)
    /// against the row kernels, on random bytes: large weights and activations of one
    /// sign are where 16-bit sums would saturate.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_kernels_match_row_kernels_on_random_bytes() {
        let Some(t) = x86::token() else {
            return;
        };
        let (rows, cols) = (24, 256);
        let mut qx = QuantizedActivations::default();
        let xs: Vec<f32> = values(11, cols * 5)
            .iter()
            .enumerate()
            .map(|(i, &v)| if i % 3 == 0 { 127.0 } else { v * 127.0 })
            .collect();
        qx.quantize_from(&xs, cols).unwrap();
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let rb = ty.row_bytes(cols).unwrap();
            let mut w: Vec<u8> = values(12 + u64::from(ty.id()), rb * rows)
                .iter()
                .map(|v| (v * 127.0) as i8 as u8)
                .collect();
            // Finite, modest scales (and mins): random f16 bits may be NaN.
            let scales = if ty == GgmlType::Q4_1 { 2 } else { 1 };
            for block in w.chunks_exact_mut(ty.block_bytes()) {
                for k in 0..scales {
                    let v = 0.01 + f32::from(block[2 * k + 1] & 7) * 0.003;
                    put_f16(&mut block[2 * k..], v);
                }
            }
            let expect: Vec<f32> = (0..qx.count)
                .flat_map(|v| {
                    let (w, qx) = (&w, &qx);
                    (0..rows)
                        .map(move |r| dot_q8_dispatch(Isa::Scalar, ty, &w[r * rb..][..rb], qx, v))
                })
                .collect();
            for k in [t, t.without_avx512(), t.without_vnni()] {
                let pm = PackedMatrix::pack(Isa::Avx2(k), ty, &w, rows, cols).unwrap();
                let mut out = vec![0f32; rows * qx.count];
                x86::packed_rows(k, &pm, 0..rows, &qx, &mut |v, r0, lanes| {
                    out[v * rows + r0..][..PANEL].copy_from_slice(lanes);
                });
                for (i, (a, b)) in expect.iter().zip(&out).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                        "{ty:?} {k:?} entry {i}: scalar {a}, packed {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn packed_matches_plain_and_batches_exactly() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            packed_case(ty);
        }
    }

    fn packed_case(ty: GgmlType) {
        let (rows, cols, batch) = (24, 256, 9);
        let rb = ty.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rb * rows];
        for (r, b) in values(8, rows * cols)
            .chunks_exact(cols)
            .zip(w.chunks_exact_mut(rb))
        {
            quantize_row(ty, r, b).unwrap();
        }
        let Some(pm) = PackedMatrix::new(ty, &w, rows, cols) else {
            println!("no packed kernels on this CPU");
            return;
        };
        let xs = values(9, cols * batch);
        let run = |packed: Option<&PackedMatrix>, xs: &[f32]| {
            let mut out = vec![0f32; rows * (xs.len() / cols)];
            let mut job = [MatJob {
                ty,
                weights: &w,
                packed,
                n_rows: rows,
                out: &mut out,
            }];
            matmul_many(&mut job, cols, xs, &mut QuantizedActivations::default()).unwrap();
            out
        };
        let (plain, packed) = (run(None, &xs), run(Some(&pm), &xs));
        for (a, b) in plain.iter().zip(&packed) {
            assert!(
                (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                "{ty:?}: {a} vs {b}"
            );
        }
        for (v, x) in xs.chunks_exact(cols).enumerate() {
            assert_eq!(run(Some(&pm), x), packed[v * rows..(v + 1) * rows]);
        }
    }

    #[test]
    fn shape_errors_are_typed() {
        let mut out = [0f32; 2];
        assert!(matches!(
            matmul(GgmlType::Q4_1, &[0; 40], 2, 32, &[0.0; 31], &mut out),
            Err(QuantError::Length { .. })
        ));
        assert!(matches!(
            matmul(GgmlType::Q4_1, &[0; 39], 2, 32, &[0.0; 32], &mut out),
            Err(QuantError::Length { .. })
        ));
        assert_eq!(
            dot_row(GgmlType::Q5_0, &[0; 22], &[0.0; 32]),
            Err(QuantError::Unsupported(GgmlType::Q5_0))
        );
    }
}
