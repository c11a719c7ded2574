#!/usr/bin/env bash
# One paired main-job-sized campaign, as the reviewer trials in README's Benchmarks ran them:
#   tools/paired.sh RSIM FAMILY SEED [DIR]
# makes a study of FAMILY (an `rsim init --example` name) at DIR (default: a fresh temporary
# directory) with the generator secret `printf pair-<FAMILY without tiny->-SEED | sha256sum`
# (its first 32 hex digits), so two builds given the same FAMILY and SEED train and evaluate on the
# same data, runs `rsim run --steps 600 --experiments 16 --seed SEED`, and prints one line:
#   FAMILY SEED TEST WALL_SECONDS
# (TEST: the promoted node's test score, or the base model's where nothing was promoted)
# The study is kept (its path goes to stderr); rsim's own log goes to DIR.log. PAIRED_RUN_FLAGS
# adds flags to the run (e.g. PAIRED_RUN_FLAGS=--lockstep, for a course that rests on the seed and
# the data alone).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 RSIM FAMILY SEED [DIR]" >&2
  exit 2
fi
rsim=$1 family=$2 seed=$3
case $seed in '' | *[!0-9]*) echo "$0: SEED must be a number, not '$seed'" >&2; exit 2 ;; esac
dir=${4:-$(mktemp -d)/study}
if [ -e "$dir" ]; then
  echo "$0: $dir exists; give a new directory" >&2
  exit 2
fi
secret=$(printf 'pair-%s-%s' "${family#tiny-}" "$seed" | sha256sum | cut -c1-32)
"$rsim" init "$dir" --example "$family" --generator-secret "$secret" >/dev/null 2>"$dir.log"
start=$(date +%s)
"$rsim" -C "$dir" --json run --steps 600 --experiments 16 --seed "$seed" ${PAIRED_RUN_FLAGS:-} >"$dir.json" 2>>"$dir.log"
wall=$(($(date +%s) - start))
# The promoted node's test score; where the campaign promoted nothing (no node beat the base
# model), the base model's, which then stands; `refused` where a promoted node's was refused.
test=$(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
t = s["test"] if s["test"] is not None else (s["base_test"] if s["best_node"] is None else None)
print("refused" if t is None else t)' "$dir.json")
echo "study: $dir" >&2
echo "$family $seed $test $wall"
