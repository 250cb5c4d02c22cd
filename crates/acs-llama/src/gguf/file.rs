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

    /// Tells the OS that the bytes `range` of a mapped file are not needed for now
    /// (the matrices a loader has copied into another layout): their pages leave the
    /// process's resident memory, and come back from the file if they are read again.
    /// Does nothing for a file held in memory, or off Unix.
    pub fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let Storage::Mmap(map) = &self.storage
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
        let _ = range;
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
