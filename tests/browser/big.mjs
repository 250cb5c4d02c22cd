// A model past what wasm32 addresses (a generated file over 4 GiB), picked as a file in
// headless Chromium and loaded twice: on WebGPU (SwiftShader), where its tensors stream
// to the device and wasm memory holds the engine alone, and on the CPU backend, which
// keeps it in JS memory and stages a block at a time into wasm memory. Both sample the
// same greedy tokens. Prints one JSON line.
//
// usage: node big.mjs BASE_URL MODEL.gguf
import { runScript } from "./page.mjs";

const [base, model] = process.argv.slice(2);
const out = { ok: false };

// Loads the picked file on `backend`, samples greedily and ends the engine.
const run = (page, backend) => page.evaluate(async (backend) => {
  const { AcsBrowser } = await import("/acs-client.js");
  const file = document.querySelector("#big-model").files[0];
  const acs = await AcsBrowser.start({ file, backend, threads: 2, persist: false });
  const started = performance.now();
  const c = await acs.completions({ model: "llama-8b", prompt: "Once upon a", max_tokens: 2, temperature: 0 });
  const sampleMs = Math.round(performance.now() - started);
  const { backend: b, wasmMemory, bytes, loadMs } = acs.info;
  acs.terminate();
  return { backend: b, wasmMemory, bytes, loadMs: Math.round(loadMs), sampleMs, texts: c.choices.map((ch) => ch.text) };
}, backend);

await runScript(async (browser) => {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.goto(`${base}/`);
  await page.evaluate(() => {
    const input = Object.assign(document.createElement("input"), { type: "file", id: "big-model" });
    document.body.append(input);
  });
  await page.setInputFiles("#big-model", model);
  out.webgpu = await run(page, "webgpu");
  out.cpu = await run(page, "cpu");
  const { webgpu, cpu } = out;
  out.ok = webgpu.bytes > 2 ** 32 && /^webgpu: /.test(webgpu.backend) &&
    /weights in JS memory/.test(cpu.backend) &&
    // Neither holds the file in wasm memory: WebGPU the engine, the CPU one block more.
    webgpu.wasmMemory < 2 ** 28 && cpu.wasmMemory < 2 ** 30 &&
    cpu.texts.length === 1 && cpu.texts[0].length > 0 &&
    JSON.stringify(cpu.texts) === JSON.stringify(webgpu.texts);
}, out);
