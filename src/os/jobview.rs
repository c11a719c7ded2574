//! What faces and the orchestrator read beyond the declared queries, answered by the OS so none
//! of them reads the index, git or the job directories itself: a running job's progress and log,
//! the recorded result of the action that ran a job, one recorded action or a node's whole
//! history, a registered dataset, the compute used.

use serde_json::Value;

use crate::jobs::{self, Progress};
use crate::model::paths::{self, JOB_LOG_FILE};
use crate::model::{ActionName, ActionRecord, NodeMeta};
use crate::os::Study;
use crate::util::error::{Error, Result};

/// A job whose action is not recorded yet: running (or orphaned, until a recovery records it).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunningJob {
    pub job: String,
    pub node: String,
    pub action: String,
    pub agent: String,
    pub started_at: String,
}

impl Study {
    /// Every job whose intent is open, oldest first (the registry, never every job directory).
    pub fn running_jobs(&self) -> Vec<RunningJob> {
        let mut out: Vec<RunningJob> = super::recovery::open_job_dirs(&self.root)
            .iter()
            .filter_map(|d| super::recovery::read_intent(d))
            .map(|i| RunningJob {
                job: i.job,
                node: i.node,
                action: i.action.as_str().to_string(),
                agent: i.agent,
                started_at: i.started_at,
            })
            .collect();
        out.sort_by(|a, b| (&a.started_at, &a.job).cmp(&(&b.started_at, &b.job)));
        out
    }

    /// The tip of `main` (changes when the owner commits a new `rsim.toml`).
    pub fn main_tip(&self) -> Option<git2::Oid> {
        self.record.main_tip().ok()
    }

    /// Each reviewed node's latest review verdict (`promising`, `dead_end`, `needs_more_seeds`).
    pub fn latest_verdicts(&self) -> Result<std::collections::HashMap<String, String>> {
        let mut latest = std::collections::HashMap::new();
        for r in self.index.review_requests()? {
            for v in r["verdicts"].as_array().into_iter().flatten() {
                if let (Some(n), Some(verdict)) = (v["node"].as_str(), v["verdict"].as_str()) {
                    latest.insert(n.to_string(), verdict.to_string());
                }
            }
        }
        Ok(latest)
    }

    /// Whether this study ever started the job (its directory holds a spec).
    pub fn job_exists(&self, job: &str) -> bool {
        job_exists(&self.root, job)
    }

    /// A running job's progress, from its log.
    pub fn job_progress(&self, job: &str) -> Option<Progress> {
        job_progress(&self.root, job)
    }

    /// A job's log (its last `max` bytes): the live file while it runs, else the stored artifact.
    pub fn job_log(&self, job: &str, max: u64) -> Result<String> {
        if let Some(t) = jobs::tail(&paths::job_dir(&self.root, job).join(JOB_LOG_FILE), max) {
            return Ok(t);
        }
        let (_, _, rec) = self
            .index
            .job(job)?
            .ok_or_else(|| Error::not_found(format!("job: no job {job} in this study")))?;
        let sha = rec
            .log
            .ok_or_else(|| Error::not_found(format!("job: job {job} has no log")))?;
        let bytes = self.store.get(&sha)?;
        let start = bytes
            .len()
            .saturating_sub(usize::try_from(max).unwrap_or(usize::MAX));
        Ok(String::from_utf8_lossy(&bytes[start..]).into_owned())
    }

    /// Action `seq` of `node` as recorded, with the commit that recorded it.
    pub fn action(&self, node: &str, seq: u32) -> Result<(ActionRecord, String)> {
        let tip = self
            .record
            .node_tip(node)?
            .ok_or_else(|| Error::not_found(format!("node: no node {node}")))?;
        let a = self
            .record
            .actions_since(node, tip, seq.saturating_sub(1))?
            .into_iter()
            .find(|a| a.record.seq == seq)
            .ok_or_else(|| Error::not_found(format!("action: node {node} has no action {seq}")))?;
        Ok((a.record, a.commit.to_string()))
    }

