//! Jobs that died with their writer: re-attach (Slurm) or record them lost (local), exactly once.

use std::fs;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::*;
use crate::jobs::Reattach;
use crate::model::paths::JOB_LOG_FILE;
use crate::util::origin::ProcessStamp;

impl Study {
    /// Jobs whose writing process died (killed, crashed, machine restarted) before their action was
    /// recorded are never dropped silently. A local job's processes are stopped and the action is
    /// recorded with the job `lost`. A Slurm job outlives its writer: rsim re-attaches to it, and
    /// once it has ended records the action with its real outcome (checkpoint, scores); while it is
    /// still queued or running it is left alone. Jobs of live processes are left to them.
    /// Returns how many actions were recorded.
    pub fn recover_orphaned_jobs(&self) -> Result<usize> {
        self.recover_jobs(false, true)
    }

    /// Like `recover_orphaned_jobs`, but waits for orphaned Slurm jobs that are still queued or
    /// running and records how they end (what a restarted server does in the background).
    pub fn wait_for_orphaned_jobs(&self) -> Result<usize> {
        self.recover_jobs(true, true)
    }

    /// Recover the jobs whose intent is open (`.rsim/jobs/open/`): what every opening of the study
    /// does. It reads one (usually empty) directory instead of every job directory the study has
    /// ever had, so a query pays nothing for a long history, and it writes only when a job is
    /// found orphaned. Job directories from before that registry are scanned once.
    pub(in crate::os) fn recover_open_jobs(&self) -> Result<usize> {
        self.recover_jobs(false, false)
    }

    /// `full`: look at every job directory, not only those with an open intent.
    pub(in crate::os) fn recover_jobs(&self, wait: bool, full: bool) -> Result<usize> {
        self.record.refuse_write()?;
        let dir = self.root.join(STATE_DIR).join("jobs");
        if !dir.is_dir() {
            return Ok(0);
        }
        let open = dir.join(OPEN_INTENTS_DIR);
        let scanned = open.join(SCANNED_FILE);
        let full = full || !scanned.exists();
        if full {
            // The registry exists before a full scan lists the job directories, and writers
            // register a job before writing its intent: a job the listing misses is registered.
            fs::create_dir_all(&open).at("cannot create", &open)?;
        }
        let names = if full { &dir } else { &open };
        let mut job_dirs: Vec<std::path::PathBuf> = fs::read_dir(names)
            .at("cannot read", names)?
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| dir.join(e.file_name()))
            .collect();
        job_dirs.sort();
        let mut recorded = 0;
        for jd in &job_dirs {
            if self.recover_job(jd, wait)? {
                recorded += 1;
            }
        }
        if full && !scanned.exists() {
            fs::write(&scanned, b"").at("cannot write", &scanned)?;
        }
        Ok(recorded)
    }

    /// Recover one job directory; true when its action was recorded now. Only a job this machine
    /// started is looked at: job state that came with a repository (or a copy of a study) names
    /// processes, Slurm jobs and intents that are not this machine's, and is never acted on.
    fn recover_job(&self, jd: &Path, wait: bool) -> Result<bool> {
        if !crate::jobs::is_ours(jd) {
            tracing::debug!(job_dir = %jd.display(), "not started on this machine: left alone");
            return Ok(false);
        }
        let (intent_path, marker) = (jd.join(INTENT_FILE), jd.join(RECORDED_FILE));
        if marker.exists() {
            unregister_intent(jd);
            return Ok(false);
        }
        if !intent_path.is_file() {
            // Registered by a writer that has not written the intent yet, or that died first.
            if registered_writer(jd).is_some_and(|w| !w.alive()) {
                unregister_intent(jd);
            }
            return Ok(false);
        }
        let intent: JobIntent = match fs::read(&intent_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(i) => i,
            None => return Ok(false),
        };
        if intent.writer_alive() {
            return Ok(false);
        }
        if let Some((_, _, _)) = self.index.job(&intent.job)? {
            write_recorded(jd)?;
            return Ok(false);
        }
        // The backend that ran the job, from what its directory holds, says what became of it:
        // still running, ended (record its real outcome), or lost with its writer.
        let runner = crate::jobs::runner_of_job(jd);
        let node_exists = self.record.node_tip(&intent.node)?.is_some();
        match runner.reattach(jd, wait && node_exists)? {
            Reattach::Running => return Ok(false),
            Reattach::Ended { spec, job } => {
                if !node_exists || !claim_recovery(jd) {
                    return Ok(false);
                }
                self.record_reattached(&intent, &spec, *job)?;
                return Ok(true);
            }
            Reattach::Lost => {}
        }
        // What it ran, read before recovery writes its own claim into the directory.
        let ran_s = intent.started.until_last_write(jd);
        if !claim_recovery(jd) {
            return Ok(false);
        }
        runner.stop_orphan(jd, &intent.job);
        let mut job = crate::jobs::lost_record(
            &intent.job,
            intent.kind,
            &intent.started_at,
            ran_s,
            &intent.command,
            &intent.env,
        );
        if !node_exists {
            return Ok(false);
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
        write_recorded(jd)?;
        Ok(true)
    }

    /// An agent waiting on `job` whose writer died meanwhile (its server was killed): record it
    /// now, as the first write would (only a job this machine started, only in a writable study).
    /// True when something was recorded.
    pub fn record_if_orphaned(&self, job: &str) -> Result<bool> {
        if self.read_only().is_some()
            || job.is_empty()
            || !job.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Ok(false);
        }
        let jd = crate::model::paths::job_dir(&self.root, job);
        if !crate::jobs::is_ours(&jd) || jd.join(RECORDED_FILE).exists() {
            return Ok(false);
        }
        match read_intent(&jd) {
            Some(i) if !i.writer_alive() => Ok(self.recover_job(&jd, false)?),
            _ => Ok(false),
        }
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
            ActionName::Reproduce => {
                let req: ReproduceRequest = serde_json::from_value(intent.request.clone())?;
                self.finish_reproduce(&caller, &req, intent.request.clone(), spec, job)?;
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
        crate::jobs::mark_ours(&spec.dir)?;
        let me = ProcessStamp::current();
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
            writer: me.clone(),
            evaluator: evaluator.map(str::to_string),
        };
        // Registered before the intent exists, so that an opener never misses it (see
        // `recover_open_jobs`); the entry names this process, in case it dies before the intent.
        if let Some(entry) = open_intent_entry(&spec.dir) {
            if let Some(open) = entry.parent() {
                fs::create_dir_all(open).at("cannot create", open)?;
            }
            let line = me.map_or_else(|| std::process::id().to_string(), |m| m.line());
            fs::write(&entry, line).at("cannot write", &entry)?;
        }
        let p = spec.dir.join(INTENT_FILE);
        fs::write(&p, crate::util::hash::json_bytes(&intent)?).at("cannot write", &p)
    }

    pub(in crate::os) fn mark_recorded(&self, spec: &JobSpec) -> Result<()> {
        write_recorded(&spec.dir)
    }
}

