"""GPU evaluation recipe for rsim: the same job spec as `rsim job eval`.

    python3 tools/recipes/eval.py [--check-spec] SPEC.json

Greedy decoding of every eval item with the checkpoint, exact match of the parsed final answer
(plain, reversed or scratchpad), written to out/result.json (rsim keeps per-item results only
for the visible dev split).
"""
import json
import sys
import tempfile
from pathlib import Path

from common import CharTokenizer, out_dir, parse_answer, read_rows, spec_from_argv


def main() -> None:
    spec_path, spec, check = spec_from_argv(sys.argv[1:], "evaluate", "eval.py")
    if check:
        print("spec ok")
        return
    import torch
    from transformers import AutoModelForCausalLM

    # (in a temporary folder: a sandboxed job writes only out/, its home and its TMPDIR)
    work = Path(tempfile.mkdtemp(prefix="model-"))
    for name, path in spec["checkpoint"]["files"].items():
        (work / name).unlink(missing_ok=True)
        (work / name).symlink_to(Path(path).resolve())
    config = json.loads((work / "config.json").read_text())
    tok = CharTokenizer(config.get("rsim_vocab"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(work).to(device).eval()
    ctx = config.get("n_positions", 48)
    items = read_rows(spec["eval_set"])
    results, correct = [], 0
    by_len = {}
    for i, it in enumerate(items):
        by_len.setdefault(len(it["prompt"]), []).append(i)
    outputs = [""] * len(items)
    with torch.no_grad():
        for length, idx in by_len.items():
            ids = torch.tensor([tok.encode(items[i]["prompt"]) for i in idx], device=device)
            done = torch.zeros(len(idx), dtype=torch.bool, device=device)
            gen = []
            while ids.shape[1] < ctx and not bool(done.all()):
                nxt = model(input_ids=ids).logits[:, -1, :].argmax(-1)
                gen.append(nxt)
                done |= nxt == 0
                ids = torch.cat([ids, nxt[:, None]], dim=1)
            for k, i in enumerate(idx):
                toks = []
                for step in gen:
                    t = int(step[k])
                    if t == 0:
                        break
                    toks.append(t)
                outputs[i] = tok.decode(toks)
    for it, output in zip(items, outputs):
        ok = parse_answer(output) == parse_answer(it["answer"])
        correct += ok
        results.append({"prompt": it["prompt"], "expected": it["answer"], "output": output, "correct": ok})
    out = out_dir(spec_path)
    result = {"metrics": {"exact_match": correct / max(1, len(items))}, "n_items": len(items), "items": results}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({"device": device, "exact_match": result["metrics"]["exact_match"]}), file=sys.stderr)


if __name__ == "__main__":
    main()
