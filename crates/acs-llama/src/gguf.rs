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

use std::collections::BTreeMap;
use std::ops::Range;

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
    /// Opening or mapping the file failed.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
}

/// The type ids of metadata values, as numbered in the GGUF spec.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl MetaType {
    const ALL: [MetaType; 13] = [
        MetaType::U8,
        MetaType::I8,
        MetaType::U16,
        MetaType::I16,
        MetaType::U32,
        MetaType::I32,
        MetaType::F32,
        MetaType::Bool,
        MetaType::String,
        MetaType::Array,
        MetaType::U64,
        MetaType::I64,
        MetaType::F64,
    ];

    /// The type with spec number `id`.
    pub fn from_id(id: u32) -> Option<MetaType> {
        Self::ALL.get(usize::try_from(id).ok()?).copied()
    }

    /// The spec number of this type.
    pub fn id(self) -> u32 {
        Self::ALL.iter().position(|&t| t == self).unwrap_or(0) as u32
    }

    /// The fewest bytes one value of this type occupies: what bounds element counts.
    fn min_size(self) -> u64 {
        match self {
            MetaType::U8 | MetaType::I8 | MetaType::Bool => 1,
            MetaType::U16 | MetaType::I16 => 2,
            MetaType::U32 | MetaType::I32 | MetaType::F32 => 4,
            MetaType::U64 | MetaType::I64 | MetaType::F64 | MetaType::String => 8,
            MetaType::Array => 12,
        }
    }
}

/// One metadata value.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: GGUF arrays hold one element type, so they are stored typed
/// (a 49152-entry vocabulary is one `Vec<String>`, not 49152 enum values).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetaValue {
    /// The value's type.
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(_) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// The value as a signed 128-bit integer, for any integer type: files disagree
    /// on integer widths (a context length may be u32 in one file and u64 in another).
    fn as_int(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    fn describe(&self) -> String {
        match self {
            MetaValue::Array(a) => format!("array of {:?}", a.elem_type()),
            v => format!("{:?}", v.meta_type()),
        }
    }
}

impl MetaArray {
    /// The element type.
    pub fn elem_type(&self) -> MetaType {
        match self {
            MetaArray::U8(_) => MetaType::U8,
            MetaArray::I8(_) => MetaType::I8,
            MetaArray::U16(_) => MetaType::U16,
            MetaArray::I16(_) => MetaType::I16,
            MetaArray::U32(_) => MetaType::U32,
            MetaArray::I32(_) => MetaType::I32,
            MetaArray::F32(_) => MetaType::F32,
            MetaArray::Bool(_) => MetaType::Bool,
            MetaArray::String(_) => MetaType::String,
            MetaArray::Array(_) => MetaType::Array,
            MetaArray::U64(_) => MetaType::U64,
            MetaArray::I64(_) => MetaType::I64,
            MetaArray::F64(_) => MetaType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The metadata key/value pairs, with typed getters that name the key on failure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    map: BTreeMap<String, MetaValue>,
}

macro_rules! int_getter {
    ($name:ident, $t:ty) => {
        #[doc = concat!("The integer at `key` as ", stringify!($t), " (any stored integer type whose value fits).")]
        pub fn $name(&self, key: &str) -> Result<$t, GgufError> {
            let v = self.require(key)?;
            v.as_int()
                .and_then(|i| <$t>::try_from(i).ok())
                .ok_or_else(|| wrong(key, stringify!($t), v))
        }
    };
}

macro_rules! array_getter {
    ($name:ident, $variant:ident, $t:ty) => {
        #[doc = concat!("The array of ", stringify!($t), " at `key`.")]
        pub fn $name(&self, key: &str) -> Result<&[$t], GgufError> {
            match self.require(key)? {
                MetaValue::Array(MetaArray::$variant(v)) => Ok(v),
                v => Err(wrong(key, concat!("array of ", stringify!($t)), v)),
            }
        }
    };
}

fn wrong(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found: v.describe(),
    }
}

impl Metadata {
    /// The value at `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.map.get(key)
    }

