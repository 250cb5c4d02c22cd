// The Workers entry module: instantiates the Rust worker (wasm-bindgen's bundler
// output beside this file) and exports its fetch handler and Durable Object class.
import * as bindings from "./index_bg.js";
import wasmModule from "./index_bg.wasm";

const instance = new WebAssembly.Instance(wasmModule, { "./index_bg.js": bindings });
bindings.__wbg_set_wasm(instance.exports);
instance.exports.__wbindgen_start();

/** One API key's Budget, Holds and jobs (see worker/src/account.rs). */
export class Account {
  constructor(state, env) {
    this.inner = new bindings.Account(state, env);
  }
  fetch(request) {
    return this.inner.fetch(request);
  }
  alarm() {
    return this.inner.alarm();
  }
}

export default {
  fetch(request, env, ctx) {
    return bindings.fetch(request, env, ctx);
  },
};
