# Shared by run_against_acs.sh and run_against_edge.sh (sourced, not run, after they
# set HERE to this folder): the settings both take, and their common steps.

ROOT="$(cd "$HERE/../.." && pwd)"
ACS_BIN="${ACS_BIN:-${CARGO_TARGET_DIR:-/root/.cache/acs-target}/release/acs}"
RETENTION="${ACS_RETENTION_SECS:-4}"
MAX_BODY="${ACS_MAX_BODY_BYTES:-1048576}"
MAX_QUEUED="${ACS_MAX_QUEUED_JOBS:-8}"
BODY_TIMEOUT="${ACS_BODY_TIMEOUT_SECS:-3}"
VENV="${ACS_CONFORMANCE_VENV:-$HOME/.cache/acs-conformance-venv}"

# Sets PYTHON to a Python with the suite's requirements: $PYTHON if given, else the
# venv $VENV (made on first use).
conformance_python() {
  if [[ -z "${PYTHON:-}" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
      python3 -m venv "$VENV" >&2 && "$VENV/bin/pip" install -q -r "$HERE/requirements.txt" >&2
    fi
    PYTHON="$VENV/bin/python"
  fi
  if ! "$PYTHON" -c "import pytest, httpx" 2>/dev/null; then
    "$PYTHON" -m pip install -q -r "$HERE/requirements.txt" >&2
  fi
}

# A free loopback port.
free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Writes $DATA/restart.sh, which the suite's restart test runs: it kills the process
# whose pid is in file $1 hard (SIGKILL, a crash) and runs $DATA/start.sh again.
write_restart() {
  cat >"$DATA/restart.sh" <<RESTART
#!/usr/bin/env bash
PID=\$(cat '$1')
kill -9 "\$PID" 2>/dev/null
while kill -0 "\$PID" 2>/dev/null; do sleep 0.05; done
exec bash '$DATA/start.sh'
RESTART
}

# Runs the suite: run_suite BASE_URL MAKE_KEY RESTART_CMD LOG [pytest args…]. Shows the
# end of LOG on failure when ACS_SHOW_SERVER_LOG is set; returns pytest's status.
run_suite() {
  local log="$4"
  export ACS_BASE_URL="$1" ACS_MAKE_KEY="$2" ACS_RESTART_CMD="$3"
  shift 4
  export ACS_RETENTION_SECS="$RETENTION"
  export ACS_MAX_BODY_BYTES="$MAX_BODY"
  export ACS_MAX_QUEUED_JOBS="$MAX_QUEUED"
  export ACS_BODY_TIMEOUT_SECS="$BODY_TIMEOUT"
  export ACS_OPENAPI="${ACS_OPENAPI:-$ROOT/crates/acs-server/openapi.json}"
  # schemathesis beside the chosen Python (a venv), else on PATH.
  if [[ -z "${ACS_SCHEMATHESIS:-}" && "$PYTHON" == */* && -x "$(dirname "$PYTHON")/schemathesis" ]]; then
    export ACS_SCHEMATHESIS="$(dirname "$PYTHON")/schemathesis"
  fi
  (cd "$HERE" && "$PYTHON" -m pytest -rfE "$@")
  local rc=$?
  if [[ $rc -ne 0 && -n "${ACS_SHOW_SERVER_LOG:-}" ]]; then tail -50 "$log" >&2; fi
  return $rc
}
