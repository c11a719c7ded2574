//! `rsim bench`: the record's performance targets, measured on the machine it runs on.
//!
//! 1. Cost of one accepted action (schema validation + policy + git commit + index update):
//!    median over `actions` `compare`/`branch`/`conclude`-style actions on a fresh study.
//! 2. A study with `nodes` nodes: the `dag` query (load from the index, build the petgraph, answer)
//!    and `reindex` (rebuild the index from git alone), each the median of `repeat` runs.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use crate::api::Study;
use crate::api::types::*;
use crate::error::{Error, Result};
use crate::model::Caller;

#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    pub machine: String,
    pub action_ms_median: f64,
    pub action_ms_p90: f64,
    pub actions_timed: usize,
    pub nodes: usize,
    pub build_s: f64,
    pub dag_ms_median: f64,
    pub dag_ms_runs: Vec<f64>,
    pub reindex_s_median: f64,
    pub reindex_s_runs: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} cores, {model}")
}

pub fn run(
    nodes: usize,
    actions: usize,
    repeat: usize,
    dir: Option<&Path>,
    reuse: bool,
    json_out: bool,
) -> Result<()> {
    let tmp;
    let base = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            tmp = tempdir()?;
            tmp.clone()
        }
    };
    let owner = Caller::owner();

    // 1. Action cost on a fresh example study.
    let small = base.join("actions");
    if small.exists() {
        std::fs::remove_dir_all(&small)?;
    }
    bench_study(&small, nodes + actions)?;
    let study = Study::open(&small)?;
    let mut times = Vec::with_capacity(actions);
    let mut last = "n0".to_string();
    for i in 0..actions {
        let t = Instant::now();
        match i % 3 {
            0 => {
                let r = study.call(
                    &owner,
                    "branch",
                    json!({"parents": [last], "title": format!("direction {i}"), "hypothesis": "bench"}),
                )?;
                last = r["node"].as_str().unwrap_or("n0").to_string();
            }
            1 => {
                study.call(
                    &owner,
                    "compare",
                    json!({"node": last, "nodes": ["n0", last], "task": "add2"}),
                )?;
            }
            _ => {
                study.call(
                    &owner,
                    "register_dataset",
                    json!({"node": last, "name": format!("d{i}"), "source": {"kind": "inline", "rows": [{"prompt": format!("{i}+1="), "answer": (i + 1).to_string()}]}}),
                )?;
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let action_ms_median = median(&mut times);
    let action_ms_p90 = percentile(&mut times, 0.9);
    eprintln!(
        "action: median {action_ms_median:.2} ms, p90 {action_ms_p90:.2} ms over {actions} actions"
    );

    // 2. A large DAG, built through the same API (branch actions), then packed like a real repo.
    let big = base.join("dag");
    let reusing = reuse && big.join(".git").is_dir();
    if !reusing {
        bench_study(&big, nodes + actions)?;
    }
    let mut study = Study::open(&big)?;
    let t = Instant::now();
    let have = study.index().node_count()? as usize;
    let nodes = if reusing { have } else { nodes };
    let mut ids: Vec<String> = (0..have.max(1)).map(|i| format!("n{i}")).collect();
    let mut rng_state: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in have..nodes {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        let p1 = ids[(rng_state % ids.len() as u64) as usize].clone();
        let mut parents = vec![p1.clone()];
        if i % 10 == 0 {
            let p2 = ids[((rng_state >> 20) % ids.len() as u64) as usize].clone();
            if p2 != p1 {
                parents.push(p2);
            }
        }
        let r = study.branch(
            &owner,
            BranchRequest {
                parents,
                title: format!("direction {i}"),
                hypothesis: String::new(),
            },
        )?;
        ids.push(r.node);
        if i % 10_000 == 0 {
            eprintln!("built {i} nodes in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    let build_s = t.elapsed().as_secs_f64();
    let status = std::process::Command::new("git")
        .args(["-C", &big.to_string_lossy(), "pack-refs", "--all"])
        .status()
        .map_err(|e| Error::internal(format!("git pack-refs: {e}")))?;
    if !status.success() {
        return Err(Error::internal("git pack-refs failed"));
    }
    let mut dag_runs = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        let r = study.dag(DagRequest::default())?;
        dag_runs.push(t.elapsed().as_secs_f64() * 1000.0);
        if r.nodes.len() != nodes {
            return Err(Error::internal(format!(
                "dag returned {} nodes, expected {nodes}",
                r.nodes.len()
            )));
        }
    }
    let mut reindex_runs = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        study.reindex()?;
        reindex_runs.push(t.elapsed().as_secs_f64());
    }
    let report = BenchReport {
        machine: machine(),
        action_ms_median,
        action_ms_p90,
        actions_timed: actions,
        nodes,
        build_s,
        dag_ms_median: median(&mut dag_runs.clone()),
        dag_ms_runs: dag_runs,
        reindex_s_median: median(&mut reindex_runs.clone()),
        reindex_s_runs: reindex_runs,
    };
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("machine:            {}", report.machine);
        println!(
            "accepted action:    median {:.2} ms, p90 {:.2} ms ({} actions)",
            report.action_ms_median, report.action_ms_p90, actions
        );
        println!("build {} nodes:  {:.1} s", nodes, report.build_s);
        println!(
            "dag query:          median {:.1} ms over {} runs {:?}",
            report.dag_ms_median,
            repeat,
            report
                .dag_ms_runs
                .iter()
                .map(|x| (x * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
        println!(
            "reindex:            median {:.2} s over {} runs {:?}",
            report.reindex_s_median,
            repeat,
            report
                .reindex_s_runs
                .iter()
                .map(|x| (x * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

/// A study sized for the benchmark (the example's node budget is far smaller).
pub fn bench_study(dir: &Path, max_nodes: usize) -> Result<()> {
    std::fs::create_dir_all(dir.join("models/base"))?;
    std::fs::create_dir_all(dir.join("eval"))?;
    crate::trainer::write_base_model(&dir.join("models/base"))?;
    let rows = crate::datasets::to_jsonl(&[crate::api::types::Row {
        prompt: "1+1=".into(),
        answer: "2".into(),
    }])?;
    std::fs::write(dir.join("eval/dev.jsonl"), &rows)?;
    std::fs::write(dir.join("eval/test.jsonl"), &rows)?;
    let config = format!(
        "[study]\nname = \"bench\"\n[base_model]\nname = \"base\"\npath = \"models/base\"\n\
         [tasks.add2]\ndev = {{ path = \"eval/dev.jsonl\" }}\ntest = {{ path = \"eval/test.jsonl\" }}\n\
         [budgets]\nmax_nodes = {max_nodes}\n[jobs]\nsft = [\"@rsim\", \"job\", \"train\"]\nevaluate = [\"@rsim\", \"job\", \"eval\"]\n"
    );
    std::fs::write(dir.join(crate::config::CONFIG_FILE), config)?;
    crate::init::init(dir, None)?;
    Ok(())
}

fn tempdir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("rsim-bench-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
