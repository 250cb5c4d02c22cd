// One engine for the pages of an origin (`AcsBrowser.start({ shared: true })`), in
// headless Chromium: the first page loads the served model into a SharedWorker; a
// second page that starts with the same model joins that engine at once (no second
// load) and sees the first page's job, since the engine, its store and its Budget
// are one; both pages' completions run side by side; after the first page closes, the
// second still samples. A page that starts with another backend gets an engine of its
// own. Prints one JSON line.
//
// usage: node shared.mjs BASE_URL
import { runScript } from "./page.mjs";

const [base] = process.argv.slice(2);
const out = { ok: false };

// Starts a shared engine in `page` (window.shared) and returns its load info.
async function start(page, backend = "cpu") {
  return page.evaluate(async (backend) => {
    const { AcsBrowser } = await import("/acs-client.js");
    window.shared = await AcsBrowser.start({ url: "/model.gguf", backend, shared: true, persist: false });
    const { type, backend: b, loadMs, shared, attached, threads } = window.shared.info;
    return { type, backend: b, loadMs, shared, attached: Boolean(attached), threads };
  }, backend);
}

const sample = (page, prompt) => page.evaluate(async (prompt) => {
  const c = await window.shared.completions({ model: "llama-8b", prompt, max_tokens: 6, temperature: 0 });
  return c.choices[0].text;
}, prompt);

await runScript(async (browser) => {
  const context = await browser.newContext();
  const a = await context.newPage();
  const b = await context.newPage();
  for (const p of [a, b]) p.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await a.goto(`${base}/`);
  await b.goto(`${base}/`);
  out.a = await start(a);
  out.b = await start(b);

  // A job made in one page is the other's too.
  const job = await a.evaluate(async () =>
    (await window.shared.createJob({ model: "llama-8b", prompt: "Once upon a time", max_tokens: 4 })).job);
  out.jobSeenByB = await b.evaluate(async (id) => {
    for (let i = 0; i < 600; i++) {
      const j = await window.shared.job(id);
      if (j.status === "succeeded") return { status: j.status, choices: (await window.shared.jobResult(id)).choices.length };
      await new Promise((r) => setTimeout(r, 100));
    }
    return "not finished";
  }, job.id);

  // Both pages at once.
  const [ta, tb] = await Promise.all([sample(a, "The sky is"), sample(b, "The sky is")]);
  out.sideBySide = [ta, tb];
  await a.close();
  out.afterClose = await sample(b, "The sky is");

  // Another backend: an engine of its own.
  const c = await context.newPage();
  await c.goto(`${base}/`);
  out.c = await start(c, "auto");

  out.ok = out.a.shared && !out.a.attached && out.b.shared && out.b.attached &&
    out.b.loadMs === out.a.loadMs && out.jobSeenByB?.status === "succeeded" && out.jobSeenByB.choices === 1 &&
    ta.length > 0 && ta === tb && out.afterClose === ta && out.c.shared && !out.c.attached;
}, out);
