//! The job protocol: everything rsim and a job program (the embedded `rsim job train|eval`, the
//! GPU recipes in `tools/recipes/`, any command a study configures) exchange, in one place.
//!
//! - In: `spec.json` ([`JobParams`]), the path of which is the job command's last argument.
//! - Out, under `out/` beside it: a training job writes `out/checkpoint/` (a directory, stored as
//!   the new checkpoint) and `out/metrics.json` ([`TrainMetrics`]); an evaluation job writes
//!   `out/result.json` ([`EvalResult`]).
//! - Progress, on the job's stderr (its log): lines `step k/n loss x` ([`progress_line`],
//!   parsed back by [`progress_in`]).
//!
//! The types are job-side: they never embed an agent's request type (`crate::api`), so changing
//! what agents may ask for cannot silently change what job programs read. Their JSON Schemas are
//! generated into `schemas/jobs/` (see [`schema_files`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::data::{Adapter, EvalItem, Schedule};
use crate::model::{JobKind, Split};
use crate::util::error::{Error, IoContext, Result};

/// The spec file in a job's directory.
pub const SPEC_FILE: &str = "spec.json";
/// The directory beside the spec where a job writes what it produced.
pub const OUT_DIR: &str = "out";
/// Under `out/`: the checkpoint a training job produced.
pub const CHECKPOINT_DIR: &str = "checkpoint";
/// Under `out/`: checkpoints kept part-way through a run (`save_every`), one directory per step.
pub const STEPS_DIR: &str = "steps";
/// Under `out/`: a training job's numbers.
pub const METRICS_FILE: &str = "metrics.json";
/// Under `out/`: an evaluation job's scores.
pub const RESULT_FILE: &str = "result.json";

/// What a job reads from `spec.json`: a training or an evaluation job (the `kind` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobParams {
    /// Fine-tune `base` on `datasets`.
    Sft(SftParams),
    /// Score `checkpoint` on `eval_set`.
    Evaluate(EvalParams),
}

/// A training job's spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SftParams {
    /// The job's id.
    pub job: String,
    /// The node the run is recorded on.
    pub node: String,
    /// The checkpoint to start from.
    pub base: CheckpointRef,
    /// The rows to train on, mixed.
    #[schemars(length(min = 1))]
    pub datasets: Vec<DatasetRef>,
    pub hyper: TrainHyper,
}

/// How to train: exactly what the trainers use, built by rsim from the agent's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainHyper {
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Optimiser steps.
    #[schemars(range(min = 1))]
    pub steps: u64,
    /// Rows per step (sampled with replacement).
    #[schemars(range(min = 1))]
    pub batch_size: u32,
    /// Steps of linear warmup before the schedule.
    pub warmup_steps: u64,
    pub schedule: Schedule,
    pub adapter: Adapter,
    /// Compute the loss on answer tokens only (prompt tokens are context).
    pub answer_only_loss: bool,
    /// Seeds initialisation of adapters and the row sampling.
    pub seed: u64,
    /// Also keep a checkpoint every this many steps, under `out/steps/<step>/` (0: none).
    pub save_every: u64,
    /// Pieces each batch is split into, computed side by side on the job's threads with their
    /// gradients summed: the whole batch's update, to float rounding. Set by rsim from the job's
    /// threads (`shards_for`), never by an agent, and kept with the run (the trainer's `shards`
    /// metric), so a reproduction computes the same sums on any machine. Trainers that do not
    /// split batches (the transformers recipes) ignore it.
    #[schemars(range(min = 1))]
    pub shards: u32,
}

/// The pieces a batch of `batch` rows is split into for a job given `threads`: one a thread, of
/// at least 4 rows each (smaller pieces cost more in per-operation overhead than they share out).
pub fn shards_for(threads: Option<u32>, batch: u32) -> u32 {
    threads.unwrap_or(1).min(batch / 4).max(1)
}

/// An evaluation job's spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalParams {
    /// The job's id.
    pub job: String,
    /// The checkpoint to score.
    pub checkpoint: CheckpointRef,
    /// The task (a name from rsim.toml).
    pub task: String,
    pub split: Split,
    /// The task's headline metric.
    pub metric: String,
    /// JSONL rows `{prompt, answer}` to score.
    pub eval_set: PathBuf,
}

/// A checkpoint as a job sees it: its hash and where each of its files is (in the object store,
/// under its hash; link or copy them under their names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    /// The checkpoint's manifest hash.
    pub sha256: String,
    /// File name in the checkpoint → path of its content.
    pub files: BTreeMap<String, PathBuf>,
}

