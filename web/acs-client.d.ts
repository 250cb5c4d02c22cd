// Types of the `acs-web` package (acs-client.js): ACS in the browser. The engine runs
// in a Web Worker, on WebGPU or on the CPU (wasm, on threads where the page is
// cross-origin isolated); requests and answers are the ACS API's (OpenAI's shapes plus
// ACS's extensions), as plain objects.

/** Where the batches step: "auto" (WebGPU on a hardware GPU, else the CPU), "webgpu" (software adapters too) or "cpu". */
export type Backend = "auto" | "webgpu" | "cpu";

/** What a model file's header says, read before the download. */
export interface HeaderSummary {
  family: string;
  n_layers: number;
  d_model: number;
  vocab: number;
  context: number;
  /** Tensors of each weight format ("Q4_K", "F32", …). */
  formats: Record<string, number>;
  /** Bytes of the weights: wasm memory on the CPU backend, GPU memory on WebGPU. */
  weight_bytes: number;
  /** Bytes of the largest tensor, which WebGPU binds whole. */
  largest_tensor_bytes: number;
  /** Files the model is in (more than 1 for a split model). */
  parts: number;
}

/**
 * How far loading got: the file's header (before the download), the download into the
 * Cache API, then the bytes into the engine.
 */
export interface Progress {
  type: "progress";
  phase: "header" | "download" | "load";
  /** With phase "header". */
  header?: HeaderSummary;
  loaded: number;
  total: number;
  fromCache?: boolean;
  /** Tensors on the GPU so far (WebGPU only). */
  tensors?: number;
  tensorsTotal?: number;
  /** With phase "download": how often the download broke off and resumed. */
  resumes?: number;
}

export interface StartOptions {
  /**
   * A GGUF file's URL: fetched with progress (its header first), then kept in the
   * Cache API; a download that breaks off resumes where it stopped. A split model's
   * first file (`NAME-00001-of-0000N.gguf`) brings the others from beside it.
   */
  url?: string;
  /** A GGUF file the user picked (never cached), or a split model's files. */
  file?: Blob | File[];
  backend?: Backend;
  /** A Budget for the page: requests then take Holds and are charged as on a server. */
  budget?: { tokens: number; maxRunning?: number };
  /** The model's id in requests (default "local"; "llama-8b" always works too). */
  modelId?: string;
  /** Keep jobs and the Budget in IndexedDB across reloads (default true). */
  persist?: boolean;
  /**
   * The CPU backend's threads (default: the device's cores, at most 8). More than one
   * needs a cross-origin isolated page; elsewhere the engine runs on one.
   */
  threads?: number;
  /**
   * Where the CPU backend keeps the weights: "wasm" (wasm memory: fastest, up to
   * 3 GiB), "js" (JS memory, each step copying a block at a time into wasm memory: any
   * size the tab's memory takes, slower) or "auto" (the default: "wasm" while the file
   * fits, else "js").
   */
  cpuWeights?: "auto" | "wasm" | "js";
  onProgress?: (p: Progress) => void;
  /**
   * The GPU device was lost (a driver reset, the GPU process gone): the engine loads
   * the model again on the CPU, and requests meanwhile fail with 503 `gpu_device_lost`.
   */
  onLost?: (reason: string) => void;
  /** The model loaded again on the CPU after `onLost` (`info` null and `error` set if it failed). */
  onRecovered?: (info: LoadInfo | null, error?: AcsError) => void;
  /**
   * Run the engine in a SharedWorker: the pages of this origin that start with the
   * same model and backend share one engine (its memory, GPU device, Budget and jobs).
   */
  shared?: boolean;
  /** Where acs-worker.js is (default: beside acs-client.js). */
  workerUrl?: string | URL;
}

/** What `start` resolves with, as `acs.info`. */
export interface LoadInfo {
  type: "loaded";
  /**
   * "cpu", "cpu (N threads)", either with "weights in JS memory" where they are kept
   * there ("cpu (N threads, weights in JS memory)"), or "webgpu: <adapter>".
   */
  backend: string;
  models: ModelList;
  loadMs: number;
  fromCache: boolean;
  /** The file's size (the files' together for a split model). */
  bytes: number;
  /** Files the model came in. */
  parts: number;
  /** How often a download broke off and resumed. */
  resumes: number;
  /** The engine's wasm memory after loading. */
  wasmMemory: number;
  /** The CPU backend's threads. */
  threads: number;
  /** Whether the engine is the build with shared memory (threads). */
  sharedMemory: boolean;
  /** Why no copy of the file was kept (the site's storage is full), in plain words. */
  uncached?: string;
  /**
   * Whether the browser keeps the site's storage from eviction: asked after a download,
   * set once the browser answers (Firefox asks the visitor).
   */
  persisted?: boolean;
  /** Whether the engine runs in a SharedWorker. */
  shared: boolean;
  /** Whether this page joined a shared engine that another page had loaded. */
  attached?: boolean;
  /** Whether this is the load again on the CPU after the GPU was lost. */
  recovered?: boolean;
  /** Why the GPU was lost, once it was. */
  lost?: string;
}

export interface Model {
  id: string;
  object: "model";
  owned_by: string;
  family?: string;
  context_window?: number;
  n_layers?: number;
  d_model?: number;
  [field: string]: unknown;
}

export interface ModelList {
  object: "list";
  data: Model[];
}

