// The CPU backend with its weights in JS memory (`cpuWeights: "js"`, what a model past
// wasm32's 4 GiB takes), in headless Chromium on the served model, on the device's
// threads (web/pkg-threads; the page is cross-origin isolated): it samples what the
// backend with its weights in wasm memory samples, and its wasm memory holds the
// engine and one block's matrices instead of the file. Prints one JSON line with
// both engines' wasm memory and tokens/s.
//
// usage: node js_weights.mjs BASE_URL
import { runScript } from "./page.mjs";

const [base] = process.argv.slice(2);
const out = { ok: false };

// Starts an engine with its weights in `cpuWeights`, samples two prompts × n=2
// greedily (after a one-token warm-up) and ends it; what it loaded and sampled.
const run = (page, cpuWeights) => page.evaluate(async (cpuWeights) => {
  const { AcsBrowser } = await import("/acs-client.js");
  const acs = await AcsBrowser.start({ url: "/model.gguf", backend: "cpu", cpuWeights, persist: false });
  const body = { model: "llama-8b", prompt: ["Once upon a time", "The answer is"], n: 2, max_tokens: 16, temperature: 0 };
  await acs.completions({ ...body, max_tokens: 1 });
  const started = performance.now();
  const c = await acs.completions(body);
  const seconds = (performance.now() - started) / 1000;
  const { backend, wasmMemory, bytes, threads } = acs.info;
  acs.terminate();
  return {
    backend, wasmMemory, bytes, threads,
    texts: c.choices.map((ch) => ch.text),
    tokensPerSecond: Math.round(c.usage.completion_tokens / seconds * 10) / 10,
  };
}, cpuWeights);

await runScript(async (browser) => {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.goto(`${base}/`);
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  out.wasm = await run(page, "wasm");
  out.js = await run(page, "js");
  const { wasm, js } = out;
  out.ok = out.isolated &&
    /^cpu \(\d+ threads\)$/.test(wasm.backend) &&
    /^cpu \(\d+ threads, weights in JS memory\)$/.test(js.backend) &&
    js.texts.length === 4 && JSON.stringify(js.texts) === JSON.stringify(wasm.texts) &&
    // The file is not in wasm memory: the engine and one block's matrices are.
    js.wasmMemory + js.bytes / 2 < wasm.wasmMemory;
}, out);
