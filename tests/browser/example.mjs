// Opens the acs-web npm package's example page (example/index.html of the packed
// package, served beside node_modules/acs-web) in headless Chromium and waits for its
// four choices. Prints one JSON line with what the page showed.
//
// usage: node example.mjs BASE_URL
import { runScript } from "./page.mjs";

const [base] = process.argv.slice(2);
const out = { ok: false };
await runScript(async (browser) => {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  page.on("pageerror", (e) => console.error("page error:", e.message));
  await page.goto(`${base}/`);
  await page.waitForFunction(() => document.querySelector("#out").textContent !== "loading…", null, { timeout: 300_000 });
  out.lines = (await page.textContent("#out")).split("\n");
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  out.ok = out.lines.length === 4 && out.lines.every((l, i) => l.startsWith(`${i}: `) && l.length > 3);
}, out);
