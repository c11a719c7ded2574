//! Running jobs for actions: job specs, timeouts cut to budgets, checkpoints as jobs see them, logs, cancel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::jobs::EnvPin;
use crate::jobs::protocol::{CheckpointRef, JobParams};
use crate::record::claims::Claim;

impl Study {
    /// Ask a running or queued job to stop; its action is then recorded with the job cancelled.
    /// Goes through the policy like any action: an observer or reviewer may not cancel, and a
    /// worker may cancel only the jobs it started (rule `job-owner`); a refusal is recorded on
    /// the job's node.
    pub(in crate::os) fn exec_cancel_job(
        &self,
        caller: &Caller,
        req: CancelJobRequest,
    ) -> Result<CancelJobResult> {
        check_caller(caller)?;
        let dir = paths::job_dir(&self.root, &req.job);
        // A job just admitted (out of the queue, its claim taken) has its directory and spec
        // written in a moment: wait for them rather than answer that there is no such job.
        let started = std::time::Instant::now();
        while !dir.join(crate::jobs::protocol::SPEC_FILE).is_file()
            && started.elapsed() < std::time::Duration::from_secs(10)
            && self.index.queued_job(&req.job)?.is_none()
            && self.index.has_claim(&req.job)?
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let intent = read_intent(&dir);
        let finished = self.index.job(&req.job)?.is_some();
        // A job still waiting in the admission queue has no directory yet.
        let queued = match intent {
            Some(_) => None,
            None => self.index.queued_job(&req.job)?,
        };
        let facts = Facts {
            job_agent: intent
                .as_ref()
                .map(|i| i.agent.clone())
                .or_else(|| queued.as_ref().map(|(_, agent)| agent.clone())),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::CancelJob(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            // Recorded where the job ran; a job this study never ran is refused on the root node.
            let node = intent
                .as_ref()
                .map(|i| i.node.clone())
                .or_else(|| queued.as_ref().map(|(node, _)| node.clone()))
                .filter(|n| self.record.node_tip(n).ok().flatten().is_some())
                .unwrap_or_else(|| ROOT_NODE.to_string());
            return Err(self.record_rejection(
                &node,
                caller,
                ActionName::CancelJob,
                request,
                decision,
            ));
        }
        if finished {
            return Err(Error::invalid(format!(
                "job {} has finished; its action is already recorded",
                req.job
            )));
        }
        if queued.is_some() && self.index.cancel_queued(&req.job, &caller.agent)? {
            return Ok(CancelJobResult {
                job: req.job,
                cancel_requested: true,
            });
        }
        crate::jobs::cancel(&dir, &caller.agent).map_err(|e| match e.kind {
            ErrorKind::NotFound => {
                Error::not_found(format!("job: no job {} in this study", req.job))
            }
            _ => e,
        })?;
        Ok(CancelJobResult {
            job: req.job,
            cancel_requested: true,
        })
    }
    pub fn base_checkpoint(&self) -> Result<String> {
        self.index
            .base_checkpoint(ROOT_NODE)?
            .ok_or_else(|| Error::internal("the root node records no base checkpoint"))
    }

    /// A checkpoint as a job sees it: its hash and each file's path in the object store.
    pub(in crate::os) fn checkpoint_files(&self, sha: &str) -> Result<CheckpointRef> {
        let m = self.store.manifest(sha)?;
        let files: BTreeMap<String, PathBuf> = m
            .files
            .iter()
            .map(|(k, v)| (k.clone(), self.store.path(v)))
            .collect();
        Ok(CheckpointRef {
            sha256: sha.to_string(),
            files,
        })
    }

    pub(in crate::os) fn job_facts(
        &self,
        _caller: &Caller,
        _node: &str,
        checkpoint: Option<&str>,
    ) -> Result<Facts> {
        Ok(Facts {
            checkpoint_known: checkpoint.is_some(),
            checkpoint_corrupt: checkpoint.and_then(|c| self.store.manifest_damage(c)),
            network_isolation_unavailable: !crate::jobs::network_isolation_available(),
            sandbox_unavailable: crate::jobs::sandbox::landlock_abi().err(),
            ..Facts::default()
        })
    }

    /// Admit a job: in one write transaction of the index, count what is recorded plus what
    /// running jobs claim (evaluations, test evaluations, compute), ask the policy, and claim this
    /// job's share if it is accepted — so concurrent jobs, in this process or another, can never
    /// all pass a cap that only one of them fits under. Returns the job's wall-clock limit (cut
    /// to what is left of every compute budget after the other claims), or the refusal.
    ///
    /// The policy refuses on compute *used* (recorded). A job that the policy accepts but that
    /// does not fit in what the others' claims leave now waits in the admission queue, first come
    /// first served (`Index::enqueue`), for at most `budgets.queue_wait_seconds`; it is admitted
    /// when it is at the head and fits. While several agents hold or wait for compute, one agent
    /// may claim at most an equal share of what the study has left (`compute_grant`), so one
    /// agent's long jobs cannot claim everything while others wait, and cancelling and
    /// resubmitting only puts a job at the back of the queue.
    pub(in crate::os) fn admit(
        &self,
        caller: &Caller,
        node: &str,
        job: &str,
        evaluation: Option<Split>,
        facts: Facts,
        decide: impl Fn(&Facts) -> Decision,
    ) -> Result<std::result::Result<u64, Decision>> {
        let started = std::time::Instant::now();
        let wait = std::time::Duration::from_secs(self.config.budgets.queue_wait_seconds);
        // Leaves the queue however admission ends (admitted, refused, failed, cancelled).
        struct Leave<'a>(&'a crate::record::index::Index, &'a str);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if let Err(e) = self.0.dequeue(self.1) {
                    tracing::warn!("job {}: cannot leave the admission queue: {e}", self.1);
                }
            }
        }
        let _leave = Leave(&self.index, job);
        // What the study and the agent hold on disk, counted once (a walk of the store and the
        // job directories) before the queue: a job adds to it only when it ends.
        let mut facts = facts;
        facts.storage = Some(self.storage_fact(&caller.agent)?);
        let mut pause = std::time::Duration::from_millis(20);
        loop {
            let step = self.index.with_claims(|index| {
                let mut facts = facts.clone();
                let held = index.claimed(node, &caller.agent)?;
                facts.compute_seconds_used = index.compute_seconds_used()?;
                facts.node_compute_used = index.compute_seconds_used_by(Some(node), None)?;
                facts.agent_compute_used =
                    index.compute_seconds_used_by(None, Some(&caller.agent))?;
                facts.compute_seconds_claimed = held.compute_s;
                facts.node_compute_claimed = held.node_compute_s;
                facts.agent_compute_claimed = held.agent_compute_s;
                if evaluation.is_some() {
                    facts.evaluations_total =
                        index.evaluation_count(None, None)? + held.evaluations;
                    facts.node_evaluations =
                        index.evaluation_count(Some(node), None)? + held.node_evaluations;
                    facts.agent_evaluations =
                        index.evaluation_count_by(None, None, Some(&caller.agent))?
                            + held.agent_evaluations;
                    facts.test_evaluations_on_node = index
                        .evaluation_count(Some(node), Some("test"))?
                        + held.node_test_evaluations;
                    facts.agent_test_evaluations =
                        index.evaluation_count_by(None, Some("test"), Some(&caller.agent))?
                            + held.agent_test_evaluations;
                }
                let decision = decide(&facts);
                if !decision.accepted() {
                    return Ok((None, Admission::Refused(decision)));
                }
                let queued = index.enqueue(job, node, &caller.agent)?;
                if let Some(by) = queued.cancelled_by {
                    return Ok((None, Admission::Cancelled(by)));
                }
                // One waiting job per agent: a loop that submits job after job cannot fill the
                // queue and push every other agent's job behind its own.
                if queued.same_agent > 0 {
                    return Ok((
                        None,
                        Admission::Refused(Decision::reject(
                            crate::model::rule::Rule::BudgetCompute,
                            format!(
                                "agent {:?} already has a job waiting in the admission queue for \
                                 compute that running jobs claim; one job per agent waits at a \
                                 time (wait for it, or cancel it)",
                                caller.agent
                            ),
                        )),
                    ));
                }
                let mut sharing = queued.waiting_agents;
                sharing.extend(index.claim_holders()?.into_keys());
                sharing.insert(caller.agent.clone());
                let grant = self.compute_grant(&facts, sharing.len());
                if queued.ahead > 0 || !grant.fits() {
                    return Ok((
                        None,
                        Admission::Wait(
                            queued.ahead,
                            grant,
                            facts.compute_seconds_claimed,
                            facts.compute_seconds_used,
                        ),
                    ));
                }
                let claim = Claim {
                    job: job.to_string(),
                    node: node.to_string(),
                    agent: caller.agent.clone(),
                    evaluation: evaluation.is_some(),
                    test: evaluation == Some(Split::Test),
                    compute_s: grant.timeout_s as f64
                        * f64::from(self.config.backend.charge_units().max(1)),
                };
                Ok((Some(claim), Admission::Admitted(grant.timeout_s)))
            })?;
            match step {
                Admission::Admitted(timeout) => return Ok(Ok(timeout)),
                Admission::Refused(decision) => return Ok(Err(decision)),
                Admission::Cancelled(by) => {
                    return Err(Error::invalid(format!(
                        "job {job} was cancelled by {by} while it waited in the admission queue; \
                         it never ran and nothing was recorded"
                    )));
                }
                Admission::Wait(ahead, grant, claimed, used) => {
                    let holds_a_claim = CLAIMS_ON_THIS_THREAD.with(|n| n.get()) > 0;
                    if started.elapsed() >= wait || holds_a_claim {
                        return Ok(Err(Decision::reject(
                            crate::model::rule::Rule::BudgetCompute,
                            format!(
                                "waited {} s in the admission queue (budgets.queue_wait_seconds) \
                                 with {ahead} job(s) ahead: running jobs claim {:.0} s (their \
                                 wall-clock limits) and finished jobs used {:.0} s of the study's \
                                 {} s, leaving this job {} s of the {} s it may get; it can be \
                                 submitted again, or the owner raises budgets.compute_seconds",
                                started.elapsed().as_secs(),
                                claimed,
                                used,
                                self.config.budgets.compute_seconds,
                                grant.timeout_s,
                                grant.needed_s,
                            ),
                        )));
                    }
                    // A face waiting for the job's id learns it now: the job can be followed
                    // (and cancelled) while it waits.
                    crate::os::session::announce_job(job);
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(250));
                }
            }
        }
    }
    /// `admit` for an action's request: the job's wall-clock limit and its claim (released when
    /// the guard drops, after the action is recorded), or the refusal recorded on `node`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::os) fn admit_or_record(
        &self,
        caller: &Caller,
        job: &str,
        req: Request<'_>,
        node: &str,
        evaluation: Option<Split>,
        facts: Facts,
        request: &Value,
    ) -> Result<(u64, ClaimGuard<'_>)> {
        let admitted = self.admit(caller, node, job, evaluation, facts, |f| {
            policy::check(req, caller, &self.config, f)
        })?;
        match admitted {
            Ok(timeout) => Ok((timeout, ClaimGuard::job(&self.index, job))),
            Err(decision) => {
                let action = ActionName::parse(req.name())
                    .ok_or_else(|| Error::internal("a query was admitted as a job"))?;
                Err(self.record_rejection(node, caller, action, request.clone(), decision))
            }
        }
    }

    /// The longest a job may run now: the backend's limit, cut to what is left of the study's,
    /// the node's and the agent's compute budgets after what is used and claimed (so a job is
    /// stopped when a budget runs out, and concurrent jobs share what is left instead of each
    /// getting all), and to the caller's equal share of what the study has left while `sharing`
    /// agents (those holding or waiting for compute, the caller included) want it.
    pub(in crate::os) fn compute_grant(&self, f: &Facts, sharing: usize) -> Grant {
        let b = &self.config.budgets;
        let budget_left = b.compute_seconds as f64 - f.compute_seconds_used;
        // What the job could get with nothing else running ...
        let mut alone = budget_left;
        if let Some(max) = b.node_compute_seconds {
            alone = alone.min(max as f64 - f.node_compute_used);
        }
        if let Some(max) = b.agent_compute_seconds {
            alone = alone.min(max as f64 - f.agent_compute_used);
        }
        // ... and what the others' claims and the fair share leave it now.
        let mut now = (budget_left - f.compute_seconds_claimed)
            .min(budget_left / sharing.max(1) as f64 - f.agent_compute_claimed);
        if let Some(max) = b.node_compute_seconds {
            now = now.min(max as f64 - f.node_compute_used - f.node_compute_claimed);
        }
        if let Some(max) = b.agent_compute_seconds {
            now = now.min(max as f64 - f.agent_compute_used - f.agent_compute_claimed);
        }
        // A job holding several units (CPUs or GPUs of a Slurm job) uses the budget that much faster.
        let units = f64::from(self.config.backend.charge_units().max(1));
        let cap = self.config.backend.timeout_s();
        let secs = |s: f64| ((s / units).ceil().max(0.0) as u64).min(cap);
        // The least it waits for: a minute, or all it could get with nothing else running and
        // its share of the study's budget (when that is less).
        let needed_s = secs(alone.min(budget_left / sharing.max(1) as f64)).clamp(1, MIN_GRANT_S);
        Grant {
            timeout_s: secs(now),
            needed_s,
        }
    }
    /// The study's job environment, pinned before a job is admitted: `Ok(None)` for `host`
    /// (fingerprinted per command in `job_spec`), `Ok(Some(pin))` for a Nix flake pinned to its
    /// narHash or a Python environment that matches its lock, `Err(why)` — in Nix's own words,
    /// or what drifted from the lock — when it cannot be pinned. The policy refuses the job then
    /// (`environment-pinned`); it is a fact gathered before the check, like the machine's
    /// network isolation.
    pub(in crate::os) fn pin_environment(&self) -> std::result::Result<Option<EnvPin>, String> {
        crate::jobs::pin_environment(&self.root, &self.config.environment).map_err(|e| e.message)
    }

    /// The spec of an admitted job. `pin` is what `pin_environment` gave before the policy
    /// admitted it; a job whose environment is not pinned is never built a spec.
    pub(in crate::os) fn job_spec(
        &self,
        id: String,
        command: &[String],
        params: JobParams,
        timeout_s: u64,
        pin: &std::result::Result<Option<EnvPin>, String>,
    ) -> Result<JobSpec> {
        let pin = pin.as_ref().map_err(|why| {
            Error::internal(format!(
                "job {id}: the policy admitted a job whose environment is not pinned: {why}"
            ))
        })?;
        let dir = self.root.join(STATE_DIR).join("jobs").join(&id);
        let mut command = crate::jobs::absolute_command(
            &self.root,
            &expand_command(command, self.rsim_bin.as_deref())?,
        );
        // A Python environment's programs are its own; the sandbox lets the job read the
        // environment and its interpreter's prefix.
        let mut read = self.config.policy.sandbox_read.clone();
        if let Some(EnvPin::Python(p)) = pin {
            command = p.resolve(command);
            read.extend(p.read_paths());
        }
        // The sandbox wraps the job's own program, inside its environment (Nix runs outside it).
        let rsim = match self.rsim_bin.as_deref() {
            Some(b) => b.to_path_buf(),
            None => crate::os::current_rsim()?,
        };
        let sandbox = match self.config.policy.sandbox {
            crate::config::SandboxMode::Off => None,
            mode => Some(crate::jobs::sandbox::for_job(
                &rsim,
                &dir,
                &params,
                &command,
                &self.root,
                &read,
                mode == crate::config::SandboxMode::Required,
            )),
        };
        let file = dir.join(crate::jobs::sandbox::SANDBOX_FILE);
        let sandboxed = |command: Vec<String>| match &sandbox {
            None => command,
            Some(_) => crate::jobs::sandbox::wrap(&rsim, &file, command),
        };
        let (command, env) = match (&self.config.environment, pin.as_ref()) {
            (crate::config::Environment::Host, _) => {
                let cache = self.root.join(STATE_DIR).join("fingerprints");
                let env = crate::jobs::host_fingerprint(&self.root, &command, &cache)?;
                (sandboxed(command), env)
            }
            (crate::config::Environment::Nix { .. }, Some(EnvPin::Nix(pin))) => {
                (pin.wrap(sandboxed(command)), pin.label())
            }
            (crate::config::Environment::Python { .. }, Some(pin @ EnvPin::Python(_))) => {
                (sandboxed(command), pin.label())
            }
            (env, _) => {
                return Err(Error::internal(format!(
                    "job {id}: the {env:?} environment was not pinned before the job was admitted"
                )));
            }
        };
        if !crate::jobs::is_pinned(&env) {
            return Err(Error::internal(format!(
                "job {id}: refusing to run a job whose environment is not pinned ({env:?})"
            )));
        }
        Ok(JobSpec {
            id,
            command,
            dir,
            timeout_s,
            env,
            isolate_network: crate::jobs::network_isolation_available(),
            require_isolation: self.config.policy.require_network_isolation,
            limits: self.config.backend.limits(),
            slots_dir: Some(self.root.join(STATE_DIR).join("jobs").join("slots")),
            params,
            sandbox,
        })
    }

    /// Move a finished job's log into the store (kept once: the job directory keeps no copy;
    /// views read the stored log once the live file is gone).
    pub(in crate::os) fn store_log_at(&self, p: &Path) -> Result<Option<String>> {
        if p.is_file() {
            Ok(Some(self.store.absorb_file(p)?))
        } else {
            Ok(None)
        }
    }

    pub(in crate::os) fn store_log(&self, spec: &JobSpec) -> Result<Option<String>> {
        self.store_log_at(&spec.log_path())
    }

    /// Fingerprint of the evaluator: sha256 over its argv and the content of every file it names.
    pub fn evaluator_fingerprint(&self) -> Result<String> {
        evaluator_fingerprint(&self.root, &self.config.jobs.evaluate)
    }

    /// `base` → the base model's checkpoint; a sha256 → itself if a recorded checkpoint (else None).
    pub(in crate::os) fn resolve_checkpoint(&self, c: &str) -> Result<Option<String>> {
        if c == "base" {
            return self.base_checkpoint().map(Some);
        }
        Ok(self.index.checkpoint_origin(c)?.map(|_| c.to_string()))
    }
}

