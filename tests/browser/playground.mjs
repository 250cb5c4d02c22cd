// Drives the playground served by `acs serve` in headless Chromium (SwiftShader's
// WebGPU):
//  1. "This browser": loads the served model (/model.gguf) into the page's Web Worker,
//     samples the tutorial's two prompts with n=2 and checks the four choices land in
//     index order; the openai JS SDK (npm `openai`), loaded into the page, runs against
//     the engine through the package's `fetch`; a job is submitted and the page
//     reloaded at once: the model then comes from the Cache API and the job (kept in
//     IndexedDB) runs to `succeeded`; its result and the activations picture are shown;
//  2. "Remote ACS": the same request to the server with a key gets the same shapes; the
//     model picker lists the server's models; chat mode samples three replies to one
//     conversation side by side and continues the first as its own conversation;
//  3. a model file picked from disk loads too (never through the cache), with backend
//     "auto": SwiftShader is a software adapter, so the wasm CPU backend;
//  4. the page is cross-origin isolated, so the CPU backend runs on two threads
//     (web/pkg-threads, helper workers over shared memory) and samples the same
//     choices as on one (web/pkg).
// Saves a screenshot and prints one JSON line with what it saw and measured.
//
// usage: node playground.mjs BASE_URL API_KEY SCREENSHOT.png MODEL.gguf
import { fileURLToPath } from "node:url";
import { loadModel, runScript } from "./page.mjs";

const openaiDir = fileURLToPath(new URL("./node_modules/openai/", import.meta.url));

const [base, key, shot, modelFile] = process.argv.slice(2);
const RUN_TIMEOUT = 600_000;

async function sample(page) {
  await page.fill("#max_tokens", "12");
  await page.fill("#seed", "7");
  await page.click("#run");
  await page.waitForFunction(() => /done in|\d{3} |error|Load a model/.test(document.querySelector("#run-status").textContent),
    null, { timeout: RUN_TIMEOUT });
  const cells = await page.$$eval(".choice", (els) =>
    els.map((e) => ({ index: Number(e.dataset.index), text: e.textContent, finish: e.dataset.finish })));
  return { status: await page.textContent("#run-status"), usage: await page.textContent("#usage"), cells };
}

const fourInOrder = (r) => r.cells.length === 4 && r.cells.every((c, i) => c.index === i && c.text.length > 0 && c.finish);

