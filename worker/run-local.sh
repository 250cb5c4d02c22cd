#!/usr/bin/env bash
# Runs the built edge (worker/build.sh) locally in workerd, the Workers runtime, offline.
#   ACS_EDGE_ADDR     where it listens (default 127.0.0.1:8787)
#   ACS_UPSTREAMS     the acs servers it proxies to, comma-separated (required)
#   ACS_EDGE_SECRET   the secret they were started with (--edge-secret; required)
#   ACS_ADMIN_SECRET  the secret of the /admin routes (required)
#   ACS_EDGE_DATA     where Durable Object storage lives (default worker/.data)
#   ACS_RETENTION_SECS, ACS_MAX_BODY_BYTES, ACS_MAX_QUEUED_JOBS as for acs serve
#   ACS_UPSTREAM_COOLDOWN_MS  how long a failed upstream is tried last (default 30000;
#                     doubled for each failure in a row)
#   ACS_JOBS_PER_ALARM  jobs one alarm invocation starts before it hands on (default 1000)
# Extra arguments go to `workerd serve`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build"
[[ -f "$BUILD/index_bg.wasm" ]] || { echo "run-local.sh: build first (worker/build.sh)" >&2; exit 2; }
: "${ACS_UPSTREAMS:?}" "${ACS_EDGE_SECRET:?}" "${ACS_ADMIN_SECRET:?}"
ADDR="${ACS_EDGE_ADDR:-127.0.0.1:8787}"
DATA="${ACS_EDGE_DATA:-$HERE/.data}"
mkdir -p "$DATA"
WORKERD="${WORKERD:-$HERE/node_modules/.bin/workerd}"
# capnp text strings: escape backslashes and quotes.
q() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"; }
modules=""
while IFS= read -r f; do
  rel="${f#"$BUILD"/}"
  case "$rel" in
    *.wasm) modules+="    (name = $(q "$rel"), wasm = embed $(q "$rel")),"$'\n' ;;
    *.js|*.mjs) modules+="    (name = $(q "$rel"), esModule = embed $(q "$rel")),"$'\n' ;;
  esac
done < <(cd "$BUILD" && find "$BUILD" -type f \( -name '*.js' -o -name '*.mjs' -o -name '*.wasm' \) ! -name 'shim.mjs' ! -name 'index.js' | sort)
# capnp embeds files relative to the config, so the config lives beside the build.
CONFIG="$BUILD/workerd-${ADDR//[^0-9]/_}.capnp"
cat >"$CONFIG" <<CAPNP
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "edge", worker = .edge),
    (name = "upstreams", network = (allow = ["public", "private", "local"])),
    (name = "storage", disk = (path = $(q "$DATA/objects"), writable = true)),
  ],
  sockets = [(name = "http", address = $(q "$ADDR"), http = (), service = "edge")],
);

const edge :Workerd.Worker = (
  compatibilityDate = "2026-11-01",
  modules = [
    (name = "shim.mjs", esModule = embed "shim.mjs"),
$modules  ],
  bindings = [
    (name = "ACCOUNTS", durableObjectNamespace = "Account"),
    (name = "ACS_UPSTREAMS", text = $(q "$ACS_UPSTREAMS")),
    (name = "ACS_EDGE_SECRET", text = $(q "$ACS_EDGE_SECRET")),
    (name = "ACS_ADMIN_SECRET", text = $(q "$ACS_ADMIN_SECRET")),
    (name = "ACS_RETENTION_SECS", text = $(q "${ACS_RETENTION_SECS:-86400}")),
    (name = "ACS_MAX_BODY_BYTES", text = $(q "${ACS_MAX_BODY_BYTES:-4194304}")),
    (name = "ACS_MAX_QUEUED_JOBS", text = $(q "${ACS_MAX_QUEUED_JOBS:-256}")),
    (name = "ACS_UPSTREAM_COOLDOWN_MS", text = $(q "${ACS_UPSTREAM_COOLDOWN_MS:-30000}")),
    (name = "ACS_JOBS_PER_ALARM", text = $(q "${ACS_JOBS_PER_ALARM:-1000}")),
  ],
  durableObjectNamespaces = [(className = "Account", uniqueKey = "acs-accounts", enableSql = true)],
  durableObjectStorage = (localDisk = "storage"),
  globalOutbound = "upstreams",
);
CAPNP
mkdir -p "$DATA/objects"
exec "$WORKERD" serve "$CONFIG" --experimental "$@"
