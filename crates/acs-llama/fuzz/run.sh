#!/usr/bin/env bash
# Fuzzes the GGUF reader for SECONDS (default 60). Needs `cargo install cargo-fuzz`.
# Works on the stable toolchain: RUSTC_BOOTSTRAP=1 unlocks the sanitizer flags.
# Exits non-zero when libFuzzer finds a crash (its input lands in artifacts/).
set -euo pipefail
seconds="${1:-60}"
cd "$(dirname "$0")"
mkdir -p corpus/gguf_parse
cp -n seeds/* corpus/gguf_parse/ 2>/dev/null || true
RUSTC_BOOTSTRAP=1 exec cargo fuzz run gguf_parse corpus/gguf_parse -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10
