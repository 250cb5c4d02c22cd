// Measures the in-browser engine in headless Chromium: model load time (network and
// cache) and decode tokens/s on each backend, through the playground page that
// `acs serve` serves. Prints one JSON line per backend.
//
// usage: node bench.mjs BASE_URL [max_tokens] [backends]
//   backends: comma-separated, "webgpu,cpu" by default; "cpu:N" runs the CPU
//   backend on N threads (the page must be cross-origin isolated for N > 1, as
//   `acs serve` serves it)
//   (acs serve must be running; no key needed: everything runs in the page)
import { launch, loadModel } from "./page.mjs";

const [base, maxTokens = "16", backends = "webgpu,cpu"] = process.argv.slice(2);
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(`${base}/`);
  for (const spec of backends.split(",")) {
    const [backend, threads = ""] = spec.split(":");
    const { text, loadMs } = await loadModel(page, backend, undefined, threads);
    const load = { text, ms: loadMs };
    const runs = await page.evaluate(async (max) => {
      const out = [];
      for (const n of [1, 4]) {
        const t0 = performance.now();
        const c = await window.acs.completions({ model: "llama-8b", prompt: "The sky is", n, max_tokens: max,
                                                 temperature: 1, seed: 1 });
        const s = (performance.now() - t0) / 1000;
        out.push({ n, completion_tokens: c.usage.completion_tokens, seconds: Number(s.toFixed(2)),
                   tokens_per_s: Number((c.usage.completion_tokens / s).toFixed(2)) });
      }
      return out;
    }, Number(maxTokens));
    console.log(JSON.stringify({ backend: spec, load, runs }));
  }
} finally {
  await browser.close();
}
