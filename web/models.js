// The browser's copies of model files, shared by the page (acs-client.js, the
// playground) and the engine's worker (acs-worker.js): the Cache API's
// "acs-models-v1", each entry a file's whole response as it was downloaded, with the
// server's validators (ETag, Last-Modified, Content-Length) kept beside it so that a
// new file at the same URL is downloaded again rather than served stale.

export const MODEL_CACHE = "acs-models-v1";

// The header that records when a copy was made.
const CACHED_AT = "x-acs-cached-at";
// The header that records where the copy's download led (after redirects).
export const SOURCE_URL = "x-acs-source-url";

/** The cached model files: [{url, bytes, etag, lastModified, cachedAt}], newest first. */
export async function cachedModels() {
  if (!("caches" in self)) return [];
  const cache = await caches.open(MODEL_CACHE);
  const out = [];
  for (const req of await cache.keys()) {
    const resp = await cache.match(req);
    if (!resp) continue;
    const h = resp.headers;
    out.push({
      url: req.url,
      bytes: Number(h.get("content-length")) || 0,
      etag: h.get("etag"),
      lastModified: h.get("last-modified"),
      cachedAt: h.get(CACHED_AT),
    });
  }
  return out.sort((a, b) => String(b.cachedAt).localeCompare(String(a.cachedAt)));
}

/** Deletes the cached copy of `url`; resolves to whether there was one. */
export async function deleteCachedModel(url) {
  if (!("caches" in self)) return false;
  const cache = await caches.open(MODEL_CACHE);
  return cache.delete(new URL(url, self.location.href).href);
}

/** What this site stores and may store ({usage, quota} in bytes) and whether it is persistent. */
export async function storageUse() {
  const s = self.navigator?.storage;
  const { usage = 0, quota = 0 } = (await s?.estimate?.()) ?? {};
  const persisted = (await s?.persisted?.()) ?? false;
  return { usage, quota, persisted };
}

/** The headers a copy keeps: the body's length, the server's validators, and when it was made. */
export function copyHeaders(resp, total) {
  const headers = { "content-length": String(total), [CACHED_AT]: new Date().toISOString(), [SOURCE_URL]: resp.url };
  for (const name of ["etag", "last-modified"]) {
    const v = resp.headers.get(name);
    if (v) headers[name] = v;
  }
  return headers;
}

/**
 * Whether the file at `url` differs from its cached copy `hit`: the server's ETag, else
 * its Last-Modified, else its length, from a HEAD request. A server that cannot be
 * reached (offline) leaves the copy in use.
 */
export async function changedSince(url, hit) {
  let head;
  try {
    head = await fetch(url, { method: "HEAD", cache: "no-store" });
  } catch {
    return false;
  }
  if (!head.ok) return false;
  const [was, now] = [hit.headers, head.headers];
  for (const name of ["etag", "last-modified"]) {
    if (was.get(name) || now.get(name)) return was.get(name) !== now.get(name);
  }
  const length = now.get("content-length");
  return length !== null && length !== was.get("content-length");
}

/** Whether `e` is the browser refusing to store more for this site. */
export function isQuotaError(e) {
  return e?.name === "QuotaExceededError" || /quota/i.test(String(e?.message));
}

const mb = (n) => `${(n / 1e6).toFixed(1)} MB`;

/** A quota error in plain words, with what the site uses and may use. */
export async function quotaMessage(bytes) {
  const { usage, quota } = await storageUse();
  return `the browser has no room to keep this ${mb(bytes)} model for this site (by its estimate ` +
    `${mb(usage)} used of ${mb(quota)}): it was loaded without a copy, so a reload downloads it ` +
    "again. Delete cached models to make room.";
}

/** Any other refusal to keep a copy, in plain words with the browser's own. */
export function uncachedMessage(e, bytes) {
  return `the browser would not keep a copy of this ${mb(bytes)} model (${e?.message || e}): it was ` +
    "loaded without one, so a reload downloads it again.";
}

/**
 * The URLs of a model's files: a split model's (`NAME-00001-of-0000N.gguf`, as
 * llama.cpp's llama-gguf-split names them) from its first file's URL, else the URL.
 */
export function partUrls(href) {
  const url = new URL(href);
  const m = /^(.*)-00001-of-(\d{5})\.gguf$/.exec(url.pathname);
  if (!m || Number(m[2]) < 2) return [url.href];
  return Array.from({ length: Number(m[2]) }, (_, i) => {
    const part = new URL(url);
    part.pathname = `${m[1]}-${String(i + 1).padStart(5, "0")}-of-${m[2]}.gguf`;
    return part.href;
  });
}
