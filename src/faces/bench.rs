//! `rsim bench`: the record's performance targets, measured on the machine it runs on.
//!
//! 1. Cost of one accepted action (schema validation + policy + git commit + index update):
//!    median over `actions` `compare`/`branch`/`conclude`-style actions on a fresh study.
//! 2. A study with `nodes` nodes: the `dag` query (load from the index, build the petgraph, answer)
//!    and `reindex` (rebuild the index from git alone), each the median of `repeat` runs.
//!
//! `rsim bench --slurm N` measures jobs instead: the same tiny-arith `run_sft` N times on the local
//! backend and N times on the Slurm backend (after one warm-up each), giving Slurm's
//! submit-to-start latency and the overhead of a Slurm job over a local one (medians).

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use crate::api::types::*;
use crate::model::{Caller, Split};
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::{Error, Result};

#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    pub machine: String,
    pub action_ms_median: f64,
    pub action_ms_p90: f64,
    pub actions_timed: usize,
    /// Signing a commit with the study's key (part of every action), and checking one.
    pub sign_us_median: f64,
    pub verify_us_median: f64,
    pub nodes: usize,
    pub build_s: f64,
    pub dag_ms_median: f64,
    pub dag_ms_runs: Vec<f64>,
    pub reindex_s_median: f64,
    pub reindex_s_runs: Vec<f64>,
    /// Size of each query's answer an agent gets (default bound) and of the unbounded `dag`,
    /// in JSON bytes and estimated tokens (bytes / 4).
    pub answers: Vec<AnswerSize>,
}

#[derive(Debug, serde::Serialize)]
pub struct AnswerSize {
    pub query: String,
    pub bytes: usize,
    pub tokens: u64,
    /// Items in the answer, and whether a next page exists.
    pub items: usize,
    pub more: bool,
}

