// What the browser scripts share: headless Chromium (Debian's, with SwiftShader's
// WebGPU) and loading a model into the playground's in-browser engine.
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"],
  });
}

// Clicks "Load model" under "This browser" with `backend` (and `threads` for the CPU
// backend, "" for the default) and waits until the model is loaded (or refused);
// returns what the status line says and records.
export async function loadModel(page, backend, timeout = 300_000, threads = "") {
  await page.check("#mode-browser");
  await page.selectOption("#backend", backend);
  await page.fill("#threads", String(threads));
  await page.click("#load");
  await page.waitForFunction(() => {
    const s = document.querySelector("#load-status");
    return s.dataset.loadMs || /cannot/.test(s.textContent);
  }, null, { timeout });
  return page.$eval("#load-status", (s) => ({
    text: s.textContent, loadMs: Number(s.dataset.loadMs), fromCache: s.dataset.fromCache === "true",
    bytes: Number(s.dataset.bytes), wasmMemory: Number(s.dataset.wasmMemory),
    threads: Number(s.dataset.threads), sharedMemory: s.dataset.sharedMemory === "true",
  }));
}

// Runs `steps(browser)` in a fresh headless Chromium, then prints `out` as the one JSON
// line the Rust tests read (`out.error` holds what threw) and sets the exit status
// from `out.ok`, which the steps set once every check held.
export async function runScript(steps, out) {
  const browser = await launch();
  try {
    await steps(browser);
  } catch (e) {
    out.error = String(e.stack || e);
  } finally {
    console.log(JSON.stringify(out));
    if (!out.ok) process.exitCode = 1;
    await browser.close();
  }
}
