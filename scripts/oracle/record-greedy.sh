#!/usr/bin/env bash
# Records llama.cpp's greedy continuations of a few prompts on Gemma 3 270M Q4_K_M
# (scripts/fetch-gemma3.sh) into crates/acs-llama/tests/fixtures/gemma3-270m-greedy.jsonl,
# which tests/real_models.rs holds ACS's tokenizer and forward pass to. Rerun it to
# check against another llama.cpp, or after changing the prompts here.
#
# usage: LLAMA_CPP=SRC LLAMA_BUILD=BUILD scripts/oracle/record-greedy.sh
#   (SRC and BUILD as for scripts/oracle/record.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

. scripts/oracle/build.sh
oracle_build greedy "$work/greedy"

model="$(scripts/fetch-gemma3.sh)"
out=crates/acs-llama/tests/fixtures/gemma3-270m-greedy.jsonl
# Prompts of prose, code and sequences, most chosen for long runs of clear picks
# (llama.cpp's margins are in the file; tests stop comparing at a near tie).
"$work/greedy" "$model" 16 \
  "A, B, C, D," \
  "10, 20, 30, 40," \
  "1, 2, 3, 4, 5," \
  "for i in range(10):" \
  "The quick brown fox" \
  "Water boils at" \
  "Monday, Tuesday, Wednesday," \
  "def fibonacci(n):" \
  "The capital of France is" 2>/dev/null > "$out"
echo "recorded $out"
