// The helper threads of the threaded engine (web/pkg-threads): Web Workers that run
// acs-team.js on the engine's compiled module and shared memory and join its team.
// A dedicated engine's page starts them (acs-client.js), a shared engine its own
// (acs-worker.js).

// Starts `n` helpers from acs-team.js beside `base` on `imports`: {pkg, module,
// memory}, the threaded package's URL and what it instantiates. Returns the workers
// and a promise of how many joined the team; one that fails is only a thread fewer,
// as the engine's own thread claims every loop's tasks too.
export function startHelpers(base, n, imports) {
  const workers = [];
  const joined = [];
  for (let i = 0; i < n; i++) {
    const worker = new Worker(new URL("./acs-team.js", base), { type: "module", name: `acs-team-${i + 1}` });
    workers.push(worker);
    joined.push(new Promise((resolve) => {
      worker.onmessage = ({ data }) => {
        if (data.type !== "joined") console.warn("an ACS helper thread failed:", data.message);
        resolve(data.type === "joined");
      };
      worker.onerror = (e) => {
        console.warn("an ACS helper thread failed:", e.message);
        resolve(false);
      };
    }));
    worker.postMessage(imports);
  }
  return { workers, joined: Promise.all(joined).then((ok) => ok.filter(Boolean).length) };
}
