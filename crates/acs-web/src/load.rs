//! Loading a model from a file fed in order, chunk by chunk (a `fetch` body, the Cache
//! API, a picked file). For WebGPU the weights go to the device tensor by tensor as
//! their bytes arrive, so the file is never whole in wasm memory: only the header is
//! kept (the tokenizer and the shape). The CPU backend keeps the whole file, since its
//! weights are the file: in wasm memory, or, for a model past what wasm32 addresses, in
//! JS memory, from which each step stages a block's matrices at a time.

use std::sync::Arc;

use acs_llama::gguf::{GgufFile, GgufHeader, HeaderParse, TensorStream};
use acs_llama::model::Model;
use acs_llama::webgpu::{GpuLoader, pick_adapter, wgpu};

use crate::LoadError;
use crate::device::Device;
use crate::js_weights::{JsFiles, JsPages};

/// Where the CPU backend keeps a model's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuWeights {
    /// In wasm memory up to [`CPU_MAX_FILE`], in JS memory past it.
    Auto,
    /// In wasm memory: the fastest, for files up to [`CPU_MAX_FILE`].
    Wasm,
    /// In JS memory, staged into wasm memory a block at a time each step.
    Js,
}

impl CpuWeights {
    /// The `cpuWeights` load option: `"auto"`, `"wasm"` or `"js"`.
    pub fn parse(option: Option<&str>) -> Result<CpuWeights, LoadError> {
        match option.unwrap_or("auto") {
            "auto" => Ok(CpuWeights::Auto),
            "wasm" => Ok(CpuWeights::Wasm),
            "js" => Ok(CpuWeights::Js),
            other => Err(LoadError::Options(format!(
                "cpuWeights must be \"auto\", \"wasm\" or \"js\", not {other:?}"
            ))),
        }
    }
}

/// Where the bytes fed so far have gone.
#[derive(Debug)]
enum Feed {
    /// The header is not whole yet; `need` is the fewest bytes it can take.
    Header {
        prefix: Vec<u8>,
        need: u64,
        gpu: Option<Gpu>,
    },
    /// Weights stream to the GPU; the header's model stays for tokenizer and shape,
    /// and the header for the streams of a split model's further files.
    Gpu {
        model: Box<Model>,
        header: Box<GgufHeader>,
        stream: TensorStream,
        loader: Box<GpuLoader>,
    },
    /// The CPU backend's copy of the whole file (of each file of a split model: those
    /// fed whole in `done`, the one being fed in `bytes`, and each one's length).
    Cpu {
        done: Vec<Vec<u8>>,
        bytes: Vec<u8>,
        lens: Vec<u64>,
    },
    /// The CPU backend's files in JS memory, with the header they make, and the
    /// bytes each file must reach (its last tensor's end).
    Js {
        header: Box<GgufHeader>,
        pages: JsPages,
        need: Vec<u64>,
    },
}

/// The adapter to load onto, and whether failing to open it is an error (`webgpu`) or
/// a reason to run on the CPU (`auto`).
#[derive(Debug)]
struct Gpu {
    adapter: wgpu::Adapter,
    required: bool,
}

/// How far loading got, for progress bars.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Progress {
    /// File bytes consumed.
    pub loaded: u64,
    /// Tensors uploaded to the GPU (0 on the CPU backend).
    pub tensors: usize,
    /// Tensors the model needs on the GPU (0 until the header is read, or on the CPU).
    pub tensors_total: usize,
}

/// A model being loaded: the bytes of its file, or of each file of a split model in
/// turn ([`Builder::next_part`] between them).
#[derive(Debug)]
pub struct Builder {
    feed: Option<Feed>,
    loaded: u64,
    /// The headers of a split model's further files, which the first file's header
    /// merges with once it is whole (empty for a model in one file).
    more_parts: Vec<GgufHeader>,
    /// The file being fed, and how many the model has (1 until the header is read).
    part: u16,
    parts: u16,
    cpu_weights: CpuWeights,
}

impl Builder {
    /// Picks the backend: `auto` (WebGPU on a hardware GPU, else the CPU), `webgpu`
    /// (any adapter, software ones included) or `cpu`.
    ///
    /// A split model's further files' headers (`more_parts`, in order) come first:
    /// the weights of the first file can go to the GPU only once every tensor's
    /// shape is known. `cpu_weights` says where the CPU backend keeps them.
    pub async fn new(
        backend: &str,
        more_parts: Vec<GgufHeader>,
        cpu_weights: CpuWeights,
    ) -> Result<Builder, LoadError> {
        let gpu = match backend {
            "cpu" => None,
            "webgpu" => Some(Gpu {
                adapter: pick_adapter(true).await.map_err(LoadError::NoWebGpu)?,
                required: true,
            }),
            // A software adapter (SwiftShader, lavapipe) steps this engine far slower
            // than its wasm CPU backend (`tests/browser/bench.mjs` compares them; see
            // docs/performance.md), so `auto` takes hardware GPUs only.
            "auto" => pick_adapter(false).await.ok().map(|adapter| Gpu {
                adapter,
                required: false,
            }),
            other => {
                return Err(LoadError::Options(format!(
                    "backend must be \"auto\", \"webgpu\" or \"cpu\", not {other:?}"
                )));
            }
        };
        Ok(Builder {
            feed: Some(Feed::Header {
                prefix: Vec::new(),
                need: 0,
                gpu,
            }),
            loaded: 0,
            more_parts,
            part: 0,
            parts: 1,
            cpu_weights,
        })
    }

