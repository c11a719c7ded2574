"""The transformers path through rsim, end to end, as an agent drives it (`rsim call`): the
hf-tiny example (a small GPT-2 made locally, the transformers + peft recipes, a Python
environment pinned by a lockfile), full SFT and LoRA, dev and test evaluations (the tripwire
included), a contaminated dataset refused, an environment that drifted from its lock refused,
reproduce, fsck and audit clean; then the same SFT spec run bare, for what the harness costs.

    python3 tools/hf_check.py RSIM_BIN WORK_DIR

Run by tools/hf.sh (which builds the environment into the cache first). Prints a summary and
writes WORK_DIR/summary.json; exits non-zero on the first thing that is not as it should be.
"""
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# One full-SFT job of about a minute on one core (tools/recipes/tune_notes.md).
FULL = {"learning_rate": 1e-3, "steps": 1000, "batch_size": 64, "warmup_steps": 50, "schedule": "cosine"}
LORA = {"learning_rate": 2e-3, "steps": 600, "batch_size": 64, "warmup_steps": 50, "schedule": "cosine",
        "adapter": {"kind": "lora", "rank": 16, "alpha": 32.0}}
# Rounds of the harness-cost benchmark at the end (0: none; tools/test.sh runs none: a benchmark's
# figure from a CI run's busy cores says little, and one round is two minutes of full SFT).
RATIO_RUNS = max(0, int(os.environ.get("HF_RATIO_RUNS", "1")))


