//! The `reproduce` action: re-run a recorded `run_sft` from what the record holds (its request
//! as recorded in git: base, datasets by name — bound for good to the hash they were registered
//! with, and re-hashed here — hyper-parameters and seed), in the environment it ran in, through
//! the same admission (policy, budgets, claims) as any job; then record whether the checkpoint is
//! identical and each trainer number's difference. A different checkpoint is not stored as a
//! usable checkpoint: only its hash is recorded.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::jobs::protocol::{self, DatasetRef, JobParams, SftParams};
use crate::os::*;

/// What the record says of the run to reproduce.
pub(in crate::os) struct Original {
    pub request: RunSftRequest,
    pub checkpoint: String,
    pub env: String,
    pub train_metrics: BTreeMap<String, f64>,
}

impl Study {
    /// The recorded run_sft at `node`/`seq`, or a clear error (nothing is written).
    pub(in crate::os) fn reproducible(&self, node: &str, seq: u32) -> Result<Original> {
        let (rec, _) = self.action(node, seq)?;
        if rec.action != ActionName::RunSft {
            return Err(Error::invalid(format!(
                "seq: action {seq} of {node} is a {}, which runs no training job; reproduce re-runs a run_sft (rsim log --node {node} lists them)",
                rec.action
            )));
        }
        let checkpoint = rec
            .result
            .as_ref()
            .and_then(|r| r["checkpoint"].as_str())
            .map(str::to_string);
        let (Some(job), Some(checkpoint)) = (rec.job.as_ref(), checkpoint) else {
            return Err(Error::invalid(format!(
                "seq: run_sft {seq} of {node} recorded no checkpoint ({}), so there is nothing to reproduce",
                if rec.decision.accepted() {
                    format!(
                        "its job {}",
                        rec.job.as_ref().map_or("never ran", |j| j.state.as_str())
                    )
                } else {
                    "it was rejected".to_string()
                }
            )));
        };
        let request: RunSftRequest = serde_json::from_value(rec.request.clone()).map_err(|e| {
            Error::invalid(format!("seq: the recorded request no longer parses: {e}"))
        })?;
        let train_metrics = rec
            .result
            .as_ref()
            .and_then(|r| serde_json::from_value(r["train_metrics"].clone()).ok())
            .unwrap_or_default();
        Ok(Original {
            request,
            checkpoint,
            env: job.env.clone(),
            train_metrics,
        })
    }

    pub(in crate::os) fn exec_reproduce(
        &self,
        caller: &Caller,
        req: ReproduceRequest,
    ) -> Result<ReproduceResult> {
        check_caller(caller)?;
        self.require_node(&req.node)?;
        let orig = self.reproducible(&req.node, req.seq)?;
        let base_sha = self.resolve_checkpoint(&orig.request.base)?;
        let mut ds = Vec::new();
        let mut facts = self.job_facts(caller, &req.node, base_sha.as_deref())?;
        for name in &orig.request.datasets {
            match self.index.dataset(name)? {
                Some((sha, _, rows)) => {
                    if let Some(why) = self.store.damage(&sha) {
                        facts.dataset_corrupt.push(format!("{name}: {why}"));
                    }
                    ds.push((name.clone(), sha, rows));
                }
                None => facts
                    .dataset_corrupt
                    .push(format!("{name}: no longer registered")),
            }
        }
        let pin = self.pin_environment();
        facts.environment_unpinned = pin.as_ref().err().cloned();
        let command = self.config.jobs.sft.clone();
        if pin.is_ok() {
            let now = self.environment_label(&command, &pin)?;
            if now != orig.env {
                facts.environment_changed = Some((orig.env.clone(), now));
            }
        }
        let request = serde_json::to_value(&req)?;
        let job_id = crate::jobs::new_job_id();
        let (timeout, _claim) = self.admit_or_record(
            caller,
            &job_id,
            Request::Reproduce(&req),
            &req.node,
            None,
            facts,
            &request,
        )?;
        let base_sha =
            base_sha.ok_or_else(|| Error::internal("policy accepted an unknown checkpoint"))?;
        let params = JobParams::Sft(SftParams {
            job: job_id.clone(),
            node: req.node.clone(),
            base: self.checkpoint_files(&base_sha)?,
            datasets: ds
                .iter()
                .map(|(name, sha, rows)| DatasetRef {
                    name: name.clone(),
                    sha256: sha.clone(),
                    rows: *rows,
                    path: self.store.path(sha),
                })
                .collect(),
            hyper: super::run_sft::train_hyper(&orig.request),
        });
        let spec = self.job_spec(job_id, &command, params, timeout, &pin)?;
        self.write_intent(
            caller,
            ActionName::Reproduce,
            &req.node,
            &request,
            &spec,
            None,
        )?;
        let mut job = self.runner.run(&spec)?;
        job.log = self.store_log(&spec)?;
        self.finish_reproduce(caller, &req, request, &spec, job)
    }

