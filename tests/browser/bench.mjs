// Measures the in-browser engine in headless Chromium: model load time (network and
// cache) and decode tokens/s on each backend, through the playground page that
// `acs serve` serves. Prints one JSON line per backend.
//
// usage: node bench.mjs BASE_URL [max_tokens] [backends]
//   backends: comma-separated, "webgpu,cpu" by default; "cpu:N" runs the CPU
//   backend on N threads (the page must be cross-origin isolated for N > 1, as
//   `acs serve` serves it)
//   (acs serve must be running; no key needed: everything runs in the page)
//   ACS_BENCH_MODEL_URL: another model URL than the served /model.gguf (a file
//   beside the playground under `acs serve --web DIR`); ACS_BENCH_N: the n of each
//   run, "1,4" by default.
import { launch, loadModel } from "./page.mjs";

const [base, maxTokens = "16", backends = "webgpu,cpu"] = process.argv.slice(2);
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(`${base}/`);
  if (process.env.ACS_BENCH_MODEL_URL) await page.fill("#model-url", process.env.ACS_BENCH_MODEL_URL);
  const ns = (process.env.ACS_BENCH_N || "1,4").split(",").map(Number);
  for (const spec of backends.split(",")) {
    const [backend, threads = ""] = spec.split(":");
    const { text, loadMs } = await loadModel(page, backend, 3_600_000, threads);
    const load = { text, ms: loadMs };
    const runs = await page.evaluate(async ([max, ns]) => {
      const out = [];
      for (const n of ns) {
        const t0 = performance.now();
        const c = await window.acs.completions({ model: "llama-8b", prompt: "The sky is", n, max_tokens: max,
                                                 temperature: 1, seed: 1 });
        const s = (performance.now() - t0) / 1000;
        out.push({ n, completion_tokens: c.usage.completion_tokens, seconds: Number(s.toFixed(2)),
                   tokens_per_s: Number((c.usage.completion_tokens / s).toFixed(2)) });
      }
      return out;
    }, [Number(maxTokens), ns]);
    console.log(JSON.stringify({ backend: spec, load, runs }));
  }
} finally {
  await browser.close();
}
