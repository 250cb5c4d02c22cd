// The engine's Web Worker: it owns the GPU device and the model, so the page never
// stalls while a batch steps. A dedicated worker serves one page; as a shared worker
// (`AcsBrowser.start({ shared: true })`) it serves every page of the origin that
// connects to it, one engine for all. A page talks to it by messages (acs-client.js):
//
//   page → worker  {type:"load", url | file (a File, or a split model's Files),
//                   backend, budget, modelId, threads, cpuWeights}
//                  {type:"call", id, method, args}      {type:"abort", id}
//                  {type:"close"}  (a page leaves the shared worker)
//                  {type:"helpers", joined}  (how many of the helper threads the
//                   engine asked for joined its team)
//   worker → page  {type:"progress", phase: "header" | "download" | "load", loaded,
//                   total, tensors, tensorsTotal, fromCache, header, resumes}
//                  {type:"loaded", backend, models, loadMs, fromCache, uncached, resumes,
//                   parts, bytes, wasmMemory, threads, sharedMemory, shared, attached}
//                  {type:"chunk", id, chunk}  {type:"result", id, value}
//                  {type:"error", id?, error:{name, message, status, body}}
//                  {type:"lost", reason}  (the GPU device was lost: the model loads
//                   again on the CPU, with progress, then "loaded" with recovered: true)
//                  {type:"helpers", n, pkg, module, memory}  (a dedicated worker's
//                   threaded engine asks its page to start `n` helper threads)
//
// The model file streams into the engine and each tensor to the GPU as its bytes
// arrive; it is cached with the Cache API (a reload reads it from there), and the
// store of jobs and Budget is kept in IndexedDB after every change (a reload finds
// its jobs; queued and interrupted ones run again).
//
// The engine is one of two builds of the package: web/pkg-threads, whose CPU backend
// runs its loops on a team of helper workers (acs-team.js) over shared memory, where
// the page is cross-origin isolated (browsers lend shared memory to no other page);
// else web/pkg, on this one thread.

import { startHelpers } from "./helpers.js";
import { MODEL_CACHE, SOURCE_URL, changedSince, copyHeaders, isQuotaError, partUrls, quotaMessage, uncachedMessage } from "./models.js";

// The default of threads: the device's cores, at most this many (a token's weights
// stream from memory, which a few cores already keep busy).
const MAX_DEFAULT_THREADS = 8;
let Acs = null;
let acs = null;
// The package once loaded ({pkg, wasm}), the load message the model came from, and
// why the GPU was lost while the model loads again on the CPU.
let loaded = null;
let source = null;
let recovering = null;
// Hears how many helper threads the page started for this engine
// (`startHelperThreads`).
let helpersJoined = null;
// How often an idle engine is checked for a lost GPU device.
const LOST_CHECK_MS = 1000;

// The pages this worker answers, each {post, aborts}: a dedicated worker's one page,
// or every page connected to the shared worker (`AcsBrowser.start({ shared: true })`:
// the pages of one origin that load the same model share this one engine).
const pages = new Set();
// The first load's promise of its "loaded" message, which a shared worker's later
// pages wait on instead of loading the model again.
let loading = null;

function connect(port) {
  const page = { post: (msg) => port.postMessage(msg), aborts: new Map() };
  pages.add(page);
  port.onmessage = async (ev) => {
    const m = ev.data;
    try {
      if (m.type === "load") page.post(await loadFor(m));
      else if (m.type === "call") await call(page, m);
      else if (m.type === "abort") page.aborts.get(m.id)?.abort();
      else if (m.type === "helpers") helpersJoined?.(m.joined);
      else if (m.type === "close") {
        for (const ctl of page.aborts.values()) ctl.abort();
        pages.delete(page);
      }
    } catch (e) {
      page.post({ type: "error", id: m.id, error: errorOf(e) });
    }
  };
}

if ("onconnect" in self) self.onconnect = (ev) => connect(ev.ports[0]);
else connect(self);

function broadcast(msg) {
  for (const page of pages) page.post(msg);
}

