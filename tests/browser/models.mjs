// The models a visitor keeps, in the playground in headless Chromium: the served
// model's header is read and shown before the download and before a copy loads (family, shape, weight formats,
// the weights' bytes); the model is downloaded once into the Cache API and listed with
// its size; a second load reads
// the copy; a new file at the same URL (the server's validators changed, here by the
// browser's request routing) is downloaded again, and that copy is read while the file
// stays the same; a deleted copy is gone from the list and the next load downloads; with the
// site's quota too small for the model (Chromium's quota override), the model still
// loads, without a copy, and the status line says why in plain words; the URL is
// offered among the recent ones. Saves a screenshot; prints one JSON line.
//
// usage: node models.mjs BASE_URL SCREENSHOT.png
import { loadModel, runScript } from "./page.mjs";

const [base, shot] = process.argv.slice(2);
const out = { ok: false, loads: [] };

const cached = (page) => page.$$eval("#cached tbody tr", (trs) =>
  trs.map((tr) => ({ url: tr.dataset.url, cells: [...tr.cells].map((td) => td.textContent) })));

async function load(page, label) {
  const l = await loadModel(page, "cpu");
  // The cache's list is redrawn after the load.
  await page.waitForTimeout(300);
  const [uncached, header] = await page.$eval("#load-status", (s) => [s.dataset.uncached, s.dataset.header ?? null]);
  out.loads.push({ label, fromCache: l.fromCache, uncached, header: header && JSON.parse(header),
                   text: l.text, cached: await cached(page) });
  return out.loads.at(-1);
}

await runScript(async (browser) => {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.goto(`${base}/`);
  const size = Number((await (await fetch(`${base}/model.gguf`, { method: "HEAD" })).headers.get("content-length")));
  const first = await load(page, "first");
  const second = await load(page, "second");
  // A new file at the same URL: the server's validators, as its HEAD answers them,
  // change (the body itself passes through).
  await page.route("**/model.gguf", async (route) => {
    if (route.request().method() !== "HEAD") return route.continue();
    const resp = await route.fetch();
    await route.fulfill({ response: resp, headers: { ...resp.headers(), etag: '"v2"', "last-modified": "Wed, 01 Jan 2031 00:00:00 GMT" } });
  });
  const changed = await load(page, "the server's file changed");
  await page.unroute("**/model.gguf");
  const same = await load(page, "the server's file as downloaded");
  // Delete the copy from the list.
  await page.click(`#cached tbody tr button`);
  await page.waitForFunction(() => document.querySelectorAll("#cached tbody tr").length === 0);
  const afterDelete = await load(page, "after delete");
  // A quota too small for the model.
  await page.click(`#cached tbody tr button`);
  await page.waitForFunction(() => document.querySelectorAll("#cached tbody tr").length === 0);
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Storage.overrideQuotaForOrigin", { origin: base, quotaSize: 20e6 });
  const full = await load(page, "quota of 20 MB");
  await cdp.send("Storage.overrideQuotaForOrigin", { origin: base });
  out.recent = await page.$$eval("#recent-models option", (os) => os.map((o) => o.value));
  out.storage = await page.textContent("#storage");
  await page.screenshot({ path: shot, fullPage: true });
  const listed = (l) => l.cached.length === 1 && l.cached[0].url === `${base}/model.gguf` &&
    l.cached[0].cells[1] === `${(size / 1e6).toFixed(1)} MB`;
  // The header, read before the first download: the default model's shape and formats,
  // its weights most of the file.
  const h = first.header;
  out.ok = size > 0 && h?.family === "llama" && h.n_layers === 30 && h.d_model === 576 && h.formats.Q4_1 > 0 &&
    h.weight_bytes > 0.9 * size && h.weight_bytes < size && h.parts === 1 && second.header?.n_layers === 30 &&
    h.largest_tensor_bytes > 0 && h.largest_tensor_bytes < h.weight_bytes / 2 &&
    !first.fromCache && listed(first) && second.fromCache && listed(second) &&
    !changed.fromCache && changed.header !== null && listed(changed) && same.fromCache && listed(same) &&
    !afterDelete.fromCache && listed(afterDelete) &&
    !full.fromCache && full.uncached === "true" && full.cached.length === 0 &&
    /not kept: the browser has no room to keep this [\d.]+ MB model for this site .* Delete cached models to make room/.test(full.text) &&
    /· cpu/.test(full.text) && out.recent.includes("/model.gguf") && /this site stores/.test(out.storage);
}, out);