impl CheckpointRef {
    /// The path of one of the checkpoint's files.
    pub fn file(&self, name: &str) -> Result<&Path> {
        self.files
            .get(name)
            .map(PathBuf::as_path)
            .ok_or_else(|| Error::invalid(format!("checkpoint {} has no {name}", self.sha256)))
    }
}

/// A registered dataset as a job sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetRef {
    pub name: String,
    pub sha256: String,
    pub rows: u64,
    /// JSONL rows `{prompt, answer}`.
    pub path: PathBuf,
}

/// `out/metrics.json` of a training job: numbers it reports (e.g. `final_loss`).
pub type TrainMetrics = BTreeMap<String, f64>;

/// `out/result.json` of an evaluation job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalResult {
    /// Scores by name (the task's metric among them).
    pub metrics: BTreeMap<String, f64>,
    /// How many items were scored.
    pub n_items: u64,
    /// Per-item results (rsim keeps them only for the visible dev split).
    #[serde(default)]
    pub items: Vec<EvalItem>,
}

impl JobParams {
    pub fn kind(&self) -> JobKind {
        match self {
            JobParams::Sft(_) => JobKind::Sft,
            JobParams::Evaluate(_) => JobKind::Evaluate,
        }
    }

    /// The checkpoint the job reads: a training job's base, an evaluation job's checkpoint.
    pub fn checkpoint(&self) -> &CheckpointRef {
        match self {
            JobParams::Sft(s) => &s.base,
            JobParams::Evaluate(e) => &e.checkpoint,
        }
    }

    /// Read a spec file.
    pub fn read(spec_path: &Path) -> Result<JobParams> {
        let bytes = fs::read(spec_path).at("cannot read", spec_path)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::invalid(format!("{}: {e}", spec_path.display())))
    }

    /// Write the spec file (pretty JSON, keys in a stable order).
    pub fn write(&self, spec_path: &Path) -> Result<()> {
        fs::write(spec_path, crate::util::hash::json_bytes(self)?).at("cannot write", spec_path)
    }
}

impl SftParams {
    /// Read a spec file that must be a training job's.
    pub fn read(spec_path: &Path) -> Result<SftParams> {
        match JobParams::read(spec_path)? {
            JobParams::Sft(s) => Ok(s),
            other => Err(wrong_kind(spec_path, JobKind::Sft, other.kind())),
        }
    }
}

impl EvalParams {
    /// Read a spec file that must be an evaluation job's.
    pub fn read(spec_path: &Path) -> Result<EvalParams> {
        match JobParams::read(spec_path)? {
            JobParams::Evaluate(e) => Ok(e),
            other => Err(wrong_kind(spec_path, JobKind::Evaluate, other.kind())),
        }
    }
}

fn wrong_kind(spec_path: &Path, want: JobKind, got: JobKind) -> Error {
    Error::invalid(format!(
        "{}: expected a {} job spec, got kind {}",
        spec_path.display(),
        want.as_str(),
        got.as_str()
    ))
}

/// The `out/` directory of the job whose spec is at `spec_path`.
pub fn out_dir_of(spec_path: &Path) -> PathBuf {
    spec_path.parent().unwrap_or(Path::new(".")).join(OUT_DIR)
}

/// Where a training job leaves its checkpoint.
pub fn checkpoint_dir(out: &Path) -> PathBuf {
    out.join(CHECKPOINT_DIR)
}

/// Where a training job leaves the checkpoint it kept at `step` (`save_every`).
pub fn step_checkpoint_dir(out: &Path, step: u64) -> PathBuf {
    out.join(STEPS_DIR).join(step.to_string())
}

/// The checkpoints a training job kept part-way (`out/steps/<step>/`), by step. Entries whose
/// name is not a step number are ignored (a job writes what it likes under `out/`).
pub fn step_checkpoints(out: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = fs::read_dir(out.join(STEPS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let step: u64 = e.file_name().to_str()?.parse().ok()?;
            (step.to_string() == e.file_name().to_str()?).then(|| (step, e.path()))
        })
        .collect();
    v.sort_by_key(|(s, _)| *s);
    v
}