/// Under `.rsim/jobs/`: one empty file per job whose intent may still need recording (named by
/// the job id, holding its writer's pid). Removed once the job's action is recorded.
const OPEN_INTENTS_DIR: &str = "open";
/// In the registry: every job directory written before the registry existed has been looked at.
const SCANNED_FILE: &str = ".scanned";

/// The directories of the jobs whose intent is open (the registry): what is running now (or
/// orphaned until a recovery records it). Reads one usually small directory. Jobs this machine
/// did not start are not listed.
pub(in crate::os) fn open_job_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let dir = root.join(STATE_DIR).join("jobs");
    let Ok(entries) = fs::read_dir(dir.join(OPEN_INTENTS_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| dir.join(e.file_name()))
        .filter(|jd| crate::jobs::is_ours(jd))
        .collect()
}

/// The registry entry of the job in `job_dir` (`.rsim/jobs/<id>` → `.rsim/jobs/open/<id>`).
fn open_intent_entry(job_dir: &Path) -> Option<std::path::PathBuf> {
    Some(
        job_dir
            .parent()?
            .join(OPEN_INTENTS_DIR)
            .join(job_dir.file_name()?),
    )
}

/// The writer that registered the job in `job_dir`, if it is registered.
fn registered_writer(job_dir: &Path) -> Option<ProcessStamp> {
    ProcessStamp::parse_line(&fs::read_to_string(open_intent_entry(job_dir)?).ok()?)
}

fn unregister_intent(job_dir: &Path) {
    if let Some(entry) = open_intent_entry(job_dir) {
        let _ = fs::remove_file(entry);
    }
}

/// The job's action is recorded: mark its directory, then drop it from the registry.
fn write_recorded(job_dir: &Path) -> Result<()> {
    let p = job_dir.join(RECORDED_FILE);
    fs::write(&p, b"").at("cannot write", &p)?;
    unregister_intent(job_dir);
    Ok(())
}