const out = { ok: false };
await runScript(async (browser) => {
  const page = await browser.newPage({ viewport: { width: 1100, height: 1300 } });
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.goto(`${base}/`);
  out.first = await loadModel(page, "webgpu");
  out.browser = await sample(page);
  // The openai JS SDK in the page, unchanged but for its `fetch` option.
  await page.route("**/vendor/openai/**", (route) => route.fulfill({
    path: openaiDir + new URL(route.request().url()).pathname.replace(/^\/vendor\/openai\//, ""),
    contentType: "text/javascript",
  }));
  out.openai = await page.evaluate(async () => {
    const { default: OpenAI } = await import("/vendor/openai/index.mjs");
    const client = new OpenAI({ apiKey: "in-browser", baseURL: `${location.origin}/v1`,
                                fetch: window.acs.fetch, dangerouslyAllowBrowser: true });
    const { data: c, response } = await client.completions
      .create({ model: "llama-8b", prompt: ["The sky is", "The grass is"], n: 2, max_tokens: 3 })
      .withResponse();
    const traffic = ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-budget-remaining-tokens"]
      .map((h) => response.headers.get(h));
    const stream = await client.completions.create({ model: "llama-8b", prompt: "Hello", max_tokens: 3, stream: true });
    let text = "";
    for await (const chunk of stream) text += chunk.choices.map((x) => x.text).join("");
    let status = 0;
    try { await client.completions.create({ model: "nope", prompt: "x" }); } catch (e) { status = e.status; }
    // Chat: four replies to one conversation, whole and streamed, the same with a seed.
    const messages = [{ role: "user", content: "Name a colour." }];
    const chat = await client.chat.completions.create({ model: "llama-8b", messages, n: 4, max_completion_tokens: 4, seed: 5 });
    const chatStream = await client.chat.completions.create({ model: "llama-8b", messages, n: 4, max_completion_tokens: 4, seed: 5, stream: true });
    const chatStreamed = ["", "", "", ""];
    const roles = [];
    for await (const chunk of chatStream) {
      for (const ch of chunk.choices) {
        if (ch.delta.role) roles[ch.index] = ch.delta.role;
        chatStreamed[ch.index] += ch.delta.content ?? "";
      }
    }
    return { indexes: c.choices.map((x) => x.index), usage: c.usage, streamed: text, notFound: status, traffic,
             chat: { object: chat.object, indexes: chat.choices.map((x) => x.index),
                     texts: chat.choices.map((x) => x.message.content), streamed: chatStreamed, roles } };
  });
  // A job, then a reload before it can finish: IndexedDB brings it back.
  await page.click("#submit-job");
  await page.waitForFunction(() => /job .* (queued|running|succeeded)/.test(document.querySelector("#run-status").textContent));
  const jobId = (await page.textContent("#run-status")).split(" ")[1];
  await page.reload();
  out.reloaded = await loadModel(page, "webgpu");
  await page.waitForFunction((id) => [...document.querySelectorAll("#jobs tbody tr")]
    .some((tr) => tr.firstChild.textContent === id && tr.dataset.status === "succeeded"), jobId, { timeout: RUN_TIMEOUT });
  out.job = { id: jobId, status: "succeeded" };
  // Its result into the grid, and the activations picture of the first prompt.
  await page.click(`#jobs tbody tr:has-text("${jobId}") button`);
  await page.waitForFunction(() => document.querySelectorAll(".choice").length === 4 &&
    [...document.querySelectorAll(".choice")].every((c) => c.textContent.length > 0));
  await page.click("#activations");
  await page.waitForFunction(() => /blocks ×|job|rror/.test(document.querySelector("#heatmap-status").textContent),
    null, { timeout: RUN_TIMEOUT });
  out.activations = await page.textContent("#heatmap-status");
  await page.screenshot({ path: shot, fullPage: true });
  // The same page against the remote endpoint.
  await page.check("#mode-remote");
  await page.fill("#base", `${base}/v1`);
  await page.fill("#key", key);
  await page.click("#check");
  await page.waitForFunction(() => /layers/.test(document.querySelector("#endpoint-status").textContent));
  out.remote = await sample(page);
  out.models = await page.$$eval("#model option", (os) => os.map((o) => o.value));
  // Chat mode against the server: n replies side by side, then one conversation goes on.
  await page.check("#kind-chat");
  await page.fill("#n", "3");
  await page.fill("#max_tokens", "8");
  await page.click("#run");
  await page.waitForFunction(() => /done in|rror|\d{3} /.test(document.querySelector("#run-status").textContent),
    null, { timeout: RUN_TIMEOUT });
  const roles = () => page.$$eval(".conversation", (cols) =>
    cols.map((c) => [...c.querySelectorAll(".msg")].map((m) => m.dataset.role + (m.textContent ? "" : "(empty)"))));
  out.chat = { status: await page.textContent("#run-status"), first: await roles() };
  await page.fill('.conversation[data-index="0"] .reply input', "Why?");
  await page.press('.conversation[data-index="0"] .reply input', "Enter");
  await page.waitForFunction(() => document.querySelectorAll('.conversation[data-index="0"] .msg.assistant[data-finish]').length === 2,
    null, { timeout: RUN_TIMEOUT });
  out.chat.continued = await roles();
  await page.screenshot({ path: shot.replace(/\.png$/, "-chat.png"), fullPage: true });
  await page.check("#kind-completions");
  // A file the user picks.
  await page.setInputFiles("#model-file", modelFile);
  out.picked = await loadModel(page, "auto");
  // The CPU backend on two threads (web/pkg-threads: `acs serve` makes the page
  // cross-origin isolated) samples what it samples on one (web/pkg).
  await page.setInputFiles("#model-file", []);
  out.isolated = await page.evaluate(() => self.crossOriginIsolated);
  const seeded = () => page.evaluate(async () => {
    const c = await window.acs.completions({ model: "llama-8b", prompt: ["The sky is", "Once upon a time"], n: 2,
                                             max_tokens: 12, temperature: 1, seed: 3 });
    return c.choices.map((x) => x.text);
  });
  const one = await loadModel(page, "cpu", undefined, 1);
  const oneTexts = await seeded();
  const two = await loadModel(page, "cpu", undefined, 2);
  const twoTexts = await seeded();
  out.threads = { one: [one.threads, one.sharedMemory, one.text], two: [two.threads, two.sharedMemory, two.text],
                  texts: twoTexts, same: oneTexts.join("\u0000") === twoTexts.join("\u0000") };
  const o = out.openai;
  // On WebGPU the weights stream to the device: the file is never whole in wasm memory.
  const lean = (l) => !/webgpu/.test(l.text) || l.wasmMemory < l.bytes / 2;
  out.ok = lean(out.first) && lean(out.reloaded) && lean(out.picked) &&
    /from .*\.gguf.* · cpu( \(\d+ threads\))? ·/.test(out.picked.text) &&
    out.isolated && out.threads.one.slice(0, 2).join() === "1,false" && out.threads.two.slice(0, 2).join() === "2,true" &&
    out.threads.same && out.threads.texts.length === 4 && out.threads.texts.every((t) => t.length > 0) && o.indexes.join() === "0,1,2,3" && o.usage.total_tokens === o.usage.prompt_tokens + o.usage.completion_tokens &&
    o.streamed.length > 0 && o.notFound === 404 && o.traffic.every((v) => /^\d+$/.test(v ?? "")) &&
    o.chat.object === "chat.completion" && o.chat.indexes.join() === "0,1,2,3" &&
    o.chat.texts.join("\u0000") === o.chat.streamed.join("\u0000") && o.chat.roles.join() === "assistant,assistant,assistant,assistant" &&
    !out.first.fromCache && out.reloaded.fromCache && fourInOrder(out.browser) &&
    fourInOrder(out.remote) && /^30 blocks × \d+ positions/.test(out.activations) &&
    out.models.includes("llama-8b") && out.models.includes("SmolLM2-135M-Instruct") &&
    /done in/.test(out.chat.status) && out.chat.first.length === 3 &&
    out.chat.first.every((c) => c.join() === "system,user,assistant") &&
    out.chat.continued[0].join() === "system,user,assistant,user,assistant" &&
    out.chat.continued[1].join() === "system,user,assistant";
}, out);
