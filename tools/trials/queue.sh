#!/usr/bin/env bash
# Run a plan of trial work one item at a time, resuming where a stopped run left off:
#   tools/trials/queue.sh PLAN RESULTS_DIR SCRATCH_DIR
# Each PLAN line (blank lines and `#` comments skipped) is one of
#   campaign TAG FAMILY SEED
#       tools/paired.sh with the binary SCRATCH_DIR/bin/rsim-TAG; appends
#       `TAG FAMILY SEED TEST WALL_SECONDS` to RESULTS_DIR/TAG.tsv (TEST is FAILED where the
#       campaign failed; its log is kept beside its study).
#   table TAG FAMILY EXPERIMENTS STEPS SEEDS [STRATEGY [DATA_FROM]]
#       `rsim bench-strategies --oracle --json` with that binary; writes
#       RESULTS_DIR/TAG-FAMILY-EXPERIMENTS-STEPS.json and appends
#       `TAG table FAMILY EXPERIMENTS STEPS SEEDS WALL_SECONDS` (or `... FAILED`) to TAG.tsv.
#       With STRATEGY, that strategy alone (`--strategy`, no oracle); with DATA_FROM (a table's
#       directory under SCRATCH_DIR/studies), its per-seed generator secrets are copied first, so
#       the campaigns train and are scored on that table's data, seed for seed.
#   wait FILE COUNT
#       waits until RESULTS_DIR/FILE holds COUNT lines (another queue's work comes first).
# An item is done when its line is in its results file; a line is appended only once the item
# has finished, so a queue stopped part-way (a session's end) skips what it finished and starts
# the campaign it was in again; a table goes on from its studies (bench-strategies --dir resumes
# the campaigns it finds there). Studies and logs go to SCRATCH_DIR/studies. Results files are
# written, never read, by this script beyond matching an item's first fields: a trial is read
# once, when all of it has run (TRIAL-*.md).
# Several queues may run one plan at once (two cores, two queues): each item is held under an
# flock on SCRATCH_DIR/studies/ITEM.lock while it runs, a queue skips an item another queue holds,
# and a queue writes PLAN.done only once every item of the plan has its line (it waits on the
# items others hold). The kernel lets a lock go when its queue dies, so nothing stale is left.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 PLAN RESULTS_DIR SCRATCH_DIR" >&2
  exit 2
fi
plan=$1 results=$2 scratch=$3
paired=$(cd "$(dirname "$0")/.." && pwd)/paired.sh
[ -x "$paired" ] || { echo "$0: $paired is missing" >&2; exit 2; }
mkdir -p "$results" "$scratch/studies"
# Whether RESULTS_DIR/FILE has a line starting with the given fields.
has() { [ -f "$results/$1" ] && grep -q -- "^$2 " "$results/$1"; }
# Takes the item's lock on fd 9 (without waiting unless $1 is `wait`); fails where another queue
# holds it. The lock goes with fd 9, closed by `unlock` or by this queue's death.
lock() {
  exec 9>"$scratch/studies/$2.lock"
  if [ "$1" = wait ]; then flock 9; else flock -n 9 || { exec 9>&-; return 1; }; fi
}
unlock() { exec 9>&-; }
# Every binary the plan names must be there before anything runs.
for tag in $(awk '$1 == "campaign" || $1 == "table" {print $2}' "$plan" | sort -u); do
  [ -x "$scratch/bin/rsim-$tag" ] || { echo "$0: $scratch/bin/rsim-$tag is missing" >&2; exit 2; }
done
# One pass over the plan: runs what is neither done nor held by another queue; with mode=wait,
# waits for each held item instead (another queue finishing it, or this one running it where
# that queue died).
pass() {
n=0
while read -r kind a b c d e f g <&3; do
  n=$((n + 1))
  case $kind in
    '' | '#'*) continue ;;
    campaign)
      tag=$a family=$b seed=$c
      has "$tag.tsv" "$tag $family $seed" && continue
      lock "${mode:-}" "$tag-$family-$seed" || continue
      # Another queue may have finished it between the check and the lock.
      has "$tag.tsv" "$tag $family $seed" && { unlock; continue; }
      dir=$scratch/studies/$tag-$family-$seed
      rm -rf "$dir" "$dir.log" "$dir.json"
      start=$(date +%s)
      if line=$("$paired" "$scratch/bin/rsim-$tag" "$family" "$seed" "$dir" 2>>"$scratch/studies/$tag.err" </dev/null); then
        echo "$tag $line" >>"$results/$tag.tsv"
      else
        echo "$tag $family $seed FAILED $(($(date +%s) - start))" >>"$results/$tag.tsv"
      fi
      unlock
      ;;
    table)
      tag=$a family=$b experiments=$c steps=$d seeds=$e
      key="$tag table $family $experiments $steps $seeds"
      has "$tag.tsv" "$key" && continue
      lock "${mode:-}" "$tag-table-$family-$experiments-$steps" || continue
      has "$tag.tsv" "$key" && { unlock; continue; }
      dir=$scratch/studies/$tag-table-$family-$experiments-$steps
      out=$results/$tag-$family-$experiments-$steps.json
      which=(--oracle)
      [ -n "$f" ] && which=(--strategy "$f")
      if [ -n "$g" ] && ! compgen -G "$dir/secret-*" >/dev/null; then
        mkdir -p "$dir"
        cp "$scratch/studies/$g"/secret-* "$dir/"
      fi
      start=$(date +%s)
      if "$scratch/bin/rsim-$tag" --json bench-strategies --example "$family" --seeds "$seeds" \
        --experiments "$experiments" --steps "$steps" "${which[@]}" --dir "$dir" \
        >"$out.part" 2>>"$dir.log" </dev/null; then
        mv "$out.part" "$out"
        echo "$key $(($(date +%s) - start))" >>"$results/$tag.tsv"
      else
        echo "$key FAILED $(($(date +%s) - start))" >>"$results/$tag.tsv"
      fi
      unlock
      ;;
    wait)
      until [ -f "$results/$a" ] && [ "$(wc -l <"$results/$a")" -ge "$b" ]; do sleep 60; done
      ;;
    *)
      echo "$plan:$n: unknown item '$kind' (campaign, table or wait)" >&2
      exit 2
      ;;
  esac
done 3<"$plan"
}
mode='' pass
mode=wait pass
echo "DONE $(date -u +%FT%TZ)" >>"$results/$(basename "$plan" .plan).done"
