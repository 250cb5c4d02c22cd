#!/usr/bin/env bash
# Fuzzes request parsing and validation for SECONDS (default 60). Needs
# `cargo install cargo-fuzz`; works on stable with RUSTC_BOOTSTRAP=1.
# Exits non-zero when libFuzzer finds a crash (its input lands in artifacts/).
set -euo pipefail
seconds="${1:-60}"
cd "$(dirname "$0")"
mkdir -p corpus/request_parse
cp -n seeds/* corpus/request_parse/ 2>/dev/null || true
RUSTC_BOOTSTRAP=1 exec cargo fuzz run request_parse corpus/request_parse -- \
    -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -timeout=10
