//! ACS in the browser: the whole contract on the visitor's GPU, nothing to install.
//!
//! [`Acs`] is the JS API: `Acs.load(bytes, options)` or `Acs.loadStream(stream,
//! options, onProgress)`, then `completions`, `createJob`, `job`, `cancelJob`,
//! `jobResult`, `jobs`, `models`, `budget`, taking and returning the contract's JSON as
//! JS objects. The page runs it in a dedicated Web Worker
//! (`web/acs-worker.js`), which owns the GPU device; `web/acs-client.js` talks to the
//! worker and offers a `fetch` that the openai JS SDK can use in-page.
//!
//! - [`load`]: a model from a file streamed in chunks, its weights straight to the GPU;
//! - [`device`]: WebGPU, or the CPU backend compiled to wasm where WebGPU is absent;
//! - [`runtime`]: the store, the scheduler task and the job dispatcher;
//! - [`threads`]: the CPU backend's helper threads, in the build with shared memory.
#![cfg(target_arch = "wasm32")]

pub mod device;
mod js_weights;
pub mod load;
pub mod runtime;
pub mod threads;

use std::rc::Rc;
use std::sync::Arc;

use acs_core::{ApiError, Budget, Endpoint, MemoryStore};
use acs_llama::gguf::GgufError;
use acs_llama::model::{Model, ModelError};
use acs_llama::webgpu::GpuError;
use serde::{Deserialize, Serialize};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::device::Device;
use crate::load::{Builder, CpuWeights};
use crate::runtime::{Runtime, Settings};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The options object is not what `load` takes.
    #[error("bad options: {0}")]
    Options(String),
    /// Not a GGUF file, or a broken one.
    #[error("not a usable GGUF file: {0}")]
    Gguf(#[from] GgufError),
    /// A GGUF file, but not a model this engine runs.
    #[error("the model cannot be run: {0}")]
    Model(#[from] ModelError),
    /// WebGPU was asked for and the browser has none.
    #[error(
        "this browser offers no WebGPU adapter ({0}); load with backend \"auto\" or \"cpu\" to run on the CPU"
    )]
    NoWebGpu(GpuError),
    /// The GPU could not take the model (too little memory, device lost, …).
    #[error("the GPU could not load the model: {0}")]
    Gpu(GpuError),
    /// The saved store of an earlier page is unreadable.
    #[error("the saved jobs are unreadable: {0}")]
    Snapshot(#[from] serde_json::Error),
    /// The saved store could not be recovered.
    #[error("the saved jobs could not be recovered: {0}")]
    Recover(ApiError),
    /// The file cannot fit the wasm memory of the CPU backend.
    #[error(
        "the model takes {bytes} bytes; the CPU backend in the browser holds at most {limit} (wasm memory). Use a browser with WebGPU or a smaller model"
    )]
    TooLarge {
        /// The file's size.
        bytes: u64,
        /// The most the CPU backend takes.
        limit: u64,
    },
    /// A file ended before its last tensor's bytes.
    #[error(
        "file {file} of the model ended after {have} bytes, short of the {need} its tensors take: a truncated download?"
    )]
    EndedEarly {
        /// Which file (1 unless the model is split).
        file: u16,
        /// Bytes it gave.
        have: u64,
        /// Bytes its tensors reach to.
        need: u64,
    },
    /// The file ended inside its header.
    #[error("the file ended after {0} bytes, inside its GGUF header: a truncated download?")]
    Truncated(u64),
    /// Fed again after a failure.
    #[error("loading already failed")]
    Failed,
    /// A split model's files given short of, or beyond, its count.
    #[error("a split model: {0}")]
    Parts(String),
    /// The stream of the file could not be read.
    #[error("reading the file failed: {0}")]
    Read(String),
}

