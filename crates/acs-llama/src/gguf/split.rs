//! Split models: one model in several GGUF files, as llama.cpp's `llama-gguf-split`
//! writes them (`NAME-00001-of-00003.gguf`, ...). Every part is a GGUF file of its
//! own; the first holds the model's metadata, and each holds some of the tensors, with
//! offsets into its own data section. Each part says where it stands with the keys
//! `split.no` (from 0), `split.count` and `split.tensors.count` (the model's tensors
//! in all parts).

use super::GgufError;
use super::header::GgufHeader;
use super::metadata::Metadata;

/// `split.no`: this part's number, from 0.
pub const KEY_NO: &str = "split.no";
/// `split.count`: how many parts the model has.
pub const KEY_COUNT: &str = "split.count";
/// `split.tensors.count`: the model's tensors in all parts.
pub const KEY_TENSORS: &str = "split.tensors.count";

/// Where a part stands in its split model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitInfo {
    /// This part's number, from 0.
    pub no: u16,
    /// How many parts the model has.
    pub count: u16,
    /// The model's tensors in all parts.
    pub tensors: u64,
}

impl SplitInfo {
    /// The split keys of a part's metadata; `None` for a file that is not a part of
    /// a split model (no `split.count`, or a count of 1).
    pub fn of(metadata: &Metadata) -> Result<Option<SplitInfo>, GgufError> {
        if metadata.get(KEY_COUNT).is_none() {
            return Ok(None);
        }
        let count = u16::try_from(metadata.get_u32(KEY_COUNT)?)
            .map_err(|_| split_error(format!("{KEY_COUNT} is over 65535")))?;
        let no = u16::try_from(metadata.get_u32(KEY_NO)?)
            .map_err(|_| split_error(format!("{KEY_NO} is over 65535")))?;
        if count == 0 || no >= count {
            return Err(split_error(format!(
                "{KEY_NO} {no} is not a part of {KEY_COUNT} {count}"
            )));
        }
        let tensors = metadata.get_u64(KEY_TENSORS)?;
        Ok((count > 1).then_some(SplitInfo { no, count, tensors }))
    }
}

fn split_error(message: String) -> GgufError {
    GgufError::Split(message)
}

/// The file name of part `no` (from 0) of `count`, after the parts' common `prefix`
/// (`llama-gguf-split`'s naming: `PREFIX-00002-of-00003.gguf` for `no` 1).
pub fn part_name(prefix: &str, no: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", u32::from(no) + 1)
}

/// The parts' common prefix and `(no, count)` of a part's name, if it is named as
/// [`part_name`] names parts.
pub fn parse_part_name(name: &str) -> Option<(&str, u16, u16)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    let (no, count): (u16, u16) = (no.parse().ok()?, count.parse().ok()?);
    (no >= 1 && no <= count).then(|| (prefix, no - 1, count))
}

