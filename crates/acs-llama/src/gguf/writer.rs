//! Writing GGUF files.

use super::metadata::{MetaArray, MetaValue};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufError};
use crate::quant::GgmlType;

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
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec does not fail");
        out
    }

    /// Writes the file: the header, then each tensor's bytes as they are held (no
    /// copy of the whole file is made, so a file of many GB writes in its size).
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
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
        w.write_all(&out)?;
        let padding = vec![0u8; align];
        for (_, _, _, data) in &self.tensors {
            w.write_all(data)?;
            w.write_all(&padding[..data.len().next_multiple_of(align) - data.len()])?;
        }
        Ok(())
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