/// What `Acs.load` takes besides the bytes.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct LoadOptions {
    /// `"auto"` (WebGPU on a hardware GPU, else the CPU), `"webgpu"` (any adapter,
    /// software ones included) or `"cpu"`.
    backend: Option<String>,
    /// The model's id in requests (default `"local"`; `"llama-8b"` always works too).
    model_id: Option<String>,
    /// KV cache memory in MiB (default 256).
    kv_mib: Option<usize>,
    /// How long finished jobs' results are kept, in ms (default 24 h).
    retention_ms: Option<i64>,
    /// A Budget for the page: its Holds and limits then apply as on a server.
    budget: Option<BudgetOption>,
    /// The store an earlier page saved (`onChange`), so its jobs survive a reload.
    snapshot: Option<String>,
    /// Where the CPU backend keeps the weights: `"wasm"` (wasm memory, up to 3 GiB),
    /// `"js"` (JS memory, a block at a time staged into wasm memory each step: any
    /// size the tab's memory takes, slower) or `"auto"` (the default: `"wasm"` while
    /// the file fits, else `"js"`).
    cpu_weights: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BudgetOption {
    tokens: u64,
    max_running: Option<u32>,
}

impl LoadOptions {
    fn from_js(options: JsValue) -> Result<LoadOptions, LoadError> {
        if options.is_undefined() || options.is_null() {
            return Ok(LoadOptions::default());
        }
        serde_wasm_bindgen::from_value(options).map_err(|e| LoadError::Options(e.to_string()))
    }

    fn backend(&self) -> &str {
        self.backend.as_deref().unwrap_or("auto")
    }

    fn cpu_weights(&self) -> Result<CpuWeights, LoadError> {
        CpuWeights::parse(self.cpu_weights.as_deref())
    }
}

impl BudgetOption {
    fn budget(&self) -> Budget {
        Budget {
            tokens_left: self.tokens,
            max_running: self.max_running.unwrap_or(16),
        }
    }
}

/// The engine in this page or worker: one model, one local API key.
#[wasm_bindgen]
#[derive(Debug)]
pub struct Acs {
    rt: Rc<Runtime>,
}

#[wasm_bindgen]
impl Acs {
    /// Loads a GGUF model from its bytes and starts the engine.
    pub async fn load(bytes: Vec<u8>, options: JsValue) -> Result<Acs, JsValue> {
        async {
            let options = LoadOptions::from_js(options)?;
            let builder =
                Builder::new(options.backend(), Vec::new(), options.cpu_weights()?).await?;
            let (model, device) = if builder.keeps_file() {
                load::cpu(vec![bytes])?
            } else {
                let mut builder = builder;
                builder.push(&bytes).await?;
                drop(bytes);
                builder.finish().await?
            };
            Self::start(model, device, options)
        }
        .await
        .map_err(load_error)
    }

    /// Reads a GGUF file's header from its first bytes, before the file is fetched
    /// whole: the fewest bytes the header needs when `prefix` ends inside it, else 0
    /// for a model this engine runs. Throws (an `AcsLoadError`) for a file it refuses:
    /// not GGUF, corrupt, or an architecture, weight format or RoPE scaling it does not
    /// run, named with what it does.
    #[wasm_bindgen(js_name = inspectHeader)]
    pub fn inspect_header(prefix: &[u8]) -> Result<f64, JsValue> {
        match load::inspect(prefix) {
            Ok(need) => Ok(need.unwrap_or(0) as f64),
            Err(e) => Err(load_error(e)),
        }
    }

    /// What a runnable model file's header says (`{family, n_layers, d_model, vocab,
    /// context, formats, weight_bytes, largest_tensor_bytes, parts}`), from a prefix
    /// that holds the whole header (after [`Acs::inspect_header`] answered 0), with a
    /// split model's further files' prefixes in `more` (each holding its header);
    /// `null` while `prefix` ends inside the header. Throws for a model it refuses,
    /// as [`Acs::inspect_header`] does, and for a split model's files that do not fit
    /// together.
    #[wasm_bindgen(js_name = describeHeader)]
    pub fn describe_header(
        prefix: &[u8],
        more: Option<Vec<js_sys::Uint8Array>>,
    ) -> Result<JsValue, JsValue> {
        let more: Vec<Vec<u8>> = more
            .unwrap_or_default()
            .iter()
            .map(|p| p.to_vec())
            .collect();
        match load::summarize(prefix, &more) {
            Ok(Some(summary)) => Ok(to_js(&summary)),
            Ok(None) => Ok(JsValue::NULL),
            Err(e) => Err(load_error(e)),
        }
    }

