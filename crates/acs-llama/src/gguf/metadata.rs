//! Metadata values: the types GGUF numbers, values and arrays, and typed lookups by
//! key.

use std::collections::BTreeMap;

use super::GgufError;

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
    pub(super) fn min_size(self) -> u64 {
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
    pub(super) fn as_int(&self) -> Option<i128> {
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
    pub(super) map: BTreeMap<String, MetaValue>,
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
