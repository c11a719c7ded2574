//! Running jobs for actions: job specs, timeouts cut to budgets, checkpoints as jobs see them, logs, cancel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::jobs::NixPin;
use crate::jobs::protocol::{CheckpointRef, JobParams};

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

    /// Facts every job-running action needs: checkpoint provenance and integrity, compute used, isolation.
    pub(in crate::os) fn job_facts(
        &self,
        caller: &Caller,
        node: &str,
        checkpoint: Option<&str>,
    ) -> Result<Facts> {
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
    pub(in crate::os) fn job_timeout(&self, caller: &Caller, node: &str) -> Result<u64> {
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
        pin: Option<&NixPin>,
    ) -> Result<JobSpec> {
        let dir = self.root.join(STATE_DIR).join("jobs").join(&id);
        let command = crate::jobs::absolute_command(
            &self.root,
            &expand_command(command, self.rsim_bin.as_deref())?,
        );
        let (command, env) = match (&self.config.environment, pin) {
            (crate::config::Environment::Host, _) => {
                let cache = self.root.join(STATE_DIR).join("fingerprints");
                let env = crate::jobs::host_fingerprint(&self.root, &command, &cache)?;
                (command, env)
            }
            (crate::config::Environment::Nix { .. }, Some(pin)) => (pin.wrap(command), pin.label()),
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