    /// Loads a GGUF model from a `ReadableStream` of its bytes (a `fetch` body, a
    /// Cache API response, `file.stream()`), uploading each tensor to the GPU as it
    /// arrives; `onProgress({loaded, tensors, tensors_total})` hears how far it got
    /// about every MiB.
    ///
    /// A split model (`NAME-00001-of-0000N.gguf`, ...) comes as an array of its
    /// files in order, each `{stream, header}`: `stream` a `ReadableStream` or a
    /// function that returns one (or a promise of one), called when the file's turn
    /// comes, so that a file downloads only once the one before it is in; `header` a
    /// prefix of the file that holds its GGUF header (for every file but the first,
    /// whose header its stream brings), since the first file's weights can go to the
    /// GPU only once every tensor's shape is known.
    #[wasm_bindgen(js_name = loadStream)]
    pub async fn load_stream(
        stream: JsValue,
        options: JsValue,
        on_progress: Option<js_sys::Function>,
    ) -> Result<Acs, JsValue> {
        async {
            let options = LoadOptions::from_js(options)?;
            let files = match stream.dyn_ref::<js_sys::Array>() {
                Some(a) => a.iter().collect(),
                None => vec![stream],
            };
            let mut more = Vec::new();
            for file in files.iter().skip(1) {
                let prefix = get(file, "header")
                    .dyn_into::<js_sys::Uint8Array>()
                    .map_err(|_| {
                        LoadError::Parts("each file after the first needs its header".into())
                    })?;
                more.push(load::part_header(&prefix.to_vec())?);
            }
            let mut builder = Builder::new(options.backend(), more, options.cpu_weights()?).await?;
            let mut reported = 0u64;
            for (i, file) in files.iter().enumerate() {
                if i > 0 {
                    builder.next_part()?;
                }
                let stream = file_stream(file).await?;
                feed(&mut builder, &stream, |p| {
                    if let Some(f) = &on_progress
                        && p.loaded - reported >= 1 << 20
                    {
                        reported = p.loaded;
                        let _ = f.call1(&JsValue::NULL, &to_js(&p));
                    }
                })
                .await?;
            }
            if let Some(f) = &on_progress {
                let _ = f.call1(&JsValue::NULL, &to_js(&builder.progress()));
            }
            let (model, device) = builder.finish().await?;
            Self::start(model, device, options)
        }
        .await
        .map_err(load_error)
    }

    fn start(model: Arc<Model>, device: Device, options: LoadOptions) -> Result<Acs, LoadError> {
        let restored = match &options.snapshot {
            Some(s) => Some(MemoryStore::from_snapshot(serde_json::from_str(s)?)),
            None => None,
        };
        let settings = Settings {
            model_id: options.model_id.unwrap_or_else(|| "local".into()),
            kv_bytes: options.kv_mib.unwrap_or(256) << 20,
            retention_ms: options.retention_ms.unwrap_or(acs_core::Timestamp::DAY_MS),
            budget: options.budget.as_ref().map(BudgetOption::budget),
        };
        let rt = Runtime::start(model, device, settings, restored).map_err(LoadError::Recover)?;
        Ok(Acs { rt })
    }