    /// The value at `key`, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.map
            .get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_owned()))
    }

    /// All pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds or replaces a pair (for building metadata in code).
    pub fn insert(&mut self, key: impl Into<String>, value: MetaValue) {
        self.map.insert(key.into(), value);
    }

    int_getter!(get_u32, u32);
    int_getter!(get_u64, u64);
    int_getter!(get_i32, i32);
    int_getter!(get_i64, i64);
    int_getter!(get_usize, usize);

    /// The float at `key` (F32, or F64 narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            MetaValue::F32(v) => Ok(*v),
            MetaValue::F64(v) => Ok(*v as f32),
            v => Err(wrong(key, "f32", v)),
        }
    }

    /// The bool at `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetaValue::Bool(v) => Ok(*v),
            v => Err(wrong(key, "bool", v)),
        }
    }

    /// The string at `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            MetaValue::String(v) => Ok(v),
            v => Err(wrong(key, "string", v)),
        }
    }

    /// The array at `key`, of any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        match self.require(key)? {
            MetaValue::Array(a) => Ok(a),
            v => Err(wrong(key, "array", v)),
        }
    }

    array_getter!(get_str_array, String, String);
    array_getter!(get_f32_array, F32, f32);
    array_getter!(get_i32_array, I32, i32);
    array_getter!(get_u32_array, U32, u32);
    array_getter!(get_u8_array, U8, u8);
}

/// One tensor's description from the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// llama.cpp's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), then rows, and so on.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section (aligned).
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Values per row (`dims[0]`; 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of the other dims).
    pub fn n_rows(&self) -> u64 {
        // Cannot overflow: the parser checked the product of all dims.
        self.dims.iter().skip(1).product()
    }

    /// Number of values.
    pub fn n_elements(&self) -> u64 {
        self.row_len() * self.n_rows()
    }
}

/// Everything before the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    /// 2 or 3.
    pub version: u32,
    /// The key/value pairs.
    pub metadata: Metadata,
    /// The tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment (`general.alignment` or 32).
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

/// The result of parsing a prefix of a file.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderParse {
    /// The whole header was in the prefix.
    Complete(Box<GgufHeader>),
    /// The prefix ends inside the header; at least `min_len` bytes from the start of
    /// the file are needed. A `min_len` beyond the file's size means a corrupt file.
    NeedMore {
        /// The fewest bytes the header can occupy, as far as parsing got.
        min_len: u64,
    },
}

/// Internal parse failure: ending short is a "need more" when streaming and an error
/// when the whole file is at hand.
enum Fail {
    Short {
        what: &'static str,
        need: u64,
        /// Set when a count made the need: then a complete file has too many.
        count: Option<u64>,
    },
    Bad(GgufError),
}

impl From<GgufError> for Fail {
    fn from(e: GgufError) -> Self {
        Fail::Bad(e)
    }
}

