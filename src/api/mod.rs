//! The Experiment OS API: the one code path for every action. Faces (CLI, MCP, LSP,
//! orchestrator) call `Study::call` with JSON or the typed methods; none writes the record.
//!
//! Each action: validate (JSON Schema + semantic checks) → gather facts → policy → execute
//! (jobs, object store) → record (one git commit, compare-and-swap) → index.

pub mod schema;
pub mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::{CONFIG_FILE, StudyConfig};
use crate::dag::Dag;
use crate::datasets;
use crate::error::{Error, ErrorKind, IoContext, Result};
use crate::index::Index;
use crate::jobs::{JobRunner, JobSpec, LocalRunner};
use crate::model::*;
use crate::policy::{self, Facts, Request};
use crate::record::{self, Append, NodeSnapshot, Record, TreeFile};
use crate::store::ObjectStore;
use types::*;

/// Where the study keeps what is not in git.
pub const STATE_DIR: &str = ".rsim";
pub const ROOT_NODE: &str = "n0";
/// Attempts at a compare-and-swap before giving up (each retry re-reads the tip).
const CAS_ATTEMPTS: usize = 64;

/// An open study: config, record, index, object store and job runner.
pub struct Study {
    root: PathBuf,
    config: StudyConfig,
    record: Record,
    index: Index,
    store: ObjectStore,
    runner: Box<dyn JobRunner>,
    /// The binary `@rsim` in job commands stands for (default: this executable).
    rsim_bin: Option<PathBuf>,
}

/// What an action prepares once it has seen the node's current tip.
struct Prepared {
    summary: String,
    body: String,
    decision: Decision,
    result: Option<Value>,
    job: Option<JobRecord>,
    artifacts: Vec<ArtifactRef>,
    metrics: Vec<MetricRecord>,
    refers_to: Vec<String>,
    meta: Option<NodeMeta>,
    files: Vec<TreeFile>,
}

impl Prepared {
    /// Record the job that ran for this action, with its log as an artifact.
    fn attach_job(&mut self, job: &JobRecord) {
        if let Some(l) = &job.log {
            self.artifacts.push(ArtifactRef {
                sha256: l.clone(),
                kind: ArtifactKind::Log,
                name: format!("{}.log", job.id),
                parent: None,
            });
        }
        self.job = Some(job.clone());
    }

    fn accepted(summary: String, result: Value) -> Self {
        Prepared {
            summary,
            body: String::new(),
            decision: Decision::accept(),
            result: Some(result),
            job: None,
            artifacts: Vec::new(),
            metrics: Vec::new(),
            refers_to: Vec::new(),
            meta: None,
            files: Vec::new(),
        }
    }
}

impl Study {
    /// Open the study at `root` (the directory holding rsim.toml and .git), with the job backend
    /// its committed config names (`[backend] kind`).
    pub fn open(root: &Path) -> Result<Study> {
        Self::open_inner(root, None)
    }

    pub fn open_with_runner(root: &Path, runner: Box<dyn JobRunner>) -> Result<Study> {
        Self::open_inner(root, Some(runner))
    }

    /// Open with the runner the committed config chooses (local or Slurm), wrapped by `wrap`
    /// (e.g. a face that wants to know when a job starts).
    pub fn open_wrapping_runner(
        root: &Path,
        wrap: impl FnOnce(Box<dyn JobRunner>) -> Box<dyn JobRunner>,
    ) -> Result<Study> {
        let canonical = root
            .canonicalize()
            .map_err(|e| Error::invalid(format!("{}: {e}", root.display())))?;
        let record = Record::open(&canonical)?;
        let config = load_committed_config(&record, &canonical)?;
        Self::open_inner(root, Some(wrap(runner_for(&config.backend))))
    }

