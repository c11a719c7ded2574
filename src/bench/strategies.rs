//! `rsim bench-strategies`: the efficiency benchmark — orchestration against the baselines at
//! equal compute, several seeds each, on fresh studies of an example.

use std::path::Path;

use serde_json::json;

use super::{Faces, bench_dir};
use crate::os::Study;
use crate::util::error::{Error, Result};

/// One campaign of the strategy benchmark.
#[derive(Debug, serde::Serialize)]
pub struct CampaignRun {
    pub strategy: crate::campaign::Strategy,
    pub seed: u64,
    pub summary: crate::campaign::RunSummary,
}

/// Settings of the strategy benchmark (`rsim bench-strategies`).
#[derive(Debug, Clone, Copy)]
pub struct StrategiesOptions<'a> {
    /// The example each campaign's fresh study is made from.
    pub example: &'a str,
    /// Campaigns per strategy (seeds 0, 1, …).
    pub seeds: u64,
    /// Each campaign's compute budget: training runs of `steps` steps.
    pub experiments: u64,
    pub steps: u64,
    /// The strategies to run (none: all).
    pub which: &'a [crate::campaign::Strategy],
    /// Also run the oracle per seed (`oracle_recipe`, as a `line` campaign).
    pub oracle: bool,
    /// Every campaign in lockstep (`rsim run --lockstep`): its course rests on its seed and data.
    pub lockstep: bool,
}