/// A training run's learning curve from its log: `(step, loss)` of every progress line that
/// reports a finite loss, in step order (a step logged twice keeps its last line), thinned to at
/// most `max` points spread evenly over the run (the last point always kept).
pub fn curve_in(log: &str, max: usize) -> Vec<(u64, f64)> {
    let mut by_step = std::collections::BTreeMap::new();
    for p in log.lines().filter_map(parse_progress) {
        if let Some(l) = p.loss {
            by_step.insert(p.step, l);
        }
    }
    let all: Vec<(u64, f64)> = by_step.into_iter().collect();
    if all.len() <= max || max == 0 {
        return if max == 0 { Vec::new() } else { all };
    }
    let n = all.len();
    let mut out: Vec<(u64, f64)> = (0..max).map(|i| all[i * (n - 1) / (max - 1)]).collect();
    out.dedup_by_key(|p| p.0);
    out
}

/// A training job's metrics (none when it wrote no `metrics.json`).
pub fn read_train_metrics(out: &Path) -> Result<TrainMetrics> {
    let path = out.join(METRICS_FILE);
    if !path.is_file() {
        return Ok(TrainMetrics::new());
    }
    let bytes = fs::read(&path).at("cannot read", &path)?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::invalid(format!(
            "the trainer's {OUT_DIR}/{METRICS_FILE} is not a JSON object of numbers: {e}"
        ))
    })
}

pub fn write_train_metrics(out: &Path, metrics: &TrainMetrics) -> Result<()> {
    fs::create_dir_all(out).at("cannot create", out)?;
    let path = out.join(METRICS_FILE);
    fs::write(&path, crate::util::hash::json_bytes(metrics)?).at("cannot write", &path)
}

/// An evaluation job's result; an error (saying what is wrong) when it is missing or malformed.
pub fn read_eval_result(out: &Path) -> Result<EvalResult> {
    let path = out.join(RESULT_FILE);
    let bytes = fs::read(&path).map_err(|e| {
        Error::invalid(format!(
            "the evaluator wrote no {OUT_DIR}/{RESULT_FILE}: {e}"
        ))
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::invalid(format!(
            "the evaluator's {OUT_DIR}/{RESULT_FILE} is malformed: {e}"
        ))
    })
}

pub fn write_eval_result(out: &Path, result: &EvalResult) -> Result<()> {
    fs::create_dir_all(out).at("cannot create", out)?;
    let path = out.join(RESULT_FILE);
    fs::write(&path, crate::util::hash::json_bytes(result)?).at("cannot write", &path)
}

/// What a running job's log says about its progress: its newest `step k/n …` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub step: u64,
    pub total: Option<u64>,
    /// The loss, when the line reports one (`… loss x`).
    pub loss: Option<f64>,
    pub line: String,
}

/// `step k/n`: how every progress line starts (what follows is free: `loss x` by convention).
pub fn step_prefix(step: u64, total: u64) -> String {
    format!("step {step}/{total}")
}

/// A trainer's progress line: `step k/n loss x`.
pub fn progress_line(step: u64, total: u64, loss: f64) -> String {
    format!("{} loss {loss:.4}", step_prefix(step, total))
}

/// Parse the newest progress line out of a log's tail. Pretraining prints the same lines after
/// `pretrain `; `step k` without a total is accepted.
pub fn progress_in(log: &str) -> Option<Progress> {
    log.lines().rev().find_map(parse_progress)
}

fn parse_progress(line: &str) -> Option<Progress> {
    let l = line.trim();
    let rest = l
        .strip_prefix("step ")
        .or_else(|| l.strip_prefix("pretrain step "))?;
    let mut words = rest.split_whitespace();
    let frac = words.next()?;
    let (step, total) = match frac.split_once('/') {
        Some((k, n)) => (k.parse().ok()?, Some(n.parse().ok()?)),
        None => (frac.parse().ok()?, None),
    };
    let mut loss = None;
    while let Some(w) = words.next() {
        if w == "loss" {
            loss = words
                .next()
                .and_then(|x| x.parse::<f64>().ok())
                .filter(|x| x.is_finite());
            break;
        }
    }
    Some(Progress {
        step,
        total,
        loss,
        line: l.to_string(),
    })
}

/// `TrainMetrics` is a plain map: its schema gets a name and says what it is.
fn metrics_schema() -> schemars::Schema {
    let mut s = crate::util::schema::schema_of::<TrainMetrics>();
    s.insert("title".into(), "TrainMetrics".into());
    s.insert(
        "description".into(),
        "`out/metrics.json` of a training job: numbers it reports (e.g. `final_loss`).".into(),
    );
    s
}

