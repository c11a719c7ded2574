#!/usr/bin/env bash
# The main job on the embedded default: a tiny-arith study, driven through the same actions an
# agent uses. Builds rsim, creates the study in DIR (default: ./tiny-arith-study), opens two research
# directions, trains each with two seeds, compares them on the dev split, concludes, evaluates the
# winner once on the protected test split, and prints the DAG and the record.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-tiny-arith-study}"
cargo build --release --locked -q
rsim="$PWD/target/release/rsim"
if [ -e "$dir" ]; then echo "$dir exists; pass another directory" >&2; exit 2; fi

"$rsim" init "$dir" --example tiny-arith
r() { "$rsim" -C "$dir" "$@"; }
j() { "$rsim" -C "$dir" --json "$@"; }
field() { python3 -c "import json,sys; v=json.load(sys.stdin); print(eval('v'+sys.argv[1]))" "$1"; }

small=$(j branch --from n0 --title "Small data (2k problems)" --hypothesis "a few thousand problems are enough" | field "['node']")
large=$(j branch --from n0 --title "Large data (20k problems)" --hypothesis "coverage of the problem space drives accuracy" | field "['node']")
r call register_dataset "{\"node\":\"$small\",\"name\":\"add2-2k\",\"source\":{\"kind\":\"arith\",\"op\":\"add\",\"digits\":2,\"format\":\"plain\",\"n\":2000,\"seed\":11}}" >/dev/null
r call register_dataset "{\"node\":\"$large\",\"name\":\"add2-20k\",\"source\":{\"kind\":\"arith\",\"op\":\"add\",\"digits\":2,\"format\":\"plain\",\"n\":20000,\"seed\":12}}" >/dev/null

best_ck=""; best=-1
for node_ds in "$small:add2-2k" "$large:add2-20k"; do
  node=${node_ds%%:*}; ds=${node_ds#*:}
  for seed in 1 2; do
    ck=$(j run-sft --node "$node" --dataset "$ds" --steps 400 --batch-size 32 --seed "$seed" | field "['checkpoint']")
    em=$(j evaluate --node "$node" --checkpoint "$ck" --task add2 --split dev | field "['metrics']['exact_match']")
    echo "$node seed $seed: dev exact_match $em (checkpoint ${ck:0:12})"
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$em" "$best"; then best=$em; best_ck=$ck; best_node=$node; fi
  done
done
# Compare the two directions (recorded on n0), then conclude each direction with what the comparison measured (mean dev exact match over seeds).
j call compare "{\"node\":\"n0\",\"nodes\":[\"$small\",\"$large\"],\"task\":\"add2\"}" > "$dir/.rsim/last-compare.json"
python3 - "$dir/.rsim/last-compare.json" <<'PY' | while read -r node outcome findings; do
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
best = max(rows, key=lambda r: r["mean"])
for r in rows:
    ci = r.get("ci95") or [float("nan")] * 2
    print(f"{r['node']} {r['title']!r}: n={r['n']} mean={r['mean']:.3f} 95% [{ci[0]:.3f}, {ci[1]:.3f}]", file=sys.stderr)
for r in rows:
    outcome = "positive" if r is best else "negative"
    print(r["node"], outcome, f"mean dev exact_match {r['mean']:.3f} over {r['n']} seeds (best {r['best']:.3f}); {'the better' if r is best else 'the worse'} of the compared directions.")
PY
  r call conclude "{\"node\":\"$node\",\"outcome\":\"$outcome\",\"findings\":\"$findings\"}" >/dev/null
done
echo "protected test split, best dev checkpoint ${best_ck:0:12} (from $best_node):"
r evaluate --node n0 --checkpoint "$best_ck" --task add2 --split test
r dag
r log --limit 20
echo "The record is plain git: git -C $dir log --graph --all --oneline"
