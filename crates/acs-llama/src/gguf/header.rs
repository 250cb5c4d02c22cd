//! Parsing the header (metadata and tensor infos) from a byte prefix, with every
//! count bounded by the bytes that could hold it and every offset checked.

use std::ops::Range;

use super::metadata::{MetaArray, MetaType, MetaValue, Metadata};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufError, MAX_ARRAY_DEPTH, MAX_DIMS, overflow};
use crate::quant::GgmlType;

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
    /// The file of a split model that holds the data (its `split.no`); 0 for a model
    /// in one file.
    pub part: u16,
}

impl TensorInfo {
    /// The same tensor, its data in part `part` of a split model.
    pub(super) fn in_part(self, part: u16) -> TensorInfo {
        TensorInfo { part, ..self }
    }

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
    /// Absolute file offset of the data section (of the first file, for a split
    /// model).
    pub data_offset: u64,
    /// The data section's offset in each further file of a split model (file 2 at
    /// index 0; see [`GgufHeader::merge_split`]); empty for a model in one file.
    pub part_data_offsets: Vec<u64>,
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

    /// Absolute range of a tensor's data in the file that holds it (part
    /// [`TensorInfo::part`] of a split model).
    pub fn tensor_range(&self, t: &TensorInfo) -> Result<Range<u64>, GgufError> {
        let data_offset = match t.part {
            0 => Some(self.data_offset),
            p => self.part_data_offsets.get(usize::from(p) - 1).copied(),
        }
        .ok_or_else(|| GgufError::TensorOutOfBounds {
            name: t.name.clone(),
        })?;
        let start = data_offset
            .checked_add(t.offset)
            .ok_or_else(|| overflow(&t.name))?;
        let end = start
            .checked_add(t.n_bytes)
            .ok_or_else(|| overflow(&t.name))?;
        Ok(start..end)
    }

    /// Checks that every tensor's data in file `part` (0 for a model in one file)
    /// lies inside its `file_len` bytes.
    pub fn check_file_len(&self, part: u16, file_len: u64) -> Result<(), GgufError> {
        for t in self.tensors.iter().filter(|t| t.part == part) {
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
        part_data_offsets: Vec::new(),
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
        part: 0,
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
    unique_names(tensors)
}

fn unique_names(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(GgufError::DuplicateTensor(w[0].to_owned()));
    }
    Ok(())
}

impl GgufHeader {
    /// Tensor names are unique across a split model's parts too.
    pub(super) fn check_unique_names(&self) -> Result<(), GgufError> {
        unique_names(&self.tensors)
    }
}
