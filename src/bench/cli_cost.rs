//! `rsim bench-cli`: the cost of one CLI call, as an agent with a shell pays it — separate
//! processes of this binary on one study, with `[record] fsync` on and off.

use std::path::Path;
use std::time::Instant;

use super::{bench_dir, machine, median, percentile};
use crate::util::error::{Error, Result};

/// Which `[record] fsync` settings `rsim bench-cli` measures (the command line names them `on`,
/// `off`, `both`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
) -> Result<String> {
    let mut txt = String::new();
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
        outln!(txt, "{}", serde_json::to_string_pretty(&rep)?);
    } else {
        outln!(txt, "machine: {}", rep.machine);
        outln!(
            txt,
            "per rsim process, wall ms over {} runs (after {} warm-up runs):",
            rep.runs,
            rep.warmup
        );
        for r in &rep.results {
            let fs = if r.fsync { "fsync on " } else { "fsync off" };
            outln!(
                txt,
                "  {fs}  query `rsim {}`: median {:.2}, p90 {:.2}",
                r.query.join(" "),
                r.query_ms_median,
                r.query_ms_p90
            );
            outln!(
                txt,
                "  {fs}  write `rsim {}`: median {:.2}, p90 {:.2}",
                r.write.join(" "),
                r.write_ms_median,
                r.write_ms_p90
            );
        }
    }
    Ok(txt)
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
    let file = crate::config::CONFIG_FILE;
    let text = crate::os::owner::committed_config_text(study)?;
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
    crate::os::owner::commit_config(
        study,
        &text,
        ("rsim bench", "bench@rsim.invalid"),
        &format!("bench-cli: [record] fsync = {fsync}"),
    )?;
    Ok(())
}
