"""Build a randomly initialised causal LM from a config (no downloads) as an rsim base checkpoint.

    python3 tools/recipes/init_model.py --out models/base [--layers 2 --width 64 --heads 4 --context 48 --seed 0]
"""
import argparse
import json
from pathlib import Path

from common import VOCAB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(a.seed)
    cfg = GPT2Config(vocab_size=len(VOCAB), n_positions=a.context, n_embd=a.width, n_layer=a.layers, n_head=a.heads,
                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = GPT2LMHeadModel(cfg)
    out = Path(a.out)
    model.save_pretrained(out)
    conf = json.loads((out / "config.json").read_text())
    conf["rsim_vocab"] = VOCAB
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "out": str(out)}))


if __name__ == "__main__":
    main()