fn overflow(what: &str) -> GgufError {
    GgufError::Overflow {
        what: what.to_owned(),
    }
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    fn short(&self, what: &'static str, n: u64, count: Option<u64>) -> Fail {
        match (self.pos as u64).checked_add(n) {
            Some(need) => Fail::Short { what, need, count },
            None => match count {
                Some(count) => Fail::Bad(GgufError::TooMany { what, count }),
                None => Fail::Bad(overflow(what)),
            },
        }
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], Fail> {
        if n > self.remaining() {
            return Err(self.short(what, n, None));
        }
        // n <= remaining, which fits in usize.
        let n = n as usize;
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Fail> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, Fail> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, Fail> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` values of at least `min_size` bytes each can still fit.
    fn bound(&self, count: u64, min_size: u64, what: &'static str) -> Result<usize, Fail> {
        let Some(bytes) = count.checked_mul(min_size) else {
            return Err(Fail::Bad(GgufError::TooMany { what, count }));
        };
        if bytes > self.remaining() {
            return Err(self.short(what, bytes, Some(count)));
        }
        // count <= remaining bytes, which fits in usize.
        Ok(count as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<String, Fail> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Fail::Bad(GgufError::BadUtf8 { what }))
    }

    fn meta_type(&mut self) -> Result<MetaType, Fail> {
        let id = self.u32("metadata value type")?;
        MetaType::from_id(id).ok_or(Fail::Bad(GgufError::UnknownValueType(id)))
    }

    fn value(&mut self, ty: MetaType, depth: u32) -> Result<MetaValue, Fail> {
        const W: &str = "metadata value";
        Ok(match ty {
            MetaType::U8 => MetaValue::U8(self.array::<1>(W)?[0]),
            MetaType::I8 => MetaValue::I8(self.array::<1>(W)?[0] as i8),
            MetaType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(W)?)),
            MetaType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(W)?)),
            MetaType::U32 => MetaValue::U32(self.u32(W)?),
            MetaType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(W)?)),
            MetaType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(W)?)),
            MetaType::Bool => MetaValue::Bool(self.array::<1>(W)?[0] != 0),
            MetaType::String => MetaValue::String(self.string("metadata string")?),
            MetaType::Array => MetaValue::Array(self.meta_array(depth + 1)?),
            MetaType::U64 => MetaValue::U64(self.u64(W)?),
            MetaType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(W)?)),
            MetaType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(W)?)),
        })
    }

    fn meta_array(&mut self, depth: u32) -> Result<MetaArray, Fail> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(Fail::Bad(GgufError::TooDeep));
        }
        let ty = self.meta_type()?;
        let count = self.u64("array length")?;
        let n = self.bound(count, ty.min_size(), "array element")?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const S: usize = std::mem::size_of::<$t>();
                // `bound` checked that n * S bytes remain.
                let raw = self.take((n * S) as u64, "array element")?;
                MetaArray::$variant(
                    raw.chunks_exact(S)
                        .map(|c| {
                            let mut a = [0u8; S];
                            a.copy_from_slice(c);
                            <$t>::from_le_bytes(a)
                        })
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            MetaType::U8 => fixed!(U8, u8),
            MetaType::I8 => fixed!(I8, i8),
            MetaType::U16 => fixed!(U16, u16),
            MetaType::I16 => fixed!(I16, i16),
            MetaType::U32 => fixed!(U32, u32),
            MetaType::I32 => fixed!(I32, i32),
            MetaType::F32 => fixed!(F32, f32),
            MetaType::U64 => fixed!(U64, u64),
            MetaType::I64 => fixed!(I64, i64),
            MetaType::F64 => fixed!(F64, f64),
            MetaType::Bool => MetaArray::Bool(
                self.take(n as u64, "array element")?
                    .iter()
                    .map(|&b| b != 0)
                    .collect(),
            ),
            MetaType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string("array string")?);
                }
                MetaArray::String(v)
            }
            MetaType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(depth + 1)?);
                }
                MetaArray::Array(v)
            }
        })
    }
}

/// Rounds `x` up to a multiple of the power of two `align`.
fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

impl GgufHeader {
    /// Parses the header from a prefix of the file.
    ///
    /// Returns [`HeaderParse::NeedMore`] when the prefix ends inside the header (feed
    /// more bytes and call again), and an error as soon as the prefix proves the file
    /// corrupt.
    pub fn parse(bytes: &[u8]) -> Result<HeaderParse, GgufError> {
        match parse_inner(bytes) {
            Ok(h) => Ok(HeaderParse::Complete(Box::new(h))),
            Err(Fail::Short { need, .. }) => Ok(HeaderParse::NeedMore { min_len: need }),
            Err(Fail::Bad(e)) => Err(e),
        }
    }

    /// Parses the header from bytes that are the whole file (or at least hold the
    /// whole header): ending early is [`GgufError::Truncated`] or, when a count
    /// claimed more than the rest could hold, [`GgufError::TooMany`].
    pub fn parse_complete(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
        parse_inner(bytes).map_err(|f| match f {
            Fail::Short {
                what,
                count: Some(count),
                ..
            } => GgufError::TooMany { what, count },
            Fail::Short { what, .. } => GgufError::Truncated { what },
            Fail::Bad(e) => e,
        })
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor called `name`, or [`GgufError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_owned()))
    }

    /// Absolute file range of a tensor's data.
    pub fn tensor_range(&self, t: &TensorInfo) -> Result<Range<u64>, GgufError> {
        let start = self
            .data_offset
            .checked_add(t.offset)
            .ok_or_else(|| overflow(&t.name))?;
        let end = start
            .checked_add(t.n_bytes)
            .ok_or_else(|| overflow(&t.name))?;
        Ok(start..end)
    }

    /// Checks that every tensor's data lies inside a file of `file_len` bytes.
    pub fn check_file_len(&self, file_len: u64) -> Result<(), GgufError> {
        for t in &self.tensors {
            if self.tensor_range(t)?.end > file_len {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                });
            }
        }
        Ok(())
    }
}

