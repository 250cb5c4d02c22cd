//! GGUF (versions 2 and 3): the file format llama.cpp stores models in.
//!
//! Layout: magic `GGUF`, version (u32), tensor count (u64), metadata count (u64), the
//! metadata key/value pairs, the tensor infos (name, dims, ggml type, offset), padding
//! to `general.alignment` (default 32), then the tensor data. All little-endian.
//!
//! The header is parsed from a byte prefix ([`GgufHeader::parse`]) so that a browser
//! can stream the file: it feeds chunks until the header parses, then hands every
//! chunk to a [`TensorStream`] that yields each tensor's bytes as soon as they are
//! complete, holding at most one tensor in memory. Natively [`GgufFile::open`] maps the
//! file and [`GgufFile::tensor_bytes`] borrows from the mapping.
//!
//! Files are untrusted: every count is bounded by the bytes that could hold it before
//! anything is allocated, all offset arithmetic is checked, and every failure is a
//! [`GgufError`] naming what is wrong.

mod file;
mod header;
mod metadata;
mod split;
mod writer;

pub use file::{GgufFile, TensorStream};
pub use header::{GgufHeader, HeaderParse, TensorInfo};
pub use metadata::{MetaArray, MetaType, MetaValue, Metadata};
pub use split::{SplitInfo, parse_part_name, part_name, split_model};
pub use writer::{GgufWriter, encode_value};

use crate::quant::GgmlType;

/// The first four bytes of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted; real files use at most one level, and the
/// limit keeps hostile nesting from exhausting the stack.
pub const MAX_ARRAY_DEPTH: u32 = 4;

/// What is wrong with a GGUF file, or with a metadata lookup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// A version other than 2 or 3 (1 used 32-bit counts; others are unknown).
    #[error("unsupported GGUF version {0}")]
    UnsupportedVersion(u32),
    /// The file ends inside `what`.
    #[error("file truncated inside {what}")]
    Truncated {
        /// The structure being read.
        what: &'static str,
    },
    /// A count larger than the rest of the file could hold.
    #[error("{what} count {count} exceeds what the file can hold")]
    TooMany {
        /// What is being counted.
        what: &'static str,
        /// The count the file claims.
        count: u64,
    },
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    BadUtf8 {
        /// Which string.
        what: &'static str,
    },
    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("arrays nested deeper than {MAX_ARRAY_DEPTH}")]
    TooDeep,
    /// The same metadata key twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// The same tensor name twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// A ggml type id ggml does not define.
    #[error("tensor {name:?} has unknown ggml type {id}")]
    UnknownType {
        /// The tensor.
        name: String,
        /// The stored type id.
        id: u32,
    },
    /// More than [`MAX_DIMS`] dimensions.
    #[error("tensor {name:?} has {n_dims} dimensions (at most {MAX_DIMS})")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// The stored dimension count.
        n_dims: u32,
    },
    /// A row length (`dims[0]`) that is not a whole number of blocks.
    #[error("tensor {name:?}: row length {row_len} is not a multiple of the {ty:?} block size")]
    RaggedRow {
        /// The tensor.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// `dims[0]`.
        row_len: u64,
    },
    /// `general.alignment` that is zero, not a power of two, or not a u32.
    #[error("bad general.alignment {0}")]
    BadAlignment(u64),
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {name:?} offset {offset} is not aligned to {alignment}")]
    Misaligned {
        /// The tensor.
        name: String,
        /// Its offset within the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Two tensors whose data overlap.
    #[error("tensor {name:?} overlaps the previous tensor's data")]
    TensorOverlap {
        /// The later tensor.
        name: String,
    },
    /// A tensor whose data lies (partly) past the end of the file.
    #[error("tensor {name:?} lies outside the file")]
    TensorOutOfBounds {
        /// The tensor.
        name: String,
    },
    /// A size or offset computation that overflows 64 bits.
    #[error("size of {what} overflows")]
    Overflow {
        /// What was being computed.
        what: String,
    },
    /// A metadata key the caller needs is absent.
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    /// A metadata key holds a different type than the caller needs.
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// A tensor the caller needs is absent.
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    /// The parts of a split model do not fit together, or a part was opened alone.
    #[error("split model: {0}")]
    Split(String),
    /// Opening or mapping the file failed.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
}

/// A size or offset that does not fit the arithmetic.
pub(crate) fn overflow(what: &str) -> GgufError {
    GgufError::Overflow {
        what: what.to_owned(),
    }
}
