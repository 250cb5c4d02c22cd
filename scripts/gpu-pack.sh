#!/usr/bin/env bash
# Packs what the WebGPU benchmark needs on a GPU machine that has no Rust toolchain and
# no network into .gpu/ (git-ignored): the `acs` binary built with `--features webgpu`,
# the WebGPU test binary (the WGSL pass against the CPU pass on generated models), the
# `shaped_model` example (a random-weight GGUF of the default model's shapes: the
# model itself is too large to copy along), and the Vulkan loader's .debs for
# machines whose image lacks it. Copy the repository with .gpu/ to that machine and
# run scripts/gpu-bench.sh there. The binaries are stripped (about 25 MB together).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
rm -rf .gpu
mkdir -p .gpu/debs
cargo build --release -p acs-server --features webgpu
cargo build --release -p acs-llama --example shaped_model
tests=$(cargo test --release -p acs-llama --features webgpu --test webgpu --no-run \
  --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "webgpu" and m.get("executable"):
        print(m["executable"])')
strip -o .gpu/acs "$CARGO_TARGET_DIR/release/acs"
strip -o .gpu/shaped_model "$CARGO_TARGET_DIR/release/examples/shaped_model"
strip -o .gpu/webgpu_tests "$tests"
# The Vulkan loader, and the GL dispatch libraries NVIDIA's Vulkan driver links.
(cd .gpu/debs && apt-get -qq download libvulkan1 libglvnd0 libglx0 libgl1 libegl1 \
  libopengl0 libgles2 2>/dev/null)
du -sh .gpu