/// The efficiency benchmark: each strategy runs `seeds` campaigns of `experiments` × `steps` on
/// fresh studies of `example`; the best node of each (promoted by reviewers for orchestration,
/// best on dev for the baselines) is scored once on the protected test split.
pub fn strategies(
    faces: Faces,
    o: StrategiesOptions<'_>,
    dir: Option<&Path>,
    json_out: bool,
) -> Result<String> {
    use crate::campaign::{RunOptions, Strategy, run};
    let StrategiesOptions {
        example,
        seeds,
        experiments,
        steps,
        which,
        oracle,
        lockstep,
    } = o;
    let mut txt = String::new();
    let base = bench_dir(dir)?;
    let mut which: Vec<Strategy> = if which.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        which.to_vec()
    };
    which.retain(|s| *s != Strategy::Line);
    if which.is_empty() {
        return Err(Error::invalid(
            "--strategy line is run by --oracle, with the best recipe the other strategies found",
        ));
    }
    let mut columns = which.clone();
    if oracle {
        columns.push(Strategy::Line);
    }
    let mut runs = Vec::new();
    for seed in 0..seeds {
        for s in &columns {
            let d = base.join(format!("{s:?}-{seed}").to_lowercase());
            if !d.join(".git").exists() {
                (faces.init_example)(&d, example)?;
                // Every strategy's study of this seed draws its generated data with one secret:
                // the same request gives the same rows whichever strategy makes it.
                crate::os::owner::share_generator_secret(&d, &seed_secret(&base, seed)?)?;
            }
            let study = Study::open(&d)?;
            let task = study
                .config()
                .tasks
                .keys()
                .next()
                .cloned()
                .ok_or_else(|| Error::invalid("the example has no task"))?;
            drop(study);
            let mut o = RunOptions::new(*s, &task);
            o.experiments = experiments;
            o.steps = steps;
            o.seed = seed;
            o.lockstep = lockstep;
            if *s == Strategy::Line {
                let (line, from) = oracle_recipe(&base, &which, seed, &task)?;
                eprintln!("oracle seed {seed}: {line} (found by {})", from.name());
                o.recipe = Some(line);
            }
            if let Some(saved) = crate::campaign::saved_options(&d)?
                && (
                    saved.strategy,
                    saved.experiments,
                    saved.steps,
                    saved.seed,
                    &saved.recipe,
                    saved.lockstep,
                ) != (
                    o.strategy,
                    o.experiments,
                    o.steps,
                    o.seed,
                    &o.recipe,
                    o.lockstep,
                )
            {
                return Err(Error::invalid(format!(
                    "{}: a campaign with other settings is under way there ({:?}, {} experiments × {} \
                     steps, seed {}); use another --dir",
                    d.display(),
                    saved.strategy,
                    saved.experiments,
                    saved.steps,
                    saved.seed
                )));
            }
            let summary = run(&d, o, true)?;
            eprintln!(
                "{s:?} seed {seed}: best dev {:?} test {:?}{}, lock-in share {:.2} depth {}, {} experiments, {:.0} s",
                summary.best_dev,
                summary.test,
                if summary.best_node.is_none() {
                    format!(
                        " (nothing promoted: the base model's {:?} stands)",
                        summary.base_test
                    )
                } else {
                    String::new()
                },
                summary.lock_in.top_share,
                summary.lock_in.max_lonely_depth,
                summary.experiments,
                summary.seconds
            );
            runs.push(CampaignRun {
                strategy: *s,
                seed,
                summary,
            });
        }
    }
    let mut rows = Vec::new();
    for s in &columns {
        let mine: Vec<&CampaignRun> = runs.iter().filter(|r| r.strategy == *s).collect();
        let col = |f: &dyn Fn(&CampaignRun) -> Option<f64>| -> Vec<f64> {
            mine.iter().filter_map(|r| f(r)).collect()
        };
        let test = col(&delivered);
        let dev = col(&|r| r.summary.best_dev);
        let share = col(&|r| Some(r.summary.lock_in.top_share));
        let depth = col(&|r| Some(r.summary.lock_in.max_lonely_depth as f64));
        let secs = col(&|r| Some(r.summary.seconds));
        let (tm, tci) = crate::util::stats::mean_ci95(&test);
        let paired = paired_with_orchestra(&runs, *s);
        // How optimistic the promoted checkpoint's dev score was, and its score on evidence it
        // was not selected on (the dev twin), each against its test score.
        let gap = |estimate: &dyn Fn(&CampaignRun) -> Option<f64>| {
            let d = col(&|r| Some(estimate(r)? - r.summary.test?));
            let (m, ci) = crate::util::stats::mean_ci95(&d);
            json!({"campaigns": d.len(), "mean": m, "ci95": ci})
        };
        rows.push(json!({
            "strategy": s, "campaigns": mine.len(), "test": test, "test_mean": tm, "test_ci95": tci,
            "promoted_nothing": mine.iter().filter(|r| r.summary.best_node.is_none()).count(),
            "orchestra_minus_this": paired,
            "share_of_oracle": share_of_oracle(&runs, *s),
            "dev_minus_test": gap(&|r| r.summary.best_dev),
            "fresh_minus_test": gap(&|r| r.summary.fresh.as_ref().map(|f| f.score)),
            "best_dev_mean": crate::util::stats::mean_ci95(&dev).0,
            "lock_in_share_mean": crate::util::stats::mean_ci95(&share).0,
            "lock_in_depth_mean": crate::util::stats::mean_ci95(&depth).0,
            "seconds_mean": crate::util::stats::mean_ci95(&secs).0,
        }));
    }
    if json_out {
        outln!(
            txt,
            "{}",
            serde_json::to_string_pretty(
                &json!({"example": example, "seeds": seeds, "experiments": experiments, "steps": steps, "strategies": rows, "runs": runs})
            )?
        );
    } else {
        outln!(
            txt,
            "strategy benchmark: {example}, {experiments} experiments × {steps} steps per campaign, {seeds} seeds per strategy"
        );
        outln!(
            txt,
            "{:<10} {:>22} {:>10} {:>14} {:>14} {:>8}",
            "strategy",
            "best test (95% CI)",
            "best dev",
            "lock-in share",
            "lock-in depth",
            "secs"
        );
        let mut paired_lines = Vec::new();
        for r in &rows {
            let ci = ci_text(&r["test_ci95"]);
            let f = |k: &str| {
                r[k].as_f64()
                    .map_or("n/a".to_string(), |v| format!("{v:.3}"))
            };
            outln!(
                txt,
                "{:<10} {:>22} {:>10} {:>14} {:>14} {:>8}",
                r["strategy"].as_str().unwrap_or("?"),
                format!("{}{ci}", f("test_mean")),
                f("best_dev_mean"),
                f("lock_in_share_mean"),
                f("lock_in_depth_mean"),
                r["seconds_mean"]
                    .as_f64()
                    .map_or("n/a".into(), |v| format!("{v:.0}"))
            );
            let p = &r["orchestra_minus_this"];
            if let Some(d) = p["mean"].as_f64() {
                let ci = ci_text(&p["ci95"]);
                paired_lines.push(format!(
                    "  orchestra − {}: {d:+.3}{ci} over {} paired seeds; orchestra ahead on {}, \
                     behind on {}, tied on {}",
                    r["strategy"].as_str().unwrap_or("?"),
                    p["seeds"],
                    p["wins"],
                    p["losses"],
                    p["ties"]
                ));
            }
        }
        for r in &rows {
            let n = r["promoted_nothing"].as_u64().unwrap_or(0);
            if n > 0 {
                outln!(
                    txt,
                    "  {}: promoted nothing on {n} of {} seeds (no node beat the base model); the \
                     base model's test score counts for those seeds",
                    r["strategy"].as_str().unwrap_or("?"),
                    r["campaigns"]
                );
            }
        }
        outln!(
            txt,
            "the promoted checkpoint's estimate minus its test score (mean, 95% CI): its dev \
             score, which it was selected on, and its dev twin score, which it was not"
        );
        for r in &rows {
            let g = |k: &str| {
                let v = &r[k];
                v["mean"].as_f64().map_or("n/a".to_string(), |m| {
                    format!(
                        "{m:+.3}{} ({} campaigns)",
                        ci_text(&v["ci95"]),
                        v["campaigns"]
                    )
                })
            };
            outln!(
                txt,
                "  {:<10} dev − test {}; dev twin − test {}",
                r["strategy"].as_str().unwrap_or("?"),
                g("dev_minus_test"),
                g("fresh_minus_test")
            );
        }
        if oracle {
            outln!(
                txt,
                "test score as a share of the oracle's (the best recipe any strategy found, \
                 trained as one line at the same budget; per seed, then the mean, 95% CI):"
            );
            for r in &rows {
                let v = &r["share_of_oracle"];
                if let Some(m) = v["mean"].as_f64() {
                    outln!(
                        txt,
                        "  {:<10} {m:.3}{} over {} seeds",
                        r["strategy"].as_str().unwrap_or("?"),
                        ci_text(&v["ci95"]),
                        v["seeds"]
                    );
                }
            }
        }
        if !paired_lines.is_empty() {
            outln!(
                txt,
                "paired differences of the best test score (by campaign seed: the same eval \
                 splits, and generated training data drawn with one secret; 95% CI):"
            );
            for l in paired_lines {
                outln!(txt, "{l}");
            }
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(txt)
}

/// The generator secret every strategy's study of campaign seed `seed` shares, kept beside the
/// studies (made on first use, random).
fn seed_secret(base: &Path, seed: u64) -> Result<String> {
    let path = base.join(format!("secret-{seed}"));
    if let Ok(s) = std::fs::read_to_string(&path) {
        return Ok(s.trim().to_string());
    }
    let fresh = format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    std::fs::write(&path, &fresh)
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", path.display())))?;
    Ok(fresh)
}

/// The oracle's recipe for campaign seed `seed`: the recipe (from the base model) of the best
/// node on dev of any strategy's campaign of that seed, in hindsight, and the strategy that found
/// it.
fn oracle_recipe(
    base: &Path,
    which: &[crate::campaign::Strategy],
    seed: u64,
    task: &str,
) -> Result<(String, crate::campaign::Strategy)> {
    let mut best: Option<(f64, String, crate::campaign::Strategy)> = None;
    for s in which {
        let d = base.join(format!("{s:?}-{seed}").to_lowercase());
        let study = Study::open(&d)?;
        let st = crate::campaign::state::CampaignState::load(&study, task)?;
        let found = st.campaign_nodes().filter_map(|n| {
            let r = n.recipe.as_ref()?;
            Some((n.best_checkpoint()?.1, r.with_format(r.format).to_string()))
        });
        for (dev, line) in found {
            if best.as_ref().is_none_or(|b| dev > b.0) {
                best = Some((dev, line, *s));
            }
        }
    }
    best.map(|(_, line, s)| (line, s)).ok_or_else(|| {
        Error::invalid(format!(
            "seed {seed}: no strategy's campaign left a node with a recipe and a dev score, so \
             there is no recipe for the oracle"
        ))
    })
}

/// Strategy `s`'s test score as a share of the oracle's (`line`) on the same seed: the mean over
/// seeds both scored (the oracle above 0), its 95% interval.
fn share_of_oracle(
    runs: &[CampaignRun],
    s: crate::campaign::Strategy,
) -> Option<serde_json::Value> {
    use crate::campaign::Strategy;
    let oracle = |seed: u64| {
        runs.iter()
            .find(|r| r.strategy == Strategy::Line && r.seed == seed)
            .and_then(delivered)
            .filter(|t| *t > 0.0)
    };
    let shares: Vec<f64> = runs
        .iter()
        .filter(|r| r.strategy == s)
        .filter_map(|r| Some(delivered(r)? / oracle(r.seed)?))
        .collect();
    if shares.is_empty() {
        return None;
    }
    let (mean, ci) = crate::util::stats::mean_ci95(&shares);
    Some(json!({"seeds": shares.len(), "mean": mean, "ci95": ci, "shares": shares}))
}

/// What a campaign delivered on the protected test split: its promoted node's score, or, where it
/// promoted nothing (no node's evidence beat the base model's), the base model's, which then
/// stands. A campaign that learned nothing is a result to average in, not a seed to drop (dropping
/// it would leave a strategy's failures out of its mean and of every paired difference). None only
/// where a promoted node's test score was refused (a spent budget) or the base model's is unknown.
fn delivered(r: &CampaignRun) -> Option<f64> {
    match (r.summary.test, &r.summary.best_node) {
        (Some(t), _) => Some(t),
        (None, None) => r.summary.base_test,
        (None, Some(_)) => None,
    }
}

/// ` [lo, hi]` for a 95% interval given as a two-number array; empty when there is none.
fn ci_text(v: &serde_json::Value) -> String {
    v.as_array()
        .filter(|a| a.len() == 2)
        .map(|a| {
            format!(
                " [{:.3}, {:.3}]",
                a[0].as_f64().unwrap_or(f64::NAN),
                a[1].as_f64().unwrap_or(f64::NAN)
            )
        })
        .unwrap_or_default()
}

/// Orchestration's test score minus strategy `s`'s, paired by campaign seed (every strategy's
/// study of a seed has the same eval splits, campaign seed and generator secret, so the same
/// data request draws the same rows): the mean difference, its 95% interval (Student t over the differences), and
/// on how many seeds orchestration came out ahead, behind or level.
/// None for orchestration itself or without a seed both scored.
fn paired_with_orchestra(
    runs: &[CampaignRun],
    s: crate::campaign::Strategy,
) -> Option<serde_json::Value> {
    use crate::campaign::Strategy;
    if s == Strategy::Orchestra {
        return None;
    }
    let score = |strategy: Strategy, seed: u64| {
        runs.iter()
            .find(|r| r.strategy == strategy && r.seed == seed)
            .and_then(delivered)
    };
    let diffs: Vec<f64> = runs
        .iter()
        .filter(|r| r.strategy == s)
        .filter_map(|r| Some(score(Strategy::Orchestra, r.seed)? - delivered(r)?))
        .collect();
    if diffs.is_empty() {
        return None;
    }
    let (mean, ci) = crate::util::stats::mean_ci95(&diffs);
    Some(json!({
        "seeds": diffs.len(), "mean": mean, "ci95": ci, "differences": diffs,
        "wins": diffs.iter().filter(|d| **d > 0.0).count(),
        "losses": diffs.iter().filter(|d| **d < 0.0).count(),
        "ties": diffs.iter().filter(|d| **d == 0.0).count(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::Strategy;

    fn run(strategy: Strategy, seed: u64, test: Option<f64>) -> CampaignRun {
        CampaignRun {
            strategy,
            seed,
            summary: crate::campaign::RunSummary {
                test,
                ..Default::default()
            },
        }
    }

    #[test]
    fn differences_pair_scores_by_seed_and_skip_seeds_without_both() {
        let runs = vec![
            run(Strategy::Orchestra, 0, Some(0.9)),
            run(Strategy::Greedy, 0, Some(0.6)),
            run(Strategy::Orchestra, 1, Some(0.5)),
            run(Strategy::Greedy, 1, Some(0.7)),
            run(Strategy::Orchestra, 2, None),
            run(Strategy::Greedy, 2, Some(0.1)),
            run(Strategy::Greedy, 3, Some(0.4)),
            run(Strategy::Orchestra, 4, Some(0.4)),
            run(Strategy::Greedy, 4, Some(0.4)),
        ];
        let p = paired_with_orchestra(&runs, Strategy::Greedy).expect("pairs");
        assert_eq!(p["seeds"], 3);
        let d: Vec<f64> = serde_json::from_value(p["differences"].clone()).expect("diffs");
        for (got, want) in d.iter().zip([0.3, -0.2, 0.0]) {
            assert!((got - want).abs() < 1e-9, "{d:?}");
        }
        assert_eq!(
            (p["wins"].clone(), p["losses"].clone(), p["ties"].clone()),
            (json!(1), json!(1), json!(1))
        );
        assert!((p["mean"].as_f64().expect("mean") - 0.1 / 3.0).abs() < 1e-9);
        let ci = p["ci95"].as_array().expect("ci");
        assert!(ci[0].as_f64().expect("lo") < 0.0 && ci[1].as_f64().expect("hi") > 0.0);
        assert!(paired_with_orchestra(&runs, Strategy::Orchestra).is_none());
        assert!(paired_with_orchestra(&runs, Strategy::Random).is_none());
    }

    #[test]
    fn a_campaign_that_promoted_nothing_counts_as_the_base_model_not_as_a_missing_seed() {
        // Orchestration promoted nothing on seed 1 (no node beat the base model): the base model,
        // at 0.02 on test, is what that campaign delivered. On seed 2 a promoted node's test score
        // was refused: that seed is missing, not the base model's.
        let with = |strategy, seed, test, best: Option<&str>| {
            let mut r = run(strategy, seed, test);
            r.summary.best_node = best.map(str::to_string);
            r.summary.base_test = Some(0.02);
            r
        };
        let runs = vec![
            with(Strategy::Orchestra, 0, Some(0.9), Some("n3")),
            with(Strategy::Greedy, 0, Some(0.6), Some("n2")),
            with(Strategy::Orchestra, 1, None, None),
            with(Strategy::Greedy, 1, Some(0.5), Some("n4")),
            with(Strategy::Orchestra, 2, None, Some("n5")),
            with(Strategy::Greedy, 2, Some(0.1), Some("n1")),
            with(Strategy::Line, 0, Some(0.8), Some("n1")),
            with(Strategy::Line, 1, Some(0.4), Some("n1")),
        ];
        let p = paired_with_orchestra(&runs, Strategy::Greedy).expect("pairs");
        let d: Vec<f64> = serde_json::from_value(p["differences"].clone()).expect("diffs");
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            (d[0] - 0.3).abs() < 1e-9 && (d[1] - (0.02 - 0.5)).abs() < 1e-9,
            "{d:?}"
        );
        assert_eq!(
            (p["wins"].clone(), p["losses"].clone()),
            (json!(1), json!(1))
        );
        let share = share_of_oracle(&runs, Strategy::Orchestra).expect("shares");
        let shares: Vec<f64> = serde_json::from_value(share["shares"].clone()).expect("shares");
        assert!((shares[0] - 0.9 / 0.8).abs() < 1e-9 && (shares[1] - 0.05).abs() < 1e-9);
        assert_eq!(delivered(&runs[4]), None);
    }
}