/// The shortest wall-clock limit a job waits for rather than take less: a job is admitted with
/// less only when that is all the budgets (and its share of them) could give it.
const MIN_GRANT_S: u64 = 60;

/// What a job may claim now (`timeout_s`, its wall-clock limit) and the least it is admitted
/// with (`needed_s`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::os) struct Grant {
    pub timeout_s: u64,
    pub needed_s: u64,
}

impl Grant {
    fn fits(&self) -> bool {
        self.timeout_s >= self.needed_s
    }
}

thread_local! {
    /// Job claims this thread holds (an action still running one of its jobs, or recording it):
    /// a thread that holds one never waits in the admission queue — it could be waiting for
    /// itself (a run's scoring of its kept checkpoints while the run's claim is still held).
    static CLAIMS_ON_THIS_THREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One look at the admission queue.
enum Admission {
    Admitted(u64),
    Refused(Decision),
    Cancelled(String),
    /// Jobs ahead, what it may get now, and the compute claimed and used (s).
    Wait(u64, Grant, f64, f64),
}

/// Releases what an action claimed in the index — an admitted job's share, a dataset name in
/// registration — when the action is done (recorded, refused, or failed before it could run):
/// from then on the record itself counts.
pub(in crate::os) struct ClaimGuard<'a> {
    index: &'a crate::record::index::Index,
    held: Held,
}

