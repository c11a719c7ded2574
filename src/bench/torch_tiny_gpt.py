# The embedded trainer's model written in PyTorch, for `rsim bench-step`: the same tiny-gpt
# (learned token and position embeddings, pre-norm blocks of causal self-attention and a ReLU
# MLP, a final norm and an unbiased head), started from the same weights, trained on the same
# batches (padded to their longest row, answer-only loss) with AdamW at a constant learning rate.
# Written the way a PyTorch user writes it: F.layer_norm, scaled_dot_product_attention,
# cross_entropy, torch.optim.AdamW. Prints one JSON line like `rsim job step-bench`.
#   python3 torch_tiny_gpt.py SPEC THREADS
import json
import os
import struct
import sys
import time

threads = int(sys.argv[2])
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(threads)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(threads)
torch.set_num_interop_threads(1)


def load_safetensors(path):
    """The checkpoint's tensors (f32 only), read without the safetensors package."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = memoryview(data)[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}, not F32")
        a, b = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(body[a:b]), dtype=torch.float32).reshape(t["shape"])
    return out


spec = json.load(open(sys.argv[1]))
init = spec["init"]
config = json.load(open(os.path.join(init, "config.json")))
vocab = {c: i for i, c in enumerate(config["vocab"])}
d, heads, layers = config["d_model"], config["n_heads"], config["n_layers"]
params = {k: v.clone().requires_grad_(True) for k, v in load_safetensors(os.path.join(init, "model.safetensors")).items()}
rows = [json.loads(line) for line in open(spec["rows"]) if line.strip()]
opt = torch.optim.AdamW(params.values(), lr=spec["learning_rate"], weight_decay=0.0)


def batch(picked):
    """ids, next-token targets and the answer-only mask, padded to the longest row."""
    encoded = []
    for r in picked:
        text = r["prompt"] + r["answer"]
        encoded.append((len(r["prompt"]), [vocab[c] for c in text] + [0]))
    t = max(len(a) - 1 for _, a in encoded)
    ids, tgt, mask = [], [], []
    for p, a in encoded:
        for i in range(t):
            ids.append(a[i] if i < len(a) else 0)
            tgt.append(a[i + 1] if i + 1 < len(a) else 0)
            mask.append(1.0 if i + 1 < len(a) and i + 1 >= p else 0.0)
    n = len(picked)
    return torch.tensor(ids).view(n, t), torch.tensor(tgt), torch.tensor(mask)


def loss_of(ids, tgt, mask):
    b, t = ids.shape
    w = params
    x = w["tok_emb"][ids] + w["pos_emb"][:t]
    for l in range(layers):
        g = lambda n: w[f"h{l}.{n}"]  # noqa: E731
        a = F.layer_norm(x, (d,), g("ln1_g"), g("ln1_b"), 1e-5)
        q, k, v = (a @ g("qkv_w") + g("qkv_b")).split(d, dim=2)
        q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + y.transpose(1, 2).reshape(b, t, d) @ g("proj_w") + g("proj_b")
        m = F.layer_norm(x, (d,), g("ln2_g"), g("ln2_b"), 1e-5)
        x = x + torch.relu(m @ g("fc_w") + g("fc_b")) @ g("out_w") + g("out_b")
    x = F.layer_norm(x, (d,), w["lnf_g"], w["lnf_b"], 1e-5)
    logits = (x @ w["head_w"]).view(b * t, -1)
    per = F.cross_entropy(logits, tgt, reduction="none")
    return (per * mask).sum() / mask.sum().clamp(min=1.0)


curve, recent, first, clock = [], [], [], None
for step, idx in enumerate(spec["batches"][: spec["steps"]], start=1):
    loss = loss_of(*batch([rows[i] for i in idx]))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    recent = (recent + [loss.item()])[-20:]
    if step <= 5:
        first.append(recent[-1])
    if step % 50 == 0 or step == spec["steps"]:
        curve.append([step, sum(recent) / len(recent)])
    if step == spec["warmup_steps"]:
        clock = time.perf_counter()
timed = time.perf_counter() - clock
print(json.dumps({
    "trainer": "pytorch",
    "threads": threads,
    "ms_per_step": 1e3 * timed / (spec["steps"] - spec["warmup_steps"]),
    "curve": curve,
    "first_losses": first,
    "torch": torch.__version__,
}))