def fail(msg: str) -> None:
    print(f"hf_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


class Rsim:
    def __init__(self, bin_: str, study: Path):
        self.bin, self.study = bin_, study

    def run(self, *args, ok=True, **kw):
        p = subprocess.run([self.bin, "-C", str(self.study), *args], capture_output=True, text=True, **kw)
        if ok and p.returncode != 0:
            fail(f"rsim {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        return p

    def call(self, action: str, req: dict, ok=True, role="worker"):
        t = time.time()
        p = self.run("--agent", f"hf-{role}", "--role", role, "call", action, "-", input=json.dumps(req), ok=ok)
        took = time.time() - t
        print(f"hf_check: {action} {req.get('node', '')} {'ok' if p.returncode == 0 else 'refused'} "
              f"in {took:.1f} s", file=sys.stderr, flush=True)
        out = json.loads(p.stdout) if p.returncode == 0 else None
        return out, p, took


def falls(sft: dict, what: str) -> None:
    """The recorded learning curve (the recipe's progress lines, parsed by rsim) goes down."""
    # Uniform guessing over the 18-character vocabulary costs ln 18 = 2.89 per token.
    curve = [p["loss"] for p in sft.get("curve", [])]
    if len(curve) < 5 or not (curve[-1] < curve[0] and curve[-1] < 0.6 * math.log(18)):
        fail(f"the {what} run's recorded learning curve does not fall: {curve}")


def main() -> None:
    rsim_bin, work = sys.argv[1], Path(sys.argv[2])
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    study = work / "study"
    times = {}
    t = time.time()
    p = subprocess.run([rsim_bin, "init", "--example", "hf-tiny", str(study)], capture_output=True, text=True)
    times["init"] = time.time() - t
    if p.returncode != 0:
        fail(f"rsim init --example hf-tiny: {p.stderr.strip()[-3000:]}")
    r = Rsim(rsim_bin, study)
    env = json.loads(r.run("env", "check", "--json").stdout)["env"]
    if not (env.startswith("python lock=env/requirements.lock@") and " torch=2.15.0" in env
            and " transformers=5.23.0" in env and " peft=0.21.2" in env):
        fail(f"the environment label names the lock, interpreter and versions: {env}")

    r.call("branch", {"parents": ["n0"], "title": "Full SFT on reversed sums"})
    reg, _, times["register_dataset"] = r.call("register_dataset", {
        "node": "n1", "name": "rev",
        "source": {"kind": "arith", "op": "add", "digits": 2, "format": "reversed", "n": 8000, "seed": 1}})
    if reg["rows"] != 8000:
        fail(f"register_dataset: {reg}")
    # The gate on this path too: the protected test split's items, handed in as training rows.
    test_rows = [json.loads(l) for l in (study / ".rsim/protected/add2/test.jsonl").read_text().splitlines() if l]
    _, p, _ = r.call("register_dataset", {"node": "n1", "name": "leak",
                                         "source": {"kind": "inline", "rows": test_rows[:300]}}, ok=False)
    if p.returncode == 0 or "policy rule contamination" not in p.stderr:
        fail(f"a dataset of test items was not refused (exit {p.returncode}): {p.stderr.strip()[-500:]}")

    sft, _, times["run_sft_full"] = r.call("run_sft", {"node": "n1", "base": "base", "datasets": ["rev"], **FULL})
    if sft["job"]["state"] != "succeeded":
        fail(f"run_sft full: {json.dumps(sft)[:2000]}")
    ck = sft["checkpoint"]
    job_env = sft["job"]["env"]
    if job_env != env:
        fail(f"the job recorded {job_env!r}, `rsim env check` says {env!r}")
    # The commit names it too, in full (git log is the experiment record).
    body = subprocess.run(["git", "-C", str(study), "log", "-1", "--format=%B", sft["commit"]],
                          capture_output=True, text=True, check=True).stdout
    if f"Rsim-Env: {env}\n" not in body:
        fail(f"the run_sft commit's Rsim-Env trailer is not the environment's label: {body}")
    evs = {}
    for node, ckpt, split in [("n0", "base", "dev"), ("n1", ck, "dev"), ("n1", ck, "test")]:
        ev, _, took = r.call("evaluate", {"node": node, "checkpoint": ckpt, "task": "add2", "split": split})
        times[f"evaluate_{node}_{split}"] = took
        evs[f"{node}_{split}"] = ev
    base_dev = evs["n0_dev"]["metrics"]["exact_match"]
    full_dev = evs["n1_dev"]["metrics"]["exact_match"]
    full_test = evs["n1_test"]["metrics"].get("exact_match")
    # The data is drawn per study (the generator's seed is salted with the study's secret), so the
    # result varies: most runs reach 0.8-0.95, one CI run landed at 0.10 (final loss 0.64 instead
    # of 0.25-0.36). "Visibly" is what no run may miss: ten of the 200 dev items over the base
    # model's none (a one-sided two-proportion p of about 0.001), with the loss falling (below).
    if not full_dev >= base_dev + 0.05:
        fail(f"full SFT did not visibly help: dev {base_dev} -> {full_dev}")
    falls(sft, "full")
    # The tripwire scored the sealed split beside it, and found nothing to withhold.
    if full_test is None or evs["n1_test"].get("suspected_contamination", False) is not False:
        fail(f"the test evaluation: {json.dumps(evs['n1_test'])[:1500]}")

    r.call("branch", {"parents": ["n0"], "title": "LoRA on reversed sums"})
    r.call("register_dataset", {"node": "n2", "name": "rev-n2",
                                "source": {"kind": "arith", "op": "add", "digits": 2, "format": "reversed", "n": 8000, "seed": 1}})
    lora, _, times["run_sft_lora"] = r.call("run_sft", {"node": "n2", "base": "base", "datasets": ["rev-n2"], **LORA})
    if lora["job"]["state"] != "succeeded":
        fail(f"run_sft lora: {json.dumps(lora)[:2000]}")
    ev, _, times["evaluate_n2_dev"] = r.call("evaluate", {"node": "n2", "checkpoint": lora["checkpoint"],
                                                          "task": "add2", "split": "dev"})
    lora_dev = ev["metrics"]["exact_match"]
    # LoRA cannot train this random base's embeddings: it learns far less, but it learns.
    if not lora_dev >= base_dev:
        fail(f"LoRA fell below the base: dev {base_dev} -> {lora_dev}")
    falls(lora, "LoRA")

    # Checkpoint provenance over model directories: a checkpoint hash no run_sft of this study
    # recorded is refused before any job starts.
    _, p, _ = r.call("run_sft", {"node": "n2", "base": "ab" * 32, "datasets": ["rev-n2"], **LORA}, ok=False)
    if p.returncode == 0 or "checkpoint-provenance" not in p.stderr:
        fail(f"a foreign checkpoint was not refused (exit {p.returncode}): {p.stderr.strip()[-500:]}")

    # Reproduce the full run from the record: the identical checkpoint (CPU kernels, one thread).
    seq = r.call("get_job", {"job": sft["job"]["id"]})[0]["seq"]
    rep, _, times["reproduce_full"] = r.call("reproduce", {"node": "n1", "seq": seq}, role="owner")
    if rep.get("identical") is not True or rep.get("checkpoint") != ck:
        fail(f"reproduce: {json.dumps(rep)[:2000]}")

    # An environment that drifted from its lock (a package installed by hand) refuses jobs.
    python = next((a for a in sft["job"]["command"] if a.endswith("/bin/python3")), None)
    if python is None:
        fail(f"the job did not run the environment's python3: {sft['job']['command']}")
    venv = Path(python).parent.parent
    site = next(venv.glob("lib/python3*/site-packages"))
    drift = site / "requests-2.0.0.dist-info"
    drift.mkdir()
    try:
        _, p, _ = r.call("run_sft", {"node": "n1", "base": "base", "datasets": ["rev"], **FULL, "steps": 5}, ok=False)
    finally:
        drift.rmdir()
    if p.returncode == 0 or "environment-pinned" not in p.stderr or "requests" not in p.stderr:
        fail(f"a drifted environment was not refused (exit {p.returncode}): {p.stderr.strip()[-800:]}")

    fsck = json.loads(r.run("--json", "fsck").stdout)
    audit = json.loads(r.run("--json", "audit").stdout)
    if fsck["problems"]:
        fail(f"fsck: {json.dumps(fsck)[:2000]}")
    if audit["got_through"] != 0:
        fail(f"audit: {json.dumps(audit)[:2000]}")

    # The same spec bare (what the recipe costs without rsim), against the action's wall time:
    # HF_RATIO_RUNS rounds of one run_sft through rsim and one bare run, alternating, medians.
    job_dir = study / ".rsim/jobs" / sft["job"]["id"]
    spec = json.loads((job_dir / "spec.json").read_text())
    bare_dir = work / "bare"
    threads = str(sft["job"].get("threads") or 1)
    through, walls = [times["run_sft_full"]], []
    for i in range(RATIO_RUNS):
        if i > 0:
            again, _, took = r.call("run_sft", {"node": "n1", "base": "base", "datasets": ["rev"], **FULL})
            if again["checkpoint"] != ck:
                fail("the same run_sft gave another checkpoint")
            through.append(took)
        shutil.rmtree(bare_dir, ignore_errors=True)
        bare_dir.mkdir()
        (bare_dir / "spec.json").write_text(json.dumps(spec))
        t = time.time()
        p = subprocess.run([str(venv / "bin/python3"), str(study / "recipes/sft.py"), str(bare_dir / "spec.json")],
                           capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "HOME": str(bare_dir), "OMP_NUM_THREADS": threads,
                                "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads})
        walls.append(time.time() - t)
        print(f"hf_check: bare sft.py in {walls[-1]:.1f} s", file=sys.stderr, flush=True)
        if p.returncode != 0:
            fail(f"the bare recipe failed: {p.stderr[-1500:]}")
    bare = statistics.median(walls) if walls else None
    summary = {
        "environment": env,
        "dev_exact_match": {"base": base_dev, "full": full_dev, "lora": lora_dev},
        "curves_first_last": {k: [v["curve"][0]["loss"], v["curve"][-1]["loss"]] for k, v in [("full", sft), ("lora", lora)]},
        "test_exact_match_full": full_test,
        "seconds": {k: round(v, 2) for k, v in times.items()},
        "run_sft_full_seconds": [round(x, 2) for x in through],
        "bare_sft_seconds": [round(x, 2) for x in walls],
        "harness_ratio": round(statistics.median(through) / bare, 3) if bare else None,
        "job_record": {k: sft["job"].get(k) for k in ("id", "env", "threads", "sandbox", "state")},
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
