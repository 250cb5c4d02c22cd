//! The CPU backend's threads in the browser.
//!
//! The package built with shared memory (`web/pkg-threads`, `+atomics`) runs the CPU
//! kernels' loops on a team: the engine's worker plans its helpers
//! ([`plan_helpers`]) before it loads a model, then starts each as a Web Worker that
//! instantiates the same module on the same memory and calls [`join_team`]. The
//! package without shared memory (`web/pkg`) runs on one thread; pages that are not
//! cross-origin isolated can only load that one.

use wasm_bindgen::prelude::*;

/// Whether this build shares its memory between threads (the `web/pkg-threads`
/// package).
#[wasm_bindgen(js_name = sharedMemory)]
pub fn shared_memory() -> bool {
    cfg!(target_feature = "atomics")
}

/// The threads the CPU backend's loops run on, the engine's own included.
#[wasm_bindgen(js_name = cpuThreads)]
pub fn cpu_threads() -> usize {
    acs_llama::threads()
}

/// Plans `helpers` helper threads, before the first model loads: the team's size is
/// fixed at its first loop. Returns whether the plan was in time.
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = planHelpers)]
pub fn plan_helpers(helpers: usize) -> bool {
    acs_llama::plan_helpers(helpers)
}

/// A helper thread's life: called by a helper Web Worker once it instantiated the
/// module on the engine's memory; never returns.
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = joinTeam)]
pub fn join_team() {
    acs_llama::join_team()
}

/// What a helper Web Worker instantiates: `{module, memory}`, this compiled module
/// and the memory it shares.
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = helperImports)]
pub fn helper_imports() -> js_sys::Object {
    let o = js_sys::Object::new();
    for (name, value) in [
        ("module", wasm_bindgen::module()),
        ("memory", wasm_bindgen::memory()),
    ] {
        // Setting a property of a fresh plain object does not throw.
        let _ = js_sys::Reflect::set(&o, &name.into(), &value);
    }
    o
}