    /// Whether the whole file will be kept in wasm memory (the CPU backend, unless
    /// its weights are to be kept in JS memory).
    pub fn keeps_file(&self) -> bool {
        self.cpu_weights != CpuWeights::Js
            && matches!(
                self.feed,
                Some(Feed::Cpu { .. }) | Some(Feed::Header { gpu: None, .. })
            )
    }

    /// Feeds the next bytes of the file, held by JS: kept there, without a copy in
    /// wasm memory, where the weights are to stay in JS memory.
    pub async fn push_js(&mut self, chunk: &js_sys::Uint8Array) -> Result<(), LoadError> {
        if let Some(Feed::Js { pages, .. }) = &mut self.feed {
            self.loaded += u64::from(chunk.length());
            return pages.push_js(chunk);
        }
        self.push(&chunk.to_vec()).await
    }

    /// Progress so far.
    pub fn progress(&self) -> Progress {
        let (tensors, tensors_total) = match &self.feed {
            Some(Feed::Gpu { loader, .. }) => (loader.tensors_uploaded(), loader.tensors_needed()),
            _ => (0, 0),
        };
        Progress {
            loaded: self.loaded,
            tensors,
            tensors_total,
        }
    }

    /// Feeds the next bytes of the file.
    pub async fn push(&mut self, chunk: &[u8]) -> Result<(), LoadError> {
        self.loaded += chunk.len() as u64;
        let feed = self.feed.take().ok_or(LoadError::Failed)?;
        self.feed = Some(match feed {
            Feed::Header {
                mut prefix,
                need,
                gpu,
            } => {
                prefix.extend_from_slice(chunk);
                if (prefix.len() as u64) < need {
                    Feed::Header { prefix, need, gpu }
                } else {
                    match GgufHeader::parse(&prefix)? {
                        HeaderParse::NeedMore { min_len } => Feed::Header {
                            prefix,
                            need: min_len,
                            gpu,
                        },
                        HeaderParse::Complete(header) => {
                            let header = merge(*header, std::mem::take(&mut self.more_parts))?;
                            if let Some(split) = header.split()? {
                                self.parts = split.count;
                            }
                            Self::start(header, prefix, gpu, self.cpu_weights).await?
                        }
                    }
                }
            }
            Feed::Gpu {
                model,
                header,
                mut stream,
                mut loader,
            } => {
                stream.push_pieces(chunk, |t, b, last| {
                    loader.add_piece(t, b, last).map_err(LoadError::Gpu)
                })?;
                Feed::Gpu {
                    model,
                    header,
                    stream,
                    loader,
                }
            }
            Feed::Cpu {
                done,
                mut bytes,
                lens,
            } => {
                bytes.extend_from_slice(chunk);
                Feed::Cpu { done, bytes, lens }
            }
            Feed::Js {
                header,
                mut pages,
                need,
            } => {
                pages.push(chunk)?;
                Feed::Js {
                    header,
                    pages,
                    need,
                }
            }
        });
        Ok(())
    }

    /// The file fed so far has ended, and the split model's next file follows.
    pub fn next_part(&mut self) -> Result<(), LoadError> {
        let feed = self.feed.take().ok_or(LoadError::Failed)?;
        if !matches!(feed, Feed::Header { .. }) && self.part + 1 >= self.parts {
            return Err(LoadError::Parts(format!(
                "more files were given than the model's {}",
                self.parts
            )));
        }
        self.part += 1;
        self.feed = Some(match feed {
            // The first file ended inside its header.
            Feed::Header { .. } => return Err(LoadError::Truncated(self.loaded)),
            Feed::Gpu {
                model,
                header,
                stream,
                loader,
            } => {
                stream.finish()?;
                Feed::Gpu {
                    model,
                    stream: TensorStream::of_part(&header, self.part)?,
                    header,
                    loader,
                }
            }
            Feed::Cpu {
                mut done,
                bytes,
                lens,
            } => {
                done.push(bytes);
                let len = lens[usize::from(self.part)] as usize;
                Feed::Cpu {
                    done,
                    bytes: Vec::with_capacity(len),
                    lens,
                }
            }
            Feed::Js {
                header,
                mut pages,
                need,
            } => {
                check_fed(&pages, &need, self.part - 1)?;
                pages.next_file();
                Feed::Js {
                    header,
                    pages,
                    need,
                }
            }
        });
        Ok(())
    }