fn parse_inner(bytes: &[u8]) -> Result<GgufHeader, Fail> {
    let mut c = Cursor { b: bytes, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic).into());
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version).into());
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Minimum sizes: a key/value pair is an 8-byte key length, a 4-byte type and at
    // least 1 value byte; a tensor info is name length, n_dims, type and offset.
    let n_kv = c.bound(n_kv, 13, "metadata pair")?;
    let mut metadata = Metadata::default();
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.meta_type()?;
        let value = c.value(ty, 0)?;
        if metadata.map.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key).into());
        }
        metadata.map.insert(key, value);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(v) => {
            return Err(GgufError::BadAlignment(v.as_int().map_or(0, |i| i as u64)).into());
        }
    };
    let n_tensors = c.bound(n_tensors, 24, "tensor info")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        tensors.push(tensor_info(&mut c, alignment)?);
    }
    let data_offset = align_up(c.pos as u64, alignment).ok_or_else(|| overflow("header"))?;
    check_layout(&tensors, data_offset)?;
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn tensor_info(c: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo, Fail> {
    let name = c.string("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims }.into());
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let id = c.u32("tensor type")?;
    let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownType {
        name: name.clone(),
        id,
    })?;
    let offset = c.u64("tensor offset")?;
    if offset % alignment != 0 {
        return Err(GgufError::Misaligned {
            name,
            offset,
            alignment,
        }
        .into());
    }
    let row_len = dims.first().copied().unwrap_or(1);
    let block = ty.block_size() as u64;
    if row_len % block != 0 {
        return Err(GgufError::RaggedRow { name, ty, row_len }.into());
    }
    // The element count must fit in i64, as ggml's int64_t dims require.
    let size = || {
        let n_rows = dims
            .iter()
            .skip(1)
            .try_fold(1u64, |a, &d| a.checked_mul(d))?;
        row_len
            .checked_mul(n_rows)
            .filter(|&n| n <= i64::MAX as u64)?;
        let row_bytes = (row_len / block).checked_mul(ty.block_bytes() as u64)?;
        row_bytes.checked_mul(n_rows)
    };
    let n_bytes = size().ok_or_else(|| overflow(&name))?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_bytes,
    })
}

/// Tensor names must be unique, their data disjoint (a streamed load reads each byte
/// once, in order) and their absolute ranges representable.
fn check_layout(tensors: &[TensorInfo], data_offset: u64) -> Result<(), GgufError> {
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by(|a, b| a.offset.cmp(&b.offset).then(a.name.cmp(&b.name)));
    let mut prev_end = 0u64;
    for t in &by_offset {
        if t.offset < prev_end {
            return Err(GgufError::TensorOverlap {
                name: t.name.clone(),
            });
        }
        prev_end = t
            .offset
            .checked_add(t.n_bytes)
            // Absolute ranges (data offset + offset + size) must fit too.
            .filter(|end| end.checked_add(data_offset).is_some())
            .ok_or_else(|| overflow(&t.name))?;
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(GgufError::DuplicateTensor(w[0].to_owned()));
    }
    Ok(())
}

/// Delivers each tensor's bytes from a file fed in chunks, in file order, holding at
/// most one partial tensor: how the browser loads a model without the whole file in
/// memory.
#[derive(Debug)]
pub struct TensorStream {
    /// (tensor, absolute start) sorted by start.
    order: Vec<(TensorInfo, u64)>,
    next: usize,
    /// File bytes consumed so far.
    pos: u64,
    /// The current tensor's bytes when it spans chunks.
    buf: Vec<u8>,
}

