"""GPU SFT recipe for rsim (transformers + peft): the same job spec as `rsim job train`.

    python3 tools/recipes/sft.py [--check-spec] SPEC.json

Loads the base checkpoint (a transformers causal LM directory with `rsim_vocab` in config.json),
fine-tunes it on the spec's datasets with answer-only loss, AdamW, warmup + constant/linear/cosine,
full fine-tuning or LoRA adapters (merged before saving, so the checkpoint stays a plain model),
and writes out/checkpoint/ and out/metrics.json. Progress goes to stderr (the job log).
"""
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from common import CharTokenizer, fail, out_dir, read_rows, spec_from_argv


def lr_at(schedule: str, base: float, step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return base * {"constant": 1.0, "linear": 1.0 - t, "cosine": 0.5 * (1 + math.cos(math.pi * t))}[schedule]


def save_checkpoint(model, ck: Path, tok, spec: dict) -> None:
    """A whole checkpoint rsim can store: the weights and a config naming the vocabulary and base."""
    model.save_pretrained(ck)
    saved = json.loads((ck / "config.json").read_text())
    saved["rsim_vocab"] = tok.vocab
    saved["rsim_base"] = spec["base"]["sha256"]
    (ck / "config.json").write_text(json.dumps(saved, indent=2))


def main() -> None:
    spec_path, spec, check = spec_from_argv(sys.argv[1:], "sft", "sft.py")
    if check:
        print("spec ok")
        return
    import torch
    from transformers import AutoModelForCausalLM

    h = spec["hyper"]
    random.seed(h["seed"])
    torch.manual_seed(h["seed"])
    files = spec["base"]["files"]
    # Files of a checkpoint live in rsim's object store under their hashes: link them under their names.
    # (in a temporary folder: a sandboxed job writes only out/, its home and its TMPDIR)
    work = Path(tempfile.mkdtemp(prefix="base-"))
    for name, path in files.items():
        (work / name).unlink(missing_ok=True)
        (work / name).symlink_to(Path(path).resolve())
    config = json.loads((work / "config.json").read_text())
    tok = CharTokenizer(config.get("rsim_vocab"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(work).to(device)
    if h["adapter"]["kind"] == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=h["adapter"]["rank"], lora_alpha=h["adapter"]["alpha"], target_modules=["c_attn", "c_proj", "c_fc"],
                          fan_in_fan_out=True, task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    rows = [r for d in spec["datasets"] for r in read_rows(d["path"])]
    ctx = config.get("n_positions", 48)
    enc = []
    for r in rows:
        p, a = tok.encode(r["prompt"]), tok.encode(r["answer"]) + [0]
        if len(p) + len(a) > ctx:
            fail(f"row {r['prompt']!r} is longer than the model's context ({ctx})")
        enc.append((p, a))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=h["learning_rate"], weight_decay=0.0)
    steps, bs = h["steps"], h["batch_size"]
    model.train()
    start = time.time()
    last = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(h["schedule"], h["learning_rate"], step, steps, h["warmup_steps"])
        batch = [enc[random.randrange(len(enc))] for _ in range(bs)]
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.zeros((bs, width), dtype=torch.long)
        labels = torch.full((bs, width), -100, dtype=torch.long)
        attn = torch.zeros((bs, width), dtype=torch.long)
        for i, (p, a) in enumerate(batch):
            seq = p + a
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
            first = len(p) if h["answer_only_loss"] else 1
            labels[i, first : len(seq)] = torch.tensor(seq[first:])
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device), labels=labels.to(device))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        last = (last + [out.loss.item()])[-20:]
        if (step + 1) % 50 == 0 or step + 1 == steps:
            # The mean of the last 20 steps, as rsim's embedded trainer logs it: the learning curve.
            print(f"step {step + 1}/{steps} loss {sum(last) / len(last):.4f}", file=sys.stderr, flush=True)
        if h["save_every"] and (step + 1) % h["save_every"] == 0 and step + 1 < steps:
            save_checkpoint(model, out_dir(spec_path) / "steps" / str(step + 1), tok, spec)
    if device == "cuda":
        torch.cuda.synchronize()
    secs = max(time.time() - start, 1e-9)
    if h["adapter"]["kind"] == "lora":
        model = model.merge_and_unload()
    out = out_dir(spec_path)
    save_checkpoint(model, out / "checkpoint", tok, spec)
    metrics = {"final_loss": sum(last) / max(1, len(last)), "steps_per_s": steps / secs,
               "tokens_per_s": steps * bs * ctx / secs, "rows": float(len(rows))}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(json.dumps({"device": device, **metrics}), file=sys.stderr)


if __name__ == "__main__":
    main()
