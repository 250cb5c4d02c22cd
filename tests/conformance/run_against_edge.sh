#!/usr/bin/env bash
# Runs the conformance suite against the edge worker in workerd (the Workers runtime),
# in front of a fresh `acs serve --edge-secret` upstream. Builds nothing: needs
# $ACS_BIN (as run_against_acs.sh) and worker/build (worker/build.sh).
# Extra arguments go to pytest. The restart test kills workerd hard and starts it
# again on the same Durable Object storage.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"

[[ -x "$ACS_BIN" ]] || { echo "run_against_edge.sh: no acs binary at $ACS_BIN" >&2; exit 2; }
[[ -f "$ROOT/worker/build/index_bg.wasm" ]] || { echo "run_against_edge.sh: build the worker first (worker/build.sh)" >&2; exit 2; }
conformance_python

DATA="$(mktemp -d -t acs-edge-conformance.XXXXXX)"
UP_PORT="$(free_port)"
EDGE_PORT="$(free_port)"
EDGE_SECRET="edge-$RANDOM$RANDOM$RANDOM"
ADMIN_SECRET="admin-$RANDOM$RANDOM$RANDOM"

wait_up() { # url pidfile log
  for _ in $(seq 600); do
    if curl -fsS "$1" >/dev/null 2>&1; then return 0; fi
    kill -0 "$(cat "$2")" 2>/dev/null || { echo "exited:" >&2; tail -20 "$3" >&2; return 2; }
    sleep 0.2
  done
  echo "did not come up: $1" >&2; return 2
}

ACS_EDGE_SECRET="$EDGE_SECRET" "$ACS_BIN" serve --data "$DATA/upstream" --addr "127.0.0.1:$UP_PORT" \
  --retention-secs "$RETENTION" --max-body-bytes "$MAX_BODY" >>"$DATA/upstream.log" 2>&1 &
echo $! >"$DATA/upstream.pid"

cat >"$DATA/start.sh" <<START
#!/usr/bin/env bash
ACS_UPSTREAMS='http://127.0.0.1:$UP_PORT' ACS_EDGE_SECRET='$EDGE_SECRET' ACS_ADMIN_SECRET='$ADMIN_SECRET' \\
ACS_EDGE_DATA='$DATA/edge' ACS_EDGE_ADDR='127.0.0.1:$EDGE_PORT' ACS_RETENTION_SECS='$RETENTION' \\
ACS_MAX_BODY_BYTES='$MAX_BODY' ACS_MAX_QUEUED_JOBS='$MAX_QUEUED' '$ROOT/worker/run-local.sh' >>'$DATA/edge.log' 2>&1 &
echo \$! >'$DATA/edge.pid'
$(declare -f wait_up)
wait_up 'http://127.0.0.1:$EDGE_PORT/health' '$DATA/edge.pid' '$DATA/edge.log'
START
write_restart "$DATA/edge.pid"

cleanup() {
  for f in edge upstream; do
    local pid; pid="$(cat "$DATA/$f.pid" 2>/dev/null)"
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null
  done
  sleep 0.3
  for f in edge upstream; do
    local pid; pid="$(cat "$DATA/$f.pid" 2>/dev/null)"
    [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null
  done
  if [[ -n "${ACS_KEEP_DATA:-}" ]]; then echo "data kept in $DATA" >&2; else rm -rf "$DATA"; fi
}
trap cleanup EXIT
wait_up "http://127.0.0.1:$UP_PORT/v1/models" "$DATA/upstream.pid" "$DATA/upstream.log" || exit 2
bash "$DATA/start.sh" || exit 2

BASE="http://127.0.0.1:$EDGE_PORT"
export ACS_FACE=edge
run_suite "$BASE" \
  "curl -fsS -X POST '$BASE/admin/keys' -H 'authorization: Bearer $ADMIN_SECRET' -d '{{\"tokens\": {tokens}, \"max_running\": {max_running}}}' | jq -r .key" \
  "bash '$DATA/restart.sh'" "$DATA/edge.log" "$@"
