//! Jobs that died with their writer: re-attach (Slurm) or record them lost (local), exactly once.

use std::fs;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::*;
use crate::jobs::Reattach;
use crate::model::paths::JOB_LOG_FILE;

impl Study {
    /// Jobs whose writing process died (killed, crashed, machine restarted) before their action was
    /// recorded are never dropped silently. A local job's processes are stopped and the action is
    /// recorded with the job `lost`. A Slurm job outlives its writer: rsim re-attaches to it, and
    /// once it has ended records the action with its real outcome (checkpoint, scores); while it is
    /// still queued or running it is left alone. Jobs of live processes are left to them.
    /// Returns how many actions were recorded.
    pub fn recover_orphaned_jobs(&self) -> Result<usize> {
        self.recover_jobs(false)
    }

    /// Like `recover_orphaned_jobs`, but waits for orphaned Slurm jobs that are still queued or
    /// running and records how they end (what a restarted server does in the background).
    pub fn wait_for_orphaned_jobs(&self) -> Result<usize> {
        self.recover_jobs(true)
    }

    pub(in crate::os) fn recover_jobs(&self, wait: bool) -> Result<usize> {
        let dir = self.root.join(STATE_DIR).join("jobs");
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(0);
        };
        let mut recorded = 0;
        for e in entries.flatten() {
            let jd = e.path();
            let (intent_path, marker) = (jd.join(INTENT_FILE), jd.join(RECORDED_FILE));
            if !intent_path.is_file() || marker.exists() {
                continue;
            }
            let intent: JobIntent = match fs::read(&intent_path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            {
                Some(i) => i,
                None => continue,
            };
            if crate::util::proc::process_alive(intent.writer_pid) {
                continue;
            }
            if let Some((_, _, _)) = self.index.job(&intent.job)? {
                fs::write(&marker, b"").at("cannot write", &marker)?;
                continue;
            }
            // The backend that ran the job, from what its directory holds, says what became of
            // it: still running, ended (record its real outcome), or lost with its writer.
            let runner = crate::jobs::runner_of_job(&jd);
            let node_exists = self.record.node_tip(&intent.node)?.is_some();
            match runner.reattach(&jd, wait && node_exists)? {
                Reattach::Running => continue,
                Reattach::Ended { spec, job } => {
                    if !node_exists || !claim_recovery(&jd) {
                        continue;
                    }
                    self.record_reattached(&intent, &spec, *job)?;
                    recorded += 1;
                    continue;
                }
                Reattach::Lost => {}
            }
            if !claim_recovery(&jd) {
                continue;
            }
            runner.stop_orphan(&jd, &intent.job);
            let mut job = crate::jobs::lost_record(
                &intent.job,
                intent.kind,
                &intent.started_at,
                intent.started.elapsed_s(),
                &intent.command,
                &intent.env,
            );
            if !node_exists {
                continue;
            }
            job.log = self.store_log_at(&jd.join(JOB_LOG_FILE))?;
            let caller = Caller::new(intent.agent.clone(), intent.role);
            let node = intent.node.clone();
            self.commit_action(
                &node,
                &caller,
                intent.action,
                intent.request.clone(),
                |_| {
                    let mut p = Prepared::accepted(
                        format!("job {} lost", job.id),
                        serde_json::json!({ "job": job }),
                    );
                    p.body = format!(
                        "Job {} was lost: {}",
                        job.id,
                        job.error.clone().unwrap_or_default()
                    );
                    p.attach_job(&job);
                    Ok(p)
                },
            )?;
            fs::write(&marker, b"").at("cannot write", &marker)?;
            recorded += 1;
        }
        Ok(recorded)
    }

