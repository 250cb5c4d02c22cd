// The playground talks to an ACS endpoint (the `acs` server that serves this page, or
// any other base URL with a key) with the contract's own requests, streamed over SSE.

const $ = (id) => document.getElementById(id);

for (const id of ["base", "key"]) {
  const saved = localStorage.getItem(`acs.${id}`);
  if (saved) $(id).value = saved;
  $(id).addEventListener("change", () => localStorage.setItem(`acs.${id}`, $(id).value));
}

function headers() {
  return { "Content-Type": "application/json", Authorization: `Bearer ${$("key").value.trim()}` };
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    return `${resp.status} ${body.error.code}: ${body.error.message}`;
  } catch {
    return `${resp.status} ${resp.statusText}`;
  }
}

$("check").addEventListener("click", async () => {
  const status = $("endpoint-status");
  status.textContent = "…";
  try {
    const [models, budget] = await Promise.all([
      fetch(`${$("base").value}/models`),
      fetch(`${$("base").value}/budget`, { headers: headers() }),
    ]);
    if (!models.ok) throw new Error(await errorText(models));
    const m = (await models.json()).data;
    const b = budget.ok ? await budget.json() : null;
    status.textContent =
      `${m.map((x) => x.id).join(", ")} · ${m[0].n_layers} layers · d_model ${m[0].d_model}` +
      (b ? ` · ${b.tokens_left} tokens left` : ` · key: ${await errorText(budget)}`);
  } catch (e) {
    status.textContent = String(e.message || e);
  }
});

function buildGrid(prompts, n) {
  const grid = $("grid");
  grid.replaceChildren();
  grid.style.gridTemplateColumns = `minmax(8rem, auto) repeat(${n}, 1fr)`;
  const cells = [];
  prompts.forEach((p, pi) => {
    const head = document.createElement("div");
    head.className = "prompt";
    head.textContent = p;
    grid.append(head);
    for (let i = 0; i < n; i++) {
      const cell = document.createElement("div");
      cell.className = "choice";
      cell.dataset.index = String(pi * n + i);
      cell.title = `choice ${i} of prompt ${pi} (index ${pi * n + i})`;
      grid.append(cell);
      cells.push(cell);
    }
  });
  return cells;
}

$("request").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const prompts = $("prompts").value.split("\n").filter((l) => l.length > 0);
  const n = Number($("n").value);
  const body = {
    model: $("model").value,
    prompt: prompts,
    n,
    max_tokens: Number($("max_tokens").value),
    temperature: Number($("temperature").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const cells = buildGrid(prompts, n);
  const status = $("run-status");
  $("usage").textContent = "";
  status.textContent = "sampling…";
  const started = performance.now();
  try {
    const resp = await fetch(`${$("base").value}/completions`, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let usage = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.replace(/^data: /, "");
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(`${chunk.error.code}: ${chunk.error.message}`);
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
          const cell = cells[c.index];
          cell.textContent += c.text;
          if (c.finish_reason) cell.dataset.finish = c.finish_reason;
        }
      }
    }
    const secs = (performance.now() - started) / 1000;
    status.textContent = `done in ${secs.toFixed(2)} s`;
    if (usage) {
      $("usage").textContent =
        `prompt_tokens ${usage.prompt_tokens} · completion_tokens ${usage.completion_tokens}` +
        ` · total ${usage.total_tokens} · ${(usage.completion_tokens / secs).toFixed(1)} tokens/s`;
    }
  } catch (e) {
    status.textContent = String(e.message || e);
  }
});