enum Held {
    Job(String),
    Hold(String),
}

impl<'a> ClaimGuard<'a> {
    pub(in crate::os) fn job(index: &'a crate::record::index::Index, job: &str) -> Self {
        CLAIMS_ON_THIS_THREAD.with(|n| n.set(n.get() + 1));
        ClaimGuard {
            index,
            held: Held::Job(job.to_string()),
        }
    }

    /// A hold (`record::claims::Index::with_holds`): a registration's name and storage, a
    /// contamination rejection in flight, a node being created.
    pub(in crate::os) fn hold(index: &'a crate::record::index::Index, token: String) -> Self {
        ClaimGuard {
            index,
            held: Held::Hold(token),
        }
    }

    /// A hold for one quick action: it ends in the transaction that indexes the action's record
    /// (or its rejection's) — the next write this handle makes — or, if the action fails before
    /// it writes, when the guard drops.
    pub(in crate::os) fn hold_until_recorded(
        index: &'a crate::record::index::Index,
        token: String,
    ) -> Self {
        index.release_with_next_write(&token);
        ClaimGuard::hold(index, token)
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        let (what, released) = match &self.held {
            Held::Job(job) => {
                CLAIMS_ON_THIS_THREAD.with(|n| n.set(n.get().saturating_sub(1)));
                (job, self.index.release_claim(job))
            }
            Held::Hold(token) if self.index.take_released(token) => return,
            Held::Hold(token) => (token, self.index.release_hold(token)),
        };
        if let Err(e) = released {
            tracing::warn!(claim = %what, "could not release a claim: {}", e.message);
        }
    }
}
