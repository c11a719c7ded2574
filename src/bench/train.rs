//! `rsim bench-train`: time to a target test accuracy per answer format on the tiny-arith
//! example, through real actions and real jobs; with it, what a job's start and its sandbox cost.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use super::{Faces, bench_dir, machine, median};
use crate::api::types::*;
use crate::model::{Caller, Split};
use crate::os::{Execute, Study};
use crate::util::error::{Error, Result};

/// Settings of the training benchmark (`rsim bench-train`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainBenchOptions {
    pub formats: Vec<AnswerFormat>,
    pub seeds: u64,
    /// Training budgets (steps) tried in increasing order, each a whole run from the base model.
    pub budgets: Vec<u64>,
    /// Exact match to reach (dev decides when to look at test, as an agent would).
    pub target: f64,
    pub learning_rate: f64,
    pub batch_size: u32,
    pub rows: u64,
}

/// One training run of the ladder.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LadderRun {
    pub node: String,
    pub steps: u64,
    /// The training job's wall-clock seconds.
    pub train_s: f64,
    pub dev: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<f64>,
    pub steps_per_s: f64,
    pub tokens_per_s: f64,
    /// Share of the run_sft action's wall time spent outside its job (validation, policy,
    /// commit, index, process start).
    pub harness_share: f64,
}

/// One format × seed: runs of growing budgets until one reaches the target on test.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ladder {
    pub format: AnswerFormat,
    pub seed: u64,
    pub runs: Vec<LadderRun>,
    /// Training seconds and steps of the smallest budget whose checkpoint reached the target on
    /// dev and then on test; None when no budget did.
    pub to_target_s: Option<f64>,
    pub to_target_steps: Option<u64>,
    /// Test score of the last run (the one that reached the target, or the largest budget).
    pub final_test: Option<f64>,
}

