// A helper thread of the in-browser engine's CPU backend (web/pkg-threads only),
// one per helper the engine plans (started by helpers.js, for the engine's page or
// its shared worker), sent the package's URL, the engine's compiled module and the
// memory the engine runs in. The helper instantiates the module on that memory and
// joins the team: from then on it works on the forward passes' parallel loops and
// sleeps between them, never returning.
//
//   starter → helper  {pkg, module, memory}
//   helper → starter  {type:"joined"} | {type:"error", message}
self.onmessage = async ({ data }) => {
  try {
    const pkg = await import(data.pkg);
    await pkg.default({ module_or_path: data.module, memory: data.memory });
    self.postMessage({ type: "joined" });
    pkg.joinTeam();
  } catch (e) {
    self.postMessage({ type: "error", message: String(e?.message || e) });
  }
};