/// The paths of a model's files from its first file's `path` and that file's
/// [`SplitInfo`]: the path alone for a model in one file, else each part's path
/// beside it, named as [`part_name`] names them.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn file_paths(
    path: &std::path::Path,
    split: Option<SplitInfo>,
) -> Result<Vec<std::path::PathBuf>, GgufError> {
    let Some(split) = split else {
        return Ok(vec![path.to_path_buf()]);
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some((prefix, _, _)) = parse_part_name(name) else {
        return Err(split_error(format!(
            "{} is part {} of {}, and its name is not NAME-{:05}-of-{:05}.gguf, \
             so the other parts cannot be found",
            path.display(),
            split.no + 1,
            split.count,
            split.no + 1,
            split.count
        )));
    };
    Ok((0..split.count)
        .map(|no| path.with_file_name(part_name(prefix, no, split.count)))
        .collect())
}

impl GgufHeader {
    /// Where this file stands in a split model, if it is a part of one.
    pub fn split(&self) -> Result<Option<SplitInfo>, GgufError> {
        SplitInfo::of(&self.metadata)
    }

    /// One header for a model's files, in order: a model in one file keeps its own
    /// header; a split model's parts merge ([`GgufHeader::merge_split`]).
    pub fn of_files(files: Vec<GgufHeader>) -> Result<GgufHeader, GgufError> {
        match <[GgufHeader; 1]>::try_from(files) {
            Ok([one]) if one.split()?.is_none() => Ok(one),
            Ok(one) => Self::merge_split(one.into()),
            Err(files) => Self::merge_split(files),
        }
    }

    /// One header for the model of a split's parts (given in order, the first
    /// holding the model's metadata): the first part's metadata and every part's
    /// tensors, each [`TensorInfo::part`](super::TensorInfo::part) naming the file
    /// that holds its data. Checks that the parts are the ones the first announces:
    /// their numbers in order, the same count, every tensor present once.
    pub fn merge_split(parts: Vec<GgufHeader>) -> Result<GgufHeader, GgufError> {
        let mut parts = parts.into_iter();
        let Some(mut merged) = parts.next() else {
            return Err(split_error("no parts".into()));
        };
        let Some(first) = merged.split()? else {
            return Err(split_error(
                "the first file has no split keys, so it is not the first part of a split model"
                    .into(),
            ));
        };
        if first.no != 0 {
            return Err(split_error(format!(
                "this is part {} of {}; load the first part",
                first.no + 1,
                first.count
            )));
        }
        let mut seen = 1u16;
        for (no, part) in (1u16..).zip(parts) {
            match part.split()? {
                Some(s) if s.no == no && s.count == first.count => {}
                Some(s) => {
                    return Err(split_error(format!(
                        "part {} of {} was given where part {} of {} belongs",
                        s.no + 1,
                        s.count,
                        no + 1,
                        first.count
                    )));
                }
                None => {
                    return Err(split_error(format!(
                        "part {} of {} has no split keys",
                        no + 1,
                        first.count
                    )));
                }
            }
            merged.part_data_offsets.push(part.data_offset);
            merged
                .tensors
                .extend(part.tensors.into_iter().map(|t| t.in_part(no)));
            seen = no + 1;
        }
        if seen != first.count {
            return Err(split_error(format!(
                "{seen} of the model's {} parts were given",
                first.count
            )));
        }
        if merged.tensors.len() as u64 != first.tensors {
            return Err(split_error(format!(
                "the parts hold {} tensors, and the first part announces {}",
                merged.tensors.len(),
                first.tensors
            )));
        }
        merged.check_unique_names()?;
        Ok(merged)
    }
}

/// The model of `file` in `count` files as `llama-gguf-split` lays them out: the
/// first with the model's metadata, every file with its share of the tensors (in
/// order, about as many each) and the split keys. For tests and for tools that
/// prepare a model for hosts with a size limit per file.
pub fn split_model(file: &super::GgufFile, count: u16) -> Result<Vec<Vec<u8>>, GgufError> {
    use super::metadata::MetaValue;
    let tensors = file.tensors();
    if count < 2 || usize::from(count) > tensors.len() {
        return Err(split_error(format!(
            "{count} parts of a model of {} tensors",
            tensors.len()
        )));
    }
    let per_part = tensors.len().div_ceil(usize::from(count));
    let mut parts = Vec::with_capacity(usize::from(count));
    for no in 0..count {
        let mut w = super::GgufWriter::new();
        if no == 0 {
            for (k, v) in file.metadata().iter() {
                if !k.starts_with("split.") {
                    w.add(k, v.clone());
                }
            }
        } else if let Some(a) = file.metadata().get("general.alignment") {
            w.add("general.alignment", a.clone());
        }
        w.add(KEY_NO, MetaValue::U16(no));
        w.add(KEY_COUNT, MetaValue::U16(count));
        w.add(KEY_TENSORS, MetaValue::I32(tensors.len() as i32));
        let first = usize::from(no) * per_part;
        for t in tensors.iter().skip(first).take(per_part) {
            w.add_raw_tensor(
                t.name.clone(),
                t.dims.clone(),
                t.ty.id(),
                file.tensor_bytes(t)?.to_vec(),
            );
        }
        parts.push(w.to_bytes());
    }
    Ok(parts)
}
