#!/usr/bin/env bash
# Runs the conformance suite against a fresh `acs serve` on a free loopback port.
# Builds nothing: uses $ACS_BIN (default $CARGO_TARGET_DIR/release/acs, with
# CARGO_TARGET_DIR defaulting to /root/.cache/acs-target).
# Extra arguments go to pytest (e.g. -k jobs, -x, -q).
# The last line of the output is "N passed, N failed" (", N skipped" when some were).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"

if [[ ! -x "$ACS_BIN" ]]; then
  echo "run_against_acs.sh: no acs binary at $ACS_BIN (build it: cargo build --release -p acs-server)" >&2
  exit 2
fi

conformance_python

DATA="$(mktemp -d -t acs-conformance.XXXXXX)"
PORT="$(free_port)"
# start.sh starts the server and waits for it; restart.sh kills it hard (SIGKILL, a
# crash) and starts it again on the same port and data: the suite's restart test uses it.
cat >"$DATA/start.sh" <<START
#!/usr/bin/env bash
'$ACS_BIN' serve --data '$DATA' --addr '127.0.0.1:$PORT' --retention-secs '$RETENTION' \\
  --max-body-bytes '$MAX_BODY' --max-queued-jobs '$MAX_QUEUED' \\
  --body-timeout-secs '$BODY_TIMEOUT' ${ACS_SERVE_ARGS:-} >>'$DATA/server.log' 2>&1 &
echo \$! >'$DATA/server.pid'
for _ in \$(seq 600); do
  if curl -fsS 'http://127.0.0.1:$PORT/v1/models' >/dev/null 2>&1; then exit 0; fi
  kill -0 \$(cat '$DATA/server.pid') 2>/dev/null || { echo 'acs serve exited:' >&2; tail -20 '$DATA/server.log' >&2; exit 2; }
  sleep 0.2
done
echo 'acs serve did not come up' >&2; exit 2
START
write_restart "$DATA/server.pid"

cleanup() {
  local pid
  pid="$(cat "$DATA/server.pid" 2>/dev/null)"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  fi
  if [[ -n "${ACS_KEEP_DATA:-}" ]]; then echo "data kept in $DATA" >&2; else rm -rf "$DATA"; fi
}
trap cleanup EXIT
bash "$DATA/start.sh" || exit 2

run_suite "http://127.0.0.1:$PORT" \
  "'$ACS_BIN' keys create --data '$DATA' --tokens {tokens} --max-running {max_running}" \
  "bash '$DATA/restart.sh'" "$DATA/server.log" "$@"
