//! `rsim bench-step`: the embedded trainer's time per training step beside PyTorch's on the same
//! model, weights and batches, interleaved in one run. Each measurement is a process of its own
//! (`rsim job step-bench`, and `torch_tiny_gpt.py` under the given interpreter) with its compute
//! threads set before its pools start, as a job's are; the loss curves of the two must agree, or
//! the comparison is not of the same model and the benchmark says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::{bench_dir, machine, median};
use crate::model::data::{AnswerFormat, ArithOp, ArithParams};
use crate::train::StepBenchSpec;
use crate::train::gpt::{Gpt, GptConfig, batch_order};
use crate::util::error::{Error, IoContext, Result};

/// The PyTorch twin of the embedded model (written into the benchmark's directory and run there).
const TORCH_SCRIPT: &str = include_str!("torch_tiny_gpt.py");

/// How far apart the two trainers' losses on the first steps (`train::FIRST_STEPS`) may be and
/// still count as one model: from the same weights and batches they differ only by f32 rounding
/// (sums in another order), ~1e-6; another model, loss, optimizer or batch is off by far more.
/// Later the trajectories part (training at this learning rate is chaotic), so the curves are
/// reported, not compared.
pub const FIRST_TOLERANCE: f64 = 1e-3;

/// Settings of `rsim bench-step`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepBenchOptions {
    /// Steps per measurement, the warm-up included.
    pub steps: u64,
    /// Steps before the clock starts.
    pub warmup_steps: u64,
    /// Interleaved repetitions (the medians are over these).
    pub runs: u32,
    pub threads: Vec<usize>,
    pub batch: usize,
    pub learning_rate: f64,
    /// Training rows (three-digit addition, reversed answers: the main job's winning format).
    pub rows: u64,
    /// The interpreter with PyTorch (none: the embedded trainer alone).
    pub python: Option<PathBuf>,
}

/// One measurement's report (what the child printed).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
struct Measured {
    trainer: String,
    threads: usize,
    ms_per_step: f64,
    curve: Vec<(u64, f64)>,
    first_losses: Vec<f64>,
}

/// `rsim bench-step`.
pub fn per_step(o: &StepBenchOptions, dir: Option<&Path>, json_out: bool) -> Result<String> {
    if o.steps <= o.warmup_steps
        || o.warmup_steps == 0
        || o.runs == 0
        || o.threads.is_empty()
        || o.threads.contains(&0)
        || o.batch == 0
        || o.rows == 0
    {
        return Err(Error::invalid(
            "bench-step needs a warm-up of at least 1 step and more steps than that, at least one run, threads of at least 1, a batch and rows",
        ));
    }
    let base = bench_dir(dir)?;
    std::fs::create_dir_all(&base).at("cannot create", &base)?;
    let result = measure(o, &base);
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    let (embedded, torch, torch_version) = result?;
    report(o, &embedded, &torch, torch_version.as_deref(), json_out)
}

type Measurements = (Vec<Measured>, Vec<Measured>, Option<String>);