// A page's load: the model, or in a shared worker that already has it (or is loading
// it), the engine as it is, its "loaded" message marked `attached`.
async function loadFor(m) {
  if (loading) return { ...(await loading), attached: true };
  loading = load(m);
  try {
    return await loading;
  } catch (e) {
    loading = null;
    throw e;
  }
}

function errorOf(e) {
  return { name: e?.name || "Error", message: String(e?.message || e), status: e?.status, body: e?.body };
}

function progress(p) {
  broadcast({ type: "progress", ...p });
}

// The first `n` bytes of a body (fewer if it is shorter); the rest is not read.
async function firstBytes(body, n) {
  const reader = body.getReader();
  const out = new Uint8Array(n);
  let len = 0;
  while (len < n) {
    const { done, value } = await reader.read();
    if (done) break;
    const take = Math.min(value.length, n - len);
    out.set(value.subarray(0, take), len);
    len += take;
  }
  await reader.cancel();
  return out.subarray(0, len);
}

// How many times a download that broke off is asked for again from where it stopped,
// and the wait before the first try (doubling after each).
const RESUME_TRIES = 5;
const RESUME_DELAY_MS = 500;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A prefix of a file that holds its whole GGUF header, and the file's size, from
// `read(n)` (the file's first `n` bytes, fewer if it is shorter): a growing prefix
// until the header is whole. A model the engine does not run (its architecture, a
// weight format, its RoPE scaling) is refused here, after a few MiB, not after
// gigabytes into the cache.
async function headerOf(read, name) {
  let size = 1 << 20;
  for (;;) {
    const { prefix, total, finalUrl } = await read(size);
    const need = Acs.inspectHeader(prefix);
    if (need === 0) return { prefix, total, finalUrl };
    if (prefix.length < size) throw new Error(`the model at ${name} ends inside its GGUF header`);
    size = Math.max(need, 2 * size);
  }
}

// The header of the file at `url` before the file is fetched whole: a Range request
// (a server that ignores it sends the file, of which only the prefix is read), and
// where a redirect led (`finalUrl`).
function fetchHeader(url) {
  return headerOf(async (n) => {
    const resp = await fetch(url, { headers: { range: `bytes=0-${n - 1}` } });
    if (!resp.ok) throw new Error(`fetching the model from ${url}: HTTP ${resp.status}`);
    const total = Number(resp.headers.get("content-range")?.split("/")[1]) || Number(resp.headers.get("content-length")) || 0;
    return { prefix: await firstBytes(resp.body, n), total, finalUrl: resp.url };
  }, url);
}

// The header of a cached copy (`hit`, a Cache API response).
function cachedHeader(hit, url) {
  const total = Number(hit.headers.get("content-length")) || 0;
  const finalUrl = hit.headers.get(SOURCE_URL);
  return headerOf(async (n) => ({ prefix: await firstBytes(hit.clone().body, n), total, finalUrl }), url);
}

// The header of a picked file.
function fileHeader(file) {
  return headerOf(async (n) => ({ prefix: new Uint8Array(await file.slice(0, n).arrayBuffer()), total: file.size }), file.name);
}