/// Claim the recording of an orphaned job (another process may be opening the study right now);
/// a claim left by a dead process is taken over.
pub(in crate::os) fn claim_recovery(job_dir: &Path) -> bool {
    let claim = job_dir.join("recovering");
    if let Ok(text) = fs::read_to_string(&claim)
        && !ProcessStamp::parse_line(&text).is_some_and(|p| p.alive())
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
            if let Some(me) = ProcessStamp::current() {
                let _ = write!(f, "{}", me.line());
            }
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
    /// The writing process as this machine knows it (pid, boot, start time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) writer: Option<ProcessStamp>,
    /// The evaluator's fingerprint (evaluate jobs), to record a re-attached job as it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) evaluator: Option<String>,
}

impl JobIntent {
    /// Whether the process that wrote this intent still runs (the very process: same boot and
    /// start time, not a later one given its pid).
    fn writer_alive(&self) -> bool {
        match &self.writer {
            Some(w) => w.alive(),
            None => crate::util::proc::process_alive(self.writer_pid),
        }
    }
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

    /// Seconds from this start to the last sign of life in a lost job's directory (the latest
    /// write to it or to a file in it, one level down too: its log, its outputs), at most the
    /// time elapsed since. A job that died with its writer is charged what it ran, not the hours
    /// until a later rsim found it. A directory too large to scan (`LAST_WRITE_SCAN` entries) is
    /// charged the whole time elapsed: a partial scan could miss the last write and undercharge.
    pub(in crate::os) fn until_last_write(self, jd: &Path) -> f64 {
        self.until_last_write_within(jd, LAST_WRITE_SCAN)
    }

    fn until_last_write_within(self, jd: &Path, cap: usize) -> f64 {
        /// The latest write under `dir`, or None when more than `left` entries would be read.
        fn latest(dir: &Path, depth: u32, best: &mut f64, left: &mut usize) -> Option<()> {
            let Ok(entries) = fs::read_dir(dir) else {
                return Some(());
            };
            for e in entries.flatten() {
                *left = left.checked_sub(1)?;
                let Ok(meta) = e.metadata() else { continue };
                if let Some(t) = meta
                    .modified()
                    .ok()
                    .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                {
                    *best = best.max(t.as_secs_f64());
                }
                if depth > 0 && meta.is_dir() {
                    latest(&e.path(), depth - 1, best, left)?;
                }
            }
            Some(())
        }
        let mut last = self.0;
        let mut left = cap;
        if latest(jd, 1, &mut last, &mut left).is_none() {
            return self.elapsed_s();
        }
        let ran = ((last - self.0).max(0.0) * 1000.0).round() / 1000.0;
        ran.min(self.elapsed_s())
    }
}

/// Entries a lost job's last-write scan reads at most (a job writes a log and a few outputs).
const LAST_WRITE_SCAN: usize = 10_000;

/// The intent a job's writer left beside it, if any (None for a job this study never ran).
/// A job started and not yet recorded, as its intent says.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpenJob {
    pub job: String,
    pub node: String,
    pub action: ActionName,
    pub seed: Option<u64>,
    pub started_at: String,
}

impl Study {
    /// Jobs of `node` started and not yet recorded (running, or orphans recovery will record),
    /// from the registry of open intents.
    pub fn open_jobs(&self, node: &str) -> Vec<OpenJob> {
        let mut out: Vec<OpenJob> = open_job_dirs(&self.root)
            .into_iter()
            .filter(|jd| !jd.join(RECORDED_FILE).exists())
            .filter_map(|jd| read_intent(&jd))
            .filter(|i| i.node == node)
            .map(|i| OpenJob {
                seed: i.request.get("seed").and_then(Value::as_u64),
                job: i.job,
                node: i.node,
                action: i.action,
                started_at: i.started_at,
            })
            .collect();
        out.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        out
    }
}

