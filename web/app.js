// The playground: the same contract requests either to this browser's engine (the
// acs-web package in a Web Worker, through its `fetch`) or to a remote ACS (the `acs`
// server or the edge worker) with a key.
import { AcsBrowser, cachedModels, deleteCachedModel, storageUse } from "./acs-client.js";
import { ChatBoard, parseConversation } from "./chat.js";
import { readEvents } from "./events.js";

const $ = (id) => document.getElementById(id);
let local = null; // the in-browser engine once loaded

for (const id of ["base", "key", "model-url"]) {
  const saved = localStorage.getItem(`acs.${id}`);
  if (saved) $(id).value = saved;
  $(id).addEventListener("change", () => localStorage.setItem(`acs.${id}`, $(id).value));
}

const isChat = () => $("kind-chat").checked;
function showKind() {
  $("prompts-label").hidden = isChat();
  $("messages-label").hidden = !isChat();
  $("grid").hidden = isChat();
  $("chat").hidden = !isChat();
  $("run").textContent = isChat() ? "Chat" : "Sample";
}
for (const r of document.querySelectorAll("input[name=kind]")) r.addEventListener("change", showKind);

// The model picker: every model the endpoint serves, `llama-8b` (the first) by default.
function showModels(list) {
  const select = $("model");
  const keep = select.value;
  select.replaceChildren(...list.map((m) => {
    const o = document.createElement("option");
    o.value = m.id;
    o.textContent = `${m.id}${m.family ? ` (${m.family}, ${m.n_layers} layers)` : ""}`;
    return o;
  }));
  select.value = list.some((m) => m.id === keep) ? keep : list[0]?.id ?? "llama-8b";
}

const isBrowser = () => $("mode-browser").checked;
function showMode() {
  $("browser-settings").hidden = !isBrowser();
  $("remote-settings").hidden = isBrowser();
  refreshJobs();
}
if (localStorage.getItem("acs.mode") === "remote") $("mode-remote").checked = true;
for (const r of document.querySelectorAll("input[name=mode]")) {
  r.addEventListener("change", () => { localStorage.setItem("acs.mode", isBrowser() ? "browser" : "remote"); showMode(); });
}

