// The playground in headless Firefox (Debian's firefox-esr, driven over WebDriver BiDi
// by puppeteer-core), as a visitor without a usable GPU meets it: the page is
// cross-origin isolated, "auto" finds no hardware GPU and loads the served model on
// the wasm CPU backend on the device's threads (web/pkg-threads), the tutorial's two
// prompts with n=2 land in index order; a model URL that is not there, and WebGPU
// asked for where there is none, get errors in plain words; engines started one after
// another on two threads all start. Saves a screenshot and prints one JSON line with
// what it saw.
//
// usage: node firefox.mjs BASE_URL SCREENSHOT.png
import puppeteer from "puppeteer-core";

const [base, shot] = process.argv.slice(2);
const RUN_TIMEOUT = 600_000;

const browser = await puppeteer.launch({
  browser: "firefox",
  executablePath: process.env.FIREFOX || "/usr/bin/firefox-esr",
  headless: true,
  // A wait for a page's state is one protocol call that lasts as long as the wait, so
  // the protocol's own limit (180 s by default) would cut every wait short of
  // RUN_TIMEOUT: the first load compiles the threaded wasm package, which took longer
  // than that on a 2-core machine running the Chromium tests beside it.
  protocolTimeout: RUN_TIMEOUT + 60_000,
});

// Clicks "Load model" with the URL in the field and waits until it is loaded or
// refused; returns the status line and what it records.
async function load(page, url, backend = "auto") {
  await page.click("#mode-browser");
  await page.select("#backend", backend);
  await page.$eval("#model-url", (e, v) => { e.value = v; }, url);
  await page.click("#load");
  try {
    await page.waitForFunction(() => {
      const s = document.querySelector("#load-status");
      return s.dataset.loadMs || /cannot/.test(s.textContent);
    }, { timeout: RUN_TIMEOUT });
  } catch (e) {
    // Where the load stood when the wait gave up: its status line names the phase.
    const status = await page.$eval("#load-status", (s) => s.textContent).catch(() => "?");
    throw new Error(`loading ${url} (${backend}) did not end; its status: ${status}`, { cause: e });
  }
  return page.$eval("#load-status", (s) => ({
    text: s.textContent, threads: Number(s.dataset.threads), sharedMemory: s.dataset.sharedMemory === "true",
  }));
}

// Engines started on two threads one after another, each ending when its model URL
// answers 404: a stall in starting the helper threads shows as a start that never
// ends (Firefox at times never returns from a `new Worker` called in a worker, about
// one start in a hundred, which is why the page starts them).
const STARTS = 60;
const START_TIMEOUT = 30_000;

// In the page: `n` engine starts; returns how long each took and which never ended.
async function startsAndEnds(n, timeoutMs) {
  const { AcsBrowser } = await import("/acs-client.js");
  const ms = [];
  const stalled = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const ended = await Promise.race([
      AcsBrowser.start({ url: "/no-such-model.gguf", threads: 2, persist: false }).then(() => true, () => true),
      new Promise((resolve) => setTimeout(() => resolve(false), timeoutMs)),
    ]);
    if (!ended) stalled.push(i);
    ms.push(Math.round(performance.now() - t));
  }
  ms.sort((a, b) => a - b);
  return { n, stalled, medianMs: ms[n >> 1], maxMs: ms[n - 1] };
}

const out = { ok: false };
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 1200 });
  // Every console line of the page and its workers, for the report when a step fails.
  out.console = [];
  page.on("console", (m) => out.console.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => out.console.push(`pageerror: ${e.message}`));
  await page.goto(`${base}/`);
  out.userAgent = await page.evaluate(() => navigator.userAgent);
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  out.gpu = await page.evaluate(async () => {
    if (!navigator.gpu) return "no navigator.gpu";
    const a = await navigator.gpu.requestAdapter().catch(() => null);
    return a ? `an adapter (fallback: ${Boolean(a.isFallbackAdapter ?? a.info?.isFallbackAdapter)})` : "no adapter";
  });
  out.missing = await load(page, "/no-such-model.gguf");
  out.noWebGpu = await load(page, "/model.gguf", "webgpu");
  out.loaded = await load(page, "/model.gguf");
  await page.$eval("#max_tokens", (e) => { e.value = "12"; });
  await page.$eval("#seed", (e) => { e.value = "7"; });
  await page.click("#run");
  await page.waitForFunction(() => /done in|\d{3} |error|Load a model/.test(document.querySelector("#run-status").textContent),
    { timeout: RUN_TIMEOUT });
  out.run = await page.$eval("#run-status", (e) => e.textContent);
  out.cells = await page.$$eval(".choice", (els) =>
    els.map((e) => ({ index: Number(e.dataset.index), text: e.textContent, finish: e.dataset.finish })));
  await page.screenshot({ path: shot, fullPage: true });
  out.starts = await page.evaluate(startsAndEnds, STARTS, START_TIMEOUT);
  out.ok = out.isolated && /cannot load the model: .*HTTP 404/.test(out.missing.text) &&
    /cannot load the model: this browser offers no WebGPU adapter .*"auto" or "cpu" to run on the CPU/.test(out.noWebGpu.text) &&
    /· cpu \(\d+ threads\) ·/.test(out.loaded.text) && out.loaded.sharedMemory && out.loaded.threads > 1 &&
    /done in/.test(out.run) && out.cells.length === 4 &&
    out.cells.every((c, i) => c.index === i && c.text.length > 0 && c.finish) &&
    out.starts.stalled.length === 0;
} catch (e) {
  out.error = String(e.stack || e) + (e.cause ? `\ncaused by: ${e.cause.stack || e.cause}` : "");
} finally {
  if (out.ok) delete out.console;
  console.log(JSON.stringify(out));
  if (!out.ok) process.exitCode = 1;
  await browser.close();
}