/// `rsim bench-train`: time to the target test accuracy per answer format on the tiny-arith
/// example, through the real actions (register_dataset, branch, run_sft, evaluate) and real jobs.
pub fn training(
    faces: Faces,
    o: &TrainBenchOptions,
    dir: Option<&Path>,
    json_out: bool,
) -> Result<String> {
    let mut txt = String::new();
    let mut budgets = o.budgets.clone();
    budgets.sort_unstable();
    budgets.dedup();
    if o.formats.is_empty() || o.seeds == 0 || budgets.is_empty() || budgets[0] == 0 {
        return Err(Error::invalid(
            "bench-train needs at least one format, one seed and one budget of at least 1 step",
        ));
    }
    if !(o.target > 0.0 && o.target <= 1.0) {
        return Err(Error::invalid(format!(
            "--target {} is not an exact-match score in (0, 1]",
            o.target
        )));
    }
    let o = TrainBenchOptions {
        budgets,
        ..o.clone()
    };
    let base = bench_dir(dir)?;
    let caller = Caller::new("bench", crate::model::Role::Worker);
    let mut ladders = Vec::new();
    let mut start_s = Vec::new();
    let mut sandbox_ms = (Vec::new(), Vec::new());
    for format in &o.formats {
        let fname = format.name();
        for seed in 0..o.seeds {
            let d = base.join(format!("{fname}-{seed}"));
            if d.exists() {
                std::fs::remove_dir_all(&d)?;
            }
            (faces.init_example)(&d, "tiny-arith")?;
            let study = Study::open(&d)?;
            let ladder = train_ladder(&study, &caller, &o, *format, fname, seed)?;
            eprintln!(
                "{fname} seed {seed}: {}",
                match (ladder.to_target_steps, ladder.to_target_s) {
                    (Some(n), Some(s)) => format!("reached the target with {n} steps, {s:.1} s"),
                    _ => format!("did not reach the target (test {:?})", ladder.final_test),
                }
            );
            if start_s.is_empty() {
                start_s = job_start_overhead(&study, &caller, fname)?;
                sandbox_ms = sandbox_overhead(&d, 20)?;
            }
            ladders.push(ladder);
        }
    }
    let rows: Vec<serde_json::Value> = o
        .formats
        .iter()
        .map(|f| ladder_summary(&ladders, *f))
        .collect();
    let start_median = median(&mut start_s.clone());
    if json_out {
        outln!(
            txt,
            "{}",
            serde_json::to_string_pretty(&json!({
                "machine": machine(), "options": o, "formats": rows,
                "job_start_s_median": start_median, "job_start_s_runs": start_s, "ladders": ladders,
                "sandbox_ms_runs": sandbox_ms.0, "unsandboxed_ms_runs": sandbox_ms.1,
                "sandbox_cost_ms_median": median(&mut sandbox_ms.0.clone()) - median(&mut sandbox_ms.1.clone()),
            }))?
        );
    } else {
        print_training(&mut txt, &o, &rows, start_median, &start_s);
        let (with, without) = (median(&mut sandbox_ms.0), median(&mut sandbox_ms.1));
        outln!(
            txt,
            "sandbox cost per job start (a `true` job through the local runner, median of {}): {:.1} ms with, {:.1} ms without: +{:.1} ms",
            sandbox_ms.1.len(),
            with,
            without,
            with - without
        );
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(txt)
}

/// Medians over the seeds of one format.
fn ladder_summary(ladders: &[Ladder], format: AnswerFormat) -> serde_json::Value {
    let mine: Vec<&Ladder> = ladders.iter().filter(|c| c.format == format).collect();
    let reached: Vec<f64> = mine.iter().filter_map(|c| c.to_target_s).collect();
    let steps: Vec<f64> = mine
        .iter()
        .filter_map(|c| c.to_target_steps.map(|s| s as f64))
        .collect();
    let tests: Vec<f64> = mine.iter().filter_map(|c| c.final_test).collect();
    let runs: Vec<&LadderRun> = mine.iter().flat_map(|c| &c.runs).collect();
    let col = |f: &dyn Fn(&LadderRun) -> f64| runs.iter().map(|r| f(r)).collect::<Vec<f64>>();
    let med = |v: &[f64]| (!v.is_empty()).then(|| median(&mut v.to_vec()));
    json!({
        "format": format,
        "seeds": mine.len(),
        "reached": reached.len(),
        "to_target_s_median": med(&reached),
        "to_target_s_runs": reached,
        "to_target_steps_median": med(&steps),
        "to_target_steps_runs": steps,
        "final_test_median": med(&tests),
        "final_test_runs": tests,
        "steps_per_s_median": med(&col(&|r| r.steps_per_s)),
        "tokens_per_s_median": med(&col(&|r| r.tokens_per_s)),
        "harness_share_median": med(&col(&|r| r.harness_share)),
    })
}

fn print_training(
    txt: &mut String,
    o: &TrainBenchOptions,
    rows: &[serde_json::Value],
    start: f64,
    start_s: &[f64],
) {
    outln!(txt, "machine: {}", machine());
    outln!(
        txt,
        "tiny-arith add3: {} generated rows per format; one run_sft from the base model per budget \
         (steps {:?}, batch {}, lr {}, cosine, 50 warm-up steps); {} seeds; target {:.0}% exact match \
         (dev first, then test)",
        o.rows,
        o.budgets,
        o.batch_size,
        o.learning_rate,
        o.seeds,
        o.target * 100.0
    );
    let f = |v: &serde_json::Value, p: usize| {
        v.as_f64().map_or("-".to_string(), |x| format!("{x:.p$}"))
    };
    let list = |v: &serde_json::Value, p: usize| {
        v.as_array()
            .map(|a| a.iter().map(|x| f(x, p)).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    };
    outln!(
        txt,
        "{:<11} {:>7} {:>26} {:>20} {:>26} {:>8} {:>9} {:>8}",
        "format",
        "reached",
        "time to target, s (runs)",
        "steps (runs)",
        "final test (runs)",
        "steps/s",
        "tokens/s",
        "harness"
    );
    for r in rows {
        outln!(
            txt,
            "{:<11} {:>7} {:>26} {:>20} {:>26} {:>8} {:>9} {:>7}%",
            r["format"].as_str().unwrap_or("?"),
            format!("{}/{}", r["reached"], r["seeds"]),
            format!(
                "{} ({})",
                f(&r["to_target_s_median"], 1),
                list(&r["to_target_s_runs"], 1)
            ),
            format!(
                "{} ({})",
                f(&r["to_target_steps_median"], 0),
                list(&r["to_target_steps_runs"], 0)
            ),
            format!(
                "{} ({})",
                f(&r["final_test_median"], 3),
                list(&r["final_test_runs"], 3)
            ),
            f(&r["steps_per_s_median"], 1),
            f(&r["tokens_per_s_median"], 0),
            r["harness_share_median"]
                .as_f64()
                .map_or("-".into(), |x| format!("{:.2}", x * 100.0)),
        );
    }
    outln!(
        txt,
        "job start (1-step run_sft: spawn, load base and data, one step, save): median {:.3} s ({})",
        start,
        start_s
            .iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn train_ladder(
    study: &Study,
    caller: &Caller,
    o: &TrainBenchOptions,
    format: AnswerFormat,
    fname: &str,
    seed: u64,
) -> Result<Ladder> {
    let dataset = format!("add3-{fname}");
    study.register_dataset(
        caller,
        RegisterDatasetRequest {
            node: "n0".into(),
            name: dataset.clone(),
            source: serde_json::from_value(json!({
                "kind": "arith", "op": "add", "digits": 3, "format": format, "n": o.rows, "seed": 7
            }))?,
            description: String::new(),
        },
    )?;
    let mut ladder = Ladder {
        format,
        seed,
        runs: Vec::new(),
        to_target_s: None,
        to_target_steps: None,
        final_test: None,
    };
    for (k, &steps) in o.budgets.iter().enumerate() {
        let node = study
            .branch(
                caller,
                BranchRequest {
                    parents: vec!["n0".into()],
                    title: format!("{fname}, {steps} steps, seed {seed}"),
                    hypothesis: String::new(),
                },
            )?
            .node;
        let t = Instant::now();
        let run = study.run_sft(
            caller,
            RunSftRequest {
                node: node.clone(),
                base: "base".into(),
                datasets: vec![dataset.clone()],
                learning_rate: o.learning_rate,
                steps,
                batch_size: o.batch_size,
                warmup_steps: 50.min(steps / 4),
                schedule: Schedule::Cosine,
                adapter: Adapter::Full,
                answer_only_loss: true,
                seed,
                eval_every: 0,
                eval_task: None,
            },
        )?;
        let action_s = t.elapsed().as_secs_f64();
        let Some(ck) = run.checkpoint.clone() else {
            return Err(Error::internal(format!(
                "run_sft on {node} failed: {}",
                run.job.error.unwrap_or_default()
            )));
        };
        let score = |split: Split| -> Result<f64> {
            let r = study.evaluate(
                caller,
                EvaluateRequest {
                    node: node.clone(),
                    checkpoint: ck.clone(),
                    task: "add3".into(),
                    split,
                },
            )?;
            r.metrics
                .get("exact_match")
                .copied()
                .ok_or_else(|| Error::internal("the evaluator reported no exact_match"))
        };
        let dev = score(Split::Dev)?;
        let last = k + 1 == o.budgets.len();
        let test = if dev >= o.target || last {
            Some(score(Split::Test)?)
        } else {
            None
        };
        let train_s = run.job.duration_s;
        eprintln!(
            "  {fname} seed {seed}: {steps} steps in {train_s:.1} s: dev {dev:.3}{}",
            test.map_or(String::new(), |t| format!(", test {t:.3}"))
        );
        let metric = |k: &str| run.train_metrics.get(k).copied().unwrap_or(f64::NAN);
        ladder.runs.push(LadderRun {
            node,
            steps,
            train_s,
            dev,
            test,
            steps_per_s: metric("steps_per_s"),
            tokens_per_s: metric("tokens_per_s"),
            harness_share: (action_s - train_s).max(0.0) / action_s,
        });
        if let Some(t) = test {
            ladder.final_test = Some(t);
            if t >= o.target {
                ladder.to_target_s = Some(train_s);
                ladder.to_target_steps = Some(steps);
                break;
            }
        }
    }
    Ok(ladder)
}

/// What the sandbox adds to a job's start: `n` jobs running `true` through the local runner in
/// the study's job directory, with the sandbox a job would get (the `rsim job sandbox` exec, the
/// Landlock ruleset) and without; wall milliseconds of each (with, without).
fn sandbox_overhead(study: &Path, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    use crate::jobs::{JobRunner, JobSpec, LocalRunner, sandbox};
    let rsim = crate::os::current_rsim()?;
    let root = study.canonicalize()?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..2 * n {
        let id = crate::jobs::new_job_id();
        let dir = root.join(crate::os::STATE_DIR).join("jobs").join(&id);
        let params =
            crate::jobs::protocol::JobParams::Evaluate(crate::jobs::protocol::EvalParams {
                job: id.clone(),
                checkpoint: crate::jobs::protocol::CheckpointRef {
                    sha256: String::new(),
                    files: Default::default(),
                },
                task: "bench".into(),
                split: Split::Dev,
                metric: "exact_match".into(),
                eval_set: root.join("rsim.toml"),
            });
        let command = vec!["true".to_string()];
        let sandboxed = i % 2 == 0;
        let sb =
            sandboxed.then(|| sandbox::for_job(&rsim, &dir, &params, &command, &root, &[], false));
        let command = if sandboxed {
            sandbox::wrap(&rsim, &dir.join(sandbox::SANDBOX_FILE), command)
        } else {
            command
        };
        let spec = JobSpec {
            id,
            command,
            dir,
            timeout_s: 60,
            env: "host".into(),
            isolate_network: false,
            require_isolation: false,
            limits: crate::jobs::JobLimits::default(),
            slots_dir: None,
            params,
            sandbox: sb,
        };
        let t = std::time::Instant::now();
        let job = LocalRunner.run(&spec)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if job.state != crate::model::JobState::Succeeded {
            return Err(Error::internal(format!(
                "the sandbox benchmark's job failed: {:?}",
                job.error
            )));
        }
        if sandboxed { &mut with } else { &mut without }.push(ms);
        let _ = std::fs::remove_dir_all(&spec.dir);
    }
    Ok((with, without))
}

/// Job start overhead: five 1-step runs (spawn, load base and data, one step, save), job seconds.
fn job_start_overhead(study: &Study, caller: &Caller, fname: &str) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for i in 0..5 {
        let r = study.run_sft(
            caller,
            RunSftRequest {
                node: "n0".into(),
                base: "base".into(),
                datasets: vec![format!("add3-{fname}")],
                learning_rate: 1e-3,
                steps: 1,
                batch_size: 32,
                warmup_steps: 0,
                schedule: Schedule::Constant,
                adapter: Adapter::Full,
                answer_only_loss: true,
                seed: i,
                eval_every: 0,
                eval_task: None,
            },
        )?;
        out.push(r.job.duration_s);
    }
    Ok(out)
}
