#!/usr/bin/env bash
# The transformers path through rsim, every CI run: builds the hf-tiny example's Python
# environment from its lock (pip, about 3 GB the first time: torch and its CUDA wheels; kept in
# ~/.cache/rsim/python-envs/ or $RSIM_PYTHON_ENVS and only checked afterwards), then
# tools/hf_check.py drives a study through `rsim call` as an agent would (full SFT, LoRA, dev and
# test evaluations, a contaminated dataset, a drifted environment, reproduce, fsck, audit) and
# runs the same SFT spec bare; first, `rsim bench-step` checks the embedded trainer's PyTorch twin
# trains the same model. About 6 minutes on two cores once the environment is built.
#   RSIM_BIN=target/debug/rsim tools/hf.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rsim="${RSIM_BIN:-target/debug/rsim}"
work="${1:-test-output/hf}"
log() { echo "hf.sh: $*" >&2; }
python3 -m venv --help >/dev/null 2>&1 || {
  log "installing python3-venv"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
}
# Build (or check) the environment once, before the study exists: `rsim env build` reads only
# rsim.toml and the lock, here the example's own.
pre="$(mktemp -d)"
trap 'rm -rf "$pre"' EXIT
mkdir -p "$pre/env"
cp examples/hf-tiny/env/requirements.lock "$pre/env/"
sed -e 's/@[A-Z_]*SHA256@/0000000000000000000000000000000000000000000000000000000000000000/' \
  examples/hf-tiny/rsim.toml > "$pre/rsim.toml"
# The built environment is the cache kept between runs; pip's own copy of the wheels would add
# another ~3 GB of disk for nothing.
export PIP_NO_CACHE_DIR=1
start=$(date +%s)
"$rsim" -C "$pre" env build >&2
log "environment ready in $(( $(date +%s) - start )) s"
# The embedded trainer's PyTorch twin (rsim bench-step) must train the same model: from the same
# weights and batches its first losses agree with the embedded trainer's, or this fails. (Its times
# here are a debug build's: the benchmark's figures come from a release build, README.)
py="$("$rsim" -C "$pre" env run -- python3 -c 'import sys; print(sys.executable)')"
"$rsim" bench-step --python "$py" --steps 60 --warmup 10 --runs 1 --threads 1 >&2
python3 tools/hf_check.py "$rsim" "$work"
