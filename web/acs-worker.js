// The engine's dedicated Web Worker: it owns the GPU device and the model, so the page
// never stalls while a batch steps. The page talks to it by messages (acs-client.js):
//
//   page → worker  {type:"load", url | file, backend, budget, modelId}
//                  {type:"call", id, method, args}      {type:"abort", id}
//   worker → page  {type:"progress", phase, loaded, total, fromCache}
//                  {type:"loaded", backend, models, loadMs, fromCache, bytes}
//                  {type:"chunk", id, chunk}  {type:"result", id, value}
//                  {type:"error", id?, error:{name, message, status, body}}
//
// The model file is cached with the Cache API (a reload reads it from there), and the
// store of jobs and Budget is kept in IndexedDB after every change (a reload finds
// its jobs; queued and interrupted ones run again).
import init, { Acs } from "./pkg/acs_web.js";

const MODEL_CACHE = "acs-models-v1";
let acs = null;
const aborts = new Map();

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

// Reads a Response body into one buffer, reporting bytes as they arrive.
async function readAll(resp, fromCache) {
  const total = Number(resp.headers.get("content-length")) || 0;
  let buf = new Uint8Array(total || 1 << 20);
  let loaded = 0;
  const reader = resp.body.getReader();
  let last = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (loaded + value.length > buf.length) {
      const bigger = new Uint8Array(Math.max(buf.length * 2, loaded + value.length));
      bigger.set(buf.subarray(0, loaded));
      buf = bigger;
    }
    buf.set(value, loaded);
    loaded += value.length;
    if (loaded - last > 1 << 20) {
      last = loaded;
      progress({ phase: "download", loaded, total, fromCache });
    }
  }
  progress({ phase: "download", loaded, total: total || loaded, fromCache });
  return buf.subarray(0, loaded);
}

async function modelBytes(m) {
  if (m.file) {
    const resp = new Response(m.file, { headers: { "content-length": String(m.file.size) } });
    return { bytes: await readAll(resp, false), fromCache: false };
  }
  const url = new URL(m.url, self.location.href).href;
  const cache = "caches" in self ? await caches.open(MODEL_CACHE) : null;
  const hit = cache && (await cache.match(url));
  if (hit) return { bytes: await readAll(hit, true), fromCache: true };
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`fetching the model from ${url}: HTTP ${resp.status}`);
  const bytes = await readAll(resp, false);
  if (cache) {
    progress({ phase: "caching", loaded: bytes.length, total: bytes.length });
    await cache.put(url, new Response(bytes, { headers: { "content-length": String(bytes.length) } }));
  }
  return { bytes, fromCache: false };
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

async function load(m) {
  const started = performance.now();
  await init();
  const { bytes, fromCache } = await modelBytes(m);
  progress({ phase: "starting", loaded: bytes.length, total: bytes.length, fromCache });
  const snapshot = m.persist === false ? undefined : await idbGet("snapshot");
  const options = { backend: m.backend || "auto" };
  if (m.modelId) options.modelId = m.modelId;
  if (m.budget) options.budget = m.budget;
  if (snapshot) options.snapshot = snapshot;
  acs = await Acs.load(bytes, options);
  if (m.persist !== false) acs.onChange((s) => idbPut("snapshot", s));
  self.postMessage({
    type: "loaded",
    backend: acs.backend,
    models: acs.models(),
    loadMs: performance.now() - started,
    fromCache,
    bytes: bytes.length,
  });
}

async function call(m) {
  if (!acs) throw Object.assign(new Error("no model is loaded yet"), { status: 503 });
  let value;
  if (m.method === "completions") {
    const ctl = new AbortController();
    aborts.set(m.id, ctl);
    try {
      value = await acs.completions(m.args[0], (chunk) => {
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