impl TensorStream {
    /// A stream expecting the file from byte 0 (the header's bytes included).
    pub fn new(header: &GgufHeader) -> Result<TensorStream, GgufError> {
        let mut order = Vec::with_capacity(header.tensors.len());
        for t in &header.tensors {
            order.push((t.clone(), header.tensor_range(t)?.start));
        }
        // Ties broken by length: an empty tensor may share its offset with the tensor
        // that follows it, and must be delivered before that tensor's bytes pass by.
        order.sort_by_key(|(t, start)| (*start, t.n_bytes));
        Ok(TensorStream {
            order,
            next: 0,
            pos: 0,
            buf: Vec::new(),
        })
    }

    /// File bytes consumed so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Whether every tensor has been delivered.
    pub fn is_done(&self) -> bool {
        self.next == self.order.len()
    }

    /// Feeds the next chunk of the file; calls `on_tensor` for every tensor completed
    /// by it (borrowing from the chunk when the tensor lies wholly inside it).
    pub fn push<E: From<GgufError>>(
        &mut self,
        chunk: &[u8],
        mut on_tensor: impl FnMut(&TensorInfo, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        // The pieces of a tensor that spans chunks gather in `buf`; a tensor wholly
        // inside this chunk (no earlier piece) is lent straight from it.
        let mut buf = std::mem::take(&mut self.buf);
        let fed = self.push_pieces(chunk, |t, piece, last| {
            if !last {
                buf.extend_from_slice(piece);
                Ok(())
            } else if buf.is_empty() {
                on_tensor(t, piece)
            } else {
                buf.extend_from_slice(piece);
                let done = on_tensor(t, &buf);
                buf = Vec::new();
                done
            }
        });
        self.buf = buf;
        fed
    }

    /// Feeds the next chunk of the file like [`TensorStream::push`], but hands each
    /// tensor's bytes over as they pass (`on_piece(tensor, bytes, last)`, in file
    /// order, `last` on a tensor's final piece) instead of gathering a tensor first:
    /// nothing is held, so a tensor of any size streams through. Feed a stream by one
    /// of the two methods only.
    pub fn push_pieces<E: From<GgufError>>(
        &mut self,
        chunk: &[u8],
        mut on_piece: impl FnMut(&TensorInfo, &[u8], bool) -> Result<(), E>,
    ) -> Result<(), E> {
        let cpos = self.pos;
        let cend = cpos
            .checked_add(chunk.len() as u64)
            .ok_or_else(|| overflow("stream position"))?;
        self.pos = cend;
        while let Some((t, start)) = self.order.get(self.next) {
            let (start, len) = (*start, t.n_bytes);
            // Validated by the header parse: start + len does not overflow.
            let end = start + len;
            if start > cend || (start == cend && len > 0) {
                break;
            }
            let lo = (start.max(cpos) - cpos) as usize;
            let hi = (end.min(cend) - cpos) as usize;
            let last = end <= cend;
            on_piece(t, &chunk[lo..hi], last)?;
            if !last {
                break;
            }
            self.next += 1;
        }
        Ok(())
    }

    /// Ends the stream: an error if the file ended before every tensor's data.
    pub fn finish(self) -> Result<(), GgufError> {
        match self.order.get(self.next) {
            None => Ok(()),
            Some((t, _)) => Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
            }),
        }
    }
}

/// Where a [`GgufFile`]'s bytes live.
#[derive(Debug)]
enum Storage {
    #[cfg(not(target_arch = "wasm32"))]
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A whole GGUF file at hand: the parsed header plus the bytes (mapped natively).
#[derive(Debug)]
pub struct GgufFile {
    header: GgufHeader,
    storage: Storage,
}

impl GgufFile {
    /// Maps the file at `path` and parses its header.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Mapping is sound
        // as long as no one truncates or rewrites the file while it is mapped, which
        // Rust cannot rule out for a shared file; model files are written once and
        // then only read, and that is the contract this loader documents (as every
        // mmap-based model loader, llama.cpp included, does).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::with_storage(Storage::Mmap(map))
    }

