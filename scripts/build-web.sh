#!/usr/bin/env bash
# Builds the browser package (crates/acs-web) into web/pkg as wasm-pack.toml says:
# wasm-pack (target web, release). Prints the bundle's size, raw and gzipped.
# (No wasm-opt pass: Debian's binaryen 108 predates the wasm features rustc emits and
# writes a module browsers reject.)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}"
wasm-pack build crates/acs-web --target web --out-dir ../../web/pkg --release --no-pack
wasm=web/pkg/acs_web_bg.wasm
raw=$(stat -c %s "$wasm")
gz=$(gzip -9 -c "$wasm" | wc -c)
echo "web/pkg: acs_web_bg.wasm $raw bytes, $gz gzipped; acs_web.js $(stat -c %s web/pkg/acs_web.js) bytes"