// The body of the file at `url` as a stream that resumes: where the connection
// breaks off, the rest is asked for from where it stopped (a Range request whose
// If-Range holds the file's validator, so a file changed meanwhile is not spliced
// onto the old one's start), up to RESUME_TRIES times in a row with a growing wait.
// `report(loaded)` hears the bytes passing, `resumed()` each try from where it
// stopped; `failed.error` holds the error that ended it, if any.
function resumableBody(url, first, { failed, report, resumed }) {
  const validator = first.headers.get("etag") || first.headers.get("last-modified");
  const total = Number(first.headers.get("content-length")) || 0;
  let reader = first.body.getReader();
  let loaded = 0;
  let tries = 0;
  const reopen = async () => {
    const headers = { range: `bytes=${loaded}-` };
    if (validator) headers["if-range"] = validator;
    const resp = await fetch(url, { headers });
    if (resp.status !== 206 || !resp.headers.get("content-range")?.startsWith(`bytes ${loaded}-`)) {
      await resp.body?.cancel();
      throw Object.assign(new Error(`the download of ${url} broke off after ${loaded} of ${total} bytes, and ` +
        `the server cannot resume it (HTTP ${resp.status}${resp.status === 200 ? ": the file changed, or the server ignores ranges" : ""})`),
      { final: true });
    }
    return resp.body.getReader();
  };
  return new ReadableStream({
    async pull(ctl) {
      for (;;) {
        try {
          reader ??= await reopen();
          const { done, value } = await reader.read();
          if (done && (!total || loaded >= total)) return ctl.close();
          if (done) throw new Error(`the body ended after ${loaded} of ${total} bytes`);
          loaded += value.length;
          tries = 0;
          report(loaded);
          return ctl.enqueue(value);
        } catch (e) {
          reader = null;
          if (e.final || ++tries > RESUME_TRIES) {
            failed.error = e.final ? e : new Error(`the download of ${url} broke off after ${loaded} of ${total} bytes ` +
              `and did not resume in ${RESUME_TRIES} tries: ${e.message}`);
            throw failed.error;
          }
          resumed();
          await sleep(RESUME_DELAY_MS * 2 ** (tries - 1));
        }
      }
    },
    cancel(reason) {
      return reader?.cancel(reason);
    },
  });
}

// One file of the model from the network: downloaded into the Cache API (streamed to
// disk, resuming where the connection breaks off) and then read back from there, so
// that a reload finds it. Where the browser has no room for the copy, the file
// streams from the network again without one, and `state.uncached` says so in plain
// words, and `state.resumes` counts the tries from where a download stopped.
// `report(loaded)` hears the download's bytes.
async function downloadPart(url, cache, state, report) {
  const download = async () => {
    const resp = await fetch(url);
    if (!resp.ok) throw new Error(`fetching the model from ${url}: HTTP ${resp.status}`);
    const failed = {};
    const total = Number(resp.headers.get("content-length")) || 0;
    // A report about every MiB: a message per chunk floods the page (Firefox's main
    // thread stalls under them).
    let last = 0;
    const body = resumableBody(url, resp, {
      failed,
      report: (loaded) => {
        if (loaded - last < 1 << 20 && loaded !== total) return;
        last = loaded;
        report(loaded);
      },
      resumed: () => { state.resumes++; },
    });
    return { resp, body, failed, total };
  };
  const { resp, body, failed, total } = await download();
  if (!cache) return body;
  try {
    await cache.put(url, new Response(body, { headers: copyHeaders(resp, total) }));
  } catch (e) {
    await cache.delete(url);
    // The download itself failed: no copy would help.
    if (failed.error) throw failed.error;
    // No room (the quota), or a copy the browser will not keep (Chromium's cache
    // answers a network error for a file of several GB): the file streams from the
    // network once more.
    state.uncached = isQuotaError(e) ? await quotaMessage(total) : uncachedMessage(e, total);
    return (await download()).body;
  }
  return (await cache.match(url)).body;
}

// The model's files, never whole in memory, as `Acs.loadStream` takes them: each
// file's header first (from its cached copy, a Range request, or the picked file),
// told to the page with what it says; then each file's stream when its turn comes. A
// picked file streams as it is; a URL's file comes from the Cache API, where a copy
// is used only while the server's file is the same (`changedSince`), else it is
// downloaded into it. A split model is several URLs (`partUrls`) or picked files.
async function modelFiles(m) {
  const picked = m.file ? [m.file].flat() : [];
  picked.sort((a, b) => a.name.localeCompare(b.name));
  const urls = picked.length ? [] : partUrls(new URL(m.url, self.location.href).href);
  const cache = !picked.length && "caches" in self ? await caches.open(MODEL_CACHE) : null;
  const parts = [];
  for (const file of picked) parts.push({ file, ...(await fileHeader(file)) });
  for (let i = 0; i < urls.length; i++) {
    const url = urls[i];
    let hit = cache && (await cache.match(url));
    if (hit && (await changedSince(url, hit))) {
      await cache.delete(url);
      hit = undefined;
    }
    const part = { url, hit, ...(await (hit ? cachedHeader(hit, url) : fetchHeader(url))) };
    parts.push(part);
    // A URL that redirects to a split model's first file (`acs serve`'s /model.gguf
    // of a split model) brings the others from beside where it led.
    if (urls.length === 1 && part.finalUrl && part.finalUrl !== url) urls.push(...partUrls(part.finalUrl).slice(1));
  }
  const total = parts.reduce((n, p) => n + p.total, 0);
  const header = Acs.describeHeader(parts[0].prefix, parts.slice(1).map((p) => p.prefix));
  progress({ phase: "header", header, total, loaded: 0 });
  const state = { uncached: undefined, resumes: 0 };
  let before = 0;
  const files = parts.map((p) => {
    const offset = before;
    before += p.total;
    const stream = () => {
      if (p.file) return p.file.stream();
      if (p.hit) return p.hit.body;
      return downloadPart(p.url, cache, state, (loaded) =>
        progress({ phase: "download", loaded: offset + loaded, total, resumes: state.resumes }));
    };
    return { header: p.prefix, stream };
  });
  return { files, total, fromCache: parts.every((p) => p.hit), state };
}

