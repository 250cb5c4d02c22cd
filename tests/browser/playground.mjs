// Drives the playground served by `acs serve` in headless Chromium: enters the key,
// samples the tutorial's two prompts with n=2, checks the four choices land in index
// order, and saves a screenshot.
//
// usage: node playground.mjs BASE_URL API_KEY SCREENSHOT.png
import { chromium } from "playwright-core";

const [base, key, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
  await page.goto(`${base}/`);
  await page.fill("#key", key);
  await page.click("#check");
  await page.waitForFunction(() => /layers/.test(document.querySelector("#endpoint-status").textContent));
  await page.fill("#max_tokens", "12");
  await page.fill("#seed", "7");
  await page.click("#run");
  await page.waitForFunction(() => /done in/.test(document.querySelector("#run-status").textContent),
    null, { timeout: 60_000 });
  const cells = await page.$$eval(".choice", (els) =>
    els.map((e) => ({ index: Number(e.dataset.index), text: e.textContent, finish: e.dataset.finish })));
  const usage = await page.textContent("#usage");
  await page.screenshot({ path: shot, fullPage: true });
  const ok = cells.length === 4 && cells.every((c, i) => c.index === i && c.text.length > 0 && c.finish);
  console.log(JSON.stringify({ ok, cells, usage }));
  if (!ok) process.exitCode = 1;
} finally {
  await browser.close();
}