    /// Record the action of a re-attached job that has ended, exactly as its writer would have.
    pub(in crate::os) fn record_reattached(
        &self,
        intent: &JobIntent,
        spec: &JobSpec,
        mut job: JobRecord,
    ) -> Result<()> {
        let caller = Caller::new(intent.agent.clone(), intent.role);
        job.log = self.store_log(spec)?;
        match intent.action {
            ActionName::RunSft => {
                let req: RunSftRequest = serde_json::from_value(intent.request.clone())?;
                self.finish_sft(
                    &caller,
                    &req,
                    intent.request.clone(),
                    spec,
                    job,
                    spec.params.checkpoint().sha256.clone(),
                )?;
            }
            ActionName::Evaluate => {
                let req: EvaluateRequest = serde_json::from_value(intent.request.clone())?;
                let task = self.config.tasks.get(&req.task).cloned().ok_or_else(|| {
                    Error::invalid(format!(
                        "job {}: task {:?} is no longer in rsim.toml",
                        spec.id, req.task
                    ))
                })?;
                let evaluator = match &intent.evaluator {
                    Some(e) => e.clone(),
                    None => self.evaluator_fingerprint()?,
                };
                self.finish_evaluate(
                    &caller,
                    &req,
                    intent.request.clone(),
                    spec,
                    job,
                    spec.params.checkpoint().sha256.clone(),
                    evaluator,
                    task,
                )?;
            }
            other => {
                return Err(Error::internal(format!(
                    "job {}: action {} does not run jobs",
                    spec.id,
                    other.as_str()
                )));
            }
        }
        Ok(())
    }

    /// Note, before a job runs, what would have to be recorded if this process died meanwhile.
    pub(in crate::os) fn write_intent(
        &self,
        caller: &Caller,
        action: ActionName,
        node: &str,
        request: &Value,
        spec: &JobSpec,
        evaluator: Option<&str>,
    ) -> Result<()> {
        fs::create_dir_all(&spec.dir).at("cannot create", &spec.dir)?;
        let intent = JobIntent {
            job: spec.id.clone(),
            kind: spec.kind(),
            action,
            node: node.to_string(),
            agent: caller.agent.clone(),
            role: caller.role,
            request: request.clone(),
            command: spec.command.clone(),
            env: spec.env.clone(),
            started_at: now_rfc3339(),
            started: Timestamp::now(),
            writer_pid: std::process::id(),
            evaluator: evaluator.map(str::to_string),
        };
        let p = spec.dir.join(INTENT_FILE);
        fs::write(&p, crate::util::hash::json_bytes(&intent)?).at("cannot write", &p)
    }

    pub(in crate::os) fn mark_recorded(&self, spec: &JobSpec) -> Result<()> {
        let p = spec.dir.join(RECORDED_FILE);
        fs::write(&p, b"").at("cannot write", &p)
    }
}

/// Claim the recording of an orphaned job (another process may be opening the study right now);
/// a claim left by a dead process is taken over.
pub(in crate::os) fn claim_recovery(job_dir: &Path) -> bool {
    let claim = job_dir.join("recovering");
    if let Some(pid) = fs::read_to_string(&claim)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        && !crate::util::proc::process_alive(pid)
    {
        let _ = fs::remove_file(&claim);
    }
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&claim)
    {
        Ok(mut f) => {
            use std::io::Write;
            let _ = write!(f, "{}", std::process::id());
            true
        }
        Err(_) => false,
    }
}

/// What a job's action would record, written before the job runs (see `recover_orphaned_jobs`).
#[derive(Debug, Serialize, serde::Deserialize)]
pub(in crate::os) struct JobIntent {
    pub(super) job: String,
    pub(super) kind: JobKind,
    pub(super) action: ActionName,
    pub(super) node: String,
    pub(super) agent: String,
    pub(super) role: Role,
    pub(super) request: Value,
    pub(super) command: Vec<String>,
    pub(super) env: String,
    pub(super) started_at: String,
    pub(super) started: Timestamp,
    pub(super) writer_pid: u32,
    /// The evaluator's fingerprint (evaluate jobs), to record a re-attached job as it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) evaluator: Option<String>,
}

/// Seconds since the epoch, for durations across processes.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub(in crate::os) struct Timestamp(f64);

impl Timestamp {
    pub(in crate::os) fn now() -> Self {
        Timestamp(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        )
    }
    pub(in crate::os) fn elapsed_s(self) -> f64 {
        ((Timestamp::now().0 - self.0).max(0.0) * 1000.0).round() / 1000.0
    }
}

/// The intent a job's writer left beside it, if any (None for a job this study never ran).
pub(in crate::os) fn read_intent(job_dir: &Path) -> Option<JobIntent> {
    fs::read(job_dir.join(INTENT_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}
