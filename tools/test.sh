#!/usr/bin/env bash
# Run every test of rsi-master on a fresh machine: installs what the tests need, then checks
# formatting and lints and runs the whole suite (unit, API, CLI, crash-safety, schema freshness).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's start, the time the one before took (wall, and CPU seconds of the processes it
# waited for: over the wall time, the stage kept more than one core busy), and the disk left (a CI
# machine's disk ran out once: the log says where, and how fast the time goes).
t0=$SECONDS last=$SECONDS last_cpu=0
times_file=$(mktemp)
# Sets $cpu: `times` must run in this shell itself (in a command substitution, a subshell, it would
# count the subshell's children: none).
children_cpu() { times >"$times_file"; cpu=$(tail -1 "$times_file" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] } printf "%d", n }'); }
stage() {
  children_cpu
  echo "test.sh: ${SECONDS}s (+$((SECONDS - last))s, CPU +$((cpu - last_cpu))s) $* — disk free $(df -h --output=avail . | tail -1 | tr -d ' ')" >&2
  last=$SECONDS last_cpu=$cpu
}
stage "installing what the tests need"

need() { command -v "$1" >/dev/null 2>&1; }
if ! need git; then
  echo "installing git" >&2
  if need apt-get; then apt-get update -qq && apt-get install -y -qq --no-install-recommends git ca-certificates >/dev/null; else echo "git is required" >&2; exit 1; fi
fi
if ! need cargo; then echo "cargo (Rust 1.95 or newer) is required: https://rustup.rs" >&2; exit 1; fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true

# Nix for the Nix-environment tests (offline configuration; idempotent).
tools/setup-nix.sh
# A single-node Slurm cluster for the Slurm-backend tests (idempotent); they may not skip here.
tools/setup-slurm.sh
export RSIM_REQUIRE_SLURM=1
# The sandbox tests attack for real and may not skip here (they need Landlock: Linux 5.13+).
export RSIM_REQUIRE_SANDBOX=1

# The MCP clients (npm, pip; idempotent): the command-agent test drives rsim through the Python
# client, and may not skip here.
MCP_ONLY=install tools/mcp-clients.sh
export RSIM_REQUIRE_MCP_CLIENTS=1
# Python's venv (the transformers lane builds an environment with it): installed here, because that
# lane later runs beside the Node lane, whose scripts may run apt-get too (two at once fight over
# dpkg's lock).
if ! python3 -c 'import ensurepip' >/dev/null 2>&1 && need apt-get; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

# One profile (debug) for everything: building release too would compile every crate twice.
stage "fmt, clippy"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
stage "cargo test"
cargo test --locked
# The faces against the binary, in two lanes side by side (a clean run on two cores: the Node
# lane mostly waits on its clients, the transformers lane's jobs run one at a time on one thread).
mkdir -p test-output
# The transformers path: the hf-tiny example's Python environment from its lock (torch,
# transformers, peft: ~3 GB and ~3 minutes the first time, kept in ~/.cache/rsim/python-envs/),
# then a study driven through `rsim call` end to end — full SFT, LoRA, evaluations, reproduce,
# a contaminated dataset and a drifted environment refused — about 4 minutes. Its harness-cost
# benchmark (the spec run bare) is left to `tools/hf.sh` run by hand: HF_RATIO_RUNS=0 here.
stage "transformers path (in the background; its log follows the Node lane)"
# A process group of its own, so that a failing Node lane stops it and what it started; a copy of
# the binary of its own, so that nothing rebuilt meanwhile swaps it under its jobs (a study pins
# the binary that evaluates).
cp target/debug/rsim target/rsim-hf
HF_RATIO_RUNS=0 RSIM_BIN=target/rsim-hf setsid tools/hf.sh >test-output/hf.log 2>&1 &
hf_pid=$!
trap 'kill -- "-$hf_pid" 2>/dev/null || true' EXIT
# Real MCP clients (conformance suite, Inspector CLI, Python and TypeScript SDKs) against the binary;
# the conformance suite's fixture tools are served by the `rsim-conformance` example, which
# `cargo test` built beside rsim (it links the same library: nothing is compiled again).
stage "MCP clients"
RSIM_BIN=target/debug/rsim RSIM_CONFORMANCE_BIN=target/debug/examples/rsim-conformance tools/mcp-clients.sh
# Real MCP hosts (Claude Code, Codex CLI, Gemini CLI from npm) against a scripted model endpoint on
# loopback: stdio, HTTP, HTTP with tokens, and `rsim run --worker 'cmd:…'` (about a minute).
stage "MCP hosts"
RSIM_BIN=target/debug/rsim tools/hosts.sh
# The web page in headless Chromium against a real `rsim serve` while a campaign runs (under a
# minute; installs chromium and playwright-core when missing); screenshots in test-output/web/.
stage "web"
RSIM_BIN=target/debug/rsim tools/web.sh
# The editor face: `rsim lsp` from Node (vscode-jsonrpc), then the VS Code extension in code-server
# through headless Chromium while a campaign runs (under a minute once installed; the first install
# of code-server takes a few minutes); screenshots in test-output/editor/.
stage "editor"
RSIM_BIN=target/debug/rsim tools/editor.sh
stage "waiting for the transformers path"
hf_rc=0
wait "$hf_pid" || hf_rc=$?
trap - EXIT
cat test-output/hf.log >&2
[ "$hf_rc" = 0 ] || { echo "test.sh: the transformers path failed (exit $hf_rc)" >&2; exit "$hf_rc"; }
stage "done in $((SECONDS - t0)) s"
rm -f "$times_file"
