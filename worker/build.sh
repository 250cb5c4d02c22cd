#!/usr/bin/env bash
# Builds the edge worker into worker/build/: the Rust crate for wasm32, wasm-bindgen's
# bundler output, and the entry module. It is wrangler's [build] command, so that
# `wrangler deploy` from a clean checkout builds the worker by itself: the wasm32
# target and wasm-bindgen-cli 0.2.130 (the version the crate pins) are installed
# here when missing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown >&2
fi
if ! wasm-bindgen --version 2>/dev/null | grep -q "0.2.130"; then
  echo "installing wasm-bindgen-cli 0.2.130 (once)" >&2
  cargo install --quiet --locked wasm-bindgen-cli --version 0.2.130 >&2
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/root/.cache/acs-target}"
TARGET_DIR="$CARGO_TARGET_DIR"
cargo build --manifest-path "$HERE/Cargo.toml" -p acs-edge --release --target wasm32-unknown-unknown
rm -rf "$HERE/build"
wasm-bindgen --target bundler --out-dir "$HERE/build" --out-name index \
  "$TARGET_DIR/wasm32-unknown-unknown/release/acs_edge.wasm"
cp "$HERE/js/shim.mjs" "$HERE/build/shim.mjs"
echo "built $(du -b "$HERE/build/index_bg.wasm" | cut -f1) bytes of wasm ($(gzip -9c "$HERE/build/index_bg.wasm" | wc -c) gzipped) in $HERE/build" >&2
