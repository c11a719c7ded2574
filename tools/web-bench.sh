#!/usr/bin/env bash
# The web page's benchmark (figures in the README): first paint in headless Chromium at 1k, 10k
# and 100k nodes (median of RUNS loads) and the server's memory with 100 open pages.
# Usage: tools/web-bench.sh [--release]   (debug binary by default)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
if [ "${1:-}" = "--release" ]; then profile=release; cargo build --release --locked -q; else cargo build --locked -q; fi
command -v chromium >/dev/null 2>&1 || { echo "run tools/web.sh once first (it installs chromium)" >&2; exit 1; }
[ -d tests/web/node_modules/playwright-core ] || (cd tests/web && npm ci --no-audit --no-fund --silent)
echo "machine: $(nproc) cores, $(uname -m), $profile build" >&2
RSIM_BIN="$PWD/target/$profile/rsim" node tests/web/bench.mjs