/// The answers an agent gets from a study, measured through `Study::call` (JSON as MCP sends it).
pub fn answer_sizes(study: &Study) -> Result<Vec<AnswerSize>> {
    let who = Caller::new("bench", crate::model::Role::Observer);
    let mut out = Vec::new();
    for (label, query, args, list) in [
        (
            "dag full, unbounded",
            "dag",
            serde_json::json!({"max_tokens": 10_000_000}),
            "nodes",
        ),
        (
            "dag full (default bound)",
            "dag",
            serde_json::json!({}),
            "nodes",
        ),
        (
            "dag summary",
            "dag",
            serde_json::json!({"view": "summary"}),
            "nodes",
        ),
        (
            "dag frontier",
            "dag",
            serde_json::json!({"view": "frontier"}),
            "nodes",
        ),
        (
            "list_nodes limit 100000",
            "list_nodes",
            serde_json::json!({"limit": 100_000}),
            "nodes",
        ),
        (
            "log limit 100000",
            "log",
            serde_json::json!({"limit": 100_000}),
            "actions",
        ),
    ] {
        let v = study.call(&who, query, args)?;
        let bytes = serde_json::to_vec(&v)?.len();
        out.push(AnswerSize {
            query: label.to_string(),
            bytes,
            tokens: (bytes as u64).div_ceil(4),
            items: v[list].as_array().map_or(0, Vec::len),
            more: v["next_cursor"].is_string(),
        });
    }
    Ok(out)
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
    let base = bench_dir(dir)?;
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

    let (mut sign, mut verify) = study.signing_cost(&last, 200)?;
    let (sign_us_median, verify_us_median) = (median(&mut sign), median(&mut verify));
    eprintln!("signing: sign {sign_us_median:.0} µs, verify {verify_us_median:.0} µs per commit");
    drop(study);

    // 2. A large DAG, built through the same API (branch actions), then packed like a real repo.
    let big = base.join("dag");
    let reusing = reuse && big.join(".git").is_dir();
    if !reusing {
        bench_study(&big, nodes + actions)?;
    }
    let mut study = Study::open(&big)?;
    let t = Instant::now();
    let have = study
        .list_nodes(
            &Caller::owner(),
            crate::api::types::ListNodesRequest {
                status: None,
                limit: 1,
                offset: 0,
                max_tokens: None,
                cursor: None,
            },
        )?
        .total as usize;
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
        let r = study.dag(
            &Caller::owner(),
            DagRequest {
                max_tokens: Some(10_000_000),
                ..DagRequest::default()
            },
        )?;
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
    let answers = answer_sizes(&study)?;
    let report = BenchReport {
        answers,
        machine: machine(),
        action_ms_median,
        action_ms_p90,
        actions_timed: actions,
        sign_us_median,
        verify_us_median,
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
        println!(
            "commit signature:   sign {:.0} µs, verify {:.0} µs (median of 200)",
            report.sign_us_median, report.verify_us_median
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
        println!("answers at {nodes} nodes (tokens = JSON bytes / 4):");
        for a in &report.answers {
            println!(
                "  {:<26} {:>10} bytes {:>9} tokens {:>7} items{}",
                a.query,
                a.bytes,
                a.tokens,
                a.items,
                if a.more { ", next_cursor" } else { "" }
            );
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

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
) -> Result<()> {
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
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("machine:               {}", report.machine);
        println!(
            "job:                   tiny-arith-ngram run_sft, {} steps, {} runs per backend (medians)",
            report.steps, report.jobs
        );
        println!(
            "local:                 action {:.3} s, job {:.3} s",
            report.local_action_s_median, report.local_job_s_median
        );
        println!(
            "slurm:                 action {:.3} s, job {:.3} s",
            report.slurm_action_s_median, report.slurm_job_s_median
        );
        println!(
            "slurm submit-to-start: median {:.3} s {:?}",
            report.slurm_submit_to_start_s_median, report.slurm_submit_to_start_s_runs
        );
        println!(
            "slurm overhead:        {:.3} s per job over local",
            report.slurm_overhead_s
        );
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

/// A study sized for the benchmark (the example's node budget is far smaller).
/// One view of one DAG shape: its size and the time to produce it.
#[derive(Debug, serde::Serialize)]
pub struct ViewFigure {
    pub shape: &'static str,
    pub view: &'static str,
    pub nodes: usize,
    pub bytes: usize,
    pub bytes_per_node: f64,
    pub ms: f64,
}

/// `rsim bench --views N`: every text view of a chain N deep and of a DAG N wide (N children of
/// the root), built through branch actions by the campaign's own author (so the report shows
/// every node). Views must be linear in the DAG's size: bytes per node stay flat as N grows.
pub fn views(n: usize, dir: Option<&Path>, json_out: bool) -> Result<()> {
    let base = bench_dir(dir)?;
    let author = Caller::new("orchestrator", crate::model::Role::Owner);
    let mut figures = Vec::new();
    for shape in ["chain", "wide"] {
        let root = base.join(shape);
        if root.exists() {
            std::fs::remove_dir_all(&root)?;
        }
        bench_study(&root, n + 10)?;
        let study = Study::open(&root)?;
        let t = Instant::now();
        let mut last = crate::model::ROOT_NODE.to_string();
        for i in 0..n {
            let parent = if shape == "chain" {
                last.clone()
            } else {
                crate::model::ROOT_NODE.to_string()
            };
            let r = study.branch(
                &author,
                BranchRequest {
                    parents: vec![parent],
                    title: format!("step {i}"),
                    hypothesis: String::new(),
                },
            )?;
            last = r.node;
        }
        eprintln!(
            "{shape}: built {n} nodes in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let nodes = n + 1;
        let mut time = |view: &'static str, f: &mut dyn FnMut() -> Result<usize>| -> Result<()> {
            let t = Instant::now();
            let bytes = f()?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            eprintln!("{shape} {view}: {bytes} bytes in {ms:.1} ms");
            figures.push(ViewFigure {
                shape,
                view,
                nodes,
                bytes,
                bytes_per_node: bytes as f64 / nodes as f64,
                ms,
            });
            Ok(())
        };
        time("dag text", &mut || Ok(study.dag_graph()?.to_text().len()))?;
        time("dag dot", &mut || Ok(study.dag_graph()?.to_dot(None).len()))?;
        time("report text", &mut || {
            let r = crate::campaign::report::build(&study, None)?;
            Ok(crate::campaign::report::text(&r).len())
        })?;
        time("report html", &mut || {
            Ok(crate::faces::web::page::static_page(&study)?.len())
        })?;
    }
    if json_out {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        println!("machine: {}", machine());
        for f in &figures {
            println!(
                "{:<6} {:<12} {:>6} nodes  {:>10} bytes  {:>8.1} bytes/node  {:>9.1} ms",
                f.shape, f.view, f.nodes, f.bytes, f.bytes_per_node, f.ms
            );
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

/// `rsim bench --web N`: serve the page over a made-up DAG of `n` nodes (the layout and
/// everything after it run as for a real study) until interrupted.
pub fn web(n: usize, addr: &str, dir: Option<&Path>) -> Result<()> {
    let root = bench_dir(dir)?.join("web");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    bench_study(&root, 10)?;
    let session = std::sync::Arc::new(crate::os::session::Session::open(&root)?);
    let web =
        crate::faces::web::Web::with_overview(session, crate::faces::dagview::synthetic(n, 1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::util::error::Error::internal(format!("cannot start a runtime: {e}")))?;
    let r = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| crate::util::error::Error::invalid(format!("--http {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| crate::util::error::Error::internal(e.to_string()))?;
        eprintln!("rsim: a made-up DAG of {n} nodes (benchmark)");
        eprintln!("rsim: the web page is at http://{local}/");
        axum::serve(listener, crate::faces::web::router(web))
            .with_graceful_shutdown(async {
                let term = async {
                    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    {
                        Ok(mut s) => {
                            s.recv().await;
                        }
                        Err(_) => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term => {}
                }
            })
            .await
            .map_err(|e| crate::util::error::Error::internal(e.to_string()))
    });
    let _ = std::fs::remove_dir_all(&root);
    r
}

pub fn bench_study(dir: &Path, max_nodes: usize) -> Result<()> {
    write_study(dir, max_nodes, "kind = \"local\"\n")
}

/// A benchmark study with the given `[backend]` section.
fn write_study(dir: &Path, max_nodes: usize, backend: &str) -> Result<()> {
    std::fs::create_dir_all(dir.join("models/base"))?;
    std::fs::create_dir_all(dir.join("eval"))?;
    crate::train::write_base_model(&dir.join("models/base"))?;
    // Disjoint splits (a study whose splits share items is refused at creation).
    for (split, prompt, answer) in [("dev", "1+1=", "2"), ("test", "2+2=", "4")] {
        let rows = crate::train::datasets::to_jsonl(&[crate::api::types::Row {
            prompt: prompt.into(),
            answer: answer.into(),
        }])?;
        std::fs::write(dir.join(format!("eval/{split}.jsonl")), &rows)?;
    }
    let config = format!(
        "[study]\nname = \"bench\"\n[base_model]\nname = \"base\"\npath = \"models/base\"\n\
         [tasks.add2]\ndev = {{ path = \"eval/dev.jsonl\" }}\ntest = {{ path = \"eval/test.jsonl\" }}\n\
         [budgets]\nmax_nodes = {max_nodes}\n[backend]\n{backend}[jobs]\nsft = [\"@rsim\", \"job\", \"train\"]\nevaluate = [\"@rsim\", \"job\", \"eval\"]\n"
    );
    std::fs::write(dir.join(crate::config::CONFIG_FILE), config)?;
    crate::faces::init::init(dir, None)?;
    Ok(())
}

/// Where a benchmark builds its studies: `--dir`, else a fresh temporary directory (removed after).
fn bench_dir(dir: Option<&Path>) -> Result<std::path::PathBuf> {
    match dir {
        Some(d) => Ok(d.to_path_buf()),
        None => tempdir(),
    }
}

fn tempdir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("rsim-bench-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// One campaign of the strategy benchmark.
#[derive(Debug, serde::Serialize)]
pub struct CampaignRun {
    pub strategy: crate::campaign::Strategy,
    pub seed: u64,
    pub summary: crate::campaign::RunSummary,
}

/// The efficiency benchmark: each strategy runs `seeds` campaigns of `experiments` × `steps` on
/// fresh studies of `example`; the best node of each (promoted by reviewers for orchestration,
/// best on dev for the baselines) is scored once on the protected test split.
pub fn strategies(
    example: &str,
    seeds: u64,
    experiments: u64,
    steps: u64,
    which: &[crate::campaign::Strategy],
    dir: Option<&Path>,
    json_out: bool,
) -> Result<()> {
    use crate::campaign::{RunOptions, Strategy, run};
    let base = bench_dir(dir)?;
    let which: Vec<Strategy> = if which.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        which.to_vec()
    };
    let mut runs = Vec::new();
    for seed in 0..seeds {
        for s in &which {
            let d = base.join(format!("{s:?}-{seed}").to_lowercase());
            if !d.join(".git").exists() {
                crate::faces::init::init(&d, Some(example))?;
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
            if let Some(saved) = crate::campaign::saved_options(&d)?
                && (saved.strategy, saved.experiments, saved.steps, saved.seed)
                    != (o.strategy, o.experiments, o.steps, o.seed)
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
                "{s:?} seed {seed}: best dev {:?} test {:?}, lock-in share {:.2} depth {}, {} experiments, {:.0} s",
                summary.best_dev,
                summary.test,
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
    for s in &which {
        let mine: Vec<&CampaignRun> = runs.iter().filter(|r| r.strategy == *s).collect();
        let col = |f: &dyn Fn(&CampaignRun) -> Option<f64>| -> Vec<f64> {
            mine.iter().filter_map(|r| f(r)).collect()
        };
        let test = col(&|r| r.summary.test);
        let dev = col(&|r| r.summary.best_dev);
        let share = col(&|r| Some(r.summary.lock_in.top_share));
        let depth = col(&|r| Some(r.summary.lock_in.max_lonely_depth as f64));
        let secs = col(&|r| Some(r.summary.seconds));
        let (tm, tci) = crate::util::stats::mean_ci95(&test);
        rows.push(json!({
            "strategy": s, "campaigns": mine.len(), "test": test, "test_mean": tm, "test_ci95": tci,
            "best_dev_mean": crate::util::stats::mean_ci95(&dev).0,
            "lock_in_share_mean": crate::util::stats::mean_ci95(&share).0,
            "lock_in_depth_mean": crate::util::stats::mean_ci95(&depth).0,
            "seconds_mean": crate::util::stats::mean_ci95(&secs).0,
        }));
    }
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"example": example, "seeds": seeds, "experiments": experiments, "steps": steps, "strategies": rows, "runs": runs})
            )?
        );
    } else {
        println!(
            "strategy benchmark: {example}, {experiments} experiments × {steps} steps per campaign, {seeds} seeds per strategy"
        );
        println!(
            "{:<10} {:>22} {:>10} {:>14} {:>14} {:>8}",
            "strategy", "best test (95% CI)", "best dev", "lock-in share", "lock-in depth", "secs"
        );
        for r in &rows {
            let ci = r["test_ci95"]
                .as_array()
                .map(|a| {
                    format!(
                        " [{:.3}, {:.3}]",
                        a[0].as_f64().unwrap_or(f64::NAN),
                        a[1].as_f64().unwrap_or(f64::NAN)
                    )
                })
                .unwrap_or_default();
            let f = |k: &str| {
                r[k].as_f64()
                    .map_or("n/a".to_string(), |v| format!("{v:.3}"))
            };
            println!(
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
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

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
pub fn training(o: &TrainBenchOptions, dir: Option<&Path>, json_out: bool) -> Result<()> {
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
            crate::faces::init::init(&d, Some("tiny-arith"))?;
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
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "machine": machine(), "options": o, "formats": rows,
                "job_start_s_median": start_median, "job_start_s_runs": start_s, "ladders": ladders,
                "sandbox_ms_runs": sandbox_ms.0, "unsandboxed_ms_runs": sandbox_ms.1,
                "sandbox_cost_ms_median": median(&mut sandbox_ms.0.clone()) - median(&mut sandbox_ms.1.clone()),
            }))?
        );
    } else {
        print_training(&o, &rows, start_median, &start_s);
        let (with, without) = (median(&mut sandbox_ms.0), median(&mut sandbox_ms.1));
        println!(
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
    Ok(())
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

fn print_training(o: &TrainBenchOptions, rows: &[serde_json::Value], start: f64, start_s: &[f64]) {
    println!("machine: {}", machine());
    println!(
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
    println!(
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
        println!(
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
    println!(
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

/// Which `[record] fsync` settings `rsim bench-cli` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FsyncChoice {
    On,
    Off,
    Both,
}

/// Wall time of separate `rsim` processes on one study with one `[record] fsync` setting.
#[derive(Debug, serde::Serialize)]
pub struct CliBenchRun {
    pub fsync: bool,
    /// The query's command line (after `rsim -C STUDY`).
    pub query: Vec<String>,
    pub query_ms_median: f64,
    pub query_ms_p90: f64,
    /// The write's command line (after `rsim -C STUDY`): one accepted action per process.
    pub write: Vec<String>,
    pub write_ms_median: f64,
    pub write_ms_p90: f64,
    pub query_ms_runs: Vec<f64>,
    pub write_ms_runs: Vec<f64>,
}

/// What `rsim bench-cli` measured.
#[derive(Debug, serde::Serialize)]
pub struct CliBenchReport {
    pub machine: String,
    pub cores: usize,
    pub binary: String,
    pub runs: usize,
    pub warmup: usize,
    pub results: Vec<CliBenchRun>,
}

/// `rsim bench-cli`: the cost of one CLI call, as an agent with a shell pays it. Creates a study
/// (`rsim init DIR --example tiny-arith-ngram`, its `[record] fsync` set and committed on main),
/// then times `runs` separate processes of this binary for a query and for a write (after
/// `warmup` untimed ones each): wall time from spawn to exit, per process.
pub fn cli(
    runs: usize,
    warmup: usize,
    fsync: FsyncChoice,
    dir: Option<&Path>,
    json_out: bool,
) -> Result<()> {
    let runs = runs.max(1);
    let exe = crate::os::current_rsim()?;
    let base = bench_dir(dir)?;
    let modes: &[bool] = match fsync {
        FsyncChoice::On => &[true],
        FsyncChoice::Off => &[false],
        FsyncChoice::Both => &[true, false],
    };
    let query: Vec<String> = ["show", "n0", "--json"].map(String::from).to_vec();
    let write: Vec<String> = ["branch", "--from", "n0", "--title", "t"]
        .map(String::from)
        .to_vec();
    let mut results = Vec::new();
    for &on in modes {
        let study = base.join(if on { "cli-fsync-on" } else { "cli-fsync-off" });
        if study.exists() {
            std::fs::remove_dir_all(&study)?;
        }
        let init = [
            "init".to_string(),
            study.to_string_lossy().into_owned(),
            "--example".into(),
            "tiny-arith-ngram".into(),
        ];
        time_rsim(&exe, None, &init)?;
        commit_bench_config(&study, on, warmup + runs)?;
        let timed = |args: &[String]| -> Result<Vec<f64>> {
            for _ in 0..warmup {
                time_rsim(&exe, Some(&study), args)?;
            }
            (0..runs)
                .map(|_| time_rsim(&exe, Some(&study), args))
                .collect()
        };
        let mut q = timed(&query)?;
        let mut w = timed(&write)?;
        let run = CliBenchRun {
            fsync: on,
            query: query.clone(),
            query_ms_median: median(&mut q),
            query_ms_p90: percentile(&mut q, 0.9),
            write: write.clone(),
            write_ms_median: median(&mut w),
            write_ms_p90: percentile(&mut w, 0.9),
            query_ms_runs: q,
            write_ms_runs: w,
        };
        eprintln!(
            "fsync {}: query median {:.2} ms, p90 {:.2} ms; write median {:.2} ms, p90 {:.2} ms",
            if on { "on " } else { "off" },
            run.query_ms_median,
            run.query_ms_p90,
            run.write_ms_median,
            run.write_ms_p90
        );
        results.push(run);
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    let rep = CliBenchReport {
        machine: machine(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        binary: exe.to_string_lossy().into_owned(),
        runs,
        warmup,
        results,
    };
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        println!("machine: {}", rep.machine);
        println!(
            "per rsim process, wall ms over {} runs (after {} warm-up runs):",
            rep.runs, rep.warmup
        );
        for r in &rep.results {
            let fs = if r.fsync { "fsync on " } else { "fsync off" };
            println!(
                "  {fs}  query `rsim {}`: median {:.2}, p90 {:.2}",
                r.query.join(" "),
                r.query_ms_median,
                r.query_ms_p90
            );
            println!(
                "  {fs}  write `rsim {}`: median {:.2}, p90 {:.2}",
                r.write.join(" "),
                r.write_ms_median,
                r.write_ms_p90
            );
        }
    }
    Ok(())
}

/// Run `exe [-C study] args` to completion; its wall time in ms. A failing run fails the benchmark.
fn time_rsim(exe: &Path, study: Option<&Path>, args: &[String]) -> Result<f64> {
    let mut cmd = std::process::Command::new(exe);
    if let Some(s) = study {
        cmd.arg("-C").arg(s);
    }
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let t = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| Error::internal(format!("cannot run {}: {e}", exe.display())))?;
    let out = child
        .wait_with_output()
        .map_err(|e| Error::internal(format!("cannot wait for {}: {e}", exe.display())))?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        return Err(Error::internal(format!(
            "`rsim {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(ms)
}

/// Commit the benchmark's settings on the study's main branch (the committed config applies):
/// `[record] fsync` and a node budget that fits every timed write.
fn commit_bench_config(study: &Path, fsync: bool, writes: usize) -> Result<()> {
    let record = crate::record::Record::open(study)?;
    let repo = record.repo();
    let main = repo.find_commit(record.main_tip()?)?;
    let file = crate::config::CONFIG_FILE;
    let entry = main
        .tree()?
        .get_name(file)
        .ok_or_else(|| Error::internal(format!("{file} is not committed on main")))?
        .id();
    let text = String::from_utf8_lossy(repo.find_blob(entry)?.content()).into_owned();
    let mut cfg: toml::Table = toml::from_str(&text)
        .map_err(|e| Error::internal(format!("the example's {file} does not parse: {e}")))?;
    let mut record_section = toml::Table::new();
    record_section.insert("fsync".into(), toml::Value::Boolean(fsync));
    cfg.insert("record".into(), toml::Value::Table(record_section));
    let budgets = cfg
        .entry("budgets")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(b) = budgets.as_table_mut() {
        b.insert(
            "max_nodes".into(),
            toml::Value::Integer(i64::try_from(writes + 100).unwrap_or(i64::MAX)),
        );
    }
    let text =
        toml::to_string(&cfg).map_err(|e| Error::internal(format!("cannot write {file}: {e}")))?;
    crate::config::StudyConfig::parse(&text, file)?;
    std::fs::write(study.join(file), &text)?;
    let blob = repo.blob(text.as_bytes())?;
    let mut tb = repo.treebuilder(Some(&main.tree()?))?;
    tb.insert(file, blob, i32::from(git2::FileMode::Blob))?;
    let tree = repo.find_tree(tb.write()?)?;
    let sig = git2::Signature::now("rsim bench", "bench@rsim.invalid")?;
    repo.commit(
        Some(crate::record::MAIN_REF),
        &sig,
        &sig,
        &format!("bench-cli: [record] fsync = {fsync}"),
        &tree,
        &[&main],
    )?;
    Ok(())
}
