//! Every element type ggml numbers, with its block geometry: the table GGUF tensor
//! sizes are computed from, whether or not a type has kernels here.

use super::QuantError;
use super::format;

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
    /// The types with kernels here: the rows of the format table (`quant/format.rs`).
    pub const SUPPORTED: &'static [GgmlType] = format::SUPPORTED;

    /// This type's row of [`TYPE_TABLE`], by index: the matmuls ask for block sizes
    /// per task, where a search of the table showed in profiles.
    const fn entry(self) -> (GgmlType, u32, usize, usize) {
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
    pub const fn block_size(self) -> usize {
        self.entry().2
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// Whether [`dequantize_row`](super::dequantize_row), [`dot_row`](super::dot_row)
    /// and [`matmul`](super::matmul) handle this type.
    pub fn is_supported(self) -> bool {
        format::kernels(self).is_some()
    }

    /// Whether [`matmul`](super::matmul) rounds activations to 8 bits for this type (all block
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
