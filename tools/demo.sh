#!/usr/bin/env bash
# The main job on the embedded default: a research campaign on examples/tiny-arith (a pretrained
# ~105k-parameter transformer, three-digit addition, protected test split). Builds rsim, creates
# the study in DIR (default: ./tiny-arith-study), and runs `rsim run`: built-in Workers explore
# answer formats and training recipes, built-in Reviewers compare the evidence (mean ± 95% interval
# over seeds), give verdicts and grow the research DAG, the lock-in guard keeps exploration open,
# and the reviewer-promoted best checkpoint is scored once on the protected test split. Prints the
# report (also written as DIR/report.html) and the record as git shows it. Running it again on the
# same DIR resumes an interrupted campaign, or just reports a finished one.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-tiny-arith-study}"
cargo build --release --locked -q
rsim="$PWD/target/release/rsim"
mkdir -p "$(dirname "$dir")"
"$rsim" run examples/tiny-arith --into "$dir" --steps 600 --experiments 16 --html "$dir.report.html"
echo
echo "The record is plain git (git -C $dir log --graph --all --oneline):"
git -C "$dir" log --graph --all --oneline --max-count=40