    fn open_inner(root: &Path, runner: Option<Box<dyn JobRunner>>) -> Result<Study> {
        let root = root
            .canonicalize()
            .map_err(|e| Error::invalid(format!("{}: {e}", root.display())))?;
        let record = Record::open(&root)?;
        let config = load_committed_config(&record, &root)?;
        let runner = runner.unwrap_or_else(|| runner_for(&config.backend));
        let state = root.join(STATE_DIR);
        fs::create_dir_all(&state).at("cannot create", &state)?;
        let mut index = Index::open(&state.join("index.sqlite"))?;
        if index.needs_rebuild {
            tracing::warn!("the index was written by another rsim version; rebuilding it from git");
            index.rebuild(&record)?;
            index.needs_rebuild = false;
        }
        let repaired = index.repair(&record)?;
        if repaired > 0 {
            tracing::info!(
                repaired,
                "index caught up with git after an interrupted write"
            );
        }
        let store = ObjectStore::new(state.join("objects"));
        let study = Study {
            root,
            config,
            record,
            index,
            store,
            runner,
            rsim_bin: None,
        };
        // Recovery must never keep a study from opening: a failure is reported and retried next time.
        match study.recover_orphaned_jobs() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                n,
                "recorded jobs whose rsim process died before recording them"
            ),
            Err(e) => tracing::warn!("could not record orphaned jobs yet: {}", e.message),
        }
        Ok(study)
    }

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

    fn recover_jobs(&self, wait: bool) -> Result<usize> {
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
            if crate::jobs::process_alive(intent.writer_pid) {
                continue;
            }
            if let Some((_, _, _)) = self.index.job(&intent.job)? {
                fs::write(&marker, b"").at("cannot write", &marker)?;
                continue;
            }
            // A Slurm job keeps running without its writer: re-attach and record its real outcome.
            if let Some(sub) = crate::slurm::submitted(&jd)? {
                if self.record.node_tip(&intent.node)?.is_none() {
                    continue;
                }
                let Some(job) = crate::slurm::reattach(&jd, wait)? else {
                    continue;
                };
                if !claim_recovery(&jd) {
                    continue;
                }
                self.record_reattached(&intent, &sub.spec, job)?;
                recorded += 1;
                continue;
            }
            if !claim_recovery(&jd) {
                continue;
            }
            crate::jobs::stop_job(&jd);
            crate::slurm::stop_unnoted(&jd, &intent.job);
            let job = JobRecord {
                id: intent.job.clone(),
                kind: intent.kind,
                state: JobState::Lost,
                exit_code: None,
                started_at: intent.started_at.clone(),
                finished_at: now_rfc3339(),
                duration_s: intent.started.elapsed_s(),
                command: intent.command.clone(),
                env: intent.env.clone(),
                network: "shared".into(),
                log: self.store_log_at(&jd.join("job.log"))?,
                error: Some("the rsim process that ran this job died before recording it; the job was stopped".into()),
                compute_s: None,
                slurm: None,
            };
            let caller = Caller::new(intent.agent.clone(), intent.role);
            let node = intent.node.clone();
            if self.record.node_tip(&node)?.is_none() {
                continue;
            }
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
    fn record_reattached(
        &self,
        intent: &JobIntent,
        spec: &JobSpec,
        mut job: JobRecord,
    ) -> Result<()> {
        let caller = Caller::new(intent.agent.clone(), intent.role);
        job.log = self.store_log(spec)?;
        let sha_of = |key: &str| {
            spec.params[key]["sha256"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| {
                    Error::internal(format!("job {}: spec has no {key}.sha256", spec.id))
                })
        };
        match intent.action {
            ActionName::RunSft => {
                let req: RunSftRequest = serde_json::from_value(intent.request.clone())?;
                self.finish_sft(
                    &caller,
                    &req,
                    intent.request.clone(),
                    spec,
                    job,
                    sha_of("base")?,
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
                    sha_of("checkpoint")?,
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

    /// Ask a running or queued job to stop; its action is then recorded with the job cancelled.
    pub fn cancel_job(&self, job: &str) -> Result<()> {
        let req = GetJobRequest {
            job: job.to_string(),
        };
        revalidate("get_job", &req).map_err(|e| {
            Error::invalid(
                e.message
                    .replace("invalid get_job request", "invalid cancel request"),
            )
        })?;
        if self.index.job(job)?.is_some() {
            return Err(Error::invalid(format!(
                "job {job} has finished; its action is already recorded"
            )));
        }
        let dir = self.root.join(STATE_DIR).join("jobs").join(job);
        crate::jobs::request_cancel(&dir).map_err(|e| match e.kind {
            ErrorKind::NotFound => Error::not_found(format!("job: no job {job} in this study")),
            _ => e,
        })?;
        // A Slurm job is cancelled at once, even when no rsim process is waiting for it.
        crate::slurm::cancel(&dir)
    }

    /// Note, before a job runs, what would have to be recorded if this process died meanwhile.
    fn write_intent(
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
            kind: spec.kind,
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
        fs::write(&p, record::json_bytes(&intent)?).at("cannot write", &p)
    }

    fn mark_recorded(&self, spec: &JobSpec) -> Result<()> {
        let p = spec.dir.join(RECORDED_FILE);
        fs::write(&p, b"").at("cannot write", &p)
    }

    /// Make `@rsim` in job commands run this binary (tests and embedders whose executable is not rsim).
    pub fn set_rsim_bin(&mut self, bin: PathBuf) {
        self.rsim_bin = Some(bin);
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn config(&self) -> &StudyConfig {
        &self.config
    }
    pub fn record(&self) -> &Record {
        &self.record
    }
    pub fn index(&self) -> &Index {
        &self.index
    }
    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// Rebuild the index from git alone.
    pub fn reindex(&mut self) -> Result<usize> {
        self.index.rebuild(&self.record)
    }

    /// Load the DAG from the index.
    pub fn dag_graph(&self) -> Result<Dag> {
        Dag::load(&self.index)
    }

    /// Run any action or query from its JSON arguments (what an MCP client sends) and return its JSON result.
    pub fn call(&self, caller: &Caller, action: &str, args: Value) -> Result<Value> {
        schema::validate(action, &args)?;
        match action {
            "branch" => to_value(self.branch_checked(caller, parse(action, args)?)),
            "register_dataset" => {
                to_value(self.register_dataset_checked(caller, parse(action, args)?))
            }
            "run_sft" => to_value(self.run_sft_checked(caller, parse(action, args)?)),
            "evaluate" => to_value(self.evaluate_checked(caller, parse(action, args)?)),
            "compare" => to_value(self.compare_checked(caller, parse(action, args)?)),
            "review" => to_value(self.review_checked(caller, parse(action, args)?)),
            "conclude" => to_value(self.conclude_checked(caller, parse(action, args)?)),
            "get_node" => to_value(self.get_node(parse(action, args)?)),
            "list_nodes" => to_value(self.list_nodes(parse(action, args)?)),
            "dag" => to_value(self.dag(parse(action, args)?)),
            "log" => to_value(self.log(parse(action, args)?)),
            "get_job" => to_value(self.get_job(parse(action, args)?)),
            other => Err(Error::invalid(format!(
                "unknown action {other:?}; actions are: {}",
                schema::names()
            ))),
        }
    }

    // ------------------------------------------------------------------ typed actions

    pub fn branch(&self, caller: &Caller, req: BranchRequest) -> Result<BranchResult> {
        revalidate("branch", &req)?;
        self.branch_checked(caller, req)
    }
    pub fn register_dataset(
        &self,
        caller: &Caller,
        req: RegisterDatasetRequest,
    ) -> Result<RegisterDatasetResult> {
        revalidate("register_dataset", &req)?;
        self.register_dataset_checked(caller, req)
    }
    pub fn run_sft(&self, caller: &Caller, req: RunSftRequest) -> Result<RunSftResult> {
        revalidate("run_sft", &req)?;
        self.run_sft_checked(caller, req)
    }
    pub fn evaluate(&self, caller: &Caller, req: EvaluateRequest) -> Result<EvaluateResult> {
        revalidate("evaluate", &req)?;
        self.evaluate_checked(caller, req)
    }
    pub fn compare(&self, caller: &Caller, req: CompareRequest) -> Result<CompareResult> {
        revalidate("compare", &req)?;
        self.compare_checked(caller, req)
    }
    pub fn review(&self, caller: &Caller, req: ReviewRequest) -> Result<ReviewResult> {
        revalidate("review", &req)?;
        self.review_checked(caller, req)
    }
    pub fn conclude(&self, caller: &Caller, req: ConcludeRequest) -> Result<ConcludeResult> {
        revalidate("conclude", &req)?;
        self.conclude_checked(caller, req)
    }

    fn branch_checked(&self, caller: &Caller, req: BranchRequest) -> Result<BranchResult> {
        check_caller(caller)?;
        let mut seen = BTreeSet::new();
        for p in &req.parents {
            if !seen.insert(p) {
                return Err(Error::invalid(format!("parents: {p} is listed twice")));
            }
        }
        let mut parent_tips = Vec::new();
        for (i, p) in req.parents.iter().enumerate() {
            parent_tips.push(
                self.require_node_tip(p)
                    .map_err(|e| e.context(format!("parents.{i}")))?,
            );
        }
        let first = req.parents[0].clone();
        let facts = Facts {
            node_status: Some(self.record.snapshot(parent_tips[0])?.meta.status),
            node_count: self.index.node_count()?,
            ..Facts::default()
        };
        let decision = policy::check(Request::Branch(&req), caller, &self.config, &facts);
        let request = serde_json::to_value(&req)?;
        if !decision.accepted() {
            return Err(self.record_rejection(
                &first,
                caller,
                ActionName::Branch,
                request,
                decision,
            ));
        }
        let mut num = self.index.max_node_num()? + 1;
        for _ in 0..CAS_ATTEMPTS * 4 {
            let id = format!("n{num}");
            let at = now_rfc3339();
            let meta = NodeMeta {
                id: id.clone(),
                title: req.title.clone(),
                hypothesis: req.hypothesis.clone(),
                parents: req.parents.clone(),
                status: NodeStatus::Open,
                created_at: at.clone(),
                created_by: caller.agent.clone(),
                outcome: None,
            };
            let branch = record::node_ref(&id)
                .trim_start_matches("refs/heads/")
                .to_string();
            let rec = ActionRecord {
                seq: 1,
                action: ActionName::Branch,
                node: id.clone(),
                agent: caller.agent.clone(),
                role: caller.role,
                at,
                summary: format!("open {id} {:?}", req.title),
                request: request.clone(),
                decision: Decision::accept(),
                result: Some(serde_json::json!({ "node": id, "branch": branch })),
                job: None,
                artifacts: Vec::new(),
                metrics: Vec::new(),
                refers_to: req.parents.clone(),
            };
            let body = if req.hypothesis.is_empty() {
                format!("Parents: {}", req.parents.join(", "))
            } else {
                format!(
                    "Hypothesis: {}\n\nParents: {}",
                    req.hypothesis,
                    req.parents.join(", ")
                )
            };
            let msg = record::commit_message(&rec, &body, &req.parents);
            self.index.mark_pending(&id)?;
            match self.record.create_node(&meta, &rec, &parent_tips, &msg)? {
                record::Create::Created(commit) => {
                    self.index.sync_node(&self.record, &id)?;
                    return Ok(BranchResult {
                        node: id,
                        branch,
                        commit: commit.to_string(),
                    });
                }
                record::Create::Taken => {
                    // Another writer took this id: the index may lag, so step past it.
                    self.index.sync_node(&self.record, &id)?;
                    num += 1;
                }
                record::Create::Busy => backoff(),
            }
        }
        Err(Error::conflict(
            "could not allocate a node id: too many concurrent writers",
        ))
    }

    fn register_dataset_checked(
        &self,
        caller: &Caller,
        req: RegisterDatasetRequest,
    ) -> Result<RegisterDatasetResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        if let DatasetSource::Declared { source } = &req.source
            && !self.config.datasets.contains_key(source)
        {
            return Err(Error::not_found(format!(
                "source: no dataset source {source:?} is declared in rsim.toml (declared: {})",
                self.config
                    .datasets
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        // Materialise the rows first: the contamination scan is a fact the policy decides on.
        let mut unregistered = Vec::new();
        let mut decontaminated = 0u64;
        let rows = match &req.source {
            DatasetSource::Inline { rows } => rows.clone(),
            DatasetSource::Arith(p) => {
                let (rows, dropped) = self.decontaminate(datasets::generate_arith(p))?;
                decontaminated = dropped;
                rows
            }
            DatasetSource::Declared { source } => {
                let path = self.study_file(&self.config.datasets[source].path)?;
                let bytes = fs::read(&path).at("cannot read declared dataset", &path)?;
                datasets::parse_jsonl(&bytes, &format!("dataset source {source}"))?
            }
            DatasetSource::Mixture { parts, seed } => {
                let mut loaded = Vec::new();
                for p in parts {
                    match self.dataset_rows(&p.dataset)? {
                        Some(rows) => loaded.push((rows, p.rows)),
                        None => unregistered.push(p.dataset.clone()),
                    }
                }
                datasets::mix(&loaded, *seed)
            }
            DatasetSource::Filter {
                dataset,
                max_prompt_chars,
                max_answer_chars,
                prompt_contains,
            } => match self.dataset_rows(dataset)? {
                Some(rows) => rows
                    .into_iter()
                    .filter(|r| {
                        max_prompt_chars.is_none_or(|m| r.prompt.chars().count() as u64 <= m)
                    })
                    .filter(|r| {
                        max_answer_chars.is_none_or(|m| r.answer.chars().count() as u64 <= m)
                    })
                    .filter(|r| {
                        prompt_contains
                            .as_ref()
                            .is_none_or(|c| r.prompt.contains(c.as_str()))
                    })
                    .collect(),
                None => {
                    unregistered.push(dataset.clone());
                    Vec::new()
                }
            },
        };
        let contamination = if unregistered.is_empty() {
            self.scan_for_contamination(&rows)?
        } else {
            Vec::new()
        };
        let facts = Facts {
            node_status: Some(snap.meta.status),
            dataset_name_taken: self.index.dataset(&req.name)?.is_some(),
            unregistered_datasets: unregistered,
            contamination,
            agent_contamination_rejections: self
                .index
                .rejection_count(&caller.agent, "contamination")?,
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::RegisterDataset(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::RegisterDataset,
                request,
                decision,
            ));
        }
        if rows.is_empty() {
            return Err(Error::invalid(
                "source: the dataset has no rows (a filter that keeps nothing?)",
            ));
        }
        let bytes = datasets::to_jsonl(&rows)?;
        let sha = self.store.put_bytes(&bytes)?;
        let n = rows.len() as u64;
        let (oid, _) = self.commit_action(
            &req.node,
            caller,
            ActionName::RegisterDataset,
            request,
            |_| {
                let mut p = Prepared::accepted(
                    format!("{} ({n} rows)", req.name),
                    serde_json::json!({ "dataset": req.name, "sha256": sha, "rows": n, "decontaminated": decontaminated }),
                );
                p.body = format!(
                    "Dataset {} ({n} rows), sha256 {sha}.\n{}",
                    req.name, req.description
                );
                p.artifacts.push(ArtifactRef {
                    sha256: sha.clone(),
                    kind: ArtifactKind::Dataset,
                    name: req.name.clone(),
                    parent: None,
                });
                Ok(p)
            },
        )?;
        Ok(RegisterDatasetResult {
            dataset: req.name,
            sha256: sha,
            rows: n,
            decontaminated,
            commit: oid,
        })
    }

    fn run_sft_checked(&self, caller: &Caller, req: RunSftRequest) -> Result<RunSftResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        let base_sha = self.resolve_checkpoint(&req.base)?;
        let mut unregistered = Vec::new();
        let mut ds = Vec::new();
        for name in &req.datasets {
            match self.index.dataset(name)? {
                Some((sha, _, rows)) => ds.push((name.clone(), sha, rows)),
                None => unregistered.push(name.clone()),
            }
        }
        let mut facts = self.job_facts(caller, &req.node, base_sha.as_deref())?;
        facts.node_status = Some(snap.meta.status);
        facts.unregistered_datasets = unregistered;
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::RunSft(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::RunSft,
                request,
                decision,
            ));
        }
        let base_sha =
            base_sha.ok_or_else(|| Error::internal("policy accepted an unknown checkpoint"))?;
        let job_id = crate::jobs::new_job_id();
        let params = serde_json::json!({
            "kind": "sft",
            "job": job_id,
            "node": req.node,
            "base": self.checkpoint_files(&base_sha)?,
            "datasets": ds.iter().map(|(name, sha, rows)| serde_json::json!({
                "name": name, "sha256": sha, "rows": rows, "path": self.store.path(sha),
            })).collect::<Vec<_>>(),
            "hyper": request,
        });
        let timeout = self.job_timeout(caller, &req.node)?;
        let spec = self.job_spec(
            job_id,
            JobKind::Sft,
            &self.config.jobs.sft.clone(),
            params,
            timeout,
        )?;
        self.write_intent(caller, ActionName::RunSft, &req.node, &request, &spec, None)?;
        let mut job = self.runner.run(&spec)?;
        job.log = self.store_log(&spec)?;
        self.finish_sft(caller, &req, request, &spec, job, base_sha)
    }

    /// Collect a finished `run_sft` job's checkpoint and metrics and record the action.
    fn finish_sft(
        &self,
        caller: &Caller,
        req: &RunSftRequest,
        request: Value,
        spec: &JobSpec,
        mut job: JobRecord,
        base_sha: String,
    ) -> Result<RunSftResult> {
        let mut checkpoint = None;
        let mut train_metrics = BTreeMap::new();
        if job.state == JobState::Succeeded {
            let ck_dir = spec.out_dir().join("checkpoint");
            if ck_dir.is_dir() {
                checkpoint = Some(self.store.put_dir(&ck_dir)?);
                train_metrics = read_metrics(&spec.out_dir().join("metrics.json"))?;
            } else {
                job.state = JobState::Failed;
                job.error =
                    Some("the trainer exited 0 but wrote no out/checkpoint/ directory".into());
            }
        }
        let result_stored = serde_json::json!({
            "job": job, "checkpoint": checkpoint, "train_metrics": train_metrics,
        });
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::RunSft, request, |_| {
                let summary = match &checkpoint {
                    Some(c) => format!("{} → checkpoint {}", short_ck(&req.base), &c[..12]),
                    None => format!("{} → job {}", short_ck(&req.base), job.state.as_str()),
                };
                let mut p = Prepared::accepted(summary, result_stored.clone());
                p.body = format!(
                    "Datasets: {}; lr {}, {} steps, batch {}, seed {}.\nJob {} {} in {:.1} s{}.",
                    req.datasets.join(", "),
                    req.learning_rate,
                    req.steps,
                    req.batch_size,
                    req.seed,
                    job.id,
                    job.state.as_str(),
                    job.duration_s,
                    job.error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                if let Some(c) = &checkpoint {
                    p.artifacts.push(ArtifactRef {
                        sha256: c.clone(),
                        kind: ArtifactKind::Checkpoint,
                        name: format!("{}-{}", req.node, &c[..12]),
                        parent: Some(base_sha.clone()),
                    });
                }
                p.attach_job(&job);
                Ok(p)
            })?;
        self.mark_recorded(spec)?;
        Ok(RunSftResult {
            job,
            checkpoint,
            train_metrics,
            commit: oid,
        })
    }

    fn evaluate_checked(&self, caller: &Caller, req: EvaluateRequest) -> Result<EvaluateResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        let task = self.config.tasks.get(&req.task).cloned().ok_or_else(|| {
            Error::not_found(format!(
                "task: no task {:?} in this study (tasks: {})",
                req.task,
                self.config
                    .tasks
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let set = match req.split {
            Split::Dev => &task.dev,
            Split::Test => &task.test,
        };
        let set_path = self.study_file(&set.path)?;
        let ck = self.resolve_checkpoint(&req.checkpoint)?;
        let evaluator = self.evaluator_fingerprint()?;
        let facts = Facts {
            node_status: Some(snap.meta.status),
            evaluations_total: self.index.evaluation_count(None, None)?,
            test_evaluations_on_node: self.index.evaluation_count(Some(&req.node), Some("test"))?,
            node_evaluations: self.index.evaluation_count(Some(&req.node), None)?,
            agent_evaluations: self
                .index
                .evaluation_count_by(None, None, Some(&caller.agent))?,
            evaluator_actual: Some(evaluator.clone()),
            evaluator_pinned: self.config.jobs.evaluator_sha256.clone(),
            eval_set_actual: Some(crate::store::sha256_file(&set_path)?),
            eval_set_pinned: set.sha256.clone(),
            ..self.job_facts(caller, &req.node, ck.as_deref())?
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Evaluate(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Evaluate,
                request,
                decision,
            ));
        }
        let ck = ck.ok_or_else(|| Error::internal("policy accepted an unknown checkpoint"))?;
        let job_id = crate::jobs::new_job_id();
        let params = serde_json::json!({
            "kind": "evaluate",
            "job": job_id,
            "checkpoint": self.checkpoint_files(&ck)?,
            "task": req.task,
            "split": req.split,
            "metric": task.metric,
            "eval_set": set_path,
        });
        let timeout = self.job_timeout(caller, &req.node)?;
        let spec = self.job_spec(
            job_id,
            JobKind::Evaluate,
            &self.config.jobs.evaluate.clone(),
            params,
            timeout,
        )?;
        self.write_intent(
            caller,
            ActionName::Evaluate,
            &req.node,
            &request,
            &spec,
            Some(&evaluator),
        )?;
        let mut job = self.runner.run(&spec)?;
        job.log = self.store_log(&spec)?;
        self.finish_evaluate(caller, &req, request, &spec, job, ck, evaluator, task)
    }

    /// Collect a finished `evaluate` job's scores and record the action.
    #[allow(clippy::too_many_arguments)]
    fn finish_evaluate(
        &self,
        caller: &Caller,
        req: &EvaluateRequest,
        request: Value,
        spec: &JobSpec,
        mut job: JobRecord,
        ck: String,
        evaluator: String,
        task: crate::config::TaskConfig,
    ) -> Result<EvaluateResult> {
        let mut metrics = BTreeMap::new();
        let mut n_items = 0;
        let mut items = None;
        if job.state == JobState::Succeeded {
            match read_eval_result(&spec.out_dir().join("result.json")) {
                Ok(r) => {
                    metrics = r.metrics;
                    n_items = r.n_items;
                    if req.split == Split::Dev {
                        items = Some(r.items);
                    }
                }
                Err(e) => {
                    job.state = JobState::Failed;
                    job.error = Some(e.message);
                }
            }
        }
        let metric_records: Vec<MetricRecord> = metrics
            .iter()
            .map(|(name, value)| MetricRecord {
                name: name.clone(),
                value: *value,
                task: req.task.clone(),
                split: req.split,
                checkpoint: ck.clone(),
            })
            .collect();
        let result_stored = serde_json::json!({
            "job": job, "task": req.task, "split": req.split, "metrics": metrics, "n_items": n_items,
            "evaluator": evaluator, "items": items,
        });
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Evaluate, request, |snap| {
                let headline = metrics
                    .get(&task.metric)
                    .map(|v| format!("{}={v:.4}", task.metric))
                    .unwrap_or_else(|| format!("job {}", job.state.as_str()));
                let mut p = Prepared::accepted(
                    format!(
                        "{} on {}/{}: {headline}",
                        short_ck(&req.checkpoint),
                        req.task,
                        req.split.as_str()
                    ),
                    result_stored.clone(),
                );
                p.body = format!(
                    "Evaluator {evaluator}; {n_items} items; job {} {} in {:.1} s.",
                    job.id,
                    job.state.as_str(),
                    job.duration_s
                );
                p.attach_job(&job);
                p.metrics = metric_records.clone();
                if !metric_records.is_empty() {
                    let mut all: NodeMetrics =
                        match self.record.read_file(snap.tip, "metrics.json")? {
                            Some(b) => serde_json::from_slice(&b).unwrap_or_default(),
                            None => NodeMetrics::new(),
                        };
                    for m in &metric_records {
                        all.insert(
                            format!("{}/{}/{}", m.task, m.split.as_str(), m.name),
                            m.clone(),
                        );
                    }
                    p.files
                        .push(TreeFile::new("metrics.json", record::json_bytes(&all)?));
                }
                Ok(p)
            })?;
        self.mark_recorded(spec)?;
        Ok(EvaluateResult {
            job,
            task: req.task.clone(),
            split: req.split,
            metrics,
            n_items,
            evaluator,
            items,
            commit: oid,
        })
    }

    fn compare_checked(&self, caller: &Caller, req: CompareRequest) -> Result<CompareResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        let mut rows = Vec::new();
        for n in &req.nodes {
            let node = self
                .index
                .node(n)?
                .ok_or_else(|| Error::not_found(format!("nodes: no node {n}")))?;
            let values: Vec<f64> = self
                .index
                .node_metrics(n)?
                .into_iter()
                .filter(|(_, m)| m.task == req.task && m.split == req.split && m.name == req.metric)
                .map(|(_, m)| m.value)
                .collect();
            let (mean, ci95) = crate::stats::mean_ci95(&values);
            let best = values
                .iter()
                .copied()
                .fold(None, |b: Option<f64>, v| Some(b.map_or(v, |b| b.max(v))));
            rows.push(CompareRow {
                node: n.clone(),
                title: node.title,
                n: values.len() as u64,
                mean,
                ci95,
                best,
                values,
            });
        }
        let facts = Facts {
            node_status: Some(snap.meta.status),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Compare(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Compare,
                request,
                decision,
            ));
        }
        let stored = serde_json::json!({ "task": req.task, "split": req.split, "metric": req.metric, "rows": rows });
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Compare, request, |_| {
                let mut p = Prepared::accepted(
                    format!(
                        "{} on {}/{} across {}",
                        req.metric,
                        req.task,
                        req.split.as_str(),
                        req.nodes.join(", ")
                    ),
                    stored.clone(),
                );
                p.body = rows
                    .iter()
                    .map(|r| {
                        let ci = r
                            .ci95
                            .map(|[a, b]| format!(" [{a:.4}, {b:.4}]"))
                            .unwrap_or_default();
                        let mean = r
                            .mean
                            .map(|m| format!("{m:.4}"))
                            .unwrap_or_else(|| "-".into());
                        format!("{}: n={} mean={mean}{ci}", r.node, r.n)
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                p.refers_to = req.nodes.clone();
                Ok(p)
            })?;
        Ok(CompareResult {
            task: req.task,
            split: req.split,
            metric: req.metric,
            rows,
            commit: oid,
        })
    }

    fn review_checked(&self, caller: &Caller, req: ReviewRequest) -> Result<ReviewResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        for (i, v) in req.verdicts.iter().enumerate() {
            if self.index.node(&v.node)?.is_none() {
                return Err(Error::not_found(format!(
                    "verdicts.{i}.node: no node {}",
                    v.node
                )));
            }
        }
        for (i, p) in req.proposals.iter().enumerate() {
            for (j, parent) in p.parents.iter().enumerate() {
                if self.index.node(parent)?.is_none() {
                    return Err(Error::not_found(format!(
                        "proposals.{i}.parents.{j}: no node {parent}"
                    )));
                }
            }
        }
        let facts = Facts {
            node_status: Some(snap.meta.status),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Review(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Review,
                request,
                decision,
            ));
        }
        let mut md = format!(
            "# Review by {} ({})\n\n{}\n",
            caller.agent, caller.role, req.summary
        );
        if !req.verdicts.is_empty() {
            md.push_str("\n## Verdicts\n\n");
            for v in &req.verdicts {
                let verdict = serde_json::to_value(v.verdict)?
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                md.push_str(&format!("- **{}**: {verdict} — {}\n", v.node, v.reason));
            }
        }
        if !req.proposals.is_empty() {
            md.push_str("\n## Proposed directions\n\n");
            for p in &req.proposals {
                md.push_str(&format!(
                    "- {} (from {}): {}\n",
                    p.title,
                    p.parents.join(" + "),
                    p.hypothesis
                ));
            }
        }
        let mut path = String::new();
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Review, request, |snap| {
                path = format!("reviews/{:04}.md", snap.action_count + 1);
                let mut p = Prepared::accepted(
                    format!(
                        "{} verdicts, {} proposals",
                        req.verdicts.len(),
                        req.proposals.len()
                    ),
                    serde_json::json!({ "review": path }),
                );
                p.body = req.summary.clone();
                p.files.push(TreeFile::new(path.clone(), md.clone()));
                p.refers_to = req.verdicts.iter().map(|v| v.node.clone()).collect();
                Ok(p)
            })?;
        Ok(ReviewResult {
            review: path,
            commit: oid,
        })
    }

    fn conclude_checked(&self, caller: &Caller, req: ConcludeRequest) -> Result<ConcludeResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        let known = match &req.best_checkpoint {
            Some(c) => self.resolve_checkpoint(c)?.is_some(),
            None => true,
        };
        let facts = Facts {
            node_status: Some(snap.meta.status),
            checkpoint_known: known,
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Conclude(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Conclude,
                request,
                decision,
            ));
        }
        let outcome = serde_json::to_value(req.outcome)?
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Conclude, request, |snap| {
                let mut meta = snap.meta.clone();
                meta.status = NodeStatus::Concluded;
                meta.outcome = Some(req.outcome);
                let mut p = Prepared::accepted(
                    format!("{outcome}: {}", first_line(&req.findings)),
                    serde_json::json!({ "node": req.node, "status": "concluded" }),
                );
                p.body = req.findings.clone();
                p.files.push(TreeFile::new(
                    "notes.md",
                    format!(
                        "# {}\n\nOutcome: {outcome}\n\n{}\n",
                        meta.title, req.findings
                    ),
                ));
                p.meta = Some(meta);
                Ok(p)
            })?;
        Ok(ConcludeResult {
            node: req.node,
            status: NodeStatus::Concluded,
            commit: oid,
        })
    }

    // ------------------------------------------------------------------ queries

    pub fn get_node(&self, req: GetNodeRequest) -> Result<NodeInfo> {
        let n = self
            .index
            .node(&req.node)?
            .ok_or_else(|| Error::not_found(format!("node: no node {}", req.node)))?;
        let actions = self
            .index
            .node_actions(&req.node)?
            .into_iter()
            .map(summary_of)
            .collect();
        let metrics = self
            .index
            .node_metrics(&req.node)?
            .into_iter()
            .map(|(_, m)| m)
            .collect();
        let tip = git2::Oid::from_str(&n.tip)?;
        let notes = self
            .record
            .read_file(tip, "notes.md")?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let outcome = self.record.snapshot(tip)?.meta.outcome;
        Ok(NodeInfo {
            branch: record::node_ref(&n.id)
                .trim_start_matches("refs/heads/")
                .to_string(),
            children: self.index.children(&n.id)?,
            id: n.id,
            title: n.title,
            hypothesis: n.hypothesis,
            status: n.status,
            outcome,
            parents: n.parents,
            created_at: n.created_at,
            created_by: n.created_by,
            tip: n.tip,
            actions,
            metrics,
            notes,
        })
    }

    pub fn list_nodes(&self, req: ListNodesRequest) -> Result<ListNodesResult> {
        let nodes = self.index.nodes(req.status, req.limit, req.offset)?;
        let total = match req.status {
            None => self.index.node_count()?,
            Some(s) => self.index.nodes(Some(s), u64::MAX >> 2, 0)?.len() as u64,
        };
        Ok(ListNodesResult {
            total,
            nodes: nodes
                .into_iter()
                .map(|n| NodeSummary {
                    id: n.id,
                    title: n.title,
                    status: n.status,
                    parents: n.parents,
                    actions: n.action_count,
                    created_at: n.created_at,
                })
                .collect(),
        })
    }

    pub fn dag(&self, req: DagRequest) -> Result<DagResult> {
        let need_node = || -> Result<String> {
            let n = req.node.clone().ok_or_else(|| {
                Error::invalid(format!("node: the {:?} view needs a node", req.view))
            })?;
            if self.index.node(&n)?.is_none() {
                return Err(Error::not_found(format!("node: no node {n}")));
            }
            Ok(n)
        };
        let dag = self.dag_graph()?;
        let pick = |ids: Vec<String>| -> Vec<DagNode> {
            ids.iter()
                .filter_map(|id| dag.node(id))
                .map(dag_node)
                .collect()
        };
        let mut lineage = Vec::new();
        let nodes: Vec<DagNode> = match req.view {
            DagView::Full => {
                // The whole DAG: move the rows out instead of copying 100k titles.
                let edges = dag
                    .edges()
                    .map(|(a, b)| [a.to_string(), b.to_string()])
                    .collect();
                let nodes = dag
                    .into_nodes()
                    .into_iter()
                    .map(|n| DagNode {
                        id: n.id,
                        title: n.title,
                        status: n.status,
                        parents: n.parents,
                        value: None,
                        relation: None,
                    })
                    .collect();
                return Ok(DagResult {
                    view: req.view,
                    nodes,
                    edges,
                    lineage: Vec::new(),
                });
            }
            DagView::Frontier => pick(dag.frontier()),
            DagView::Children => pick(dag.children(&need_node()?)),
            DagView::Ancestors => pick(dag.ancestors(&need_node()?)),
            DagView::Related => {
                let n = need_node()?;
                dag.related(&n)
                    .into_iter()
                    .filter_map(|(id, rel)| {
                        dag.node(&id).map(|r| DagNode {
                            relation: Some(rel.to_string()),
                            ..dag_node(r)
                        })
                    })
                    .collect()
            }
            DagView::Best => {
                let task = match &req.task {
                    Some(t) => t.clone(),
                    None => self
                        .config
                        .tasks
                        .keys()
                        .next()
                        .cloned()
                        .ok_or_else(|| Error::invalid("task: the study has no tasks"))?,
                };
                let metric = match (&req.metric, self.config.tasks.get(&task)) {
                    (Some(m), _) => m.clone(),
                    (None, Some(t)) => t.metric.clone(),
                    (None, None) => {
                        return Err(Error::not_found(format!("task: no task {task:?}")));
                    }
                };
                let split = req.split.unwrap_or(Split::Dev);
                let mut best = self.index.best_per_node(&task, split.as_str(), &metric)?;
                best.sort_by(|a, b| {
                    b.1.total_cmp(&a.1).then_with(|| {
                        crate::index::node_num(&a.0).cmp(&crate::index::node_num(&b.0))
                    })
                });
                best.into_iter()
                    .filter_map(|(id, v)| {
                        dag.node(&id).map(|r| DagNode {
                            value: Some(v),
                            ..dag_node(r)
                        })
                    })
                    .collect()
            }
            DagView::Lineage => {
                let ck = req.checkpoint.clone().ok_or_else(|| {
                    Error::invalid("checkpoint: the lineage view needs a checkpoint")
                })?;
                let mut cur = self.resolve_checkpoint(&ck)?.ok_or_else(|| {
                    Error::not_found(format!("checkpoint: {ck} is not a recorded checkpoint"))
                })?;
                let mut ids = Vec::new();
                for _ in 0..100_000 {
                    let Some((node, seq, parent)) = self.index.checkpoint_origin(&cur)? else {
                        break;
                    };
                    let is_base = node == ROOT_NODE && seq == 1;
                    lineage.push(LineageStep {
                        checkpoint: cur.clone(),
                        node: (!is_base).then(|| node.clone()),
                        seq: (!is_base).then_some(seq),
                    });
                    if !ids.contains(&node) {
                        ids.push(node);
                    }
                    match parent {
                        Some(p) if !is_base => cur = p,
                        _ => break,
                    }
                }
                pick(ids)
            }
        };
        let ids: std::collections::HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        let edges = dag
            .edges()
            .filter(|(a, b)| ids.contains(a) && ids.contains(b))
            .map(|(a, b)| [a.to_string(), b.to_string()])
            .collect();
        Ok(DagResult {
            view: req.view,
            nodes,
            edges,
            lineage,
        })
    }

    pub fn log(&self, req: LogRequest) -> Result<LogResult> {
        if let Some(n) = &req.node
            && self.index.node(n)?.is_none()
        {
            return Err(Error::not_found(format!("node: no node {n}")));
        }
        let rows = self
            .index
            .actions(req.node.as_deref(), req.include_rejected, req.limit)?;
        Ok(LogResult {
            actions: rows.into_iter().map(summary_of).collect(),
        })
    }

    pub fn get_job(&self, req: GetJobRequest) -> Result<JobInfo> {
        match self.index.job(&req.job)? {
            Some((node, seq, job)) => Ok(JobInfo { node, seq, job }),
            None => Err(Error::not_found(format!(
                "job: no recorded job {} (a job appears here once its action is recorded)",
                req.job
            ))),
        }
    }

    // ------------------------------------------------------------------ helpers

    /// The rows of a registered dataset (hash-verified), or None if no dataset has that name.
    fn dataset_rows(&self, name: &str) -> Result<Option<Vec<types::Row>>> {
        match self.index.dataset(name)? {
            Some((sha, _, _)) => Ok(Some(datasets::parse_jsonl(
                &self.store.get(&sha)?,
                &format!("dataset {name}"),
            )?)),
            None => Ok(None),
        }
    }

    /// Every task's protected test split: (task, items).
    fn protected_test_items(&self) -> Result<Vec<(String, Vec<types::Row>)>> {
        let mut out = Vec::new();
        for (name, task) in &self.config.tasks {
            let path = self.study_file(&task.test.path)?;
            let bytes = fs::read(&path).at("cannot read protected eval set", &path)?;
            out.push((
                name.clone(),
                datasets::parse_jsonl(&bytes, &format!("task {name} test split"))?,
            ));
        }
        Ok(out)
    }

    /// Every task's protected test split, prepared for the contamination scan.
    fn protected_sets(&self) -> Result<Vec<crate::contamination::EvalSet>> {
        let cfg = self.scan_config();
        Ok(self
            .protected_test_items()?
            .iter()
            .map(|(name, items)| crate::contamination::EvalSet::new(name, "test", items, cfg))
            .collect())
    }

    fn scan_config(&self) -> crate::contamination::ScanConfig {
        crate::contamination::ScanConfig {
            ngram: self.config.policy.contamination_ngram as usize,
            threshold: self.config.policy.contamination_threshold,
        }
    }

    /// Rows that reproduce protected eval items (evidence for the contamination rule).
    pub fn scan_for_contamination(
        &self,
        rows: &[types::Row],
    ) -> Result<Vec<crate::contamination::Hit>> {
        Ok(crate::contamination::scan(
            rows,
            &self.protected_sets()?,
            self.scan_config(),
            50,
        ))
    }

    /// Generated rows minus those whose prompt is a protected test item's (after normalization).
    fn decontaminate(&self, rows: Vec<types::Row>) -> Result<(Vec<types::Row>, u64)> {
        let protected: std::collections::HashSet<Vec<String>> = self
            .protected_test_items()?
            .iter()
            .flat_map(|(_, items)| {
                items
                    .iter()
                    .map(|i| crate::contamination::tokens(&i.prompt))
            })
            .collect();
        let before = rows.len();
        let kept: Vec<types::Row> = rows
            .into_iter()
            .filter(|r| !protected.contains(&crate::contamination::tokens(&r.prompt)))
            .collect();
        let dropped = (before - kept.len()) as u64;
        Ok((kept, dropped))
    }

    fn require_node_tip(&self, id: &str) -> Result<git2::Oid> {
        self.record
            .node_tip(id)?
            .ok_or_else(|| Error::not_found(format!("no node {id} in this study")))
    }

    fn require_node(&self, id: &str) -> Result<NodeSnapshot> {
        let tip = self.require_node_tip(id).map_err(|e| e.context("node"))?;
        self.record.snapshot(tip)
    }

    /// `base` → the base model's checkpoint; a sha256 → itself if a recorded checkpoint (else None).
    fn resolve_checkpoint(&self, c: &str) -> Result<Option<String>> {
        if c == "base" {
            return self.base_checkpoint().map(Some);
        }
        Ok(self.index.checkpoint_origin(c)?.map(|_| c.to_string()))
    }

    /// The base model's checkpoint, recorded by the root node's `init`.
    /// Refuse (kind `rejected`, naming the budget) when the study's own budgets are spent: a
    /// campaign started then would only record rejections.
    pub fn require_budget_left(&self) -> Result<()> {
        let b = &self.config.budgets;
        let idx = &self.index;
        let used = idx.compute_seconds_used()?;
        if used >= b.compute_seconds as f64 {
            return Err(Error::new(
                ErrorKind::Rejected,
                format!(
                    "the study has no compute budget left: {used:.0} of budgets.compute_seconds = {} s used; raise it in rsim.toml (committed on main) to run more experiments",
                    b.compute_seconds
                ),
            ));
        }
        let evals = idx.evaluation_count(None, None)?;
        if evals >= b.evaluations {
            return Err(Error::new(
                ErrorKind::Rejected,
                format!(
                    "the study has no evaluation budget left: {evals} of budgets.evaluations = {} used",
                    b.evaluations
                ),
            ));
        }
        if idx.node_count()? >= b.max_nodes {
            return Err(Error::new(
                ErrorKind::Rejected,
                format!(
                    "the study has no node budget left: budgets.max_nodes = {} reached",
                    b.max_nodes
                ),
            ));
        }
        Ok(())
    }

    pub fn base_checkpoint(&self) -> Result<String> {
        self.index
            .base_checkpoint(ROOT_NODE)?
            .ok_or_else(|| Error::internal("the root node records no base checkpoint"))
    }

    /// A checkpoint as a job sees it: its hash and each file's path in the object store.
    fn checkpoint_files(&self, sha: &str) -> Result<Value> {
        let m = self.store.manifest(sha)?;
        let files: BTreeMap<String, PathBuf> = m
            .files
            .iter()
            .map(|(k, v)| (k.clone(), self.store.path(v)))
            .collect();
        Ok(serde_json::json!({ "sha256": sha, "files": files }))
    }

    /// Facts every job-running action needs: checkpoint provenance and integrity, compute used, isolation.
    fn job_facts(&self, caller: &Caller, node: &str, checkpoint: Option<&str>) -> Result<Facts> {
        Ok(Facts {
            checkpoint_known: checkpoint.is_some(),
            checkpoint_corrupt: checkpoint.and_then(|c| self.store.manifest_damage(c)),
            compute_seconds_used: self.index.compute_seconds_used()?,
            node_compute_used: self.index.compute_seconds_used_by(Some(node), None)?,
            agent_compute_used: self
                .index
                .compute_seconds_used_by(None, Some(&caller.agent))?,
            network_isolation_unavailable: !crate::jobs::network_isolation_available(),
            ..Facts::default()
        })
    }

    /// The longest a job may run: the backend's limit, cut to what is left of the study's, the
    /// node's and the agent's compute budgets (so a job is stopped when a budget runs out).
    fn job_timeout(&self, caller: &Caller, node: &str) -> Result<u64> {
        let b = &self.config.budgets;
        let mut left = b.compute_seconds as f64 - self.index.compute_seconds_used()?;
        if let Some(max) = b.node_compute_seconds {
            left = left.min(max as f64 - self.index.compute_seconds_used_by(Some(node), None)?);
        }
        if let Some(max) = b.agent_compute_seconds {
            left = left.min(
                max as f64
                    - self
                        .index
                        .compute_seconds_used_by(None, Some(&caller.agent))?,
            );
        }
        // A job holding several units (CPUs or GPUs of a Slurm job) uses the budget that much faster.
        let left = left / f64::from(self.config.backend.charge_units().max(1));
        Ok((left.ceil().max(1.0) as u64).min(self.config.backend.timeout_s()))
    }

    fn job_spec(
        &self,
        id: String,
        kind: JobKind,
        command: &[String],
        params: Value,
        timeout_s: u64,
    ) -> Result<JobSpec> {
        let dir = self.root.join(STATE_DIR).join("jobs").join(&id);
        let command = crate::jobs::absolute_command(
            &self.root,
            &expand_command(command, self.rsim_bin.as_deref())?,
        );
        let (command, env) = match &self.config.environment {
            crate::config::Environment::Host => {
                let cache = self.root.join(STATE_DIR).join("fingerprints");
                let env = crate::jobs::host_fingerprint(&self.root, &command, &cache)?;
                (command, env)
            }
            crate::config::Environment::Nix { flake } => {
                crate::jobs::nix_environment(&self.root, flake, command)?
            }
        };
        Ok(JobSpec {
            id,
            kind,
            command,
            dir,
            timeout_s,
            env,
            isolate_network: crate::jobs::network_isolation_available(),
            require_isolation: self.config.policy.require_network_isolation,
            limits: self.config.backend.limits(),
            slots_dir: Some(self.root.join(STATE_DIR).join("jobs").join("slots")),
            params,
        })
    }

    fn store_log_at(&self, p: &Path) -> Result<Option<String>> {
        if p.is_file() {
            Ok(Some(self.store.put_file(p)?))
        } else {
            Ok(None)
        }
    }

    fn store_log(&self, spec: &JobSpec) -> Result<Option<String>> {
        let p = spec.log_path();
        if p.is_file() {
            Ok(Some(self.store.put_file(&p)?))
        } else {
            Ok(None)
        }
    }

    /// A path from rsim.toml, inside the study, with symlink escapes refused.
    fn study_file(&self, rel: &str) -> Result<PathBuf> {
        crate::config::check_relative_path(rel).map_err(Error::invalid)?;
        let p = self.root.join(rel);
        let canon = p
            .canonicalize()
            .map_err(|e| Error::not_found(format!("{rel}: {e}")))?;
        if !canon.starts_with(&self.root) {
            return Err(Error::invalid(format!(
                "{rel} resolves outside the study (symlink escape)"
            )));
        }
        Ok(canon)
    }

    /// Fingerprint of the evaluator: sha256 over its argv and the content of every file it names.
    pub fn evaluator_fingerprint(&self) -> Result<String> {
        evaluator_fingerprint(&self.root, &self.config.jobs.evaluate)
    }

    fn record_rejection(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: Value,
        decision: Decision,
    ) -> Error {
        let rule = decision.rule.clone().unwrap_or_default();
        let reason = decision.reason.clone().unwrap_or_default();
        let res = self.commit_action(node, caller, action, request, |_| {
            Ok(Prepared {
                summary: format!("rejected by {rule}"),
                body: reason.clone(),
                decision: decision.clone(),
                result: None,
                job: None,
                artifacts: Vec::new(),
                metrics: Vec::new(),
                refers_to: Vec::new(),
                meta: None,
                files: Vec::new(),
            })
        });
        let mut e = Error::new(
            ErrorKind::Rejected,
            format!("rejected by policy rule {rule}: {reason}"),
        );
        e.rule = Some(rule);
        match res {
            Ok((oid, _)) => e.commit = Some(oid),
            Err(err) => e.message.push_str(&format!(
                " (and the rejection could not be recorded: {})",
                err.message
            )),
        }
        e
    }

    /// Append one action to `node` with compare-and-swap, retrying on concurrent writers.
    /// Returns the commit id and the recorded action.
    fn commit_action(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: Value,
        mut prepare: impl FnMut(&NodeSnapshot) -> Result<Prepared>,
    ) -> Result<(String, ActionRecord)> {
        for _ in 0..CAS_ATTEMPTS {
            let snap = self.require_node(node)?;
            let p = prepare(&snap)?;
            let rec = ActionRecord {
                seq: snap.action_count + 1,
                action,
                node: node.to_string(),
                agent: caller.agent.clone(),
                role: caller.role,
                at: now_rfc3339(),
                summary: p.summary,
                request: request.clone(),
                decision: p.decision,
                result: p.result,
                job: p.job,
                artifacts: p.artifacts,
                metrics: p.metrics,
                refers_to: p.refers_to,
            };
            let msg = record::commit_message(&rec, &p.body, &[]);
            self.index.mark_pending(node)?;
            match self
                .record
                .append(node, snap.tip, &rec, p.meta.as_ref(), &p.files, &msg)?
            {
                Append::Committed(oid) => {
                    self.index.sync_node(&self.record, node)?;
                    return Ok((oid.to_string(), rec));
                }
                Append::Stale => backoff(),
            }
        }
        Err(Error::conflict(format!(
            "node {node}: too many concurrent writers; nothing was recorded"
        )))
    }
}

