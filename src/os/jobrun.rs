//! Running jobs for actions: job specs, timeouts cut to budgets, checkpoints as jobs see them, logs, cancel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::jobs::NixPin;
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
        let intent = read_intent(&dir);
        let finished = self.index.job(&req.job)?.is_some();
        let facts = Facts {
            job_agent: intent.as_ref().map(|i| i.agent.clone()),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::CancelJob(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            // Recorded where the job ran; a job this study never ran is refused on the root node.
            let node = intent
                .as_ref()
                .map(|i| i.node.clone())
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
    pub(in crate::os) fn admit(
        &self,
        caller: &Caller,
        node: &str,
        job: &str,
        evaluation: Option<Split>,
        mut facts: Facts,
        decide: impl FnOnce(&Facts) -> Decision,
    ) -> Result<std::result::Result<u64, Decision>> {
        self.index.with_claims(|index| {
            let held = index.claimed(node, &caller.agent)?;
            facts.compute_seconds_used = index.compute_seconds_used()? + held.compute_s;
            facts.node_compute_used =
                index.compute_seconds_used_by(Some(node), None)? + held.node_compute_s;
            facts.agent_compute_used =
                index.compute_seconds_used_by(None, Some(&caller.agent))? + held.agent_compute_s;
            if evaluation.is_some() {
                facts.evaluations_total = index.evaluation_count(None, None)? + held.evaluations;
                facts.node_evaluations =
                    index.evaluation_count(Some(node), None)? + held.node_evaluations;
                facts.agent_evaluations =
                    index.evaluation_count_by(None, None, Some(&caller.agent))?
                        + held.agent_evaluations;
                facts.test_evaluations_on_node =
                    index.evaluation_count(Some(node), Some("test"))? + held.node_test_evaluations;
                facts.agent_test_evaluations =
                    index.evaluation_count_by(None, Some("test"), Some(&caller.agent))?
                        + held.agent_test_evaluations;
            }
            let decision = decide(&facts);
            if !decision.accepted() {
                return Ok((None, Err(decision)));
            }
            let timeout = self.job_timeout(&facts);
            let claim = Claim {
                job: job.to_string(),
                node: node.to_string(),
                agent: caller.agent.clone(),
                evaluation: evaluation.is_some(),
                test: evaluation == Some(Split::Test),
                compute_s: timeout as f64 * f64::from(self.config.backend.charge_units().max(1)),
            };
            Ok((Some(claim), Ok(timeout)))
        })
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

    /// The longest a job may run: the backend's limit, cut to what is left of the study's, the
    /// node's and the agent's compute budgets after what is used and claimed (so a job is stopped
    /// when a budget runs out, and concurrent jobs share what is left instead of each getting all).
    pub(in crate::os) fn job_timeout(&self, used: &Facts) -> u64 {
        let b = &self.config.budgets;
        let mut left = b.compute_seconds as f64 - used.compute_seconds_used;
        if let Some(max) = b.node_compute_seconds {
            left = left.min(max as f64 - used.node_compute_used);
        }
        if let Some(max) = b.agent_compute_seconds {
            left = left.min(max as f64 - used.agent_compute_used);
        }
        // A job holding several units (CPUs or GPUs of a Slurm job) uses the budget that much faster.
        let left = left / f64::from(self.config.backend.charge_units().max(1));
        (left.ceil().max(1.0) as u64).min(self.config.backend.timeout_s())
    }

    /// The study's job environment, pinned before a job is admitted: `Ok(None)` for `host`
    /// (fingerprinted per command in `job_spec`), `Ok(Some(pin))` for a Nix flake pinned to its
    /// narHash, `Err(why)` — in Nix's own words — when it cannot be pinned. The policy refuses
    /// the job then (`environment-pinned`); it is a fact gathered before the check, like the
    /// machine's network isolation.
    pub(in crate::os) fn pin_environment(&self) -> std::result::Result<Option<NixPin>, String> {
        match &self.config.environment {
            crate::config::Environment::Host => Ok(None),
            crate::config::Environment::Nix { flake } => crate::jobs::pin_flake(&self.root, flake)
                .map(Some)
                .map_err(|e| e.message),
        }
    }

    /// The spec of an admitted job. `pin` is what `pin_environment` gave before the policy
    /// admitted it; a job whose environment is not pinned is never built a spec.
    pub(in crate::os) fn job_spec(
        &self,
        id: String,
        command: &[String],
        params: JobParams,
        timeout_s: u64,
        pin: &std::result::Result<Option<NixPin>, String>,
    ) -> Result<JobSpec> {
        let pin = pin.as_ref().map_err(|why| {
            Error::internal(format!(
                "job {id}: the policy admitted a job whose environment is not pinned: {why}"
            ))
        })?;
        let dir = self.root.join(STATE_DIR).join("jobs").join(&id);
        let command = crate::jobs::absolute_command(
            &self.root,
            &expand_command(command, self.rsim_bin.as_deref())?,
        );
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
                &self.config.policy.sandbox_read,
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
            (crate::config::Environment::Nix { .. }, Some(pin)) => {
                (pin.wrap(sandboxed(command)), pin.label())
            }
            (crate::config::Environment::Nix { flake }, None) => {
                return Err(Error::internal(format!(
                    "job {id}: the Nix flake {flake:?} was not pinned before the job was admitted"
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

    pub(in crate::os) fn store_log_at(&self, p: &Path) -> Result<Option<String>> {
        if p.is_file() {
            Ok(Some(self.store.put_file(p)?))
        } else {
            Ok(None)
        }
    }

    pub(in crate::os) fn store_log(&self, spec: &JobSpec) -> Result<Option<String>> {
        let p = spec.log_path();
        if p.is_file() {
            Ok(Some(self.store.put_file(&p)?))
        } else {
            Ok(None)
        }
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
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        let (what, released) = match &self.held {
            Held::Job(job) => (job, self.index.release_claim(job)),
            Held::Hold(token) => (token, self.index.release_hold(token)),
        };
        if let Err(e) = released {
            tracing::warn!(claim = %what, "could not release a claim: {}", e.message);
        }
    }
}
