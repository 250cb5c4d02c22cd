#!/usr/bin/env bash
# Checks a GGUF file against llama.cpp: llama.cpp tokenizes each prompt and continues
# it greedily (scripts/oracle/greedy.c), then ACS does the same on the same file and
# reports, per prompt, whether its tokens agree and how far its greedy tokens follow
# llama.cpp's (a difference at one of llama.cpp's own near ties is rounding). Where
# they part at a wider margin, run it again on the file expanded to f32
# (`llama-quantize --allow-requantize MODEL.gguf F32.gguf F32`): there neither rounds
# activations, and a tie of the weights themselves shows as one.
#
# usage: LLAMA_CPP=SRC LLAMA_BUILD=BUILD scripts/check-gguf.sh MODEL.gguf [PROMPT ...]
#   SRC, BUILD: llama.cpp's source tree and a CMake build of it with static libraries
#               (see scripts/oracle/record.sh)
#   N_TOKENS:   greedy tokens per prompt (default 16)
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: scripts/check-gguf.sh MODEL.gguf [PROMPT ...]}"
shift
prompts=("$@")
[ ${#prompts[@]} -gt 0 ] || prompts=("The capital of France is" "def fibonacci(n):" "1, 2, 3, 4, 5,")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

. scripts/oracle/build.sh
oracle_build greedy "$work/greedy"
"$work/greedy" "$model" "${N_TOKENS:-16}" "${prompts[@]}" 2>/dev/null > "$work/greedy.jsonl"
cargo run -q --release -p acs-llama --example check_gguf -- "$model" "$work/greedy.jsonl"