    /// The header is whole: opens the GPU and uploads what the prefix holds, or goes
    /// on collecting the file for the CPU.
    async fn start(
        header: GgufHeader,
        prefix: Vec<u8>,
        gpu: Option<Gpu>,
        cpu_weights: CpuWeights,
    ) -> Result<Feed, LoadError> {
        let Some(gpu) = gpu else {
            return cpu_feed(header, prefix, cpu_weights);
        };
        let model = Box::new(Model::from_header(&header)?);
        let mut loader = match GpuLoader::new(&header, gpu.adapter).await {
            Ok(l) => Box::new(l),
            Err(e) if gpu.required => return Err(LoadError::Gpu(e)),
            // `auto`: a model this GPU cannot take runs on the CPU.
            Err(_) => return cpu_feed(header, prefix, cpu_weights),
        };
        let mut stream = TensorStream::new(&header)?;
        stream.push_pieces(&prefix, |t, b, last| {
            loader.add_piece(t, b, last).map_err(LoadError::Gpu)
        })?;
        Ok(Feed::Gpu {
            model,
            header: Box::new(header),
            stream,
            loader,
        })
    }

    /// The file has ended: the model and its backend.
    pub async fn finish(self) -> Result<(Arc<Model>, Device), LoadError> {
        let feed = self.feed.ok_or(LoadError::Failed)?;
        if !matches!(feed, Feed::Header { .. }) && self.part + 1 < self.parts {
            return Err(LoadError::Parts(format!(
                "{} of the model's {} files were given",
                self.part + 1,
                self.parts
            )));
        }
        match feed {
            Feed::Header { .. } => Err(LoadError::Truncated(self.loaded)),
            Feed::Gpu {
                stream,
                loader,
                model,
                ..
            } => {
                stream.finish()?;
                let gpu = loader.finish().await.map_err(LoadError::Gpu)?;
                Ok((Arc::new(*model), Device::gpu(gpu)))
            }
            Feed::Cpu {
                mut done, bytes, ..
            } => {
                done.push(bytes);
                Ok(cpu(done)?)
            }
            Feed::Js {
                header,
                pages,
                need,
            } => {
                check_fed(&pages, &need, self.part)?;
                let source = std::sync::Arc::new(JsFiles::new(pages));
                let model = Arc::new(Model::from_source(&header, source)?);
                Ok((Arc::clone(&model), Device::cpu(model)))
            }
        }
    }
}

/// File `part` (fed into `pages` up to now) reached its last tensor's end.
fn check_fed(pages: &JsPages, need: &[u64], part: u16) -> Result<(), LoadError> {
    let (have, need) = (pages.file_len(), need[usize::from(part)]);
    if have < need {
        return Err(LoadError::EndedEarly {
            file: part + 1,
            have,
            need,
        });
    }
    Ok(())
}

/// The header of the model: `first` alone, or merged with the headers of the split
/// model's further files.
fn merge(first: GgufHeader, more: Vec<GgufHeader>) -> Result<GgufHeader, LoadError> {
    let mut all = vec![first];
    all.extend(more);
    Ok(GgufHeader::of_files(all)?)
}

/// The most a file may take in wasm memory for the CPU backend: wasm32 addresses
/// 4 GiB, and the engine needs room beside the weights.
const CPU_MAX_FILE: u64 = 3 << 30;

/// Collecting the file for the CPU: in wasm memory, in one allocation of its size
/// (growing by doubling could ask for twice as much), or in JS memory where
/// `cpu_weights` says so or the file cannot fit wasm memory.
fn cpu_feed(
    header: GgufHeader,
    mut prefix: Vec<u8>,
    cpu_weights: CpuWeights,
) -> Result<Feed, LoadError> {
    // A model the engine cannot run is refused now, not once the file is in.
    Model::from_header(&header)?;
    // Each file's length: to its last tensor's end (the first at least its header),
    // and the padding to the alignment that writers put after each tensor.
    let mut need = vec![header.data_offset];
    need.resize(header.part_data_offsets.len() + 1, 0);
    for t in &header.tensors {
        let end = &mut need[usize::from(t.part)];
        *end = (*end).max(header.tensor_range(t)?.end);
    }
    let lens: Vec<u64> = need
        .iter()
        .map(|n| n.next_multiple_of(header.alignment))
        .collect();
    let total: u64 = lens.iter().sum();
    let js = match cpu_weights {
        CpuWeights::Js => true,
        CpuWeights::Auto => total > CPU_MAX_FILE,
        CpuWeights::Wasm if total > CPU_MAX_FILE => {
            return Err(LoadError::TooLarge {
                bytes: total,
                limit: CPU_MAX_FILE,
            });
        }
        CpuWeights::Wasm => false,
    };
    if js {
        let mut pages = JsPages::new();
        pages.push(&prefix)?;
        return Ok(Feed::Js {
            header: Box::new(header),
            pages,
            need,
        });
    }
    prefix.reserve_exact((lens[0] as usize).saturating_sub(prefix.len()));
    Ok(Feed::Cpu {
        done: Vec::new(),
        bytes: prefix,
        lens,
    })
}