    /// Parses a file held in memory.
    pub fn from_vec(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::with_storage(Storage::Owned(bytes))
    }

    fn with_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let bytes = storage_bytes(&storage);
        let header = GgufHeader::parse_complete(bytes)?;
        header.check_file_len(bytes.len() as u64)?;
        Ok(GgufFile { header, storage })
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        storage_bytes(&self.storage)
    }

    /// A tensor's raw data (checked against the file, so an info from another file
    /// cannot read out of bounds).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let r = self.header.tensor_range(t)?;
        let bytes = self.bytes();
        let oob = || GgufError::TensorOutOfBounds {
            name: t.name.clone(),
        };
        let start = usize::try_from(r.start).map_err(|_| oob())?;
        let end = usize::try_from(r.end).map_err(|_| oob())?;
        bytes.get(start..end).ok_or_else(oob)
    }

    /// The tensor called `name` and its data.
    pub fn tensor_data(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let t = self.header.require_tensor(name)?;
        Ok((t, self.tensor_bytes(t)?))
    }
}

fn storage_bytes(s: &Storage) -> &[u8] {
    match s {
        #[cfg(not(target_arch = "wasm32"))]
        Storage::Mmap(m) => m,
        Storage::Owned(v) => v,
    }
}

/// Writes GGUF files: the test-model generator's back end, and low-level enough (raw
/// tensor bytes, any version and alignment) for tests to build corrupt files.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    kv: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    /// A GGUF v3 writer with no metadata and no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets the version field written (any value, for tests).
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// Appends a key/value pair (duplicates are written as given). A U32
    /// `general.alignment` also sets the data alignment.
    pub fn add(&mut self, key: impl Into<String>, value: MetaValue) {
        self.kv.push((key.into(), value));
    }

    /// Appends a tensor of a known type. `data` must hold exactly the tensor's bytes.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let row_len = dims.first().copied().unwrap_or(1);
        let rows: u64 = dims.iter().skip(1).product();
        let expect = usize::try_from(row_len)
            .ok()
            .and_then(|n| ty.row_bytes(n).ok())
            .and_then(|rb| (rb as u64).checked_mul(rows));
        if expect != Some(data.len() as u64) {
            return Err(GgufError::TensorOutOfBounds { name });
        }
        self.add_raw_tensor(name, dims.to_vec(), ty.id(), data);
        Ok(())
    }

    /// Appends a tensor with any type id and any bytes, unchecked (for corrupt files).
    pub fn add_raw_tensor(
        &mut self,
        name: impl Into<String>,
        dims: Vec<u64>,
        type_id: u32,
        data: Vec<u8>,
    ) {
        self.tensors.push((name.into(), dims, type_id, data));
    }

    fn alignment(&self) -> u64 {
        self.kv
            .iter()
            .rev()
            .find_map(|(k, v)| match v {
                MetaValue::U32(a) if k == "general.alignment" && a.is_power_of_two() => {
                    Some(u64::from(*a))
                }
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend_from_slice(&v.meta_type().id().to_le_bytes());
            encode_value(v, &mut out);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + data.len()).next_multiple_of(align);
        }
        out.resize(out.len().next_multiple_of(align), 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(align), 0);
        }
        out
    }

    /// Writes the file.
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(&self.to_bytes())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends a value's encoding (without its type id) as GGUF stores it.
pub fn encode_value(v: &MetaValue, out: &mut Vec<u8>) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => encode_array(a, out),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn encode_array(a: &MetaArray, out: &mut Vec<u8>) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => each!(v),
        MetaArray::U16(v) => each!(v),
        MetaArray::I16(v) => each!(v),
        MetaArray::U32(v) => each!(v),
        MetaArray::I32(v) => each!(v),
        MetaArray::F32(v) => each!(v),
        MetaArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetaArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|a| encode_array(a, out)),
        MetaArray::U64(v) => each!(v),
        MetaArray::I64(v) => each!(v),
        MetaArray::F64(v) => each!(v),
    }
}
