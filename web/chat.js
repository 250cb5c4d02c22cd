// The playground's chat mode: n replies to one conversation side by side; each column
// is then a conversation of its own, continued with n = 1 from its own reply.
import { readEvents } from "./events.js";

/** "role: text" lines (roles system, user, assistant; a line without one is the user's). */
export function parseConversation(text) {
  return text.split("\n").filter((l) => l.trim()).map((line) => {
    const m = line.match(/^(system|user|assistant):\s?(.*)$/);
    return m ? { role: m[1], content: m[2] } : { role: "user", content: line };
  });
}

function bubble(role, text = "") {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.dataset.role = role;
  div.textContent = text;
  return div;
}

export class ChatBoard {
  /**
   * `root`: the element the columns go in; `send(body)`: POSTs a chat body and
   * answers the Response; `done(usage, secs)`: called after each streamed reply.
   */
  constructor(root, send, done) {
    this.root = root;
    this.send = send;
    this.done = done;
  }

  /** Samples `body.n` replies to `body.messages`, a column each. */
  async start(body) {
    this.root.replaceChildren();
    this.root.style.gridTemplateColumns = `repeat(${body.n}, 1fr)`;
    this.columns = Array.from({ length: body.n }, (_, i) => {
      const col = document.createElement("div");
      col.className = "conversation";
      col.dataset.index = String(i);
      const history = body.messages.map((m) => ({ ...m }));
      for (const m of history) col.append(bubble(m.role, m.content));
      this.root.append(col);
      return { col, history, body };
    });
    const replies = this.columns.map((c) => c.col.appendChild(bubble("assistant")));
    await this.#stream(body, (index) => replies[index]);
    this.columns.forEach((c, i) => {
      c.history.push({ role: "assistant", content: replies[i].textContent });
      this.#addInput(c);
    });
  }

  // One streamed request; `target(index)` is the bubble a choice's deltas go to.
  async #stream(body, target) {
    const started = performance.now();
    const resp = await this.send({ ...body, stream: true, stream_options: { include_usage: true } });
    if (!resp.ok) {
      const e = await resp.json().catch(() => null);
      throw new Error(e ? `${resp.status} ${e.error.code}: ${e.error.message}` : `${resp.status}`);
    }
    const usage = await readEvents(resp, (chunk) => {
      for (const ch of chunk.choices) {
        const b = target(ch.index);
        if (ch.delta.content) b.textContent += ch.delta.content;
        if (ch.finish_reason) b.dataset.finish = ch.finish_reason;
      }
    });
    this.done(usage, (performance.now() - started) / 1000);
  }

  // The column's next message: its own conversation goes on with n = 1.
  #addInput(c) {
    const form = document.createElement("form");
    form.className = "reply";
    const input = document.createElement("input");
    input.placeholder = "your reply…";
    input.setAttribute("aria-label", `reply in conversation ${c.col.dataset.index}`);
    form.append(input);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const text = input.value.trim();
      if (!text) return;
      form.remove();
      c.history.push({ role: "user", content: text });
      c.col.append(bubble("user", text));
      const reply = c.col.appendChild(bubble("assistant"));
      try {
        await this.#stream({ ...c.body, n: 1, messages: c.history }, () => reply);
        c.history.push({ role: "assistant", content: reply.textContent });
      } catch (e) {
        reply.textContent = String(e.message || e);
        reply.dataset.finish = "error";
        c.history.pop();
      }
      this.#addInput(c);
    });
    c.col.append(form);
  }
}