function idb() {
  return new Promise((resolve, reject) => {
    const r = indexedDB.open("acs", 1);
    r.onupgradeneeded = () => r.result.createObjectStore("state");
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

async function idbGet(key) {
  const db = await idb();
  return new Promise((resolve, reject) => {
    const r = db.transaction("state").objectStore("state").get(key);
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

let saving = Promise.resolve();
function idbPut(key, value) {
  // One write at a time, in order: the last snapshot wins.
  saving = saving.then(async () => {
    const db = await idb();
    await new Promise((resolve, reject) => {
      const tx = db.transaction("state", "readwrite");
      tx.objectStore("state").put(value, key);
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
    });
  }).catch((e) => console.warn("saving the jobs failed", e));
  return saving;
}

// A package's compiled module, from its fetched bytes rather than through
// `instantiateStreaming`, which in Firefox at times never settles for the
// shared-memory build on a busy machine, and stalls the page's main thread with it.
async function compiled(dir) {
  const url = new URL(`./${dir}/acs_web_bg.wasm`, import.meta.url);
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`fetching the engine from ${url}: HTTP ${resp.status}`);
  return WebAssembly.compile(await resp.arrayBuffer());
}

// Starts `n` helper threads on the threaded package (`url`), and resolves to how many
// joined the team. One that fails is only a thread fewer: the engine's own thread
// claims every loop's tasks too. A dedicated worker asks its page to start them
// (acs-client.js), as Firefox at times never returns from a `new Worker` called in a
// worker (about one in a hundred, on a busy machine or an idle one), which stalls
// the load for good, while the page's own `new Worker` returns. A shared worker
// starts its own: they outlive any one of its pages, as the engine does.
function startHelperThreads(pkg, url, n) {
  const imports = { pkg: url, ...pkg.helperImports() };
  if ("onconnect" in self) return startHelpers(import.meta.url, n, imports).joined;
  return new Promise((resolve) => {
    helpersJoined = resolve;
    broadcast({ type: "helpers", n, ...imports });
  });
}

// Loads the engine's package: web/pkg-threads with `wanted` threads (default: the
// cores, at most MAX_DEFAULT_THREADS) where the page is cross-origin isolated, else
// web/pkg. Resolves to the package and its wasm exports.
async function engine(wanted) {
  loaded ??= await firstEngine(wanted);
  return loaded;
}

async function firstEngine(wanted) {
  const threads = wanted || Math.min(navigator.hardwareConcurrency || 1, MAX_DEFAULT_THREADS);
  if (threads > 1 && self.crossOriginIsolated) {
    try {
      const url = new URL("./pkg-threads/acs_web.js", import.meta.url).href;
      const pkg = await import(url);
      const wasm = await pkg.default({ module_or_path: await compiled("pkg-threads") });
      pkg.planHelpers(threads - 1);
      const joined = await startHelperThreads(pkg, url, threads - 1);
      if (joined < threads - 1) console.warn(`${joined} of ${threads - 1} ACS helper threads started`);
      return { pkg, wasm };
    } catch (e) {
      console.warn("the threaded ACS engine could not start; it runs on one thread", e);
    }
  } else if (threads > 1) {
    console.info("this page is not cross-origin isolated (COOP and COEP headers): ACS runs on one thread");
  }
  const pkg = await import("./pkg/acs_web.js");
  return { pkg, wasm: await pkg.default({ module_or_path: await compiled("pkg") }) };
}

async function load(m) {
  const started = performance.now();
  const { pkg, wasm } = await engine(m.threads);
  Acs = pkg.Acs;
  // `modelFiles` reads the headers with the engine's own parser.
  const { files, total, fromCache, state } = await modelFiles(m);
  const snapshot = m.persist === false ? undefined : await idbGet("snapshot");
  const options = { backend: m.backend || "auto" };
  if (m.modelId) options.modelId = m.modelId;
  if (m.cpuWeights) options.cpuWeights = m.cpuWeights;
  if (m.budget) options.budget = m.budget;
  if (snapshot) options.snapshot = snapshot;
  // Bytes and tensors as they reach the engine (each tensor goes to the GPU as soon
  // as its bytes are in).
  acs = await Acs.loadStream(files, options, (p) => progress({
    phase: "load", loaded: p.loaded, total, tensors: p.tensors, tensorsTotal: p.tensors_total, fromCache,
  }));
  if (m.persist !== false) acs.onChange((s) => idbPut("snapshot", s));
  source = m;
  return {
    type: "loaded",
    shared: "onconnect" in self,
    recovered: Boolean(m.recovered),
    backend: acs.backend,
    models: acs.models(),
    loadMs: performance.now() - started,
    fromCache,
    uncached: state.uncached,
    resumes: state.resumes,
    parts: files.length,
    bytes: total,
    // The engine's wasm memory after loading: with WebGPU the weights live on the
    // device, so this stays well under the file's size.
    wasmMemory: wasm.memory.buffer.byteLength,
    threads: pkg.cpuThreads(),
    sharedMemory: pkg.sharedMemory(),
  };
}

// The error of a request while the model loads again after the GPU was lost: 503, as
// a server answers while it cannot take work.
function lostError(reason) {
  const message = `The GPU device was lost (${reason}); the model is loading again on the CPU. ` +
    "Send the request again once it is loaded.";
  return Object.assign(new Error(message), {
    status: 503, body: { error: { message, type: "server_error", param: null, code: "gpu_device_lost" } },
  });
}

// Loads the model again on the CPU after the GPU device was lost (a driver reset, the
// GPU process gone, the device destroyed): from the same URL (the Cache API has it) or
// file, with the jobs that IndexedDB kept. Requests meanwhile get `lostError`.
async function recover(reason) {
  if (recovering || !source) return;
  recovering = reason;
  acs = null;
  broadcast({ type: "lost", reason });
  try {
    loading = load({ ...source, backend: "cpu", recovered: true });
    broadcast(await loading);
  } catch (e) {
    broadcast({ type: "error", error: errorOf(e) });
  } finally {
    recovering = null;
  }
}

setInterval(() => {
  const reason = acs?.lost;
  if (reason) recover(reason);
}, LOST_CHECK_MS);

async function call(page, m) {
  if (recovering) throw lostError(recovering);
  if (!acs) throw Object.assign(new Error("no model is loaded yet"), { status: 503 });
  try {
    await answer(page, m);
  } catch (e) {
    const reason = acs?.lost ?? recovering;
    if (!reason) throw e;
    recover(reason);
    throw lostError(reason);
  }
}

async function answer(page, m) {
  let value;
  if (m.method === "completions" || m.method === "chatCompletions") {
    const ctl = new AbortController();
    page.aborts.set(m.id, ctl);
    try {
      value = await acs[m.method](m.args[0], (chunk) => {
        page.post({ type: "chunk", id: m.id, chunk });
        return true;
      }, ctl.signal);
    } finally {
      page.aborts.delete(m.id);
    }
  } else if (["createJob", "job", "jobs", "cancelJob", "jobResult", "models", "budget", "setBudget", "stats"].includes(m.method)) {
    value = await acs[m.method](...m.args);
  } else {
    throw new Error(`unknown method ${m.method}`);
  }
  page.post({ type: "result", id: m.id, value });
}
