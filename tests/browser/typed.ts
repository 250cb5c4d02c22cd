// Type-checked (never run) against the acs-web npm package's acs-client.d.ts by the
// package test (acs-server's tests/playground.rs), from a folder where `npm install`
// put the packed package: the calls a page makes, with their types spelled out, and
// misuses that the types must refuse (each `@ts-expect-error` fails the check if its
// line compiles).
import { AcsBrowser, AcsError, partUrls, type Completion, type Progress, type Chunk } from "acs-web";

export async function sample(): Promise<string[]> {
  const acs = await AcsBrowser.start({
    url: "/model.gguf", backend: "auto", threads: 2, budget: { tokens: 10_000, maxRunning: 4 },
    onProgress: (p: Progress) => console.log(p.phase, p.loaded, p.total),
    onLost: (reason: string) => console.log("lost", reason),
    onRecovered: (info, error) => console.log(info?.backend ?? error?.message),
  });
  const c: Completion = await acs.completions({ model: "llama-8b", prompt: ["a", "b"], n: 2, max_tokens: 8, seed: 1 });
  const streamed: Chunk[] = [];
  await acs.completions({ model: "llama-8b", prompt: "x", stream: true }, { onChunk: (k) => streamed.push(k) });
  const chat = await acs.chatCompletions({ model: "llama-8b", messages: [{ role: "user", content: "Hi" }], n: 3 });
  const { job } = await acs.createJob(
    { model: "llama-8b", prompt: "x", activations: { layers: [1], positions: "last" } },
    { idempotencyKey: "k1" },
  );
  try {
    await acs.jobResult(job.id);
  } catch (e) {
    if (e instanceof AcsError) console.log(e.status, e.body?.error.code);
  }
  const steered = await acs.completions({
    model: "llama-8b", prompt: "I feel", steering: [{ layer: 3, scale: 4, positive: "joy", negative: "anger" }],
  });
  const budget = await acs.budget();
  // A split model's files, in a SharedWorker that other tabs join.
  const parts: string[] = partUrls("/m-00001-of-00002.gguf");
  const tab = await AcsBrowser.start({ url: parts[0], shared: true });
  const joined: boolean = tab.info.shared && Boolean(tab.info.attached) && tab.info.parts === 2;
  return [String(joined), String(tab.info.resumes),...c.choices.map((x) => x.text), chat.choices[0].message.content, steered.choices[0].text,
          acs.info.backend, String(acs.info.threads), String(budget.tokens_left)];
}

export function misuses(acs: AcsBrowser): void {
  // @ts-expect-error: the backend is "auto", "webgpu" or "cpu"
  AcsBrowser.start({ backend: "gpu" });
  // @ts-expect-error: `shared` is a boolean
  AcsBrowser.start({ url: "/m.gguf", shared: "yes" });
  // @ts-expect-error: a completion needs a prompt
  acs.completions({ model: "llama-8b", n: 2 });
  // @ts-expect-error: a chat message's role is system, user or assistant
  acs.chatCompletions({ model: "llama-8b", messages: [{ role: "tool", content: "x" }] });
}
