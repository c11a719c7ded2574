//! Long jobs over MCP. `run_sft` and `evaluate` run through `Study::call` on a blocking thread (the
//! core runs the job to completion and records it); the face learns the job's id the moment the
//! runner starts it, so it can answer `{job, status: "running"}` quickly, report progress from the
//! job's log, cancel it, and hand the recorded result to `wait_job` later. A job whose client went
//! away still runs to the end and is recorded by the core.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::model::Caller;
use crate::os::session::Session;
use crate::util::error::Error;

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
    session: Arc<Session>,
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
        let out = session.run_long(&caller, &action, args, move |id| {
            let _ = tx_job.send(id);
        });
        let _ = tx_done.send(Some(out));
    });
    Started {
        job: rx_face,
        done: rx_done,
    }
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
    /// Waiting in the admission queue for compute that running jobs claim.
    Queued,
}

impl JobRunning {
    pub fn new(session: &Session, job: &str, action: Option<&str>) -> JobRunning {
        if let Some(place) = session.job_queued(job) {
            return JobRunning {
                job: job.to_string(),
                status: RunningStatus::Queued,
                action: action.map(str::to_string),
                progress: None,
                hint: format!(
                    "the job waits in the admission queue (place {place}, first come first served) for compute that running jobs claim; it starts when its turn comes, or is refused after budgets.queue_wait_seconds. Call wait_job with {{\"job\": \"{job}\"}} for its result, or cancel_job to take it out of the queue"
                ),
            };
        }
        JobRunning {
            job: job.to_string(),
            status: RunningStatus::Running,
            action: action.map(str::to_string),
            progress: session.job_progress(job).map(|p| p.line),
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
