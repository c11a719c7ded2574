//! Long jobs over MCP. `run_sft` and `evaluate` run through `Study::call` on a blocking thread (the
//! core runs the job to completion and records it); the face learns the job's id the moment the
//! runner starts it, so it can answer `{job, status: "running"}` quickly, report progress from the
//! job's log, cancel it, and hand the recorded result to `wait_job` later. A job whose client went
//! away still runs to the end and is recorded by the core.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::api::{STATE_DIR, Study};
use crate::util::error::{Error, Result};
use crate::jobs::{JobRunner, JobSpec};
use crate::model::{Caller, JobRecord};

thread_local! {
    /// Set by the face on the blocking thread that runs a long action; the runner takes it when the job starts.
    static JOB_STARTED: RefCell<Option<oneshot::Sender<String>>> = const { RefCell::new(None) };
}

/// The study's configured runner (local or Slurm), telling the face which job the current action
/// started.
pub struct NotifyingRunner(pub Box<dyn JobRunner>);

impl JobRunner for NotifyingRunner {
    fn run(&self, spec: &JobSpec) -> Result<JobRecord> {
        if let Some(tx) = JOB_STARTED.with(|h| h.borrow_mut().take()) {
            let _ = tx.send(spec.id.clone());
        }
        self.0.run(spec)
    }
}

/// Open studies, one per concurrent call (a `Study` holds a SQLite connection and is not `Sync`).
/// Writers on different instances are safe: the core records with git compare-and-swap.
pub struct Pool {
    root: PathBuf,
    idle: Mutex<Vec<(Study, Option<git2::Oid>)>>,
    /// Serialises this process's quick writes: its sessions then never race each other for a
    /// node id or a branch tip (the compare-and-swap still guards against other processes).
    writes: Mutex<()>,
}

impl Pool {
    pub fn open(root: &Path) -> Result<Pool> {
        let pool = Pool {
            root: root.to_path_buf(),
            idle: Mutex::new(Vec::new()),
            writes: Mutex::new(()),
        };
        // Open one now so a bad study fails at startup, not on the first call.
        let s = pool.open_one()?;
        pool.put(s);
        Ok(pool)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn open_one(&self) -> Result<(Study, Option<git2::Oid>)> {
        let s = Study::open_wrapping_runner(&self.root, |inner| Box::new(NotifyingRunner(inner)))?;
        let tip = s.record().main_tip().ok();
        Ok((s, tip))
    }

    fn put(&self, s: (Study, Option<git2::Oid>)) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }

    /// Run `f` on an idle study (opening one if none is idle). A study opened before the owner
    /// committed a new `rsim.toml` on main is reopened, so the config in force is always the committed one.
    pub fn with<T>(&self, f: impl FnOnce(&Study) -> Result<T>) -> Result<T> {
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let s = match taken {
            Some((s, tip)) if s.record().main_tip().ok() == tip => (s, tip),
            _ => self.open_one()?,
        };
        let r = f(&s.0);
        self.put(s);
        r
    }
}

/// Times a write that lost every compare-and-swap to other processes is tried again. A conflict
/// means nothing was written, so trying again cannot duplicate a record.
const CONFLICT_RETRIES: usize = 8;

impl Pool {
    /// Run a quick writing action (no job): one at a time in this process, and again on a conflict.
    pub fn write(&self, caller: &Caller, action: &str, args: Value) -> Result<Value> {
        self.with(|s| {
            let _one_at_a_time = self.writes.lock().unwrap_or_else(|e| e.into_inner());
            let mut tries = 0;
            loop {
                match s.call(caller, action, args.clone()) {
                    Err(e)
                        if e.kind == crate::util::error::ErrorKind::Conflict
                            && tries < CONFLICT_RETRIES =>
                    {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(5 + rand::random::<u64>() % 45));
                    }
                    other => return other,
                }
            }
        })
    }
}

pub type Outcome = std::result::Result<Value, Error>;

/// Jobs started by this process: job id → the action's outcome once recorded.
#[derive(Default)]
pub struct Registry {
    jobs: Mutex<HashMap<String, watch::Receiver<Option<Outcome>>>>,
}

impl Registry {
    fn insert(&self, job: &str, rx: watch::Receiver<Option<Outcome>>) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(job.to_string(), rx);
    }
    pub fn get(&self, job: &str) -> Option<watch::Receiver<Option<Outcome>>> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(job)
            .cloned()
    }
    fn remove(&self, job: &str) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(job);
    }
}

/// A long action in flight.
pub struct Started {
    /// Resolves to the job id when the runner starts the job (dropped if the action ends without one).
    pub job: oneshot::Receiver<String>,
    pub done: watch::Receiver<Option<Outcome>>,
}

