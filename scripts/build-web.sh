#!/usr/bin/env bash
# Builds the browser packages (crates/acs-web) as wasm-pack.toml says, each with
# wasm-pack (target web, release), and prints their sizes, raw and gzipped:
#   web/pkg          one thread, for any page;
#   web/pkg-threads  the CPU kernels on a team of Web Workers over shared memory
#                    (wasm atomics), for cross-origin isolated pages.
# (No wasm-opt pass: Debian's binaryen 108 predates the wasm features rustc emits and
# writes a module browsers reject.)
# ACS_WEB_THREADS=0 skips web/pkg-threads.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}"

# wasm-pack writes a `.gitignore` of `*` into each package, which would keep the
# packages out of `npm pack web` (the acs-web npm package); the repository's own
# .gitignore already leaves them out of git.
sizes() {
  rm -f "$1/.gitignore"
  local wasm="$1/acs_web_bg.wasm"
  echo "$1: acs_web_bg.wasm $(stat -c %s "$wasm") bytes, $(gzip -9 -c "$wasm" | wc -c) gzipped;" \
    "acs_web.js $(stat -c %s "$1/acs_web.js") bytes"
}

wasm-pack build crates/acs-web --target web --out-dir ../../web/pkg --release --no-pack
sizes web/pkg
[[ "${ACS_WEB_THREADS:-1}" == 0 ]] && exit 0

# Shared memory needs the standard library rebuilt with atomics (`-Z build-std`,
# unlocked on the stable toolchain by RUSTC_BOOTSTRAP, from its rust-src component),
# the linker told to make the memory shared and imported (each helper's instance
# takes the engine's), with a maximum (4 GiB, all that wasm32 addresses), and the
# thread-local storage's symbols exported for wasm-bindgen's per-thread start. Its own
# target directory, as the flags differ from every other wasm32 build's.
rustup component add rust-src >/dev/null 2>&1 || true
flags="-C target-feature=+simd128,+atomics,+bulk-memory,+mutable-globals"
for arg in --shared-memory --import-memory --max-memory=4294967296 --export=__wasm_init_tls \
  --export=__tls_size --export=__tls_align --export=__tls_base; do
  flags+=" -C link-arg=$arg"
done
CARGO_TARGET_DIR="$CARGO_TARGET_DIR/wasm-threads" RUSTC_BOOTSTRAP=1 RUSTFLAGS="$flags" \
  wasm-pack build crates/acs-web --target web --out-dir ../../web/pkg-threads --release --no-pack \
  -- -Z build-std=panic_abort,std
sizes web/pkg-threads
