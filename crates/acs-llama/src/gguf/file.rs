//! A whole GGUF file (mapped natively, or owned bytes) and the streaming loader that
//! yields tensors from chunks.

use super::header::{GgufHeader, TensorInfo};
use super::metadata::Metadata;
use super::{GgufError, overflow};

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
        Self::of_part(header, 0)
    }

    /// A stream expecting file `part` of a split model (see
    /// [`GgufHeader::merge_split`]) from its byte 0: it delivers that file's tensors.
    pub fn of_part(header: &GgufHeader, part: u16) -> Result<TensorStream, GgufError> {
        let mut order = Vec::new();
        for t in header.tensors.iter().filter(|t| t.part == part) {
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

/// A whole model file at hand (or each file of a split model): the parsed header plus
/// the bytes (mapped natively).
#[derive(Debug)]
pub struct GgufFile {
    header: GgufHeader,
    /// The files' bytes, the first file first.
    parts: Vec<Storage>,
    /// Where each file was mapped from (none for files held in memory).
    paths: Vec<std::path::PathBuf>,
}

impl GgufFile {
    /// Maps the file at `path` and parses its header. The first file of a split
    /// model (`NAME-00001-of-00003.gguf`) brings the others from beside it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let first = map(path)?;
        let header = GgufHeader::parse_complete(&first)?;
        let paths = super::split::file_paths(path, header.split()?)?;
        let (mut parts, mut headers) = (vec![Storage::Mmap(first)], vec![header]);
        for other in &paths[1..] {
            let bytes = map(other)?;
            headers.push(GgufHeader::parse_complete(&bytes)?);
            parts.push(Storage::Mmap(bytes));
        }
        let mut file = Self::with_parts(parts, headers)?;
        file.paths = paths;
        Ok(file)
    }

    /// Parses a file held in memory.
    pub fn from_vec(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_parts(vec![bytes])
    }

    /// Parses the files of a split model held in memory, in order (one file is a
    /// model in one file).
    pub fn from_parts(parts: Vec<Vec<u8>>) -> Result<GgufFile, GgufError> {
        let headers = parts
            .iter()
            .map(|b| GgufHeader::parse_complete(b))
            .collect::<Result<Vec<_>, _>>()?;
        Self::with_parts(parts.into_iter().map(Storage::Owned).collect(), headers)
    }

    fn with_parts(parts: Vec<Storage>, headers: Vec<GgufHeader>) -> Result<GgufFile, GgufError> {
        let header = GgufHeader::of_files(headers)?;
        for (no, part) in (0u16..).zip(&parts) {
            header.check_file_len(no, storage_bytes(part).len() as u64)?;
        }
        Ok(GgufFile {
            header,
            parts,
            paths: Vec::new(),
        })
    }

    /// The paths of the files [`GgufFile::open`] mapped: the model's file, or each
    /// file of a split model in order; empty for files held in memory.
    pub fn paths(&self) -> &[std::path::PathBuf] {
        &self.paths
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

    /// The bytes of file `part` (0 for a model in one file).
    pub fn part_bytes(&self, part: u16) -> &[u8] {
        self.parts.get(usize::from(part)).map_or(&[], storage_bytes)
    }

    /// Tells the OS that the bytes `range` of mapped file `part` are not needed for
    /// now (the matrices a loader has copied into another layout): their pages leave
    /// the process's resident memory, and come back from the file if they are read
    /// again. Does nothing for a file held in memory, or off Unix.
    pub fn release(&self, part: u16, range: std::ops::Range<usize>) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let Some(Storage::Mmap(map)) = self.parts.get(usize::from(part))
            && range.start < range.end
            && range.end <= map.len()
        {
            // SAFETY: the map is private, read-only and backed by the file, so the
            // pages MADV_DONTNEED drops are read back from the file when touched
            // again: every slice of the map keeps its contents (under `open`'s
            // contract that the file is not rewritten while mapped). The range lies
            // in the map. A failure only leaves the pages resident.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
        #[cfg(not(all(unix, not(target_arch = "wasm32"))))]
        let _ = (part, range);
    }

    /// A tensor's raw data (checked against the file, so an info from another file
    /// cannot read out of bounds).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let r = self.header.tensor_range(t)?;
        let bytes = self.part_bytes(t.part);
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

/// Maps the file at `path` read-only.
#[cfg(not(target_arch = "wasm32"))]
fn map(path: &std::path::Path) -> Result<memmap2::Mmap, GgufError> {
    let io = |e: std::io::Error| GgufError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this process. Mapping is sound as
    // long as no one truncates or rewrites the file while it is mapped, which Rust
    // cannot rule out for a shared file; model files are written once and then only
    // read, and that is the contract this loader documents (as every mmap-based
    // model loader, llama.cpp included, does).
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

fn storage_bytes(s: &Storage) -> &[u8] {
    match s {
        #[cfg(not(target_arch = "wasm32"))]
        Storage::Mmap(m) => m,
        Storage::Owned(v) => v,
    }
}
