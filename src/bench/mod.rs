//! Benchmarks (`rsim bench`, `bench-cli`, `bench-strategies`, `bench-train`, `bench-step`): each builds studies
//! and measures them through the same Experiment OS API as every face — actions and queries
//! through `Study`, campaigns through `campaign::run`, the committed config through `os::owner` —
//! and returns its report as the command prints it (JSON or lines for a person); the command-line
//! face parses the arguments and prints. Invariant: no protocol (the layers: `bench` sits between
//! `campaign` and `faces`), no record — what a benchmark needs from a face (an example study, the
//! HTML page) is handed in as `Faces`.

use std::path::Path;

use crate::os::Study;
use crate::util::error::{Error, Result};

/// One line of a report (writing into a `String` cannot fail).
macro_rules! outln {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o, $($t)*);
    }};
}

pub mod actions;
pub mod cli_cost;
pub mod phases;
pub mod slurm;
pub mod step;
pub mod strategies;
pub mod train;
pub mod views;

/// What benchmarks need from the faces, which sit above them in the layers (so the command line
/// hands these in instead of the benchmarks importing them).
#[derive(Clone, Copy)]
pub struct Faces {
    /// Make a study in the directory from a shipped example, as `rsim init DIR --example NAME`.
    pub init_example: fn(&Path, &str) -> Result<()>,
    /// The self-contained HTML page of a study (`rsim report --html`).
    pub static_page: fn(&Study) -> Result<String>,
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

/// A study sized for the benchmark (the example's node budget is far smaller).
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
    // What `rsim init DIR` does with a filled-in config: refuse a study, else its genesis.
    if crate::os::genesis::is_study(dir) {
        return Err(Error::invalid(format!(
            "{} is already a study (main has commits); nothing was changed",
            dir.display()
        )));
    }
    crate::os::genesis::create_study(dir)?;
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

/// This process's peak resident memory in KiB (`VmHWM`; Linux only). A new program's memory
/// starts at exec, so unlike a parent's rusage of its child it counts nothing the parent held.
pub fn peak_resident_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