    /// Where the batches step: `cpu`, or `webgpu: <adapter>`.
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.rt.backend().to_owned()
    }

    /// Why the GPU device was lost (the browser's reason and message), or `undefined`
    /// while it is not: from then on every request fails, and the page's worker loads
    /// the model again on the CPU.
    #[wasm_bindgen(getter)]
    pub fn lost(&self) -> Option<String> {
        self.rt.lost()
    }

    /// Work counters: steps, prefills, prefill and decode tokens, prompts branched
    /// from the prompt cache, largest batch, most KV cache bytes held at once.
    pub fn stats(&self) -> JsValue {
        let s = self.rt.stats();
        to_js(&serde_json::json!({
            "steps": s.steps,
            "prefills": s.prefills,
            "prefill_tokens": s.prefill_tokens,
            "prompt_cache_hits": s.prompt_cache_hits,
            "decode_tokens": s.decode_tokens,
            "max_batch": s.max_batch,
            "kv_bytes_peak": s.kv_bytes_peak,
        }))
    }

    /// `GET /v1/models`.
    pub fn models(&self) -> JsValue {
        to_js(&self.rt.models())
    }

    /// `GET /v1/budget`.
    pub fn budget(&self) -> Result<JsValue, JsValue> {
        answer(self.rt.budget())
    }

    /// Gives the page a Budget of `tokens` with at most `max_running` requests at once.
    #[wasm_bindgen(js_name = setBudget)]
    pub fn set_budget(&self, tokens: f64, max_running: u32) -> Result<JsValue, JsValue> {
        let budget = Budget {
            tokens_left: tokens.max(0.0) as u64,
            max_running,
        };
        answer(self.rt.set_budget(budget))
    }

    /// `POST /v1/completions`. `body` is the request (an object or JSON text). When it
    /// streams, `onChunk` gets each chunk (return `false` to stop); the promise
    /// resolves to the whole Completion either way. Aborting `signal` cancels.
    pub fn completions(
        &self,
        body: JsValue,
        on_chunk: Option<js_sys::Function>,
        signal: Option<web_sys::AbortSignal>,
    ) -> js_sys::Promise {
        self.respond(Endpoint::Completions, body, on_chunk, signal)
    }

    /// `POST /v1/chat/completions`, as [`Acs::completions`]: the chunks and the
    /// answer are chat's.
    #[wasm_bindgen(js_name = chatCompletions)]
    pub fn chat_completions(
        &self,
        body: JsValue,
        on_chunk: Option<js_sys::Function>,
        signal: Option<web_sys::AbortSignal>,
    ) -> js_sys::Promise {
        self.respond(Endpoint::ChatCompletions, body, on_chunk, signal)
    }

    /// `POST /v1/completion-jobs`: resolves to `{ job, replayed }` (`replayed` when the
    /// idempotency key was seen with the same body).
    #[wasm_bindgen(js_name = createJob)]
    pub fn create_job(&self, body: JsValue, idempotency_key: Option<String>) -> js_sys::Promise {
        let rt = Rc::clone(&self.rt);
        wasm_bindgen_futures::future_to_promise(async move {
            let body = request_body(body).map_err(api_error)?;
            let (job, replayed) = rt
                .create_job(&body, idempotency_key.as_deref())
                .await
                .map_err(api_error)?;
            Ok(to_js(
                &serde_json::json!({ "job": job, "replayed": replayed }),
            ))
        })
    }

    /// `GET /v1/completion-jobs/{id}`.
    pub fn job(&self, id: &str) -> Result<JsValue, JsValue> {
        answer(self.rt.job(id))
    }

    /// `GET /v1/completion-jobs?limit=&after=`.
    pub fn jobs(&self, limit: Option<String>, after: Option<String>) -> Result<JsValue, JsValue> {
        answer(self.rt.jobs(limit.as_deref(), after.as_deref()))
    }

    /// `POST /v1/completion-jobs/{id}/cancel`.
    #[wasm_bindgen(js_name = cancelJob)]
    pub fn cancel_job(&self, id: &str) -> Result<JsValue, JsValue> {
        answer(self.rt.cancel_job(id))
    }

    /// `GET /v1/completion-jobs/{id}/result`.
    #[wasm_bindgen(js_name = jobResult)]
    pub fn job_result(&self, id: &str) -> Result<JsValue, JsValue> {
        answer(self.rt.job_result(id))
    }

    /// The store (Budget, Holds, jobs, results) as JSON, to be passed back to `load`
    /// as `snapshot` after a reload.
    pub fn snapshot(&self) -> String {
        self.rt.snapshot()
    }

    /// Calls `f(snapshotJson)` after every change of the store.
    #[wasm_bindgen(js_name = onChange)]
    pub fn on_change(&self, f: Option<js_sys::Function>) {
        self.rt.on_change(f);
    }
}

/// A loading failure as a JS `Error` named `AcsLoadError`.
impl Acs {
    fn respond(
        &self,
        endpoint: Endpoint,
        body: JsValue,
        on_chunk: Option<js_sys::Function>,
        signal: Option<web_sys::AbortSignal>,
    ) -> js_sys::Promise {
        let rt = Rc::clone(&self.rt);
        wasm_bindgen_futures::future_to_promise(async move {
            let body = request_body(body).map_err(api_error)?;
            let send = |c: &serde_json::Value| match &on_chunk {
                Some(f) => f
                    .call1(&JsValue::NULL, &to_js(c))
                    .map(|r| r.as_bool() != Some(false))
                    .unwrap_or(false),
                None => true,
            };
            let aborted = || signal.as_ref().is_some_and(|s| s.aborted());
            answer(rt.complete(&body, endpoint, send, aborted).await)
        })
    }
}

