"""Shared by the GPU recipes: the rsim job protocol, a character tokenizer, answer parsing.

The recipes take exactly the job spec rsim's runner writes for its embedded trainer and evaluator
(the spec path is the last argument; outputs go to out/ beside it: out/checkpoint/ and
out/metrics.json for training, out/result.json for evaluation; progress lines `step k/n loss x`
on stderr), so a study can switch between the embedded CPU jobs and these GPU jobs by changing
`[jobs]` in rsim.toml. The protocol is rsim's `src/jobs/protocol.rs` (JSON Schemas in
`schemas/jobs/`). Nothing here imports torch, so `--check-spec` works on machines without it (CI).
"""
import json
import os
import sys
from pathlib import Path

VOCAB = "\n0123456789+-=|,r "


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


# The job protocol, exactly: rsim's `src/jobs/protocol.rs`, published as the JSON Schema
# `schemas/jobs/spec.json` (a test checks these field sets against it). Every field is required
# and no other is allowed, so a spec rsim writes and what the recipes read cannot drift apart.
SPEC_FIELDS = {
    "sft": {"kind", "job", "node", "base", "datasets", "hyper"},
    "evaluate": {"kind", "job", "checkpoint", "task", "split", "metric", "eval_set"},
}
CHECKPOINT_FIELDS = {"sha256", "files"}
DATASET_FIELDS = {"name", "sha256", "rows", "path"}
# `shards`: how many pieces rsim's embedded trainer splits a batch into; the whole batch's update
# either way, so these recipes, which train the batch whole, check it and ignore it.
HYPER_FIELDS = {"learning_rate", "steps", "batch_size", "warmup_steps", "schedule", "adapter",
                "answer_only_loss", "seed", "save_every", "shards"}
ADAPTER_FIELDS = {"full": {"kind"}, "lora": {"kind", "rank", "alpha"}}
SCHEDULES = ("constant", "linear", "cosine")
SPLITS = ("dev", "test")


def spec_from_argv(argv: list, kind: str, usage: str) -> tuple:
    """`[--check-spec] SPEC.json` → (spec path, spec, whether only to check it)."""
    check = "--check-spec" in argv
    rest = [a for a in argv if a != "--check-spec"]
    if len(rest) != 1:
        fail(f"usage: {usage} [--check-spec] SPEC.json")
    return rest[0], load_spec(rest[0], kind), check


def _fields(path: str, what: str, obj, want: set) -> dict:
    if not isinstance(obj, dict):
        fail(f"{path}: {what} is not an object")
    missing, unknown = sorted(want - obj.keys()), sorted(obj.keys() - want)
    if missing:
        fail(f"{path}: {what} has no {missing[0]!r}")
    if unknown:
        fail(f"{path}: {what} has unknown field {unknown[0]!r} (this recipe reads {sorted(want)})")
    return obj


def _int(v, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _str(v) -> bool:
    return isinstance(v, str) and v != ""


def _checkpoint(path: str, what: str, ck) -> None:
    _fields(path, what, ck, CHECKPOINT_FIELDS)
    if not _str(ck["sha256"]) or not isinstance(ck["files"], dict):
        fail(f"{path}: {what} needs a sha256 and a files object")
    if not all(_str(p) for p in ck["files"].values()):
        fail(f"{path}: {what} files must map names to paths")
    if "config.json" not in ck["files"]:
        fail(f"{path}: the checkpoint lists no config.json")


def _hyper(path: str, h) -> None:
    _fields(path, "hyper", h, HYPER_FIELDS)
    lr = h["learning_rate"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        fail(f"{path}: hyper learning_rate must be a positive number")
    for key, least in [("steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("seed", 0), ("save_every", 0),
                       ("shards", 1)]:
        if not _int(h[key], least):
            fail(f"{path}: hyper {key} must be an integer >= {least}")
    if h["schedule"] not in SCHEDULES:
        fail(f"{path}: hyper schedule must be one of {SCHEDULES}")
    if not isinstance(h["answer_only_loss"], bool):
        fail(f"{path}: hyper answer_only_loss must be true or false")
    a = h["adapter"]
    kind = a.get("kind") if isinstance(a, dict) else None
    if kind not in ADAPTER_FIELDS:
        fail(f"{path}: hyper adapter kind must be one of {sorted(ADAPTER_FIELDS)}")
    _fields(path, "hyper adapter", a, ADAPTER_FIELDS[kind])
    if kind == "lora" and not (_int(a["rank"], 1) and isinstance(a["alpha"], (int, float))):
        fail(f"{path}: a lora adapter needs an integer rank >= 1 and a number alpha")
    if kind == "lora" and h["save_every"] > 0:
        fail(f"{path}: save_every keeps whole checkpoints part-way through a run; it needs a full adapter")


def load_spec(path: str, kind: str) -> dict:
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read the job spec: {e}")
    if not isinstance(spec, dict) or spec.get("kind") != kind:
        got = spec.get("kind") if isinstance(spec, dict) else None
        fail(f"{path}: expected a {kind!r} job spec, got kind {got!r}")
    _fields(path, "the job spec", spec, SPEC_FIELDS[kind])
    if not _str(spec["job"]):
        fail(f"{path}: the job spec names no job")
    if kind == "sft":
        _checkpoint(path, "base", spec["base"])
        if not isinstance(spec["datasets"], list) or not spec["datasets"]:
            fail(f"{path}: datasets must be a non-empty list")
        for d in spec["datasets"]:
            _fields(path, "a dataset", d, DATASET_FIELDS)
            if not _str(d["path"]):
                fail(f"{path}: a dataset has no path")
        _hyper(path, spec["hyper"])
    else:
        _checkpoint(path, "checkpoint", spec["checkpoint"])
        if spec["split"] not in SPLITS:
            fail(f"{path}: split must be one of {SPLITS}")
        if not _str(spec["eval_set"]):
            fail(f"{path}: the job spec has no eval_set path")
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
