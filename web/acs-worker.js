// The engine's dedicated Web Worker: it owns the GPU device and the model, so the page
// never stalls while a batch steps. The page talks to it by messages (acs-client.js):
//
//   page → worker  {type:"load", url | file, backend, budget, modelId, threads}
//                  {type:"call", id, method, args}      {type:"abort", id}
//   worker → page  {type:"progress", phase: "header" | "download" | "load", loaded,
//                   total, tensors, tensorsTotal, fromCache, header}
//                  {type:"loaded", backend, models, loadMs, fromCache, uncached, bytes,
//                   wasmMemory, threads, sharedMemory}
//                  {type:"chunk", id, chunk}  {type:"result", id, value}
//                  {type:"error", id?, error:{name, message, status, body}}
//                  {type:"lost", reason}  (the GPU device was lost: the model loads
//                   again on the CPU, with progress, then "loaded" with recovered: true)
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

import { MODEL_CACHE, changedSince, copyHeaders, isQuotaError, quotaMessage, uncachedMessage } from "./models.js";

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
const aborts = new Map();
// How often an idle engine is checked for a lost GPU device.
const LOST_CHECK_MS = 1000;

self.onmessage = async (ev) => {
  const m = ev.data;
  try {
    if (m.type === "load") await load(m);
    else if (m.type === "call") await call(m);
    else if (m.type === "abort") aborts.get(m.id)?.abort();
  } catch (e) {
    self.postMessage({ type: "error", id: m.id, error: errorOf(e) });
  }
};

function errorOf(e) {
  return { name: e?.name || "Error", message: String(e?.message || e), status: e?.status, body: e?.body };
}

function progress(p) {
  self.postMessage({ type: "progress", ...p });
}

