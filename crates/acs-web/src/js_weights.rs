//! A model's files kept in JS memory, outside the wasm memory: how the CPU backend runs
//! a model larger than wasm32's 4 GiB. The file's bytes go to pages of `ArrayBuffer`s
//! as they arrive, and each step of the forward pass copies one block's matrices at a
//! time into wasm memory ([`acs_llama::model::WeightSource`]).

use std::thread::ThreadId;

use acs_llama::model::WeightSource;
use js_sys::Uint8Array;

use crate::LoadError;

/// Bytes of each page: large enough that a block's matrices span few pages, small
/// enough that the last page's unused tail is little beside the model.
const PAGE: usize = 64 << 20;

/// The pages being filled while the files download, in order (see [`JsFiles`]).
#[derive(Debug, Default)]
pub struct JsPages {
    pages: Vec<Uint8Array>,
    /// Where each file starts in the pages.
    starts: Vec<u64>,
    /// Bytes written.
    len: u64,
}

impl JsPages {
    /// Pages for the first file.
    pub fn new() -> JsPages {
        JsPages {
            starts: vec![0],
            ..JsPages::default()
        }
    }

    /// Bytes of the file being fed so far.
    pub fn file_len(&self) -> u64 {
        self.len - self.starts.last().copied().unwrap_or(0)
    }

    /// The next file of a split model starts.
    pub fn next_file(&mut self) {
        self.starts.push(self.len);
    }

    /// Appends the next bytes of the file being fed.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), LoadError> {
        self.append(chunk.len(), |page, at, from, n| {
            page.subarray(at, at + n)
                .copy_from(&chunk[from as usize..(from + n) as usize]);
        })
    }

    /// Appends a chunk that JS holds, without a copy in wasm memory.
    pub fn push_js(&mut self, chunk: &Uint8Array) -> Result<(), LoadError> {
        self.append(chunk.length() as usize, |page, at, from, n| {
            page.set(&chunk.subarray(from, from + n), at);
        })
    }

    /// Appends `len` bytes page by page: `copy(page, at, from, n)` puts the chunk's
    /// bytes `from..from + n` at `at` of the page.
    fn append(
        &mut self,
        len: usize,
        mut copy: impl FnMut(&Uint8Array, u32, u32, u32),
    ) -> Result<(), LoadError> {
        let mut from = 0usize;
        while from < len {
            let at = (self.len % PAGE as u64) as usize;
            if at == 0 {
                self.pages.push(new_page()?);
            }
            let n = (len - from).min(PAGE - at);
            let page = self.pages.last().expect("a page was made");
            copy(page, at as u32, from as u32, n as u32);
            from += n;
            self.len += n as u64;
        }
        Ok(())
    }
}

/// A page, or the browser's refusal (out of memory) as a load error, not a trap.
fn new_page() -> Result<Uint8Array, LoadError> {
    let constructor = js_sys::Uint8Array::new_with_length(0).constructor();
    let args = js_sys::Array::of1(&(PAGE as f64).into());
    let page = js_sys::Reflect::construct(&constructor, &args).map_err(|e| {
        LoadError::Read(format!(
            "the browser gave no more memory for the model's weights ({})",
            crate::describe(&e)
        ))
    })?;
    Ok(page.into())
}

/// The files' pages once whole: what a model loaded with
/// [`acs_llama::model::Model::from_source`] reads its weights from.
#[derive(Debug)]
pub struct JsFiles {
    pages: JsPages,
    /// The thread (worker) whose JS heap holds the pages.
    owner: ThreadId,
}

impl JsFiles {
    /// The pages, read from this thread only.
    pub fn new(pages: JsPages) -> JsFiles {
        JsFiles {
            pages,
            owner: std::thread::current().id(),
        }
    }
}

// SAFETY: a JS value is a handle into the JS heap of the worker that made it, which
// is why wasm-bindgen's types are neither `Send` nor `Sync`. `JsFiles` touches its
// pages in two places only: `read`, which first checks that it runs on the thread that
// made them (`owner`) and otherwise returns an error, and `drop`, which on any other
// thread leaks the handles rather than release them there. The pages are private, so
// nothing else can reach them from another thread.
unsafe impl Send for JsFiles {}
// SAFETY: as for `Send`: `read` (`&self`) touches the pages on their own thread only.
unsafe impl Sync for JsFiles {}

impl Drop for JsFiles {
    fn drop(&mut self) {
        if std::thread::current().id() != self.owner {
            std::mem::forget(std::mem::take(&mut self.pages.pages));
        }
    }
}

impl WeightSource for JsFiles {
    fn read(&self, part: u16, offset: u64, dst: &mut [u8]) -> Result<(), String> {
        if std::thread::current().id() != self.owner {
            return Err("the weights are read from another thread than their worker's".into());
        }
        let p = &self.pages;
        let part = usize::from(part);
        let (start, end) = match (p.starts.get(part), p.starts.get(part + 1)) {
            (Some(&s), next) => (s, next.copied().unwrap_or(p.len)),
            (None, _) => return Err(format!("the model has no file {}", part + 1)),
        };
        let from = start + offset;
        if offset.saturating_add(dst.len() as u64) > end - start {
            return Err(format!(
                "bytes {offset}..{} are past the end of file {} ({} bytes)",
                offset + dst.len() as u64,
                part + 1,
                end - start
            ));
        }
        let mut done = 0usize;
        while done < dst.len() {
            let at = from + done as u64;
            let (page, within) = ((at / PAGE as u64) as usize, (at % PAGE as u64) as usize);
            let n = (dst.len() - done).min(PAGE - within);
            p.pages[page]
                .subarray(within as u32, (within + n) as u32)
                .copy_to(&mut dst[done..done + n]);
            done += n;
        }
        Ok(())
    }
}
