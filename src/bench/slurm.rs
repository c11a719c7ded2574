//! `rsim bench --slurm N`: jobs instead of the record — the same tiny-arith `run_sft` N times on
//! the local backend and N times on the Slurm backend (after one warm-up each), giving Slurm's
//! submit-to-start latency and the overhead of a Slurm job over a local one (medians).

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use super::{bench_dir, machine, median, write_study};
use crate::model::Caller;
use crate::os::Study;
use crate::util::error::{Error, Result};

/// What `rsim bench --slurm N` measured.
#[derive(Debug, serde::Serialize)]
pub struct JobBenchReport {
    pub machine: String,
    pub jobs: usize,
    /// The same job each time: tiny-arith-ngram `run_sft`, this many steps.
    pub steps: u64,
    pub local_action_s_median: f64,
    pub local_job_s_median: f64,
    pub slurm_action_s_median: f64,
    pub slurm_job_s_median: f64,
    /// From `sbatch` to the batch script starting on the node.
    pub slurm_submit_to_start_s_median: f64,
    pub slurm_submit_to_start_s_runs: Vec<f64>,
    /// Median Slurm action time minus median local action time.
    pub slurm_overhead_s: f64,
    pub local_action_s_runs: Vec<f64>,
    pub slurm_action_s_runs: Vec<f64>,
}

/// `rsim bench --slurm N`: the same tiny job through the local and the Slurm backend.
pub fn run_jobs(
    jobs: usize,
    partition: Option<&str>,
    dir: Option<&Path>,
    json_out: bool,
) -> Result<String> {
    let mut txt = String::new();
    const STEPS: u64 = 200;
    let jobs = jobs.max(1);
    let base = bench_dir(dir)?;
    let owner = Caller::owner();
    let slurm = match partition {
        Some(p) => format!("kind = \"slurm\"\npartition = \"{p}\"\n"),
        None => "kind = \"slurm\"\n".to_string(),
    };
    // (action seconds, job seconds, submit-to-start seconds) per run, per backend.
    let mut results = Vec::new();
    for (name, backend) in [("local", "kind = \"local\"\n"), ("slurm", slurm.as_str())] {
        let dir = base.join(format!("jobs-{name}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        write_study(&dir, 100, backend)?;
        let study = Study::open(&dir)?;
        study.call(
            &owner,
            "register_dataset",
            json!({"node": "n0", "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 400, "seed": 1}}),
        )?;
        let mut runs = Vec::new();
        for i in 0..=jobs {
            let t = Instant::now();
            let r = study.call(
                &owner,
                "run_sft",
                json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": STEPS, "batch_size": 8, "seed": i}),
            )?;
            let action_s = t.elapsed().as_secs_f64();
            if r["job"]["state"] != "succeeded" {
                return Err(Error::internal(format!(
                    "{name} job did not succeed: {}",
                    r["job"]["error"]
                )));
            }
            // The first run warms caches (the program's fingerprint) and is not counted.
            if i > 0 {
                runs.push((
                    action_s,
                    r["job"]["duration_s"].as_f64().unwrap_or(f64::NAN),
                    r["job"]["slurm"]["queued_s"].as_f64().unwrap_or(f64::NAN),
                ));
            }
            eprintln!("{name} job {i}: {action_s:.3} s");
        }
        results.push(runs);
    }
    let col = |runs: &[(f64, f64, f64)], k: usize| -> Vec<f64> {
        runs.iter()
            .map(|r| [r.0, r.1, r.2][k])
            .map(|x| (x * 1000.0).round() / 1000.0)
            .collect()
    };
    let (local, slurm_runs) = (&results[0], &results[1]);
    let local_action = col(local, 0);
    let slurm_action = col(slurm_runs, 0);
    let queued = col(slurm_runs, 2);
    let report = JobBenchReport {
        machine: machine(),
        jobs,
        steps: STEPS,
        local_action_s_median: median(&mut local_action.clone()),
        local_job_s_median: median(&mut col(local, 1)),
        slurm_action_s_median: median(&mut slurm_action.clone()),
        slurm_job_s_median: median(&mut col(slurm_runs, 1)),
        slurm_submit_to_start_s_median: median(&mut queued.clone()),
        slurm_submit_to_start_s_runs: queued,
        slurm_overhead_s: median(&mut slurm_action.clone()) - median(&mut local_action.clone()),
        local_action_s_runs: local_action,
        slurm_action_s_runs: slurm_action,
    };
    if json_out {
        outln!(txt, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(txt, "machine:               {}", report.machine);
        outln!(
            txt,
            "job:                   tiny-arith-ngram run_sft, {} steps, {} runs per backend (medians)",
            report.steps,
            report.jobs
        );
        outln!(
            txt,
            "local:                 action {:.3} s, job {:.3} s",
            report.local_action_s_median,
            report.local_job_s_median
        );
        outln!(
            txt,
            "slurm:                 action {:.3} s, job {:.3} s",
            report.slurm_action_s_median,
            report.slurm_job_s_median
        );
        outln!(
            txt,
            "slurm submit-to-start: median {:.3} s {:?}",
            report.slurm_submit_to_start_s_median,
            report.slurm_submit_to_start_s_runs
        );
        outln!(
            txt,
            "slurm overhead:        {:.3} s per job over local",
            report.slurm_overhead_s
        );
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(txt)
}
