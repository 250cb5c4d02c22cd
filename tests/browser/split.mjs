// A split model and a download that breaks off, in the playground in headless
// Chromium. `acs serve` serves the default model split in three files
// (model-0000k-of-00003.gguf), and its /model.gguf leads to the first. A file server
// of the script's own (Node's http, another origin, with CORS and Range requests)
// serves the same three files and the one-file model (whole.gguf), and cuts the
// connection halfway through the second file's first download. The page loads the
// one-file model, then the split model from each server: every file's header is read
// first, the files download in turn, the broken one resumes from where it stopped (a
// Range request with If-Range), and each samples what the one-file model samples. A
// reload reads the files from the Cache API; the three picked as files sample the
// same; two of the three are refused in plain words. Prints one JSON line.
//
// usage: node split.mjs BASE_URL DIR SCREENSHOT.png (DIR holds the files)
import { createServer } from "node:http";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { loadModel, runScript } from "./page.mjs";

const [base, dir, shot] = process.argv.slice(2);
const names = readdirSync(dir).filter((n) => /-of-\d{5}\.gguf$/.test(n)).sort();
const files = new Map([...names, "whole.gguf"].map((n) => [`/${n}`, readFileSync(join(dir, n))]));
const requests = [];
let cut = false;

const server = createServer((req, res) => {
  const body = files.get(req.url);
  requests.push({ method: req.method, url: req.url, range: req.headers.range ?? null, ifRange: req.headers["if-range"] ?? null });
  res.setHeader("access-control-allow-origin", "*");
  res.setHeader("access-control-expose-headers", "content-range, content-length, etag");
  res.setHeader("cross-origin-resource-policy", "cross-origin");
  if (req.method === "OPTIONS") {
    res.setHeader("access-control-allow-headers", "range, if-range");
    return res.writeHead(204).end();
  }
  if (!body) return res.writeHead(404).end();
  const etag = `"${req.url}-${body.length}"`;
  res.setHeader("etag", etag);
  res.setHeader("accept-ranges", "bytes");
  const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? "");
  const fresh = !req.headers["if-range"] || req.headers["if-range"] === etag;
  if (range && fresh) {
    const start = Number(range[1]);
    const end = range[2] ? Math.min(Number(range[2]), body.length - 1) : body.length - 1;
    res.writeHead(206, { "content-range": `bytes ${start}-${end}/${body.length}`, "content-length": end - start + 1 });
    return res.end(req.method === "HEAD" ? undefined : body.subarray(start, end + 1));
  }
  res.writeHead(200, { "content-length": body.length });
  if (req.method === "HEAD") return res.end();
  // The second file's first whole download breaks off halfway.
  if (req.url === `/${names[1]}` && !cut) {
    cut = true;
    res.write(body.subarray(0, body.length >> 1));
    return setTimeout(() => res.socket.destroy(), 200);
  }
  res.end(body);
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const origin = `http://127.0.0.1:${server.address().port}`;

const out = { ok: false, parts: names };
const prompt = { model: "llama-8b", prompt: "The capital of France is", max_tokens: 8, temperature: 0 };
const sample = (page) => page.evaluate(async (p) => (await window.acs.completions(p)).choices[0].text, prompt);

async function loadUrl(page, url) {
  await page.fill("#model-url", url);
  const l = await loadModel(page, "cpu");
  const [header, uncached] = await page.$eval("#load-status", (s) => [JSON.parse(s.dataset.header ?? "null"), s.dataset.uncached]);
  return { ...l, header, uncached, text: l.text };
}

await runScript(async (browser) => {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.goto(`${base}/`);
  await loadUrl(page, `${origin}/whole.gguf`);
  const expect = await sample(page);
  const served = await loadUrl(page, "/model.gguf");
  out.served = { text: served.text, parts: served.header?.parts, sample: await sample(page) };

  const first = await loadUrl(page, `${origin}/${names[0]}`);
  out.first = { ...first, sample: await sample(page), resumes: await page.evaluate(() => window.acs.info.resumes),
                parts: await page.evaluate(() => window.acs.info.parts) };
  const resumed = requests.find((r) => r.url === `/${names[1]}` && r.range && !r.range.startsWith("bytes=0-"));
  out.resumedWith = resumed;

  const again = await loadUrl(page, `${origin}/${names[0]}`);
  out.again = { fromCache: again.fromCache, sample: await sample(page), text: again.text };
  out.cached = await page.$$eval("#cached tbody tr", (trs) => trs.map((tr) => tr.dataset.url));

  await page.setInputFiles("#model-file", names.map((n) => join(dir, n)));
  const picked = await loadModel(page, "cpu");
  out.picked = { text: picked.text, sample: await sample(page) };
  await page.setInputFiles("#model-file", names.slice(0, 2).map((n) => join(dir, n)));
  out.short = (await loadModel(page, "cpu")).text;
  await page.screenshot({ path: shot, fullPage: true });

  const h = first.header;
  out.expect = expect;
  const sizes = names.reduce((n, name) => n + files.get(`/${name}`).length, 0);
  out.ok = names.length === 3 && out.served.parts === 3 && out.served.sample === expect && served.bytes === sizes &&
    h?.parts === 3 && h.n_layers === 30 && first.bytes === sizes &&
    !first.fromCache && out.first.parts === 3 && out.first.resumes >= 1 &&
    resumed?.ifRange?.startsWith('"') && Number(/bytes=(\d+)-/.exec(resumed.range)[1]) > 0 &&
    out.first.sample === expect && expect.length > 0 &&
    again.fromCache && out.again.sample === expect &&
    names.every((n) => out.cached.includes(`${origin}/${n}`)) &&
    picked.text.includes(names.join(", ")) && out.picked.sample === expect &&
    /cannot load the model: .*2 of the model's 3 parts were given/.test(out.short);
}, out);
server.close();
