// The page's side of ACS in the browser: starts the engine's Web Worker
// (acs-worker.js), and offers the contract as methods and as a `fetch` that serves
// `/v1/...` from the worker, so that code written for a remote ACS (or the openai JS
// SDK, through its `fetch` option) runs unchanged on the visitor's GPU.
//
//   const acs = await AcsBrowser.start({ url: "/model.gguf", onProgress });
//   const c = await acs.completions({ model: "llama-8b", prompt: ["a", "b"], n: 2 });
//   const client = new OpenAI({ apiKey: "local", baseURL: "http://acs.local/v1",
//                               fetch: acs.fetch, dangerouslyAllowBrowser: true });

import { startHelpers } from "./helpers.js";

export { cachedModels, deleteCachedModel, partUrls, storageUse } from "./models.js";

/** An error of the contract: `status` and the JSON `body` ({error: {...}}). */
export class AcsError extends Error {
  constructor(e) {
    super(e.message);
    this.name = e.name || "AcsError";
    this.status = e.status;
    this.body = e.body;
  }
}

export class AcsBrowser {
  // The worker, or the shared worker's port.
  #worker;
  #shared = false;
  #next = 1;
  #calls = new Map();
  #events = {};
  // The helper threads this page started for a dedicated threaded engine.
  #helpers = [];