fn measure(o: &StepBenchOptions, base: &Path) -> Result<Measurements> {
    let rows = crate::train::datasets::generate_arith(&ArithParams {
        op: ArithOp::Add,
        digits: 3,
        format: AnswerFormat::Reversed,
        n: o.rows,
        seed: 1,
    });
    let rows_path = base.join("rows.jsonl");
    std::fs::write(&rows_path, crate::train::datasets::to_jsonl(&rows)?)
        .at("cannot write", &rows_path)?;
    let init = base.join("init");
    Gpt::init(GptConfig::small(), 0)?.save(&init)?;
    let seed = 7;
    let spec = StepBenchSpec {
        rows: rows_path,
        init,
        steps: o.steps,
        warmup_steps: o.warmup_steps,
        batch: o.batch,
        learning_rate: o.learning_rate,
        seed,
        batches: batch_order(seed, rows.len(), o.batch)
            .take(o.steps as usize)
            .collect(),
    };
    let spec_path = base.join("spec.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec)?).at("cannot write", &spec_path)?;
    let script = base.join("torch_tiny_gpt.py");
    std::fs::write(&script, TORCH_SCRIPT).at("cannot write", &script)?;
    let torch_version = match &o.python {
        Some(py) => Some(torch_version(py)?),
        None => None,
    };
    let exe = std::env::current_exe().map_err(|e| Error::internal(format!("own path: {e}")))?;
    let (mut embedded, mut torch) = (Vec::new(), Vec::new());
    for run in 0..o.runs {
        for &t in &o.threads {
            let mut ours = Command::new(&exe);
            ours.args(["job", "step-bench"]).arg(&spec_path);
            for var in crate::jobs::THREAD_VARS {
                ours.env(var, t.to_string());
            }
            ours.env("CANDLE_NUM_THREADS", t.to_string());
            let theirs = o.python.as_ref().map(|py| {
                let mut c = Command::new(py);
                c.arg(&script).arg(&spec_path).arg(t.to_string());
                c
            });
            // Interleaved, and alternating who goes first: a machine that slows down during
            // the run slows both.
            let mut order = vec![(ours, &mut embedded)];
            if let Some(c) = theirs {
                order.push((c, &mut torch));
            }
            if run % 2 == 1 {
                order.reverse();
            }
            for (cmd, into) in order {
                let m = child(cmd)?;
                eprintln!(
                    "bench-step: run {} · {} · {t} thread(s): {:.2} ms/step",
                    run + 1,
                    m.trainer,
                    m.ms_per_step
                );
                into.push(m);
            }
        }
    }
    Ok((embedded, torch, torch_version))
}

fn torch_version(py: &Path) -> Result<String> {
    let out = Command::new(py)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map_err(|e| Error::invalid(format!("--python {}: {e}", py.display())))?;
    if !out.status.success() {
        return Err(Error::invalid(format!(
            "--python {}: cannot import torch ({}); point it at an interpreter with PyTorch, e.g. the hf-tiny example's environment",
            py.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Run one measurement and read its JSON line.
fn child(mut cmd: Command) -> Result<Measured> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| Error::internal(format!("{shown}: {e}")))?;
    if !out.status.success() {
        return Err(Error::internal(format!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(line)
        .map_err(|e| Error::internal(format!("{shown} printed {line:?}: {e}")))
}

/// The largest distance between two runs' losses on their first steps (infinite when they do
/// not report the same number of steps, or a loss is not a number: nothing shows they agree).
fn first_gap(a: &[f64], b: &[f64]) -> f64 {
    if a.is_empty() || a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0,
            |m, d| {
                if d.is_nan() { f64::INFINITY } else { m.max(d) }
            },
        )
}

fn report(
    o: &StepBenchOptions,
    embedded: &[Measured],
    torch: &[Measured],
    torch_version: Option<&str>,
    json_out: bool,
) -> Result<String> {
    let of = |ms: &[Measured], t: usize| -> Vec<f64> {
        ms.iter()
            .filter(|m| m.threads == t)
            .map(|m| m.ms_per_step)
            .collect()
    };
    let mut rows = Vec::new();
    for &t in &o.threads {
        let mut e = of(embedded, t);
        let mut p = of(torch, t);
        let (em, pm) = (median(&mut e), median(&mut p));
        rows.push(json!({
            "threads": t,
            "embedded_ms_per_step": em,
            "embedded_runs": e,
            "pytorch_ms_per_step": (!p.is_empty()).then_some(pm),
            "pytorch_runs": p,
            "ratio": (!p.is_empty()).then_some(em / pm),
        }));
    }
    // Every PyTorch run against the embedded run of the same threads and repetition.
    let gap = (!torch.is_empty()).then(|| {
        embedded
            .iter()
            .zip(torch)
            .map(|(e, p)| first_gap(&e.first_losses, &p.first_losses))
            .fold(0.0, f64::max)
    });
    let last = |ms: &[Measured]| ms.first().and_then(|m| m.curve.last().copied());
    let same_model = gap.map(|g| g <= FIRST_TOLERANCE);
    let v = json!({
        "benchmark": "bench-step",
        "machine": machine(),
        "options": o,
        "pytorch": torch_version,
        "rows": rows,
        "first_steps_gap": gap,
        "first_steps_tolerance": FIRST_TOLERANCE,
        "embedded_first_losses": embedded.first().map(|m| &m.first_losses),
        "pytorch_first_losses": torch.first().map(|m| &m.first_losses),
        "same_model": same_model,
        "embedded_final_loss": last(embedded),
        "pytorch_final_loss": last(torch),
    });
    if same_model == Some(false) {
        return Err(Error::internal(format!(
            "bench-step: the two trainers' losses on their first steps differ by {:.2e} (more than {FIRST_TOLERANCE}): they do not train the same model, so their times do not compare\n{v}",
            gap.unwrap_or(f64::NAN)
        )));
    }
    if json_out {
        return Ok(format!("{v}\n"));
    }
    let mut txt = String::new();
    outln!(
        txt,
        "bench-step: {} steps of batch {} ({} timed after a {}-step warm-up), median of {} interleaved runs, {}",
        o.steps,
        o.batch,
        o.steps - o.warmup_steps,
        o.warmup_steps,
        o.runs,
        machine()
    );
    match torch_version {
        Some(v) => outln!(txt, "PyTorch {v} on the same model, weights and batches"),
        None => outln!(
            txt,
            "PyTorch: not measured (pass --python with an interpreter that has it)"
        ),
    }
    outln!(
        txt,
        "{:>8}  {:>14}  {:>14}  {:>9}",
        "threads",
        "embedded ms",
        "pytorch ms",
        "ratio"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().map_or("-".into(), |x| format!("{x:.2}"));
        outln!(
            txt,
            "{:>8}  {:>14}  {:>14}  {:>9}",
            r["threads"],
            f("embedded_ms_per_step"),
            f("pytorch_ms_per_step"),
            f("ratio")
        );
    }
    if let Some(g) = gap {
        outln!(
            txt,
            "same model: the first {} steps' losses agree within {g:.1e} (tolerance {FIRST_TOLERANCE}); final loss (mean of 20 steps) embedded {:.4}, pytorch {:.4}",
            crate::train::FIRST_STEPS,
            last(embedded).map_or(f64::NAN, |x| x.1),
            last(torch).map_or(f64::NAN, |x| x.1)
        );
    }
    Ok(txt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_agree_only_when_every_first_loss_is_close() {
        assert!(first_gap(&[3.0, 2.5], &[3.0, 2.5004]) < 1e-3);
        assert!(first_gap(&[3.0, 2.5], &[3.0, 2.6]) > FIRST_TOLERANCE);
        assert_eq!(first_gap(&[3.0, 2.5], &[3.0]), f64::INFINITY);
        assert_eq!(first_gap(&[], &[]), f64::INFINITY);
        assert_eq!(first_gap(&[3.0, f64::NAN], &[3.0, 2.5]), f64::INFINITY);
    }
}
