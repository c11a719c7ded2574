//! `rsim bench`: the record's performance targets, measured on the machine it runs on.
//!
//! 1. Cost of one accepted action (schema validation + policy + git commit + index update):
//!    median over `actions` `compare`/`branch`/`conclude`-style actions on a fresh study.
//! 2. A study with `nodes` nodes: the `dag` query (load from the index, build the petgraph, answer)
//!    and `reindex` (rebuild the index from git alone), each the median of `repeat` runs.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use super::{bench_dir, bench_study, machine, median, percentile};
use crate::api::types::*;
use crate::model::Caller;
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
    /// Where the timed actions' time went: each write phase's own time per action.
    pub phases: Vec<super::phases::Phase>,
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

pub fn run(
    nodes: usize,
    actions: usize,
    repeat: usize,
    dir: Option<&Path>,
    reuse: bool,
    json_out: bool,
) -> Result<String> {
    let mut txt = String::new();
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
    // Each write phase's own time, listened to on this thread while the actions run.
    let phases = super::phases::Phases::default();
    phases.listen(|| -> Result<()> {
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
    Ok(())
    })?;
    let phases = phases.per_action(actions);
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
        phases,
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
        outln!(txt, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(txt, "machine:            {}", report.machine);
        outln!(
            txt,
            "accepted action:    median {:.2} ms, p90 {:.2} ms ({} actions)",
            report.action_ms_median,
            report.action_ms_p90,
            actions
        );
        outln!(
            txt,
            "  where its time goes (own time per action, µs; calls per action):"
        );
        for p in &report.phases {
            outln!(
                txt,
                "    {:<24} {:>8.1}  {:>5.2}",
                p.name,
                p.us_per_action,
                p.calls_per_action
            );
        }
        outln!(
            txt,
            "commit signature:   sign {:.0} µs, verify {:.0} µs (median of 200)",
            report.sign_us_median,
            report.verify_us_median
        );
        outln!(txt, "build {} nodes:  {:.1} s", nodes, report.build_s);
        outln!(
            txt,
            "dag query:          median {:.1} ms over {} runs {:?}",
            report.dag_ms_median,
            repeat,
            report
                .dag_ms_runs
                .iter()
                .map(|x| (x * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
        outln!(
            txt,
            "reindex:            median {:.2} s over {} runs {:?}",
            report.reindex_s_median,
            repeat,
            report
                .reindex_s_runs
                .iter()
                .map(|x| (x * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
        outln!(txt, "answers at {nodes} nodes (tokens = JSON bytes / 4):");
        for a in &report.answers {
            outln!(
                txt,
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
    Ok(txt)
}

/// `rsim bench --node-actions N`: one node's record under N distinct actions.
#[derive(Debug, serde::Serialize)]
pub struct NodeRecordReport {
    pub machine: String,
    pub actions: usize,
    /// The study's whole `.git` after the actions, and per action.
    pub git_bytes: u64,
    pub bytes_per_action: f64,
    /// Packs left in `.git/objects/pack`.
    pub packs: usize,
    /// Median ms per action of the first and the last hundred.
    pub first_ms_median: f64,
    pub last_ms_median: f64,
    /// Where the last hundred actions' time went: each write phase's own time per action.
    pub phases: Vec<super::phases::Phase>,
}

/// Bytes of the regular files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// A fresh benchmark study in `base/name` with one node `title` branched from the root by
/// `caller`: its directory, the open study and the node's id.
fn study_with_node(
    base: &Path,
    name: &str,
    caller: &Caller,
    title: &str,
) -> Result<(std::path::PathBuf, Study, String)> {
    let study_dir = base.join(name);
    if study_dir.exists() {
        std::fs::remove_dir_all(&study_dir)?;
    }
    bench_study(&study_dir, 10)?;
    let study = Study::open(&study_dir)?;
    let node = study.call(
        caller,
        "branch",
        json!({"parents": ["n0"], "title": title, "hypothesis": "bench"}),
    )?["node"]
        .as_str()
        .unwrap_or("n0")
        .to_string();
    Ok((study_dir, study, node))
}

/// One node given `actions` distinct accepted `compare` actions (each one commit that adds a file
/// to the node's `actions/`, as a distinct refusal does): what its record weighs on disk per
/// action, and whether a write slows as the node grows.
pub fn node_actions(actions: usize, dir: Option<&Path>, json_out: bool) -> Result<String> {
    if actions == 0 {
        return Err(Error::invalid("--node-actions: give at least one action"));
    }
    let base = bench_dir(dir)?;
    let owner = Caller::owner();
    let (study_dir, study, node) = study_with_node(&base, "node-actions", &owner, "many actions")?;
    let mut times = Vec::with_capacity(actions);
    let head = actions.min(100);
    // Where the last hundred's time goes.
    let phases = super::phases::Phases::default();
    let mut act = |i: usize| -> Result<()> {
        let t = Instant::now();
        study.call(
            &owner,
            "compare",
            json!({"node": node, "nodes": ["n0", node], "task": "add2", "metric": format!("m{i}")}),
        )?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        if i % 1000 == 999 {
            eprintln!("node-actions: {} actions, last {:.2} ms", i + 1, times[i]);
        }
        Ok(())
    };
    for i in 0..actions - head {
        act(i)?;
    }
    phases.listen(|| (actions - head..actions).try_for_each(&mut act))?;
    let phases = phases.per_action(head);
    drop(study);
    let report = NodeRecordReport {
        machine: machine(),
        actions,
        git_bytes: bytes_under(&study_dir.join(".git")),
        bytes_per_action: 0.0,
        packs: std::fs::read_dir(study_dir.join(".git/objects/pack")).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
                .count()
        }),
        first_ms_median: median(&mut times[..head].to_vec()),
        last_ms_median: median(&mut times[times.len() - head..].to_vec()),
        phases,
    };
    let report = NodeRecordReport {
        bytes_per_action: report.git_bytes as f64 / actions.max(1) as f64,
        ..report
    };
    let mut txt = String::new();
    if json_out {
        outln!(txt, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(txt, "machine:          {}", report.machine);
        outln!(txt, "actions on {node}:    {}", report.actions);
        outln!(
            txt,
            ".git:             {} bytes, {:.0} bytes per action, {} packs",
            report.git_bytes,
            report.bytes_per_action,
            report.packs
        );
        outln!(
            txt,
            "write:            median {:.2} ms over the first {head}, {:.2} ms over the last {head}",
            report.first_ms_median,
            report.last_ms_median
        );
        outln!(
            txt,
            "  where the last {head} actions' time goes (own time per action, µs; calls per action):"
        );
        for p in &report.phases {
            outln!(
                txt,
                "    {:<24} {:>8.1}  {:>5.2}",
                p.name,
                p.us_per_action,
                p.calls_per_action
            );
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(txt)
}

/// One query's figures in `rsim bench --big-requests`.
#[derive(Debug, serde::Serialize)]
pub struct QueryFigure {
    pub query: &'static str,
    pub ms_median: f64,
    pub ms_runs: Vec<f64>,
    /// Peak resident memory of the `rsim` process that answered (MiB, largest of the runs).
    pub peak_mib: f64,
    pub answer_bytes: usize,
}

#[derive(Debug, serde::Serialize)]
pub struct BigRequestsReport {
    pub machine: String,
    pub actions: usize,
    pub request_mib: f64,
    pub queries: Vec<QueryFigure>,
}

/// Rows of about `bytes` of JSON that no protected item resembles, as many as the default policy
/// allows inline (100,000), each as long as it takes.
fn big_rows(bytes: usize, tag: usize) -> Vec<serde_json::Value> {
    const ROWS: usize = 100_000;
    let pad = "a".repeat((bytes / ROWS).saturating_sub(45));
    (0..ROWS)
        .map(|k| json!({"prompt": format!("x{k:07}-{tag} {pad}"), "answer": "bbbbbbbbbb"}))
        .collect()
}

/// One query in a fresh `rsim` process (this binary): its wall time, its peak resident memory
/// (MiB, as the process reports it: `RSIM_LOG=rsim::memory=info`) and its answer's size.
fn query_process(study: &Path, query: &str, args: &serde_json::Value) -> Result<(f64, f64, usize)> {
    let exe = std::env::current_exe()?;
    let t = Instant::now();
    let out = std::process::Command::new(exe)
        .arg("-C")
        .arg(study)
        .args(["--json", "call", query, &args.to_string()])
        .env("RSIM_LOG", "warn,rsim::memory=info")
        .output()?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(Error::internal(format!(
            "--big-requests: `rsim call {query}` failed: {stderr}"
        )));
    }
    let kib: f64 = stderr
        .lines()
        .find_map(|l| l.split("peak resident memory ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| {
            Error::internal(format!(
                "--big-requests: `rsim call {query}` reported no peak memory (Linux only): {stderr}"
            ))
        })?;
    Ok((ms, kib / 1024.0, out.stdout.len()))
}

/// `rsim bench --big-requests N`: one node given `n` accepted register_dataset actions whose
/// requests carry about 15 MB of inline rows each; `log` (limit 100) and `get_node` on it,
/// `repeat` runs each, each in a fresh `rsim` process: its wall time and peak memory (the
/// queries read each action's head; the rows stay in the record).
pub fn big_requests(n: usize, repeat: usize, dir: Option<&Path>, json_out: bool) -> Result<String> {
    if n == 0 {
        return Err(Error::invalid("--big-requests: give at least one action"));
    }
    let base = bench_dir(dir)?;
    let worker = Caller::new("bench", crate::model::Role::Worker);
    let (study_dir, study, node) = study_with_node(&base, "big-requests", &worker, "big requests")?;
    let mut request_bytes = 0usize;
    for i in 0..n {
        let req = json!({"node": node, "name": format!("big{i}"), "source": {"kind": "inline", "rows": big_rows(15 << 20, i)}});
        request_bytes = serde_json::to_vec(&req)?.len();
        study.call(&worker, "register_dataset", req)?;
        eprintln!("big-requests: {} of {n} registered", i + 1);
    }
    // `list_nodes` reads no action: the floor a process costs.
    let queries: [(&'static str, serde_json::Value); 3] = [
        ("log", json!({"limit": 100})),
        ("get_node", json!({"node": node})),
        ("list_nodes", json!({})),
    ];
    drop(study);
    let mut figures = Vec::new();
    for (query, args) in queries {
        let mut runs = Vec::new();
        let mut peak = 0f64;
        let mut answer_bytes = 0;
        for _ in 0..repeat.max(1) {
            let (ms, mib, bytes) = query_process(&study_dir, query, &args)?;
            runs.push(ms);
            peak = peak.max(mib);
            answer_bytes = bytes;
        }
        figures.push(QueryFigure {
            query,
            ms_median: median(&mut runs.clone()),
            ms_runs: runs,
            peak_mib: peak,
            answer_bytes,
        });
    }
    let report = BigRequestsReport {
        machine: machine(),
        actions: n,
        request_mib: request_bytes as f64 / (1 << 20) as f64,
        queries: figures,
    };
    let mut txt = String::new();
    if json_out {
        outln!(txt, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(txt, "machine:   {}", report.machine);
        outln!(
            txt,
            "{} register_dataset actions on {node}, {:.1} MiB of request each",
            report.actions,
            report.request_mib
        );
        for q in &report.queries {
            outln!(
                txt,
                "{:<9} median {:.1} ms per process over {} runs, peak memory {:.1} MiB, answer {} bytes",
                q.query,
                q.ms_median,
                q.ms_runs.len(),
                q.peak_mib,
                q.answer_bytes
            );
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(txt)
}