// A body stream that reports the bytes passing through it.
function counted(body, total, report) {
  let loaded = 0;
  let last = 0;
  return body.pipeThrough(new TransformStream({
    transform(chunk, ctl) {
      loaded += chunk.length;
      if (loaded - last >= 1 << 20 || loaded === total) {
        last = loaded;
        report(loaded);
      }
      ctl.enqueue(chunk);
    },
  }));
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

// Reads the file's GGUF header before the file is fetched whole: a model the engine
// does not run (its architecture, a weight format, its RoPE scaling) is refused after
// a few MiB, not after gigabytes into the cache. Asks for a growing prefix (a Range
// request; a server that ignores it sends the file, of which only the prefix is read)
// until the header is whole. Then tells the page what the header says (family, shape,
// weight formats, the weights' bytes) and the file's size, before the download.
async function checkHeader(url) {
  let size = 1 << 20;
  for (;;) {
    const resp = await fetch(url, { headers: { range: `bytes=0-${size - 1}` } });
    if (!resp.ok) throw new Error(`fetching the model from ${url}: HTTP ${resp.status}`);
    const total = Number(resp.headers.get("content-range")?.split("/")[1]) || Number(resp.headers.get("content-length")) || 0;
    const prefix = await firstBytes(resp.body, size);
    const need = Acs.inspectHeader(prefix);
    if (need === 0) {
      progress({ phase: "header", header: Acs.describeHeader(prefix), total, loaded: 0 });
      return;
    }
    if (prefix.length < size) throw new Error(`the model at ${url} ends inside its GGUF header`);
    size = Math.max(need, 2 * size);
  }
}

// The model file as a stream, never whole in memory: a picked file as it is; a URL
// first into the Cache API (streamed to disk, with download progress) and then read
// back from there, so that a reload finds it. A cached copy is used only while the
// server's file is the same (`changedSince`); a URL's header is checked before the
// download. Where the browser has no room for the copy, the file streams from the
// network again without one, and `uncached` says so in plain words.
async function modelStream(m) {
  if (m.file) return { stream: m.file.stream(), total: m.file.size, fromCache: false };
  const url = new URL(m.url, self.location.href).href;
  const cache = "caches" in self ? await caches.open(MODEL_CACHE) : null;
  let hit = cache && (await cache.match(url));
  if (hit && (await changedSince(url, hit))) {
    await cache.delete(url);
    hit = undefined;
  }
  const fromCache = Boolean(hit);
  if (!hit) {
    await checkHeader(url);
    const download = async () => {
      const resp = await fetch(url);
      if (!resp.ok) throw new Error(`fetching the model from ${url}: HTTP ${resp.status}`);
      const total = Number(resp.headers.get("content-length")) || 0;
      const body = counted(resp.body, total, (loaded) => progress({ phase: "download", loaded, total }));
      return { resp, total, body };
    };
    const { resp, total, body } = await download();
    if (!cache) return { stream: body, total, fromCache };
    try {
      await cache.put(url, new Response(body, { headers: copyHeaders(resp, total) }));
    } catch (e) {
      // No room (the quota), or a copy the browser will not keep (Chromium's cache
      // answers a network error for a file of several GB): the model streams from the
      // network once more.
      await cache.delete(url);
      const again = await download();
      const uncached = isQuotaError(e) ? await quotaMessage(total) : uncachedMessage(e, total);
      return { stream: again.body, total, fromCache, uncached };
    }
    hit = await cache.match(url);
  }
  return { stream: hit.body, total: Number(hit.headers.get("content-length")) || 0, fromCache };
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
// claims every loop's tasks too.
function startHelpers(pkg, url, n) {
  const { module, memory } = pkg.helperImports();
  const joined = [];
  for (let i = 0; i < n; i++) {
    const helper = new Worker(new URL("./acs-team.js", import.meta.url), { type: "module", name: `acs-team-${i + 1}` });
    joined.push(new Promise((resolve) => {
      helper.onmessage = ({ data }) => {
        if (data.type !== "joined") console.warn("an ACS helper thread failed:", data.message);
        resolve(data.type === "joined");
      };
      helper.onerror = (e) => {
        console.warn("an ACS helper thread failed:", e.message);
        resolve(false);
      };
    }));
    helper.postMessage({ pkg: url, module, memory });
  }
  return Promise.all(joined).then((ok) => ok.filter(Boolean).length);
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
      const joined = await startHelpers(pkg, url, threads - 1);
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
  // `modelStream` reads the header with the engine's own parser.
  const { stream, total, fromCache, uncached } = await modelStream(m);
  const snapshot = m.persist === false ? undefined : await idbGet("snapshot");
  const options = { backend: m.backend || "auto" };
  if (m.modelId) options.modelId = m.modelId;
  if (m.budget) options.budget = m.budget;
  if (snapshot) options.snapshot = snapshot;
  // Bytes and tensors as they reach the engine (each tensor goes to the GPU as soon
  // as its bytes are in).
  acs = await Acs.loadStream(stream, options, (p) => progress({
    phase: "load", loaded: p.loaded, total, tensors: p.tensors, tensorsTotal: p.tensors_total, fromCache,
  }));
  if (m.persist !== false) acs.onChange((s) => idbPut("snapshot", s));
  source = m;
  self.postMessage({
    type: "loaded",
    recovered: Boolean(m.recovered),
    backend: acs.backend,
    models: acs.models(),
    loadMs: performance.now() - started,
    fromCache,
    uncached,
    bytes: total,
    // The engine's wasm memory after loading: with WebGPU the weights live on the
    // device, so this stays well under the file's size.
    wasmMemory: wasm.memory.buffer.byteLength,
    threads: pkg.cpuThreads(),
    sharedMemory: pkg.sharedMemory(),
  });
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
  self.postMessage({ type: "lost", reason });
  try {
    await load({ ...source, backend: "cpu", recovered: true });
  } catch (e) {
    self.postMessage({ type: "error", error: errorOf(e) });
  } finally {
    recovering = null;
  }
}

setInterval(() => {
  const reason = acs?.lost;
  if (reason) recover(reason);
}, LOST_CHECK_MS);

async function call(m) {
  if (recovering) throw lostError(recovering);
  if (!acs) throw Object.assign(new Error("no model is loaded yet"), { status: 503 });
  try {
    await answer(m);
  } catch (e) {
    const reason = acs?.lost ?? recovering;
    if (!reason) throw e;
    recover(reason);
    throw lostError(reason);
  }
}

async function answer(m) {
  let value;
  if (m.method === "completions" || m.method === "chatCompletions") {
    const ctl = new AbortController();
    aborts.set(m.id, ctl);
    try {
      value = await acs[m.method](m.args[0], (chunk) => {
        self.postMessage({ type: "chunk", id: m.id, chunk });
        return true;
      }, ctl.signal);
    } finally {
      aborts.delete(m.id);
    }
  } else if (["createJob", "job", "jobs", "cancelJob", "jobResult", "models", "budget", "setBudget", "stats"].includes(m.method)) {
    value = await acs[m.method](...m.args);
  } else {
    throw new Error(`unknown method ${m.method}`);
  }
  self.postMessage({ type: "result", id: m.id, value });
}
