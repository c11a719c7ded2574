#!/usr/bin/env python3
"""Read a reviewer trial's orchestration-only table against the reference table it was paired with.

    tools/trial-table.py REFERENCE.json TRIAL.json [--baseline TABLE.json] [--tolerance 0.02]

Both are `rsim bench-strategies --json` outputs of one family at one budget, the trial's run with
`--strategy orchestra` on the reference's data (its per-seed generator secrets, `queue.sh`'s
DATA_FROM), so seed N of each trained and was scored on the same rows. Prints the trial's and the
reference's orchestration per seed, their means with 95% intervals (Student t), the paired
difference trial - reference, and each one's paired difference to greedy — the reference table's,
or --baseline's where the reference too ran orchestration alone on that table's data (the same
greedy campaigns: the baseline did not change); then whether the trial's mean is no more
than the tolerance below the reference's (`ok` or `FAILS`), and whether its difference to greedy
is larger (`larger` or `not larger`).
"""
import argparse
import json
import statistics
import sys

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def per_seed(path, strategy):
    with open(path) as f:
        d = json.load(f)
    out = {}
    for r in d["runs"]:
        if r["strategy"] == strategy:
            s = r["summary"]
            t = s["test"] if s["test"] is not None else (s["base_test"] if s["best_node"] is None else None)
            if t is not None:
                out[r["seed"]] = t
    return d.get("example"), out


def mean_ci(xs):
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, ""
    h = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, f" [{m - h:+.3f}, {m + h:+.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference")
    ap.add_argument("trial")
    ap.add_argument("--baseline", help="the table whose greedy to use (default: the reference)")
    ap.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args()
    fam, ref = per_seed(a.reference, "orchestra")
    fam_t, trial = per_seed(a.trial, "orchestra")
    fam_b, greedy = per_seed(a.baseline or a.reference, "greedy")
    if len({fam, fam_t, fam_b}) > 1:
        sys.exit(f"the tables are of different families: {fam}, {fam_t} and {fam_b}")
    seeds = sorted(set(ref) & set(trial) & set(greedy))
    if not seeds:
        sys.exit("no seed ran in both tables")
    print(f"{fam}, seeds {seeds[0]}-{seeds[-1]} ({len(seeds)})")
    print("seed  trial  reference  greedy")
    for s in seeds:
        print(f"{s:4}  {trial[s]:.3f}  {ref[s]:.3f}      {greedy[s]:.3f}")
    t, r, g = ([x[s] for s in seeds] for x in (trial, ref, greedy))
    for name, xs in (("trial", t), ("reference", r), ("greedy", g)):
        m, ci = mean_ci(xs)
        print(f"{name} mean {m:.3f}{ci}")
    d = [x - y for x, y in zip(t, r)]
    m, ci = mean_ci(d)
    print(f"trial - reference {m:+.3f}{ci} (ahead {sum(x > 0 for x in d)}, behind {sum(x < 0 for x in d)})")
    dt, dr = [x - y for x, y in zip(t, g)], [x - y for x, y in zip(r, g)]
    (mt, cit), (mr, cir) = mean_ci(dt), mean_ci(dr)
    print(f"trial - greedy {mt:+.3f}{cit}; reference - greedy {mr:+.3f}{cir}")
    ok = statistics.mean(t) >= statistics.mean(r) - a.tolerance - 1e-9
    print(f"mean within {a.tolerance} of the reference's: {'ok' if ok else 'FAILS'}; "
          f"difference to greedy: {'larger' if mt > mr else 'not larger'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