/// The protocol's JSON Schemas, as files under `schemas/`: (relative path, schema).
pub fn schema_files() -> Vec<(String, schemars::Schema)> {
    vec![
        (
            "jobs/spec.json".to_string(),
            crate::util::schema::schema_of::<JobParams>(),
        ),
        ("jobs/metrics.json".to_string(), metrics_schema()),
        (
            "jobs/result.json".to_string(),
            crate::util::schema::schema_of::<EvalResult>(),
        ),
    ]
}

/// A small evaluation spec, for tests of the runners.
#[cfg(test)]
pub(crate) fn example_eval() -> JobParams {
    JobParams::Evaluate(EvalParams {
        job: "j-2".into(),
        checkpoint: CheckpointRef {
            sha256: "ab".repeat(32),
            files: [("config.json".to_string(), PathBuf::from("/o/cd"))].into(),
        },
        task: "add2".into(),
        split: Split::Dev,
        metric: "exact_match".into(),
        eval_set: "/study/dev.jsonl".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint() -> CheckpointRef {
        CheckpointRef {
            sha256: "ab".repeat(32),
            files: [("config.json".to_string(), PathBuf::from("/o/cd"))].into(),
        }
    }

    fn sft() -> JobParams {
        JobParams::Sft(SftParams {
            job: "j-1".into(),
            node: "n1".into(),
            base: checkpoint(),
            datasets: vec![DatasetRef {
                name: "plain".into(),
                sha256: "ef".repeat(32),
                rows: 3,
                path: "/o/ef".into(),
            }],
            hyper: TrainHyper {
                learning_rate: 1e-3,
                steps: 20,
                batch_size: 16,
                warmup_steps: 2,
                schedule: Schedule::Linear,
                adapter: Adapter::Lora {
                    rank: 4,
                    alpha: 8.0,
                },
                answer_only_loss: true,
                seed: 7,
                save_every: 0,
                shards: 1,
            },
        })
    }

    fn evaluate() -> JobParams {
        example_eval()
    }

    #[test]
    fn a_learning_curve_is_every_logged_loss_thinned_evenly() {
        let log = "warming up\nstep 50/200 loss 1.5\nstep 100/200 loss nan\nnoise step 3\n\
                   step 150/200 loss 0.9\nstep 150/200 loss 0.8\nstep 200/200 loss 0.5\n";
        assert_eq!(curve_in(log, 10), vec![(50, 1.5), (150, 0.8), (200, 0.5)]);
        let long: String = (1..=1000)
            .map(|k| format!("step {k}/1000 loss {}\n", 1.0 / k as f64))
            .collect();
        let c = curve_in(&long, 200);
        assert!(c.len() <= 200 && c.len() > 150, "{}", c.len());
        assert_eq!(c.first().map(|p| p.0), Some(1));
        assert_eq!(c.last().map(|p| p.0), Some(1000));
        assert!(c.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn kept_checkpoints_are_the_step_directories_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let out = d.path();
        for s in ["100", "50", "007", "x"] {
            fs::create_dir_all(out.join(STEPS_DIR).join(s)).expect("mkdir");
        }
        fs::write(out.join(STEPS_DIR).join("150"), b"a file").expect("file");
        let got: Vec<u64> = step_checkpoints(out).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, vec![50, 100]);
        assert!(step_checkpoints(&out.join("none")).is_empty());
    }

    #[test]
    fn specs_round_trip_through_the_spec_file() {
        let d = tempfile::tempdir().expect("tempdir");
        for p in [sft(), evaluate()] {
            let path = d.path().join(SPEC_FILE);
            p.write(&path).expect("write");
            let v: serde_json::Value =
                serde_json::from_slice(&fs::read(&path).expect("read")).expect("json");
            assert_eq!(v["kind"], p.kind().as_str(), "the kind tags the spec");
            assert_eq!(JobParams::read(&path).expect("read back"), p);
        }
        let path = d.path().join(SPEC_FILE);
        evaluate().write(&path).expect("write");
        let e = SftParams::read(&path).expect_err("an evaluate spec is no sft spec");
        assert!(
            e.message.contains("expected a sft job spec"),
            "{}",
            e.message
        );
        assert!(EvalParams::read(&path).is_ok());
    }

    #[test]
    fn the_spec_holds_no_agent_request() {
        // The request's own fields (node, base, datasets) in `hyper` are refused: the job side
        // reads only what the trainers use, never the agent-facing request type.
        let mut v = serde_json::to_value(sft()).expect("json");
        v["hyper"]["node"] = "n1".into();
        let e = serde_json::from_value::<JobParams>(v).expect_err("unknown field");
        assert!(e.to_string().contains("node"), "{e}");
        let schema = crate::util::schema::schema_of::<TrainHyper>().to_value();
        let mut props: Vec<&str> = schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .map(String::as_str)
            .collect();
        props.sort_unstable();
        assert_eq!(
            props,
            [
                "adapter",
                "answer_only_loss",
                "batch_size",
                "learning_rate",
                "save_every",
                "schedule",
                "seed",
                "shards",
                "steps",
                "warmup_steps"
            ]
        );
        assert_eq!(
            schema["required"].as_array().map(Vec::len),
            Some(props.len()),
            "rsim writes every field; recipes may rely on each"
        );
        // Fields missing from a spec are an error, not a silent default.
        let mut v = serde_json::to_value(sft()).expect("json");
        v["hyper"]
            .as_object_mut()
            .expect("hyper")
            .remove("warmup_steps");
        assert!(serde_json::from_value::<JobParams>(v).is_err());
    }

    #[test]
    fn outputs_are_read_strictly() {
        let d = tempfile::tempdir().expect("tempdir");
        let out = d.path();
        assert!(read_train_metrics(out).expect("none").is_empty());
        let m: TrainMetrics = [("final_loss".to_string(), 0.5)].into();
        write_train_metrics(out, &m).expect("write");
        assert_eq!(read_train_metrics(out).expect("read"), m);
        fs::write(out.join(METRICS_FILE), br#"{"final_loss": "low"}"#).expect("write");
        assert!(read_train_metrics(out).is_err());

        let e = read_eval_result(out).expect_err("no result");
        assert!(
            e.message.contains("wrote no out/result.json"),
            "{}",
            e.message
        );
        let r = EvalResult {
            metrics: [("exact_match".to_string(), 0.25)].into(),
            n_items: 4,
            items: vec![EvalItem {
                prompt: "1+1=".into(),
                expected: "2".into(),
                output: "3".into(),
                correct: false,
            }],
        };
        write_eval_result(out, &r).expect("write");
        assert_eq!(read_eval_result(out).expect("read"), r);
        fs::write(
            out.join(RESULT_FILE),
            br#"{"metrics": {}, "n_items": 1, "extra": 1}"#,
        )
        .expect("write");
        assert!(read_eval_result(out).is_err(), "unknown fields are refused");
    }

    #[test]
    fn progress_lines_round_trip_and_the_newest_wins() {
        let line = progress_line(3, 20, 0.123456);
        assert_eq!(line, "step 3/20 loss 0.1235");
        let p = progress_in(&line).expect("parsed");
        assert_eq!((p.step, p.total, p.loss), (3, Some(20), Some(0.1235)));
        let log = format!(
            "loading\n{}\nstep 5/20 contexts 812\nwarning: slow\n",
            progress_line(4, 20, 1.5)
        );
        let p = progress_in(&log).expect("parsed");
        assert_eq!((p.step, p.total, p.loss), (5, Some(20), None));
        assert_eq!(p.line, "step 5/20 contexts 812");
        let p = progress_in("  pretrain step 7/100 loss 2.0000 \n").expect("pretrain");
        assert_eq!((p.step, p.total, p.loss), (7, Some(100), Some(2.0)));
        let p = progress_in("step 9 loss nan").expect("no total");
        assert_eq!((p.step, p.total, p.loss), (9, None, None));
        for bad in [
            "",
            "stepping 1/2",
            "step x/2 loss 1",
            "step 1/y",
            "the step 1/2",
        ] {
            assert_eq!(progress_in(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn schemas_describe_the_spec_file() {
        let files = schema_files();
        assert_eq!(files.len(), 3);
        let spec = files[0].1.clone().to_value();
        let text = spec.to_string();
        for field in ["hyper", "eval_set", "warmup_steps", "sha256"] {
            assert!(text.contains(field), "{field} in the spec schema");
        }
        // Every spec rsim writes validates against the schema it publishes.
        let v = jsonschema::validator_for(&spec).expect("schema compiles");
        for p in [sft(), evaluate()] {
            let json = serde_json::to_value(&p).expect("json");
            assert!(v.is_valid(&json), "{json}");
        }
        let mut bad = serde_json::to_value(sft()).expect("json");
        bad["hyper"]["node"] = "n1".into();
        assert!(
            !v.is_valid(&bad),
            "the schema refuses request fields in hyper"
        );
    }
}
