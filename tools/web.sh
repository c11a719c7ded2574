#!/usr/bin/env bash
# The web page's browser tests: headless Chromium (Debian's `chromium`, installed with apt only
# when missing) driven by playwright-core (pinned in tests/web/package-lock.json, installed only
# when missing) against a real `rsim serve` while a small campaign runs. Screenshots go to
# test-output/web/ (or $WEB_OUT). Uses target/debug/rsim unless RSIM_BIN names another binary.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
if ! need chromium; then
  if need apt-get; then
    echo "installing chromium (apt)" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
  else
    echo "chromium is required for the web tests (Debian: apt-get install chromium)" >&2; exit 1
  fi
fi
if ! need node; then echo "node (20 or newer) is required for the web tests" >&2; exit 1; fi
tools/npm-cached.sh tests/web ci --no-audit --no-fund --silent
bin="${RSIM_BIN:-target/debug/rsim}"
[ -x "$bin" ] || cargo build --locked -q
export RSIM_BIN="$PWD/$bin" WEB_OUT="${WEB_OUT:-$PWD/test-output/web}"
case "$bin" in /*) export RSIM_BIN="$bin" ;; esac
start=$(date +%s)
(cd tests/web && node web.test.mjs)
echo "web tests: $(( $(date +%s) - start )) s; screenshots in $WEB_OUT" >&2