    /// A node's state and every action recorded on it, in order, from git.
    pub fn node_history(&self, node: &str) -> Result<(NodeMeta, Vec<ActionRecord>)> {
        let tip = self
            .record
            .node_tip(node)?
            .ok_or_else(|| Error::not_found(format!("node: no node {node}")))?;
        let snap = self.record.snapshot(tip)?;
        let actions = self.record.actions_since(node, tip, 0)?;
        Ok((snap.meta, actions.into_iter().map(|a| a.record).collect()))
    }

    /// Every action recorded on a node, in order, from the index (fast; an inline dataset's rows
    /// are left out, `index::ActionRow`).
    pub fn node_actions(&self, node: &str) -> Result<Vec<ActionRecord>> {
        Ok(self
            .index
            .node_actions(node)?
            .into_iter()
            .map(|r| r.record)
            .collect())
    }

    /// A registered dataset: (sha256, node it was registered on, rows).
    pub fn dataset(&self, name: &str) -> Result<Option<(String, String, u64)>> {
        self.index.dataset(name)
    }

    /// Job seconds charged against the study's compute budget so far.
    pub fn compute_seconds_used(&self) -> Result<f64> {
        self.index.compute_seconds_used()
    }

    /// The recorded result of the action that ran `job`, once it is recorded: the stored result
    /// plus its commit. A job that ended without a result of its action's type (lost with its
    /// process, ...) is an error naming its state, not content that fits no declared schema.
    pub fn recorded_result(&self, job: &str) -> Result<Option<Value>> {
        let Some((node, seq, _)) = self.index.job(job)? else {
            return Ok(None);
        };
        let (rec, commit) = self.action(&node, seq).map_err(|e| {
            Error::internal(format!(
                "job {job}: action {seq} of node {node} is indexed but not in git ({})",
                e.message
            ))
        })?;
        let state = rec
            .job
            .as_ref()
            .map(|j| j.state.as_str())
            .unwrap_or("unknown");
        let mut v = rec.result.clone().unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("commit".into(), Value::String(commit));
            // The stored record writes absent per-item results as null; the result type omits them.
            if m.get("items").is_some_and(Value::is_null) {
                m.remove("items");
            }
            if m.get("checkpoint").is_some_and(Value::is_null) {
                m.remove("checkpoint");
            }
        }
        let fits = match rec.action {
            ActionName::RunSft => {
                serde_json::from_value::<crate::api::types::RunSftResult>(v.clone()).is_ok()
            }
            ActionName::Evaluate => {
                serde_json::from_value::<crate::api::types::EvaluateResult>(v.clone()).is_ok()
            }
            _ => true,
        };
        if !fits {
            let why = rec
                .job
                .as_ref()
                .and_then(|j| j.error.clone())
                .unwrap_or_default();
            return Err(Error::not_found(format!(
                "result: job {job} ended {state} without a {} result{}; its record: get_job {{\"job\": \"{job}\"}} or rsim://node/{node}/actions/{seq}",
                rec.action,
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                }
            )));
        }
        Ok(Some(v))
    }
}

impl crate::os::session::Session {
    /// Whether the study ever started the job, or it waits in the admission queue.
    pub fn job_exists(&self, job: &str) -> bool {
        job_exists(self.root(), job) || self.job_queued(job).is_some()
    }

    /// The job's place (1: next) in the admission queue, while it waits there.
    pub fn job_queued(&self, job: &str) -> Option<usize> {
        self.with(|s| s.index.queue())
            .ok()?
            .iter()
            .position(|(j, ..)| j == job)
            .map(|p| p + 1)
    }

    /// A running job's progress, from its log (cheap: no study handle).
    pub fn job_progress(&self, job: &str) -> Option<Progress> {
        job_progress(self.root(), job)
    }
}

fn job_exists(root: &std::path::Path, job: &str) -> bool {
    paths::job_dir(root, job).join("spec.json").is_file()
}

fn job_progress(root: &std::path::Path, job: &str) -> Option<Progress> {
    let log = jobs::tail(&paths::job_dir(root, job).join(JOB_LOG_FILE), 4096)?;
    jobs::progress_in(&log)
}