/// What the first bytes of a file say of it: the fewest bytes its header needs
/// (`Some`) or that it is whole and its model one the engine runs (`None`); an error
/// refuses the file (not GGUF, corrupt, or an architecture, format or RoPE scaling
/// the engine does not run).
///
/// A file of a split model is checked as far as it goes alone (its header); the
/// model is checked once every file's header is at hand ([`summarize`]).
pub fn inspect(prefix: &[u8]) -> Result<Option<u64>, LoadError> {
    match GgufHeader::parse(prefix)? {
        HeaderParse::NeedMore { min_len } => Ok(Some(min_len)),
        HeaderParse::Complete(header) => {
            if header.split()?.is_none() {
                Model::from_header(&header)?;
            }
            Ok(None)
        }
    }
}

/// What a model file's header says, for a page to show before the download: the
/// family and shape, the weight formats (tensors of each), and the bytes of the
/// weights, which the CPU backend holds in wasm memory and WebGPU on the device.
#[derive(Debug, serde::Serialize)]
pub struct HeaderSummary {
    /// `general.architecture`'s family.
    pub family: &'static str,
    /// Blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// The context window the file declares.
    pub context: usize,
    /// Tensors of each weight format, by ggml's name of it.
    pub formats: std::collections::BTreeMap<String, usize>,
    /// Bytes of all tensors.
    pub weight_bytes: u64,
    /// Bytes of the largest tensor, which WebGPU binds whole.
    pub largest_tensor_bytes: u64,
    /// Files the model is in (more than 1 for a split model).
    pub parts: u16,
}

/// [`HeaderSummary`] of a whole header (a prefix [`inspect`] found complete), with
/// the headers of a split model's further files (`more`, each a prefix that holds
/// its header); `None` while `prefix` ends inside the header. An error refuses the
/// model, as [`inspect`] does.
pub fn summarize(prefix: &[u8], more: &[Vec<u8>]) -> Result<Option<HeaderSummary>, LoadError> {
    let header = match GgufHeader::parse(prefix)? {
        HeaderParse::NeedMore { .. } => return Ok(None),
        HeaderParse::Complete(header) => header,
    };
    let more = more
        .iter()
        .map(|p| part_header(p))
        .collect::<Result<Vec<_>, _>>()?;
    let header = merge(*header, more)?;
    let model = Model::from_header(&header)?;
    let c = &model.config;
    let mut formats = std::collections::BTreeMap::new();
    let (mut weight_bytes, mut largest_tensor_bytes) = (0u64, 0u64);
    for t in &header.tensors {
        *formats.entry(format!("{:?}", t.ty)).or_insert(0) += 1;
        let cols = t.dims.first().copied().unwrap_or(1);
        let rows: u64 = t.dims.iter().skip(1).product();
        // Model::from_header checked each tensor's rows hold whole blocks.
        let bytes = t.ty.row_bytes(cols as usize).unwrap_or(0) as u64 * rows;
        weight_bytes += bytes;
        largest_tensor_bytes = largest_tensor_bytes.max(bytes);
    }
    Ok(Some(HeaderSummary {
        family: c.family.name(),
        n_layers: c.n_layers,
        d_model: c.d_model,
        vocab: c.vocab,
        context: c.context,
        formats,
        weight_bytes,
        largest_tensor_bytes,
        parts: header.part_data_offsets.len() as u16 + 1,
    }))
}

/// The header of a split model's file from a prefix that holds it whole.
pub fn part_header(prefix: &[u8]) -> Result<GgufHeader, LoadError> {
    Ok(GgufHeader::parse_complete(prefix)?)
}

/// The CPU backend over a whole file (each file of a split model, in order).
pub fn cpu(parts: Vec<Vec<u8>>) -> Result<(Arc<Model>, Device), LoadError> {
    let file = Arc::new(GgufFile::from_parts(parts)?);
    let model = Arc::new(Model::from_gguf(file)?);
    Ok((Arc::clone(&model), Device::cpu(model)))
}