/// The job runner a backend config asks for.
fn runner_for(backend: &crate::config::Backend) -> Box<dyn JobRunner> {
    match backend {
        crate::config::Backend::Local { .. } => Box::new(LocalRunner),
        crate::config::Backend::Slurm(s) => Box::new(crate::slurm::SlurmRunner::new(s.clone())),
    }
}

/// Claim the recording of an orphaned job (another process may be opening the study right now);
/// a claim left by a dead process is taken over.
fn claim_recovery(job_dir: &Path) -> bool {
    let claim = job_dir.join("recovering");
    if let Some(pid) = fs::read_to_string(&claim)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        && !crate::jobs::process_alive(pid)
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

const INTENT_FILE: &str = "intent.json";
const RECORDED_FILE: &str = "recorded";

/// What a job's action would record, written before the job runs (see `recover_orphaned_jobs`).
#[derive(Debug, Serialize, serde::Deserialize)]
struct JobIntent {
    job: String,
    kind: JobKind,
    action: ActionName,
    node: String,
    agent: String,
    role: Role,
    request: Value,
    command: Vec<String>,
    env: String,
    started_at: String,
    started: Timestamp,
    writer_pid: u32,
    /// The evaluator's fingerprint (evaluate jobs), to record a re-attached job as it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    evaluator: Option<String>,
}

/// Seconds since the epoch, for durations across processes.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
struct Timestamp(f64);

impl Timestamp {
    fn now() -> Self {
        Timestamp(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        )
    }
    fn elapsed_s(self) -> f64 {
        ((Timestamp::now().0 - self.0).max(0.0) * 1000.0).round() / 1000.0
    }
}

/// A short random pause before retrying a compare-and-swap, so racing writers spread out.
fn backoff() {
    std::thread::sleep(std::time::Duration::from_micros(
        200 + rand::random::<u64>() % 2000,
    ));
}

/// The config as committed on `main` (the record says which config every action ran under).
fn load_committed_config(record: &Record, root: &Path) -> Result<StudyConfig> {
    let main = record.main_tip().map_err(|_| {
        Error::invalid(format!(
            "{} is not an initialised study (no main branch): run `rsim init`",
            root.display()
        ))
    })?;
    let tree = record.repo().find_commit(main)?.tree()?;
    let entry = tree
        .get_name(CONFIG_FILE)
        .ok_or_else(|| Error::invalid(format!("{CONFIG_FILE} is not committed on main")))?;
    let blob = record.repo().find_blob(entry.id())?;
    let text = std::str::from_utf8(blob.content())
        .map_err(|_| Error::invalid(format!("{CONFIG_FILE} is not UTF-8")))?;
    if let Ok(on_disk) = fs::read_to_string(root.join(CONFIG_FILE))
        && on_disk != text
    {
        tracing::warn!(
            "{CONFIG_FILE} has uncommitted changes; the committed version applies (commit it to change the study)"
        );
    }
    StudyConfig::parse(text, CONFIG_FILE)
}

/// Fingerprint of an evaluator command: sha256 over its argv and the content of every file it
/// names (the program and any study file among its arguments). `@rsim` stands for rsim's embedded
/// evaluator, identified by the hash of its source, so rebuilding rsim for other reasons does not
/// change the fingerprint.
pub fn evaluator_fingerprint(root: &Path, command: &[String]) -> Result<String> {
    let mut parts = Vec::new();
    for (i, a) in command.iter().enumerate() {
        parts.push(a.clone());
        if a == "@rsim" {
            parts.push(crate::trainer::evaluator_source_hash());
            continue;
        }
        let file = if i == 0 {
            crate::jobs::resolve_program(root, a)
        } else {
            Some(root.join(a)).filter(|p| !a.starts_with('-') && p.is_file())
        };
        if let Some(f) = file {
            parts.push(crate::store::sha256_file(&f)?);
        }
    }
    Ok(crate::store::sha256_hex(parts.join("\0").as_bytes()))
}

/// Expand `@rsim` (this binary, or `bin`) in a command.
/// This rsim binary. When it was replaced on disk while running (a rebuild under a long-running
/// server or campaign), Linux names it `… (deleted)`: jobs then run the binary now at that path.
pub fn current_rsim() -> Result<PathBuf> {
    let exe =
        std::env::current_exe().map_err(|e| Error::internal(format!("cannot locate rsim: {e}")))?;
    if exe.is_file() {
        return Ok(exe);
    }
    let text = exe.to_string_lossy();
    match text.strip_suffix(" (deleted)").map(PathBuf::from) {
        Some(p) if p.is_file() => Ok(p),
        _ => Err(Error::internal(format!(
            "the running rsim binary {text} is gone from disk; restart rsim"
        ))),
    }
}

pub fn expand_command(cmd: &[String], bin: Option<&Path>) -> Result<Vec<String>> {
    cmd.iter()
        .map(|a| {
            if a == "@rsim" {
                let exe = match bin {
                    Some(b) => b.to_path_buf(),
                    None => current_rsim()?,
                };
                Ok(exe.to_string_lossy().into_owned())
            } else {
                Ok(a.clone())
            }
        })
        .collect()
}

fn check_caller(caller: &Caller) -> Result<()> {
    let a = &caller.agent;
    if a.is_empty()
        || a.len() > 64
        || a.chars().any(|c| c.is_control() || c.is_whitespace())
        || a.contains("..")
    {
        return Err(Error::invalid(format!(
            "agent: {a:?} is not a valid agent name (1-64 characters, no spaces, control characters or \"..\")"
        )));
    }
    Ok(())
}

fn revalidate<T: Serialize>(action: &str, req: &T) -> Result<()> {
    schema::validate(action, &serde_json::to_value(req)?)
}

fn parse<T: DeserializeOwned>(action: &str, args: Value) -> Result<T> {
    serde_json::from_value(args)
        .map_err(|e| Error::invalid(format!("invalid {action} request: {e}")))
}

fn to_value<T: Serialize>(r: Result<T>) -> Result<Value> {
    Ok(serde_json::to_value(r?)?)
}

fn summary_of(r: crate::index::ActionRow) -> ActionSummary {
    ActionSummary {
        node: r.node,
        seq: r.seq,
        action: r.record.action,
        decision: r.record.decision.decision,
        rule: r.record.decision.rule,
        reason: r.record.decision.reason,
        agent: r.record.agent,
        role: r.record.role,
        at: r.record.at,
        summary: r.record.summary,
        commit: r.commit,
        job: r.record.job.map(|j| j.id),
    }
}

fn dag_node(n: &crate::index::DagEntry) -> DagNode {
    DagNode {
        id: n.id.clone(),
        title: n.title.clone(),
        status: n.status,
        parents: n.parents.clone(),
        value: None,
        relation: None,
    }
}

fn short_ck(c: &str) -> &str {
    if c.len() > 12 { &c[..12] } else { c }
}

fn first_line(s: &str) -> String {
    let l = s
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    record::sanitize_line(l)
}

fn read_metrics(path: &Path) -> Result<BTreeMap<String, f64>> {
    if !path.is_file() {
        return Ok(BTreeMap::new());
    }
    let bytes = fs::read(path).at("cannot read", path)?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::internal(format!(
            "{}: expected a JSON object of numbers: {e}",
            path.display()
        ))
    })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EvalOutput {
    metrics: BTreeMap<String, f64>,
    n_items: u64,
    #[serde(default)]
    items: Vec<EvalItem>,
}

fn read_eval_result(path: &Path) -> Result<EvalOutput> {
    let bytes = fs::read(path)
        .map_err(|e| Error::internal(format!("the evaluator wrote no out/result.json: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("the evaluator's out/result.json is malformed: {e}")))
}
