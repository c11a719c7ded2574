#!/usr/bin/env python3
"""Read a reviewer trial against its reference, paired by family and seed, and apply its rule.

    tools/trial-rule.py REFERENCE.tsv TRIAL.tsv --main tiny-arith \
        --families tiny-add4,tiny-sub4,... --above tiny-sub4,tiny-sum3 [--tolerance 0.02]

Both files hold lines `FAMILY SEED TEST [WALL]` as tools/paired.sh prints them (a leading tag such
as `J ` is skipped; `#` lines and tables' lines, `TAG table …`, are skipped). The rule, as
TRIAL-*.md writes it: on the main job the trial reaches >= 0.85 on at least as many seeds as the
reference and its mean is no more than the tolerance below the reference's; on each family likewise
for the mean; and on at least one of the --above families its mean is above the reference's. A
family's seeds are compared only where both ran. Prints, per family, each side's mean with its 95%
interval (Student t), seeds at >= 0.85, and the paired difference with its interval and how many
seeds came out ahead or behind; then the verdict: adopted, not adopted (the first failing stage
named), or incomplete (seeds missing).
"""
import argparse
import statistics
import sys

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
BAR = 0.85


def read(path):
    scores = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts or parts[0].startswith("#") or parts[0].startswith("DONE"):
                continue
            if not parts[0].startswith("tiny-") and len(parts) > 1:
                parts = parts[1:]
            if parts[0] == "table":
                continue  # a table's line (queue.sh): its figures are in its JSON
            if len(parts) < 3:
                sys.exit(f"{path}:{n}: expected FAMILY SEED TEST, got {line.strip()!r}")
            family, seed, test = parts[:3]
            if test in ("FAILED", "refused", "None"):
                continue
            try:
                scores.setdefault(family, {})[int(seed)] = float(test)
            except ValueError:
                sys.exit(f"{path}:{n}: seed and test must be numbers, got {line.strip()!r}")
    return scores


def mean_ci(xs):
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, None
    h = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, (m - h, m + h)


def fmt(m, ci):
    return f"{m:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference")
    ap.add_argument("trial")
    ap.add_argument("--main", required=True, help="the main job's family")
    ap.add_argument("--families", required=True, help="comma-separated families of stage 2")
    ap.add_argument("--above", required=True, help="comma-separated: the trial must beat the reference on one")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--seeds", type=int, default=10, help="seeds each family needs (0..N-1)")
    a = ap.parse_args()
    ref, trial = read(a.reference), read(a.trial)
    families = [a.main] + [f for f in a.families.split(",") if f]
    above = [f for f in a.above.split(",") if f]
    verdict, means = None, {}
    print("| family | trial, mean [95% CI] | reference | >= 0.85, reference / trial | trial - reference, paired [95% CI] (ahead / behind) | rule |")
    print("|---|---|---|---|---|---|")
    for fam in families:
        r, t = ref.get(fam, {}), trial.get(fam, {})
        if not r:
            sys.exit(f"{a.reference}: no scores of {fam}")
        seeds = sorted(set(r) & set(t))
        if not seeds:
            print(f"| {fam} | — | | | | not run |")
            verdict = verdict or f"incomplete: {fam} has not run"
            continue
        tv, rv = [t[s] for s in seeds], [r[s] for s in seeds]
        d = [x - y for x, y in zip(tv, rv)]
        (tm, tci), (rm, rci), (dm, dci) = mean_ci(tv), mean_ci(rv), mean_ci(d)
        means[fam] = (tm, rm)
        bar_t, bar_r = sum(x >= BAR for x in tv), sum(x >= BAR for x in rv)
        ok = tm >= rm - a.tolerance - 1e-9 and (fam != a.main or bar_t >= bar_r)
        missing = len(seeds) < a.seeds
        rule = ("ok" if ok else "FAILS") + (f" ({len(seeds)} of {a.seeds} seeds)" if missing else "")
        print(f"| {fam} | {fmt(tm, tci)} | {fmt(rm, rci)} | {bar_r} / {bar_t} | {dm:+.3f}"
              + (f" [{dci[0]:.3f}, {dci[1]:.3f}]" if dci else "")
              + f" ({sum(x > 0 for x in d)} / {sum(x < 0 for x in d)}) | {rule} |")
        if not ok and verdict is None:
            stage = "stage 1 (the main job)" if fam == a.main else f"stage 2 ({fam})"
            verdict = f"not adopted: {stage}"
        if missing and verdict is None:
            verdict = f"incomplete: {fam} has {len(seeds)} of {a.seeds} seeds"
    if verdict is None:
        if any(means[f][0] > means[f][1] for f in above if f in means):
            verdict = "adopted"
        else:
            verdict = f"not adopted: its mean is above the reference's on none of {', '.join(above)}"
    print(f"\nverdict: {verdict}")
    return 0 if verdict == "adopted" else 1


if __name__ == "__main__":
    sys.exit(main())
