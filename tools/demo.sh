#!/usr/bin/env bash
# The main job on the embedded default: a tiny-arith study (a pretrained ~105k-parameter
# transformer, three-digit addition, protected test split), driven through the same actions an
# agent uses. Builds rsim, creates the study in DIR (default: ./tiny-arith-study), opens three
# research directions (answer formats), trains each with two seeds at equal compute, compares them
# on the dev split, concludes each with what it measured, evaluates the best checkpoint once on the
# protected test split, and prints the DAG, the record and the audit. ~5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-tiny-arith-study}"
steps="${RSIM_DEMO_STEPS:-600}"
cargo build --release --locked -q
rsim="$PWD/target/release/rsim"
if [ -e "$dir" ]; then echo "$dir exists; pass another directory" >&2; exit 2; fi

"$rsim" init "$dir" --example tiny-arith
r() { "$rsim" -C "$dir" "$@"; }
j() { "$rsim" -C "$dir" --json "$@"; }
field() { python3 -c "import json,sys; v=json.load(sys.stdin); print(eval('v'+sys.argv[1]))" "$1"; }

nodes=()
for fmt in plain reversed scratchpad; do
  node=$(j branch --from n0 --title "Answer format: $fmt" --hypothesis "the $fmt answer format makes carries easier to learn" | field "['node']")
  r call register_dataset "{\"node\":\"$node\",\"name\":\"add3-$fmt\",\"source\":{\"kind\":\"arith\",\"op\":\"add\",\"digits\":3,\"format\":\"$fmt\",\"n\":20000,\"seed\":1}}" >/dev/null
  nodes+=("$node:$fmt")
done

best_ck=""; best=-1; best_node=""
for node_fmt in "${nodes[@]}"; do
  node=${node_fmt%%:*}; fmt=${node_fmt#*:}
  for seed in 1 2; do
    ck=$(j run-sft --node "$node" --dataset "add3-$fmt" --steps "$steps" --batch-size 32 --lr 0.003 --seed "$seed" | field "['checkpoint']")
    em=$(j evaluate --node "$node" --checkpoint "$ck" --task add3 --split dev | field "['metrics']['exact_match']")
    echo "$node ($fmt) seed $seed: dev exact_match $em (checkpoint ${ck:0:12})"
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$em" "$best"; then best=$em; best_ck=$ck; best_node=$node; fi
  done
done

# Compare the directions (recorded on n0), then conclude each with what the comparison measured.
ids=$(printf '"%s",' "${nodes[@]%%:*}"); ids="[${ids%,}]"
j call compare "{\"node\":\"n0\",\"nodes\":$ids,\"task\":\"add3\"}" > "$dir/.rsim/last-compare.json"
python3 - "$dir/.rsim/last-compare.json" <<'PY' | while read -r node outcome findings; do
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
best = max(rows, key=lambda r: r["mean"])
for r in rows:
    ci = r.get("ci95") or [float("nan")] * 2
    print(f"{r['node']} {r['title']!r}: n={r['n']} mean={r['mean']:.3f} 95% [{ci[0]:.3f}, {ci[1]:.3f}]", file=sys.stderr)
for r in rows:
    outcome = "positive" if r is best else "negative"
    print(r["node"], outcome, f"mean dev exact_match {r['mean']:.3f} over {r['n']} seeds (best {r['best']:.3f}); {'the best' if r is best else 'not the best'} of the compared answer formats.")
PY
  r call conclude "{\"node\":\"$node\",\"outcome\":\"$outcome\",\"findings\":\"$findings\"}" >/dev/null
done
echo "protected test split, best dev checkpoint ${best_ck:0:12} (from $best_node):"
r evaluate --node n0 --checkpoint "$best_ck" --task add3 --split test
r dag
r log --limit 25
r audit
echo "The record is plain git: git -C $dir log --graph --all --oneline"