  /**
   * Starts the worker and loads a model: `url` (fetched with progress, resuming where
   * a download breaks off, then kept in the Cache API; a split model's first file,
   * `NAME-00001-of-0000N.gguf`, brings the others) or `file` (a File the user picked,
   * or a split model's Files). `backend`: "auto" (WebGPU
   * on a hardware GPU, else the CPU), "webgpu" (software adapters too) or "cpu". `budget`: {tokens,
   * maxRunning} to hold and charge requests as a server does. `threads`: the CPU
   * backend's threads (default: the device's cores, at most 8); more than one needs a
   * cross-origin isolated page (COOP and COEP headers) and web/pkg-threads, else the
   * engine runs on one. `cpuWeights`: where the CPU backend keeps the weights, "wasm"
   * (wasm memory: fastest, up to 3 GiB), "js" (JS memory, each step copying a block
   * at a time into wasm memory: any size the tab's memory takes, slower) or "auto"
   * (the default: "wasm" while the file fits, else "js"). Resolves once loaded, with `info` = {backend, models, loadMs,
   * fromCache, bytes, threads, sharedMemory, uncached, persisted}: `uncached` says in
   * plain words why no copy was kept (the site's storage is full), `persisted` whether
   * the browser keeps the site's storage from eviction (set once the browser answers
   * the request made after a download).
   *
   * `shared`: run the engine in a SharedWorker, so that the pages of this origin that
   * start with the same model and backend (other tabs, a page reloaded while another
   * keeps it) share one engine, its memory, its GPU device, its Budget and its jobs;
   * a page that joins an engine another page loaded resolves at once, with
   * `info.attached`. The engine ends when its last page has gone.
   *
   * If the GPU device is lost (a driver reset, the GPU process gone), the engine loads
   * the model again on the CPU: `onLost(reason)` hears it, requests meanwhile fail with
   * 503 `gpu_device_lost`, `onProgress` hears the load, and `onRecovered(info)` its end
   * (`info` then names the CPU backend; `onRecovered(null, error)` if it failed).
   */
  static async start({ url, file, backend = "auto", budget, modelId, persist = true, threads, cpuWeights, shared = false,
                       onProgress, onLost, onRecovered, workerUrl = new URL("./acs-worker.js", import.meta.url) } = {}) {
    const acs = new AcsBrowser();
    acs.#events = { onProgress, onLost, onRecovered };
    let worker;
    if (shared) {
      worker = new SharedWorker(workerUrl, { type: "module", name: sharedName(url, file, backend, modelId, cpuWeights) });
      acs.#worker = worker.port;
      acs.#shared = true;
    } else {
      worker = acs.#worker = new Worker(workerUrl, { type: "module" });
    }
    try {
      acs.info = await new Promise((resolve, reject) => {
        acs.#worker.onmessage = (ev) => {
          const m = ev.data;
          if (m.type === "progress") onProgress?.(m);
          else if (m.type === "helpers") acs.#startHelpers(m, workerUrl);
          else if (m.type === "loaded") resolve(m);
          else if (m.type === "error") reject(new AcsError(m.error));
        };
        worker.onerror = (e) => reject(new Error(`the ACS worker failed to start: ${e.message}`));
        acs.#worker.postMessage({ type: "load", url, file, backend, budget, modelId, persist, threads, cpuWeights });
      });
    } catch (e) {
      // A load that failed leaves no engine behind: its worker ends here, and with
      // it the helper threads and the memory it started.
      acs.terminate();
      throw e;
    }
    acs.#worker.onmessage = (ev) => acs.#receive(ev.data);
    // A model just downloaded into the cache: ask the browser to keep the site's
    // storage rather than evict it under pressure (only pages may ask; the browser
    // decides, and says whether it does, in `info.persisted` once it answered). Not
    // awaited: Firefox asks the visitor, and a prompt may never be answered.
    if (url && !acs.info.fromCache && !acs.info.uncached) {
      navigator.storage?.persist?.().then((p) => { acs.info.persisted = p; }, () => {});
    }
    return acs;
  }

  // Starts the helper threads the engine asks for ({n, pkg, module, memory}) and
  // tells it how many joined its team. The page starts them, not the engine's worker:
  // Firefox at times never returns from a `new Worker` called in a worker.
  async #startHelpers({ n, pkg, module, memory }, workerUrl) {
    const { workers, joined } = startHelpers(workerUrl, n, { pkg, module, memory });
    this.#helpers.push(...workers);
    this.#worker.postMessage({ type: "helpers", joined: await joined });
  }

  #receive(m) {
    if (m.type === "progress") return this.#events.onProgress?.(m);
    if (m.type === "lost") {
      this.info = { ...this.info, lost: m.reason };
      return this.#events.onLost?.(m.reason);
    }
    if (m.type === "loaded") {
      this.info = m;
      return this.#events.onRecovered?.(m);
    }
    // Loading again on the CPU failed.
    if (m.type === "error" && m.id === undefined) return this.#events.onRecovered?.(null, new AcsError(m.error));
    const call = this.#calls.get(m.id);
    if (!call) return;
    if (m.type === "chunk") call.onChunk?.(m.chunk);
    else {
      this.#calls.delete(m.id);
      if (m.type === "result") call.resolve(m.value);
      else call.reject(new AcsError(m.error));
    }
  }

  #call(method, args, { onChunk, signal } = {}) {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#calls.set(id, { resolve, reject, onChunk });
      signal?.addEventListener("abort", () => this.#worker.postMessage({ type: "abort", id }));
      this.#worker.postMessage({ type: "call", id, method, args });
    });
  }

  /** POST /v1/completions. With `stream: true`, `onChunk` gets every chunk. */
  completions(body, { onChunk, signal } = {}) { return this.#call("completions", [body], { onChunk, signal }); }
  /** POST /v1/chat/completions, as `completions`: the chunks and the answer are chat's. */
  chatCompletions(body, { onChunk, signal } = {}) { return this.#call("chatCompletions", [body], { onChunk, signal }); }
  /** POST /v1/completion-jobs → {job, replayed}. */
  createJob(body, { idempotencyKey } = {}) { return this.#call("createJob", [body, idempotencyKey]); }
  job(id) { return this.#call("job", [id]); }
  jobs({ limit, after } = {}) { return this.#call("jobs", [limit, after]); }
  cancelJob(id) { return this.#call("cancelJob", [id]); }
  jobResult(id) { return this.#call("jobResult", [id]); }
  models() { return this.#call("models", []); }
  budget() { return this.#call("budget", []); }
  setBudget(tokens, maxRunning) { return this.#call("setBudget", [tokens, maxRunning]); }
  stats() { return this.#call("stats", []); }
  /** Ends the engine; a shared engine goes on for its other pages, if any. */
  terminate() {
    if (!this.#shared) {
      for (const helper of this.#helpers) helper.terminate();
      return this.#worker.terminate();
    }
    this.#worker.postMessage({ type: "close" });
    this.#worker.close();
  }

  /**
   * A `fetch` for the contract's routes (any host; the path from `/v1` on counts).
   * Responses carry the traffic headers a server sends (`x-ratelimit-limit-requests`,
   * `x-ratelimit-remaining-requests`, `x-budget-remaining-tokens`), read from the
   * page's Budget as the response starts.
   */
  fetch = async (input, init = {}) => this.#withTraffic(await this.#route(input, init));

  async #withTraffic(res) {
    let b;
    try { b = await this.budget(); } catch { return res; }
    const headers = new Headers(res.headers);
    headers.set("x-ratelimit-limit-requests", String(b.max_running));
    headers.set("x-ratelimit-remaining-requests", String(Math.max(0, b.max_running - b.running)));
    headers.set("x-budget-remaining-tokens", String(Math.max(0, b.tokens_left - b.tokens_held)));
    return new Response(res.body, { status: res.status, statusText: res.statusText, headers });
  }

  async #route(input, init) {
    const req = input instanceof Request ? input : null;
    const url = new URL(req ? req.url : String(input), "http://acs.local/");
    const method = (init.method || req?.method || "GET").toUpperCase();
    const headers = new Headers(init.headers || req?.headers);
    const body = init.body ?? (req ? await req.text() : undefined);
    const text = body === undefined || body === null ? "" : typeof body === "string" ? body : await new Response(body).text();
    const path = url.pathname.replace(/^.*?\/v1\//, "/v1/");
    const q = url.searchParams;
    try {
      let m;
      if (path === "/v1/models" && method === "GET") return json(200, await this.models());
      if (path === "/v1/budget" && method === "GET") return json(200, await this.budget());
      if (path === "/v1/completions" && method === "POST") return await this.#completionResponse("completions", text, init.signal || req?.signal);
      if (path === "/v1/chat/completions" && method === "POST") return await this.#completionResponse("chatCompletions", text, init.signal || req?.signal);
      if (path === "/v1/completion-jobs" && method === "POST") {
        const { job, replayed } = await this.createJob(text, { idempotencyKey: headers.get("idempotency-key") ?? undefined });
        return json(replayed ? 200 : 202, job, replayed ? { "idempotent-replayed": "true" } : {});
      }
      if (path === "/v1/completion-jobs" && method === "GET") return json(200, await this.jobs({ limit: q.get("limit") ?? undefined, after: q.get("after") ?? undefined }));
      if ((m = path.match(/^\/v1\/completion-jobs\/([^/]+)$/)) && method === "GET") return json(200, await this.job(m[1]));
      if ((m = path.match(/^\/v1\/completion-jobs\/([^/]+)\/cancel$/)) && method === "POST") return json(200, await this.cancelJob(m[1]));
      if ((m = path.match(/^\/v1\/completion-jobs\/([^/]+)\/result$/)) && method === "GET") return json(200, await this.jobResult(m[1]));
      return json(404, { error: { message: `No route ${method} ${url.pathname}.`, type: "invalid_request_error", param: null, code: "not_found" } });
    } catch (e) {
      if (e instanceof AcsError && e.status) return json(e.status, e.body);
      throw e;
    }
  }

  // A whole answer of `method` (completions or chatCompletions), or server-sent events
  // once the first chunk (or an error) came.
  async #completionResponse(method, text, signal) {
    let stream = false;
    try { stream = JSON.parse(text)?.stream === true; } catch { /* the engine says why */ }
    if (!stream) return json(200, await this[method](text, { signal }));
    const enc = new TextEncoder();
    let ctl;
    const sse = new ReadableStream({ start(c) { ctl = c; } });
    let first;
    const started = new Promise((resolve) => { first = resolve; });
    const done = this[method](text, {
      signal,
      onChunk: (chunk) => { first(); ctl.enqueue(enc.encode(`data: ${JSON.stringify(chunk)}\n\n`)); },
    });
    const failedEarly = await Promise.race([started.then(() => null), done.then(() => null, (e) => e)]);
    if (failedEarly) {
      if (failedEarly instanceof AcsError && failedEarly.status) return json(failedEarly.status, failedEarly.body);
      throw failedEarly;
    }
    done.then(
      () => { ctl.enqueue(enc.encode("data: [DONE]\n\n")); ctl.close(); },
      (e) => {
        ctl.enqueue(enc.encode(`data: ${JSON.stringify(e.body || { error: { message: e.message } })}\n\ndata: [DONE]\n\n`));
        ctl.close();
      },
    );
    return new Response(sse, { status: 200, headers: { "content-type": "text/event-stream" } });
  }
}

// The shared worker of a model: one per model source, backend, id and place of the
// CPU's weights, so that only pages that load the same model share an engine.
function sharedName(url, file, backend, modelId, cpuWeights) {
  const files = file ? [file].flat().map((f) => `${f.name}:${f.size}`) : [new URL(url, location.href).href];
  return `acs ${JSON.stringify({ files, backend, modelId, cpuWeights })}`;
}

function json(status, value, extra = {}) {
  return new Response(JSON.stringify(value), { status, headers: { "content-type": "application/json", ...extra } });
}
