#!/usr/bin/env bash
# Runs on a GPU machine, from a copy of the repository holding .gpu/ (made by
# scripts/gpu-pack.sh): the WebGPU tests against the CPU pass, then `acs bench --webgpu`
# on a random-weight model of the default model's shapes. Output goes to the terminal
# and to $OUT/gpu-bench.txt (OUT defaults to .gpu/out). REPEAT (default 3) and
# DECODE (default 64) set the benchmark's --repeat and --decode-tokens.
# No `set -e`: the benchmark runs even where a test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.gpu/out}"
mkdir -p "$out"
exec > >(tee "$out/gpu-bench.txt") 2>&1
# The Vulkan loader (and the GL dispatch libraries NVIDIA's driver links), unpacked
# from the packed .debs where the image has none.
if ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then
  for f in .gpu/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
# NVIDIA's driver manifest where the loader's search paths miss it.
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [[ -z "${VK_DRIVER_FILES:-}" && -f "$icd" ]] && ! ls /usr/share/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  export VK_DRIVER_FILES="$icd"
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
echo "== WebGPU tests against the CPU pass (generated models; the default model's oracle test needs the model file)"
.gpu/webgpu_tests --skip default_model_matches_llama_cpp_oracle --test-threads 1
model="$out/shaped.gguf"
.gpu/shaped_model "$model"
echo "== acs bench --webgpu (random weights, the default model's shapes and formats)"
.gpu/acs bench --model "$model" --webgpu --repeat "${REPEAT:-3}" --decode-tokens "${DECODE:-64}"
rm -f "$model"