// One way to reach either endpoint: a fetch, a base URL and headers.
function endpoint() {
  if (isBrowser()) {
    if (!local) throw new Error("Load a model first (Endpoint: This browser).");
    return { fetch: local.fetch, base: "/v1", headers: { "Content-Type": "application/json" } };
  }
  return {
    fetch: window.fetch.bind(window),
    base: $("base").value.replace(/\/$/, ""),
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${$("key").value.trim()}` },
  };
}

async function api(path, init = {}) {
  const e = endpoint();
  return e.fetch(`${e.base}${path}`, { ...init, headers: { ...e.headers, ...(init.headers || {}) } });
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    return `${resp.status} ${body.error.code}: ${body.error.message}`;
  } catch {
    return `${resp.status} ${resp.statusText}`;
  }
}

async function ok(resp) {
  if (!resp.ok) throw new Error(await errorText(resp));
  return resp.json();
}

const mb = (b) => `${(b / 1e6).toFixed(1)} MB`;

// The largest file the wasm CPU backend keeps in wasm memory (acs-web's CPU_MAX_FILE:
// wasm32 addresses 4 GiB, and the engine needs room beside the weights); a larger one
// it keeps in JS memory, copying a block at a time into wasm memory each step.
const CPU_MAX_FILE = 3 * 2 ** 30;

// The largest buffer this browser's GPU binds (WebGPU's adapter limits), or null
// without WebGPU.
async function gpuBinding() {
  const adapter = await navigator.gpu?.requestAdapter().catch(() => null);
  return adapter ? Math.min(adapter.limits.maxStorageBufferBindingSize, adapter.limits.maxBufferSize) : null;
}

// A model's header in a line: family, shape, weight formats, and what the weights need
// against what the device offers: memory (`navigator.deviceMemory`, in GB, rounded and
// capped by the browser; Chromium's) and, for WebGPU, the largest buffer its GPU binds.
async function describe(h, total) {
  const backend = $("backend").value;
  const formats = Object.entries(h.formats).map(([f, n]) => `${f}×${n}`).join(" ");
  const device = navigator.deviceMemory ? `, this device about ${navigator.deviceMemory} GB` : "";
  let fits = "";
  if (backend === "cpu" && h.weight_bytes > CPU_MAX_FILE) fits = " (over the 3 GiB of wasm memory: the CPU backend keeps it in JS memory and copies " +
    "a block at a time each step, slower; WebGPU is faster)";
  const binding = backend === "cpu" ? null : await gpuBinding();
  if (binding !== null && h.largest_tensor_bytes > binding) {
    fits = ` (its largest tensor, ${mb(h.largest_tensor_bytes)}, is over the ${mb(binding)} this GPU binds: ` +
      "WebGPU cannot load it)";
  }
  const size = total ? (h.parts > 1 ? ` · ${h.parts} files of ${mb(total)} in all` : ` · a ${mb(total)} file`) : "";
  return `${h.family} · ${h.n_layers} layers · d_model ${h.d_model} · ${formats}${size}` +
    ` · its weights need ${mb(h.weight_bytes)} of memory${device}` +
    `${binding !== null ? `, its largest tensor ${mb(h.largest_tensor_bytes)} of the ${mb(binding)} the GPU binds` : ""}${fits}`;
}

// The model URLs loaded lately, offered under the URL field.
const RECENT = "acs.recent-models";
function recentModels() {
  try {
    return JSON.parse(localStorage.getItem(RECENT)) ?? [];
  } catch {
    return [];
  }
}
function showRecent() {
  $("recent-models").replaceChildren(...recentModels().map((u) => Object.assign(document.createElement("option"), { value: u })));
}
function remember(url) {
  localStorage.setItem(RECENT, JSON.stringify([url, ...recentModels().filter((u) => u !== url)].slice(0, 8)));
  showRecent();
}

// The models this browser keeps (the Cache API), with their sizes, each deletable,
// and what the site's storage holds of what it may.
async function showCache() {
  const rows = await cachedModels();
  $("cached").tBodies[0].replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.url = r.url;
    const url = new URL(r.url);
    const del = Object.assign(document.createElement("button"), { type: "button", textContent: "Delete" });
    del.addEventListener("click", async () => {
      await deleteCachedModel(r.url);
      await showCache();
    });
    const cells = [url.origin === location.origin ? url.pathname : r.url, mb(r.bytes),
                   r.cachedAt ? new Date(r.cachedAt).toLocaleString() : ""];
    tr.append(...cells.map((text) => Object.assign(document.createElement("td"), { textContent: text })));
    const cell = document.createElement("td");
    cell.append(del);
    tr.append(cell);
    return tr;
  }));
  const s = await storageUse();
  $("storage").textContent = `this site stores ${mb(s.usage)} of the ${mb(s.quota)} the browser allows it` +
    (s.persisted ? " · kept from eviction" : "");
}
showRecent();
showCache();

$("load").addEventListener("click", async () => {
  const status = $("load-status");
  const bar = $("load-progress");
  // One file, or a split model's files (NAME-00001-of-0000N.gguf, ...).
  const picked = [...$("model-file").files];
  const file = picked.length > 1 ? picked : picked[0];
  local?.terminate();
  local = null;
  for (const k of ["loadMs", "fromCache", "wasmMemory", "bytes", "threads", "sharedMemory", "lost", "uncached", "header"]) delete status.dataset[k];
  status.textContent = "starting…";
  bar.value = 0;
  // What the file's header says, once the download of a URL is about to start.
  let header = "";
  // What the status line says once a model is loaded (or loaded again on the CPU).
  const loaded = (i) => {
    bar.value = 1;
    const m = i.models.data[0];
    showModels(i.models.data);
    status.dataset.fromCache = String(i.fromCache);
    status.dataset.loadMs = String(Math.round(i.loadMs));
    status.dataset.wasmMemory = String(i.wasmMemory);
    status.dataset.bytes = String(i.bytes);
    status.dataset.threads = String(i.threads);
    status.dataset.sharedMemory = String(i.sharedMemory);
    const source = picked.length ? `from ${picked.map((f) => f.name).join(", ")}`
      : i.fromCache ? "from the cache" : "from the network";
    status.textContent = (i.recovered ? `the GPU was lost (${status.dataset.lost}); ` : "") + `loaded ${mb(i.bytes)} ${source} in ` +
      `${(i.loadMs / 1000).toFixed(2)} s · ${i.backend} · ${m.n_layers} layers · d_model ${m.d_model}` +
      ` · engine memory ${mb(i.wasmMemory)}` + (i.uncached ? ` · not kept: ${i.uncached}` : "");
    status.dataset.uncached = i.uncached ? "true" : "false";
    showCache();
  };
  try {
    local = await AcsBrowser.start({
      url: file ? undefined : $("model-url").value,
      file,
      backend: $("backend").value,
      threads: Number($("threads").value) || undefined,
      onProgress: (p) => {
        if (p.phase === "header") {
          status.dataset.header = JSON.stringify(p.header);
          describe(p.header, p.total).then((line) => {
            header = line;
            status.textContent = line;
          });
          return;
        }
        if (p.total) bar.value = p.loaded / p.total;
        status.textContent = (header ? `${header} · ` : "") + (p.phase === "download"
          ? `downloading into the browser's cache: ${mb(p.loaded)} of ${mb(p.total)}` +
            (p.resumes ? ` (the connection broke off; resumed ${p.resumes === 1 ? "once" : `${p.resumes} times`})` : "")
          : `loading${p.fromCache ? " from the cache" : ""}: ${mb(p.loaded)} of ${mb(p.total)}` +
            (p.tensorsTotal ? ` · ${p.tensors} of ${p.tensorsTotal} tensors on the GPU` : ""));
      },
      onLost: (reason) => {
        for (const k of ["loadMs", "fromCache", "wasmMemory", "bytes", "threads", "sharedMemory"]) delete status.dataset[k];
        status.dataset.lost = reason;
        status.textContent = `the GPU was lost (${reason}): loading the model again on the CPU…`;
      },
      onRecovered: (i, e) => {
        if (i) loaded(i);
        else status.textContent = `the GPU was lost, and loading the model on the CPU failed: ${e.message}`;
      },
    });
    // For the console (and the openai JS SDK: `new OpenAI({fetch: acs.fetch, …})`).
    window.acs = local;
    loaded(local.info);
    if (!file) remember($("model-url").value);
    refreshJobs();
  } catch (e) {
    status.textContent = `cannot load the model: ${e.message || e}`;
  }
});

