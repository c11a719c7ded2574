#!/usr/bin/env bash
# Run the GPU recipes once, end to end, on a randomly initialised model built from a config (no
# downloads): build a base model, write rsim job specs exactly as rsim's runner does, fine-tune it
# fully and with LoRA on three-digit addition, evaluate both on a dev set, and print the figures.
# Needs python3 with torch, transformers and peft (and a GPU to be interesting).
#   tools/recipes/gpu_check.sh [OUT_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-${OUT:-gpu-check-out}}"
work="$(mktemp -d)"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee "$out/versions.txt"
python3 "$here/init_model.py" --out "$work/base" --layers 4 --width 256 --heads 4 --context 48 --seed 0 | tee "$out/base.json"
python3 - "$work" <<'PY'
import json, random, sys
from pathlib import Path
w = Path(sys.argv[1])
def rows(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        out.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return out
(w / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(20000, 1)))
(w / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(500, 2)))
base = {"sha256": "0" * 64, "files": {p.name: str(p) for p in (w / "base").iterdir() if p.is_file()}}
for name, adapter, lr in [("full", {"kind": "full"}, 1e-3), ("lora", {"kind": "lora", "rank": 16, "alpha": 32.0}, 3e-3)]:
    d = w / f"sft-{name}"; d.mkdir()
    spec = {"kind": "sft", "job": f"j-{name}", "node": "n1", "base": base,
            "datasets": [{"name": "add3", "sha256": "0" * 64, "rows": 20000, "path": str(w / "train.jsonl")}],
            "hyper": {"learning_rate": lr, "steps": 2000,
                      "batch_size": 64, "warmup_steps": 100, "schedule": "cosine", "adapter": adapter,
                      "answer_only_loss": True, "seed": 1}}
    (d / "spec.json").write_text(json.dumps(spec, indent=2))
PY
for name in full lora; do
  start=$(date +%s.%N)
  python3 "$here/sft.py" "$work/sft-$name/spec.json" 2> "$out/sft-$name.log"
  end=$(date +%s.%N)
  echo "sft-$name wall $(python3 -c "print(round($end-$start,1))") s: $(cat "$work/sft-$name/out/metrics.json" | tr -d '\n ')" | tee -a "$out/summary.txt"
  python3 - "$work" "$name" <<'PY'
import json, sys
from pathlib import Path
w, name = Path(sys.argv[1]), sys.argv[2]
ck = w / f"sft-{name}" / "out" / "checkpoint"
d = w / f"eval-{name}"; d.mkdir()
spec = {"kind": "evaluate", "job": f"j-eval-{name}", "checkpoint": {"sha256": "0" * 64, "files": {p.name: str(p) for p in ck.iterdir()}},
        "task": "add3", "split": "dev", "metric": "exact_match", "eval_set": str(w / "dev.jsonl")}
(d / "spec.json").write_text(json.dumps(spec, indent=2))
PY
  start=$(date +%s.%N)
  python3 "$here/eval.py" "$work/eval-$name/spec.json" 2> "$out/eval-$name.log"
  end=$(date +%s.%N)
  echo "eval-$name wall $(python3 -c "print(round($end-$start,1))") s: $(python3 -c "import json; r=json.load(open('$work/eval-$name/out/result.json')); print(r['metrics'], r['n_items'], 'items')")" | tee -a "$out/summary.txt"
done
tail -n 3 "$out/sft-full.log" "$out/sft-lora.log"
rm -rf "$work"
