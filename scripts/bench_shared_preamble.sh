#!/usr/bin/env bash
# One request of 8 prompts behind one few-shot preamble (n=2, 16 tokens each, seed 1)
# against a fresh `acs serve`, then the same request again: wall time, usage (its
# `prompt_tokens_details.cached_tokens`) and whether the texts repeat.
# Usage: scripts/bench_shared_preamble.sh [ACS_BIN] [cpu|webgpu] [EXAMPLES]
#   ACS_BIN defaults to the release build; EXAMPLES (24) sets the preamble's length
#   (24 make about 660 tokens; take 4 on a software GPU such as lavapipe).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$HOME/.cache/acs-target}/release/acs}"
BACKEND="${2:-cpu}"
export EXAMPLES="${3:-24}"
MODEL="$("$ROOT/scripts/fetch-model.sh")"
DATA="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
KEY="$("$BIN" keys create --data "$DATA" --tokens 100000000 2>/dev/null | tail -1)"
"$BIN" serve --data "$DATA" --model "$MODEL" --addr "127.0.0.1:$PORT" --backend "$BACKEND" >"$DATA/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DATA"' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" -H "Authorization: Bearer $KEY" >/dev/null && break
  sleep 0.2
done
python3 - "$PORT" "$KEY" <<'PY'
import json, os, sys, time, urllib.request
port, key = sys.argv[1], sys.argv[2]
preamble = "Answer each question about the weather in one short sentence.\n" + "".join(
    f"Q: Example question number {i} about clouds, rain and wind?\nA: A short example answer number {i}.\n"
    for i in range(int(os.environ["EXAMPLES"])))
questions = ["Why is the sky blue?", "Why do clouds float?", "What makes rain?", "Why is snow white?",
             "What is fog made of?", "Why does wind blow?", "What is hail?", "Why is a sunset red?"]
body = json.dumps({"model": "llama-8b", "prompt": [f"{preamble}Q: {q}\nA:" for q in questions],
                   "n": 2, "max_tokens": 16, "seed": 1}).encode()
def run():
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    t = time.time()
    r = json.load(urllib.request.urlopen(req))
    return time.time() - t, r["usage"], [c["text"] for c in r["choices"]]
t, usage, texts = run()
print(f"8 prompts behind one preamble, n=2: {t:.2f} s, usage {json.dumps(usage)}")
t, usage, again = run()
print(f"the same request again:            {t:.2f} s, usage {json.dumps(usage)}, same texts: {again == texts}")
PY