$("check").addEventListener("click", async () => {
  const status = $("endpoint-status");
  status.textContent = "…";
  try {
    const [models, budget] = await Promise.all([api("/models"), api("/budget")]);
    const m = (await ok(models)).data;
    showModels(m);
    const b = budget.ok ? await budget.json() : null;
    status.textContent =
      `${m.map((x) => x.id).join(", ")} · ${m[0].n_layers} layers · d_model ${m[0].d_model}` +
      (b ? ` · ${b.tokens_left} tokens left` : ` · key: ${await errorText(budget)}`);
    refreshJobs();
  } catch (e) {
    status.textContent = String(e.message || e);
  }
});

function prompts() {
  return $("prompts").value.split("\n").filter((l) => l.length > 0);
}

function requestBody() {
  const body = {
    model: $("model").value,
    prompt: prompts(),
    n: Number($("n").value),
    max_tokens: Number($("max_tokens").value),
    temperature: Number($("temperature").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("steer").checked) {
    body.steering = [{
      layer: Number($("steer-layer").value),
      scale: Number($("steer-scale").value),
      positive: $("steer-positive").value,
      negative: $("steer-negative").value,
    }];
  }
  return body;
}

function buildGrid(ps, n) {
  const grid = $("grid");
  grid.replaceChildren();
  grid.style.gridTemplateColumns = `minmax(8rem, auto) repeat(${n}, 1fr)`;
  const cells = [];
  ps.forEach((p, pi) => {
    const head = document.createElement("div");
    head.className = "prompt";
    head.textContent = p;
    grid.append(head);
    for (let i = 0; i < n; i++) {
      const cell = document.createElement("div");
      cell.className = "choice";
      cell.dataset.index = String(pi * n + i);
      cell.title = `choice ${i} of prompt ${pi} (index ${pi * n + i})`;
      grid.append(cell);
      cells.push(cell);
    }
  });
  return cells;
}

function showUsage(usage, secs) {
  $("usage").textContent =
    `prompt_tokens ${usage.prompt_tokens} · completion_tokens ${usage.completion_tokens}` +
    ` · total ${usage.total_tokens}` +
    (usage.prompt_tokens_details?.cached_tokens ? ` · ${usage.prompt_tokens_details.cached_tokens} prompt tokens cached` : "") +
    (secs ? ` · ${(usage.completion_tokens / secs).toFixed(1)} tokens/s` : "");
}

// Chat: the conversation's n replies side by side, each column then its own conversation.
const board = new ChatBoard($("chat"),
  (body) => api("/chat/completions", { method: "POST", body: JSON.stringify(body) }),
  (usage, secs) => { if (usage) showUsage(usage, secs); $("run-status").textContent = `done in ${secs.toFixed(2)} s`; });

function chatBody() {
  const { prompt: _, max_tokens, ...rest } = requestBody();
  return { ...rest, messages: parseConversation($("messages").value), max_completion_tokens: max_tokens };
}

$("request").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (isChat()) {
    $("usage").textContent = "";
    $("run-status").textContent = "chatting…";
    try {
      await board.start(chatBody());
    } catch (e) {
      $("run-status").textContent = String(e.message || e);
    }
    return;
  }
  const body = { ...requestBody(), stream: true, stream_options: { include_usage: true } };
  const cells = buildGrid(body.prompt, body.n);
  const status = $("run-status");
  $("usage").textContent = "";
  status.textContent = "sampling…";
  const started = performance.now();
  try {
    const resp = await api("/completions", { method: "POST", body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    const usage = await readEvents(resp, (chunk) => {
      for (const c of chunk.choices) {
        const cell = cells[c.index];
        cell.textContent += c.text;
        if (c.finish_reason) cell.dataset.finish = c.finish_reason;
      }
    });
    const secs = (performance.now() - started) / 1000;
    status.textContent = `done in ${secs.toFixed(2)} s`;
    if (usage) showUsage(usage, secs);
  } catch (e) {
    status.textContent = String(e.message || e);
  }
});

const FINAL = ["succeeded", "failed", "cancelled", "expired"];

async function untilFinal(id) {
  for (;;) {
    const job = await ok(await api(`/completion-jobs/${id}`));
    if (FINAL.includes(job.status)) return job;
    await new Promise((r) => setTimeout(r, 300));
  }
}

$("submit-job").addEventListener("click", async () => {
  const status = $("run-status");
  try {
    const body = isChat() ? chatBody() : requestBody();
    const job = await ok(await api("/completion-jobs", { method: "POST", body: JSON.stringify(body) }));
    status.textContent = `job ${job.id} ${job.status}`;
    refreshJobs();
  } catch (e) {
    status.textContent = String(e.message || e);
  }
});

let polling = null;
async function refreshJobs() {
  const tbody = $("jobs").querySelector("tbody");
  let list;
  try {
    list = await ok(await api("/completion-jobs?limit=20"));
  } catch {
    tbody.replaceChildren();
    return;
  }
  tbody.replaceChildren(...list.data.map((j) => {
    const tr = document.createElement("tr");
    tr.dataset.status = j.status;
    for (const t of [j.id, j.status, new Date(j.created_at).toLocaleTimeString()]) {
      const td = document.createElement("td");
      td.textContent = t;
      tr.append(td);
    }
    const td = document.createElement("td");
    if (!FINAL.includes(j.status)) {
      const b = document.createElement("button");
      b.textContent = "cancel";
      b.onclick = async () => { await api(`/completion-jobs/${j.id}/cancel`, { method: "POST" }); refreshJobs(); };
      td.append(b);
    } else if (j.status === "succeeded") {
      const b = document.createElement("button");
      b.textContent = "show";
      b.onclick = () => showResult(j.id);
      td.append(b);
    }
    tr.append(td);
    return tr;
  }));
  clearTimeout(polling);
  if (list.data.some((j) => !FINAL.includes(j.status))) polling = setTimeout(refreshJobs, 1000);
}

async function showResult(id) {
  const c = await ok(await api(`/completion-jobs/${id}/result`));
  // A chat job's result is a chat completion: its replies to the one conversation.
  const heads = c.object === "chat.completion" ? ["the conversation"] : prompts();
  $("grid").hidden = false;
  $("chat").hidden = true;
  const n = Math.max(1, c.choices.length / Math.max(1, heads.length));
  const cells = buildGrid(heads, n);
  for (const ch of c.choices) {
    if (cells[ch.index]) {
      cells[ch.index].textContent = ch.text ?? ch.message.content;
      cells[ch.index].dataset.finish = ch.finish_reason;
    }
  }
  showUsage(c.usage);
}

// Activations: one job reads the residual stream after every block at every position
// of the first prompt; the picture is its norm, a row per block.
$("activations").addEventListener("click", async () => {
  const status = $("heatmap-status");
  try {
    status.textContent = "reading activations…";
    const m = (await ok(await api("/models"))).data[0];
    const layers = [...Array(m.n_layers).keys()];
    const body = { model: $("model").value, prompt: prompts()[0], max_tokens: 1,
                   activations: { layers, positions: "all" } };
    if ($("steer").checked) body.steering = requestBody().steering;
    const job = await ok(await api("/completion-jobs", { method: "POST", body: JSON.stringify(body) }));
    refreshJobs();
    const done = await untilFinal(job.id);
    if (done.status !== "succeeded") throw new Error(`the job ${done.status}`);
    const c = await ok(await api(`/completion-jobs/${job.id}/result`));
    const rows = c.activations.filter((a) => a.prompt_index === 0).sort((a, b) => a.layer - b.layer);
    const norms = rows.map((a) => {
      const raw = Uint8Array.from(atob(a.data), (ch) => ch.charCodeAt(0));
      const f = new Float32Array(raw.buffer);
      const [positions, width] = a.shape;
      return Array.from({ length: positions }, (_, p) =>
        Math.sqrt(f.subarray(p * width, (p + 1) * width).reduce((s, x) => s + x * x, 0)));
    });
    drawHeatmap(norms);
    status.textContent = `${rows.length} blocks × ${norms[0]?.length ?? 0} positions; colour: log norm`;
  } catch (e) {
    status.textContent = String(e.message || e);
  }
});

function drawHeatmap(norms) {
  const canvas = $("heatmap");
  const ctx = canvas.getContext("2d");
  const rows = norms.length;
  const cols = Math.max(...norms.map((r) => r.length));
  const logs = norms.flat().map((x) => Math.log(x + 1e-6));
  const lo = Math.min(...logs), hi = Math.max(...logs);
  const cw = canvas.width / cols, ch = canvas.height / rows;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  norms.forEach((r, l) => r.forEach((x, p) => {
    const t = hi > lo ? (Math.log(x + 1e-6) - lo) / (hi - lo) : 0.5;
    ctx.fillStyle = `hsl(${240 - 200 * t}, 80%, ${25 + 45 * t}%)`;
    ctx.fillRect(p * cw, l * ch, Math.ceil(cw), Math.ceil(ch));
  }));
}

showMode();
showKind();