/// The `ReadableStream` of one file given to [`Acs::load_stream`]: the stream itself,
/// or an array element's `stream`, called first where it is a function (and awaited
/// where that gives a promise).
async fn file_stream(file: &JsValue) -> Result<JsValue, LoadError> {
    let is_stream = |v: &JsValue| get(v, "getReader").is_function();
    if is_stream(file) {
        return Ok(file.clone());
    }
    let mut stream = get(file, "stream");
    if let Some(f) = stream.dyn_ref::<js_sys::Function>() {
        stream = f
            .call0(&JsValue::NULL)
            .map_err(|e| LoadError::Read(describe(&e)))?;
    }
    if stream.has_type::<js_sys::Promise>() {
        stream = JsFuture::from(js_sys::Promise::from(stream))
            .await
            .map_err(|e| LoadError::Read(describe(&e)))?;
    }
    Ok(stream)
}

/// Feeds `builder` a file's stream to its end, telling `progress` after each chunk.
async fn feed(
    builder: &mut Builder,
    stream: &JsValue,
    mut progress: impl FnMut(load::Progress),
) -> Result<(), LoadError> {
    let reader = call(stream, "getReader", &[])?;
    loop {
        let next = call(&reader, "read", &[])?;
        let next = JsFuture::from(js_sys::Promise::from(next))
            .await
            .map_err(|e| LoadError::Read(describe(&e)))?;
        if get(&next, "done").as_bool() == Some(true) {
            return Ok(());
        }
        let chunk = get(&next, "value")
            .dyn_into::<js_sys::Uint8Array>()
            .map_err(|_| LoadError::Read("the stream gave something else than bytes".into()))?;
        builder.push_js(&chunk).await?;
        progress(builder.progress());
    }
}

fn load_error(e: LoadError) -> JsValue {
    let err = js_sys::Error::new(&e.to_string());
    err.set_name("AcsLoadError");
    err.into()
}

/// `target[name](...args)`.
fn call(target: &JsValue, name: &str, args: &[JsValue]) -> Result<JsValue, LoadError> {
    let f = get(target, name)
        .dyn_into::<js_sys::Function>()
        .map_err(|_| LoadError::Read(format!("not a ReadableStream: no {name}()")))?;
    f.apply(target, &args.iter().collect())
        .map_err(|e| LoadError::Read(describe(&e)))
}

fn get(target: &JsValue, name: &str) -> JsValue {
    js_sys::Reflect::get(target, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

pub(crate) fn describe(e: &JsValue) -> String {
    e.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}

/// A request body given as an object or as JSON text.
fn request_body(body: JsValue) -> Result<serde_json::Value, ApiError> {
    if let Some(text) = body.as_string() {
        return acs_core::request::parse_json_object(text.as_bytes());
    }
    serde_wasm_bindgen::from_value(body).map_err(|e| {
        ApiError::new(
            acs_core::ErrorCode::InvalidJson,
            format!("The request body is not a JSON object: {e}."),
        )
    })
}

/// A value as a plain JS object (maps as objects, 64-bit integers as numbers).
fn to_js(v: &impl Serialize) -> JsValue {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .unwrap_or(JsValue::NULL)
}

fn answer<T: Serialize>(r: Result<T, ApiError>) -> Result<JsValue, JsValue> {
    r.map(|v| to_js(&v)).map_err(api_error)
}

/// An `ApiError` as a JS `Error` carrying the contract's `status` and `body`.
fn api_error(e: ApiError) -> JsValue {
    let err = js_sys::Error::new(&e.to_string());
    err.set_name("AcsError");
    let _ = js_sys::Reflect::set(&err, &"status".into(), &JsValue::from(e.status()));
    let _ = js_sys::Reflect::set(&err, &"body".into(), &to_js(&e.body()));
    err.into()
}