pub(in crate::os) fn read_intent(job_dir: &Path) -> Option<JobIntent> {
    fs::read(job_dir.join(INTENT_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_job_is_charged_to_its_last_write_unless_its_directory_is_too_large_to_scan() {
        let d = tempfile::tempdir().expect("tempdir");
        let start = Timestamp(Timestamp::now().0 - 100.0);
        let out = d.path().join("out");
        fs::create_dir_all(&out).expect("mkdir");
        for i in 0..4 {
            fs::write(out.join(format!("f{i}")), "x").expect("write");
        }
        // Everything was written just now: about the 100 s since the start.
        let ran = start.until_last_write_within(d.path(), 5);
        assert!((99.0..=101.0).contains(&ran), "{ran}");
        // Backdate every entry: a job that died at its start ran about nothing.
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(start.0 - 10.0);
        let backdate = |p: &Path| {
            fs::File::open(p)
                .and_then(|f| f.set_modified(old))
                .expect("mtime");
        };
        for e in fs::read_dir(&out).expect("ls").flatten() {
            backdate(&e.path());
        }
        backdate(&out);
        assert!(start.until_last_write_within(d.path(), 5) < 1.0);
        // One entry past the cap: the scan cannot see everything, so all the time is charged.
        let ran = start.until_last_write_within(d.path(), 4);
        assert!((99.0..=101.0).contains(&ran), "{ran}");
    }

    /// A pid no process has.
    const DEAD: u32 = 2_147_483_646;

    fn study() -> (tempfile::TempDir, Study) {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path();
        fs::create_dir_all(root.join("models/base")).expect("mkdir");
        crate::train::write_base_model(&root.join("models/base")).expect("base model");
        fs::write(
            root.join(CONFIG_FILE),
            "[study]\nname = \"t\"\n[base_model]\nname = \"b\"\npath = \"models/base\"\n\
             [record]\nfsync = false\n[jobs]\nsft = [\"true\"]\nevaluate = [\"true\"]\n",
        )
        .expect("config");
        crate::os::genesis::create_study(root).expect("init");
        let s = Study::open(root).expect("open");
        (d, s)
    }

    /// The intent of a job whose writer died, in `.rsim/jobs/<id>`, registered as open or not.
    fn orphan(s: &Study, id: &str, register: bool) -> PathBuf {
        let jd = s.root.join(STATE_DIR).join("jobs").join(id);
        fs::create_dir_all(&jd).expect("job dir");
        crate::jobs::mark_ours(&jd).expect("ours");
        if register {
            let e = open_intent_entry(&jd).expect("entry");
            fs::create_dir_all(e.parent().expect("registry")).expect("registry");
            fs::write(&e, DEAD.to_string()).expect("register");
        }
        let intent = JobIntent {
            job: id.into(),
            kind: JobKind::Sft,
            action: ActionName::RunSft,
            node: ROOT_NODE.into(),
            agent: "w".into(),
            role: Role::Worker,
            request: serde_json::json!({}),
            command: vec!["true".into()],
            env: "host".into(),
            started_at: now_rfc3339(),
            started: Timestamp::now(),
            writer_pid: DEAD,
            writer: None,
            evaluator: None,
        };
        let bytes = crate::util::hash::json_bytes(&intent).expect("json");
        fs::write(jd.join(INTENT_FILE), bytes).expect("intent");
        jd
    }

    #[test]
    fn opening_reads_open_intents_only_and_older_job_directories_once() {
        let (_d, s) = study();
        // Job directories from before the registry: the first opening looks at all of them.
        let old = orphan(&s, "j-old", false);
        assert_eq!(s.recover_open_jobs().expect("recover"), 1);
        assert!(old.join(RECORDED_FILE).exists());
        // From then on an opening looks at registered intents only (a query reads one directory)...
        let unregistered = orphan(&s, "j-unregistered", false);
        assert_eq!(s.recover_open_jobs().expect("recover"), 0);
        assert!(!unregistered.join(RECORDED_FILE).exists());
        let registered = orphan(&s, "j-registered", true);
        assert_eq!(s.recover_open_jobs().expect("recover"), 1);
        assert!(registered.join(RECORDED_FILE).exists());
        let entry = open_intent_entry(&registered).expect("entry");
        assert!(!entry.exists(), "a recorded job leaves the registry");
        // ...while `rsim recover` still looks at every job directory, and records each job once.
        assert_eq!(s.recover_orphaned_jobs().expect("recover"), 1);
        assert_eq!(s.recover_orphaned_jobs().expect("recover"), 0);
        let n0 = s
            .index()
            .actions(Some(ROOT_NODE), true, 100)
            .expect("actions");
        assert_eq!(n0.len(), 4, "init and three lost jobs");
        // A writer that died between registering a job and writing its intent leaves nothing.
        let never_dir = s.root.join(STATE_DIR).join("jobs").join("j-never");
        fs::create_dir_all(&never_dir).expect("job dir");
        crate::jobs::mark_ours(&never_dir).expect("ours");
        let never = open_intent_entry(&never_dir).expect("entry");
        let dead = ProcessStamp {
            start: 0,
            ..ProcessStamp::current().expect("this process")
        };
        fs::write(&never, dead.line()).expect("register");
        assert_eq!(s.recover_open_jobs().expect("recover"), 0);
        assert!(!never.exists());
    }
}
