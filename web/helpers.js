// The helper threads of the threaded engine (web/pkg-threads): Web Workers that run
// acs-team.js on the engine's compiled module and shared memory and join its team.
// A dedicated engine's page starts them (acs-client.js), a shared engine its own
// (acs-worker.js).

// Starts `n` helpers from acs-team.js beside `base` on `imports`: {pkg, module,
// memory}, the threaded package's URL and what it instantiates. Returns the workers
// and a promise of how many joined the team. One that fails, even to be created (a
// page's policy may refuse workers), is only a thread fewer, as the engine's own
// thread claims every loop's tasks too; the engine waits on the count, so no
// failure may keep it from coming.
export function startHelpers(base, n, imports) {
  const failed = (message) => {
    console.warn("an ACS helper thread failed:", message);
    return false;
  };
  const workers = [];
  const joined = [];
  for (let i = 0; i < n; i++) {
    try {
      const worker = new Worker(new URL("./acs-team.js", base), { type: "module", name: `acs-team-${i + 1}` });
      workers.push(worker);
      joined.push(new Promise((resolve) => {
        worker.onmessage = ({ data }) => resolve(data.type === "joined" || failed(data.message));
        worker.onerror = (e) => resolve(failed(e.message));
      }));
      worker.postMessage(imports);
    } catch (e) {
      joined.push(failed(String(e?.message || e)));
    }
  }
  return { workers, joined: Promise.all(joined).then((ok) => ok.filter(Boolean).length) };
}
