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
  out.text = await page.textContent("#out");
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  // The four choices in index order, one a line; a sampled text may hold line breaks
  // of its own, so the lines are found by their index prefixes.
  out.ok = /^0: [\s\S]+\n1: [\s\S]+\n2: [\s\S]+\n3: [\s\S]+$/.test(out.text);
}, out);