/// Start `action` on a blocking thread. The job, once started, is registered under its id.
pub fn start(
    pool: Arc<Pool>,
    registry: Arc<Registry>,
    caller: Caller,
    action: String,
    args: Value,
) -> Started {
    let (tx_job, rx_job) = oneshot::channel::<String>();
    let (tx_face, rx_face) = oneshot::channel::<String>();
    let (tx_done, rx_done) = watch::channel::<Option<Outcome>>(None);
    // Register the job the moment it starts, so wait_job finds it; forget it a while after it is
    // recorded (wait_job then reads the result from the record).
    let mut rx_reg = rx_done.clone();
    tokio::spawn(async move {
        let Ok(id) = rx_job.await else { return };
        registry.insert(&id, rx_reg.clone());
        let _ = tx_face.send(id.clone());
        let _ = rx_reg.wait_for(|o| o.is_some()).await;
        tokio::time::sleep(Duration::from_secs(600)).await;
        registry.remove(&id);
    });
    tokio::task::spawn_blocking(move || {
        let out = pool.with(|s| {
            JOB_STARTED.with(|h| *h.borrow_mut() = Some(tx_job));
            let r = s.call(&caller, &action, args);
            JOB_STARTED.with(|h| h.borrow_mut().take());
            r
        });
        let _ = tx_done.send(Some(out));
    });
    Started {
        job: rx_face,
        done: rx_done,
    }
}

/// The directory of a job (its log, spec and cancel file live there).
pub fn job_dir(root: &Path, job: &str) -> PathBuf {
    root.join(STATE_DIR).join("jobs").join(job)
}

/// What the log of a running job says about its progress: (step, total, last line).
pub fn progress_of(root: &Path, job: &str) -> Option<(u64, Option<u64>, String)> {
    let tail = log_tail(&job_dir(root, job).join("job.log"), 4096)?;
    for line in tail.lines().rev() {
        let l = line.trim();
        let rest = l
            .strip_prefix("step ")
            .or_else(|| l.strip_prefix("pretrain step "));
        if let Some(rest) = rest {
            let frac = rest.split_whitespace().next()?;
            let (k, n) = match frac.split_once('/') {
                Some((k, n)) => (k.parse().ok()?, n.parse().ok()),
                None => (frac.parse().ok()?, None),
            };
            return Some((k, n, l.to_string()));
        }
    }
    None
}

/// The last `max` bytes of a file, as text.
pub fn log_tail(path: &Path, max: u64) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len > max {
        f.seek(SeekFrom::Start(len - max)).ok()?;
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Answer of `run_sft`, `evaluate` and `wait_job` while the job is still running.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRunning {
    /// The job id: pass it to `wait_job` (or `cancel_job`).
    pub job: String,
    pub status: RunningStatus,
    /// The action that started the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The job's latest progress line (e.g. "step 120/400 loss 0.4312"), if it printed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// What to do next.
    pub hint: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunningStatus {
    Running,
}

impl JobRunning {
    pub fn new(root: &Path, job: &str, action: Option<&str>) -> JobRunning {
        JobRunning {
            job: job.to_string(),
            status: RunningStatus::Running,
            action: action.map(str::to_string),
            progress: progress_of(root, job).map(|p| p.2),
            hint: format!(
                "the job is still running; it is recorded when it ends even if you disconnect. Call wait_job with {{\"job\": \"{job}\"}} for its result, or cancel_job to stop it"
            ),
        }
    }
}

/// `wait_job` arguments.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitJobRequest {
    #[schemars(pattern(crate::api::types::JOB_ID_PATTERN))]
    pub job: String,
    /// Seconds to wait before answering `status: "running"` (default 60, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub timeout_s: Option<u64>,
}

/// `cancel_job` result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelJobResult {
    pub job: String,
    /// Always true: the job was asked to stop; its action is recorded with the job cancelled.
    pub cancel_requested: bool,
}

/// The recorded result of the action that ran `job`, if it is recorded: the stored result plus its commit.
pub fn recorded_result(study: &Study, job: &str) -> Result<Option<Value>> {
    let Some((node, seq, _)) = study.index().job(job)? else {
        return Ok(None);
    };
    let tip = study
        .record()
        .node_tip(&node)?
        .ok_or_else(|| Error::internal(format!("node {node} has no branch")))?;
    let acts = study
        .record()
        .actions_since(&node, tip, seq.saturating_sub(1))?;
    let Some(a) = acts.into_iter().find(|a| a.record.seq == seq) else {
        return Err(Error::internal(format!(
            "job {job}: action {seq} of node {node} is indexed but not in git"
        )));
    };
    let state = a
        .record
        .job
        .as_ref()
        .map(|j| j.state.as_str())
        .unwrap_or("unknown");
    let mut v = a.record.result.unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("commit".into(), Value::String(a.commit.to_string()));
        // The stored record writes absent per-item results as null; the result type omits them.
        if m.get("items").is_some_and(Value::is_null) {
            m.remove("items");
        }
        if m.get("checkpoint").is_some_and(Value::is_null) {
            m.remove("checkpoint");
        }
    }
    // A job that ended without a result (lost with its process, ...) has no result of the action's
    // type: say so instead of answering content that fits no declared schema.
    let fits = match a.record.action {
        crate::model::ActionName::RunSft => {
            serde_json::from_value::<crate::api::types::RunSftResult>(v.clone()).is_ok()
        }
        crate::model::ActionName::Evaluate => {
            serde_json::from_value::<crate::api::types::EvaluateResult>(v.clone()).is_ok()
        }
        _ => true,
    };
    if !fits {
        let why = a
            .record
            .job
            .as_ref()
            .and_then(|j| j.error.clone())
            .unwrap_or_default();
        return Err(Error::not_found(format!(
            "result: job {job} ended {state} without a {} result{}; its record: get_job {{\"job\": \"{job}\"}} or rsim://node/{node}/actions/{seq}",
            a.record.action,
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        )));
    }
    Ok(Some(v))
}
