"""Shared by the GPU recipes: the rsim job-spec contract, a character tokenizer, answer parsing.

The recipes take exactly the job spec rsim's runner writes for its embedded trainer and evaluator
(the spec path is the last argument; outputs go to out/ beside it), so a study can switch between
the embedded CPU jobs and these GPU jobs by changing `[jobs]` in rsim.toml. Nothing here imports
torch, so `--check-spec` works on machines without it (CI).
"""
import json
import os
import sys
from pathlib import Path

VOCAB = "\n0123456789+-=|,r "


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def spec_from_argv(argv: list, kind: str, usage: str) -> tuple:
    """`[--check-spec] SPEC.json` → (spec path, spec, whether only to check it)."""
    check = "--check-spec" in argv
    rest = [a for a in argv if a != "--check-spec"]
    if len(rest) != 1:
        fail(f"usage: {usage} [--check-spec] SPEC.json")
    return rest[0], load_spec(rest[0], kind), check


def load_spec(path: str, kind: str) -> dict:
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read the job spec: {e}")
    if spec.get("kind") != kind:
        fail(f"{path}: expected a {kind!r} job spec, got kind {spec.get('kind')!r}")
    need = {"sft": ["job", "base", "datasets", "hyper"], "evaluate": ["job", "checkpoint", "task", "split", "eval_set"]}[kind]
    for key in need:
        if key not in spec:
            fail(f"{path}: the job spec has no {key!r}")
    ck = spec["base"] if kind == "sft" else spec["checkpoint"]
    if not isinstance(ck.get("files"), dict) or "config.json" not in ck["files"]:
        fail(f"{path}: the checkpoint lists no config.json")
    if kind == "sft":
        h = spec["hyper"]
        for key in ["learning_rate", "steps", "batch_size", "seed", "schedule", "adapter", "answer_only_loss"]:
            if key not in h:
                fail(f"{path}: hyper has no {key!r}")
        for d in spec["datasets"]:
            if "path" not in d:
                fail(f"{path}: a dataset has no path")
    return spec


def out_dir(spec_path: str) -> Path:
    out = Path(os.environ.get("RSIM_JOB_OUT") or Path(spec_path).parent / "out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def read_rows(path: str) -> list:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                r = json.loads(line)
                if "prompt" not in r or "answer" not in r:
                    fail(f"{path}: line {n} has no prompt/answer")
                rows.append(r)
    return rows


def parse_answer(output: str) -> str:
    """Same rule as rsim's evaluator: scratchpad `...|579`, reversed `r975`, plain `579`."""
    out = output.strip()
    if "|" in out:
        return out.rsplit("|", 1)[1].strip()
    if out.startswith("r"):
        return out[1:][::-1]
    return out


class CharTokenizer:
    def __init__(self, vocab: str = VOCAB):
        self.vocab = vocab
        self.index = {c: i for i, c in enumerate(vocab)}

    def encode(self, text: str) -> list:
        try:
            return [self.index[c] for c in text]
        except KeyError as e:
            fail(f"character {e.args[0]!r} is not in the model's vocabulary")

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)