/** A steering entry: a vector, or the difference of two texts' mean activations at `layer`. */
export type Steering =
  | { layer: number; scale: number; vector: number[] }
  | { layer: number; scale: number; vector_b64: string }
  | { layer: number; scale: number; positive: string; negative: string };

interface Sampling {
  model: string;
  n?: number;
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  seed?: number;
  stop?: string | string[];
  presence_penalty?: number;
  frequency_penalty?: number;
  logit_bias?: Record<string, number>;
  stream?: boolean;
  user?: string;
  steering?: Steering[];
}

export interface CompletionRequest extends Sampling {
  prompt: string | string[] | number[] | number[][];
  echo?: boolean;
  logprobs?: number;
}

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string | { type: "text"; text: string }[];
}

export interface ChatRequest extends Sampling {
  messages: ChatMessage[];
  max_completion_tokens?: number;
  logprobs?: boolean;
  top_logprobs?: number;
  stream_options?: { include_usage?: boolean };
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details?: { cached_tokens: number };
}

export type FinishReason = "length" | "stop";

/** Choice `i` of prompt `p` has index `p * n + i`. */
export interface CompletionChoice {
  index: number;
  text: string;
  finish_reason: FinishReason | null;
  logprobs: unknown;
}

export interface Activation {
  prompt_index: number;
  layer: number;
  positions: number[];
  shape: number[];
  dtype: "f32";
  /** Base64 of little-endian f32s. */
  data: string;
}

export interface Completion {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: CompletionChoice[];
  usage: Usage;
  activations?: Activation[];
}

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: { index: number; message: { role: "assistant"; content: string }; finish_reason: FinishReason | null; logprobs: unknown }[];
  usage: Usage;
}

/** A streamed chunk (`text_completion` or `chat.completion.chunk`). */
export interface Chunk {
  id: string;
  object: string;
  created: number;
  model: string;
  choices: { index: number; text?: string; delta?: { role?: string; content?: string }; finish_reason: FinishReason | null }[];
  usage?: Usage | null;
}

export type JobStatus = "queued" | "running" | "succeeded" | "failed" | "cancelled";

export interface Job {
  id: string;
  object?: string;
  request_id: string;
  model: string;
  status: JobStatus;
  cancel_requested: boolean;
  created_at: number;
  started_at: number | null;
  finished_at: number | null;
  expires_at: number | null;
  result_expired: boolean;
  status_url: string;
  result_url: string;
  usage_pending: boolean;
}

export interface JobRequest extends CompletionRequest {
  activations?: { layers: number[]; positions: "last" | "all" };
}

export interface Budget {
  tokens_left: number;
  tokens_held: number;
  running: number;
  max_running: number;
}

export interface List<T> {
  object: "list";
  data: T[];
  has_more: boolean;
  first_id?: string | null;
  last_id?: string | null;
}

/** An error of the contract: `status` and the JSON `body` ({error: {message, type, param, code}}). */
export class AcsError extends Error {
  status?: number;
  body?: { error: { message: string; type: string; param: string | null; code: string | null } };
}

export interface CallOptions<C> {
  /** With `stream: true`, each chunk as it is sampled. */
  onChunk?: (chunk: C) => void;
  signal?: AbortSignal;
}

export class AcsBrowser {
  /** Starts the engine's worker and loads a model; resolves once loaded. */
  static start(options?: StartOptions): Promise<AcsBrowser>;
  readonly info: LoadInfo;
  /** POST /v1/completions (a body object or its JSON text). */
  completions(body: CompletionRequest | string, options?: CallOptions<Chunk>): Promise<Completion>;
  /** POST /v1/chat/completions. */
  chatCompletions(body: ChatRequest | string, options?: CallOptions<Chunk>): Promise<ChatCompletion>;
  /** POST /v1/completion-jobs. */
  createJob(body: JobRequest | string, options?: { idempotencyKey?: string }): Promise<{ job: Job; replayed: boolean }>;
  job(id: string): Promise<Job>;
  jobs(options?: { limit?: number | string; after?: string }): Promise<List<Job>>;
  cancelJob(id: string): Promise<Job>;
  jobResult(id: string): Promise<Completion | ChatCompletion>;
  models(): Promise<ModelList>;
  budget(): Promise<Budget>;
  setBudget(tokens: number, maxRunning?: number): Promise<Budget>;
  /** Work counters of the engine. */
  stats(): Promise<Record<string, number>>;
  /** Stops the worker (and the model with it). */
  terminate(): void;
  /**
   * A `fetch` that serves the contract's `/v1/...` routes from the engine, for code
   * written against a server (the openai SDK's `fetch` option).
   */
  fetch: (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;
}

/** A model file's copy in the browser's cache. */
export interface CachedModel {
  url: string;
  bytes: number;
  etag: string | null;
  lastModified: string | null;
  /** ISO time of the download. */
  cachedAt: string | null;
}

/** The cached model files, newest first. */
export function cachedModels(): Promise<CachedModel[]>;
/** A split model's file URLs from its first file's (`NAME-00001-of-0000N.gguf`); else `[url]`. */
export function partUrls(url: string): string[];
/** Deletes the cached copy of `url`; resolves to whether there was one. */
export function deleteCachedModel(url: string): Promise<boolean>;
/** What this site stores and may store, in bytes, and whether its storage is persistent. */
export function storageUse(): Promise<{ usage: number; quota: number; persisted: boolean }>;
