#!/usr/bin/env bash
# Makes the files the benchmarks against llama.cpp run on: random weights in real
# models' shapes (`shaped_model`, Q8_0), each requantized by llama.cpp's
# `llama-quantize` to the formats people download. Speed does not depend on the
# weights' values; the default model (real weights) is requantized too.
#
# usage: LLAMA_BIN=DIR scripts/make_bench_models.sh OUT_DIR [SHAPE...]
#   DIR holds llama-quantize (docs/performance.md says how to build it).
#   SHAPE: a shape `shaped_model` knows (default: llama-3.2-1b llama-3.1-8b), or
#   `default` for the default model's own file.
#   FORMATS (env): the llama-quantize types (default: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K
#   Q3_K_M Q4_K_M Q5_K_M Q6_K).
# Prints the paths it wrote, one a line; a file already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: LLAMA_BIN=DIR $0 OUT_DIR [SHAPE...]}"
shift
shapes=("$@")
((${#shapes[@]})) || shapes=(llama-3.2-1b llama-3.1-8b)
formats=(${FORMATS:-Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K})
quantize="${LLAMA_BIN:?set LLAMA_BIN to the directory of llama-quantize}/llama-quantize"
[[ -x "$quantize" ]] || { echo "no llama-quantize in $LLAMA_BIN" >&2; exit 2; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}"
mkdir -p "$out"

for shape in "${shapes[@]}"; do
  if [[ "$shape" == default ]]; then
    source_file="$(scripts/fetch-model.sh)"
  else
    source_file="$out/$shape-Q8_0.gguf"
    if [[ ! -s "$source_file" ]]; then
      cargo run --quiet --release -p acs-llama --example shaped_model -- \
        "$source_file" "$shape" >&2
    fi
  fi
  for f in "${formats[@]}"; do
    file="$out/$shape-$f.gguf"
    if [[ "$file" != "$source_file" && ! -s "$file" ]]; then
      if ! "$quantize" --allow-requantize "$source_file" "$file.part" "$f" \
        >"$out/quantize.log" 2>&1; then
        tail -5 "$out/quantize.log" >&2
        exit 1
      fi
      mv "$file.part" "$file"
    fi
    echo "$file"
  done
done
