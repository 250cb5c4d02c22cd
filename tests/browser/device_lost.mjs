// A GPU device lost mid-session, in the playground in headless Chromium (SwiftShader's
// WebGPU): the page loads the served model on WebGPU and samples; then the engine's
// device is destroyed (as a driver reset or a crashed GPU process loses it). A request
// meanwhile must fail with 503 `gpu_device_lost` in plain words, the model must load
// again on the CPU by itself, the status line must say so, and the page must then
// sample the two prompts' four choices. Saves a screenshot; prints one JSON line.
//
// The device is destroyed by a test wrapper of acs-worker.js, served in its place by
// the browser's request routing (the real worker loads under another URL): it keeps
// each GPU device the engine opens and destroys them when the page asks for the
// engine's stats.
//
// usage: node device_lost.mjs BASE_URL SCREENSHOT.png
import { loadModel, runScript } from "./page.mjs";

const [base, shot] = process.argv.slice(2);
const WRAPPER = `
import "/acs-worker.js?engine";
const devices = [];
const request = GPUAdapter.prototype.requestDevice;
GPUAdapter.prototype.requestDevice = async function (...args) {
  const device = await request.apply(this, args);
  devices.push(device);
  return device;
};
self.addEventListener("message", (ev) => {
  if (ev.data?.type === "call" && ev.data.method === "stats") devices.forEach((d) => d.destroy());
});
`;

// Samples the playground's two prompts with n = 2 through its UI.
async function sample(page) {
  await page.fill("#max_tokens", "4");
  await page.fill("#seed", "1");
  await page.click("#run");
  await page.waitForFunction(() => /done in|\d{3} |error|Load a model/.test(document.querySelector("#run-status").textContent),
    null, { timeout: 300_000 });
  return page.$$eval(".choice", (els) => els.map((e) => e.textContent));
}

const out = { ok: false };
await runScript(async (browser) => {
  const page = await browser.newPage({ viewport: { width: 1100, height: 1000 } });
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.route("**/acs-worker.js", (route) => route.fulfill({
    body: WRAPPER,
    contentType: "text/javascript",
    headers: { "cross-origin-embedder-policy": "require-corp", "cross-origin-opener-policy": "same-origin" },
  }));
  await page.goto(`${base}/`);
  out.before = { load: (await loadModel(page, "webgpu")).text, texts: await sample(page) };
  out.during = await page.evaluate(async () => {
    await window.acs.stats();
    try {
      await window.acs.completions({ model: "llama-8b", prompt: "The sky is", max_tokens: 4 });
      return "answered";
    } catch (e) {
      return { status: e.status, code: e.body?.error?.code, message: e.message };
    }
  });
  await page.waitForFunction(() => {
    const s = document.querySelector("#load-status");
    return s.dataset.loadMs || /failed/.test(s.textContent);
  }, null, { timeout: 300_000 });
  out.after = {
    load: await page.textContent("#load-status"),
    lost: await page.$eval("#load-status", (s) => s.dataset.lost),
    texts: await sample(page),
  };
  await page.screenshot({ path: shot, fullPage: true });
  out.ok = /· webgpu/.test(out.before.load) && out.before.texts.length === 4 &&
    out.during.status === 503 && out.during.code === "gpu_device_lost" && /GPU device was lost/.test(out.during.message) &&
    /destroy/i.test(out.after.lost) && /^the GPU was lost \(.*destroy.*\); loaded .* · cpu/i.test(out.after.load) &&
    out.after.texts.length === 4 && out.after.texts.every((t) => t.length > 0);
}, out);
