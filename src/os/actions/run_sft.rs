//! The `run_sft` action.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::os::*;

impl Study {
    pub(in crate::os) fn exec_run_sft(
        &self,
        caller: &Caller,
        req: RunSftRequest,
    ) -> Result<RunSftResult> {
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
    pub(in crate::os) fn finish_sft(
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
}