    /// The label a job of `command` would record as its environment now.
    fn environment_label(
        &self,
        command: &[String],
        pin: &std::result::Result<Option<crate::jobs::NixPin>, String>,
    ) -> Result<String> {
        match pin {
            Ok(Some(p)) => Ok(p.label()),
            _ => {
                let command = crate::jobs::absolute_command(
                    &self.root,
                    &expand_command(command, self.rsim_bin.as_deref())?,
                );
                let cache = self.root.join(STATE_DIR).join("fingerprints");
                crate::jobs::host_fingerprint(&self.root, &command, &cache)
            }
        }
    }

    /// Compare a finished reproduction with the record and record the outcome.
    pub(in crate::os) fn finish_reproduce(
        &self,
        caller: &Caller,
        req: &ReproduceRequest,
        request: Value,
        spec: &JobSpec,
        mut job: JobRecord,
    ) -> Result<ReproduceResult> {
        let orig = self.reproducible(&req.node, req.seq)?;
        let mut checkpoint = None;
        let mut metrics = BTreeMap::new();
        if job.state == JobState::Succeeded {
            let out = spec.out_dir();
            let ck_dir = protocol::checkpoint_dir(&out);
            match protocol::read_train_metrics(&out) {
                Ok(_) if !ck_dir.is_dir() => {
                    job.state = JobState::Failed;
                    job.error =
                        Some("the trainer exited 0 but wrote no out/checkpoint/ directory".into());
                }
                Ok(m) => {
                    checkpoint = Some(self.store.put_dir(&ck_dir)?);
                    metrics = m;
                }
                Err(e) => {
                    job.state = JobState::Failed;
                    job.error = Some(e.message);
                }
            }
        }
        let identical = checkpoint.as_deref() == Some(orig.checkpoint.as_str());
        let env_changed = job.env != orig.env;
        let names: BTreeSet<&String> = orig.train_metrics.keys().chain(metrics.keys()).collect();
        let train_metrics: Vec<MetricDelta> = names
            .into_iter()
            .map(|n| {
                let (a, b) = (orig.train_metrics.get(n).copied(), metrics.get(n).copied());
                MetricDelta {
                    name: n.clone(),
                    recorded: a,
                    reproduced: b,
                    difference: a.zip(b).map(|(a, b)| b - a),
                }
            })
            .collect();
        let verdict = match (&checkpoint, identical, env_changed) {
            (None, _, _) => format!("not reproduced: the job {}", job.state.as_str()),
            (Some(_), true, _) => "reproduced: the identical checkpoint, byte for byte".to_string(),
            (Some(_), false, true) => format!(
                "a different checkpoint, in another environment ({} → {}): the difference may be the environment's",
                orig.env, job.env
            ),
            (Some(_), false, false) => "NOT reproduced: a different checkpoint in the same environment — the embedded trainers are bit-for-bit repeatable, so the record, the store or the trainer is not what it was".to_string(),
        };
        let result = ReproduceResult {
            job: job.clone(),
            action: ActionName::RunSft,
            seq: req.seq,
            recorded_checkpoint: orig.checkpoint.clone(),
            checkpoint: checkpoint.clone(),
            identical,
            recorded_env: orig.env.clone(),
            env_changed,
            train_metrics,
            verdict: verdict.clone(),
            commit: String::new(),
        };
        let mut stored = serde_json::to_value(&result)?;
        if let Some(m) = stored.as_object_mut() {
            m.remove("commit");
        }
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Reproduce, request, |_| {
                let summary = format!(
                    "run_sft #{} → {}",
                    req.seq,
                    if identical {
                        "identical checkpoint".to_string()
                    } else {
                        match &checkpoint {
                            Some(c) => format!("different checkpoint {}", &c[..12]),
                            None => format!("job {}", job.state.as_str()),
                        }
                    }
                );
                let mut p = Prepared::accepted(summary, stored.clone());
                p.body = format!(
                    "Reproduction of run_sft #{} (checkpoint {}): {verdict}.",
                    req.seq, orig.checkpoint
                );
                p.attach_job(&job);
                Ok(p)
            })?;
        self.mark_recorded(spec)?;
        Ok(ReproduceResult {
            commit: oid,
            ..result
        })
    }
}
