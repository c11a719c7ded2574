//! The `reproduce` action: re-run a recorded `run_sft` or dev `evaluate` from what the record
//! holds (its request as recorded in git: base, datasets by name — bound for good to the hash they
//! were registered with, and re-hashed here — hyper-parameters and seed; or the checkpoint, task
//! and split), in the environment it ran in, through the same admission (policy, budgets, claims)
//! as any job; then record whether the checkpoint (or every score) is identical and each number's
//! difference. A different checkpoint is not stored as a usable checkpoint: only its hash is
//! recorded; reproduced scores are not node metrics (they would count twice in compare and diff).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::jobs::protocol::{self, DatasetRef, EvalParams, JobParams, SftParams};
use crate::os::*;

/// What the record says of the job to reproduce.
pub(in crate::os) struct Original {
    pub kind: OriginalKind,
    /// The checkpoint the run_sft made, or the one the evaluation scored (as recorded).
    pub checkpoint: String,
    pub env: String,
    /// The trainer's numbers, or the scores.
    pub metrics: BTreeMap<String, f64>,
}

pub(in crate::os) enum OriginalKind {
    Sft(RunSftRequest),
    Eval(EvaluateRequest),
}

impl Study {
    /// The recorded run_sft or evaluate at `node`/`seq`, or a clear error (nothing is written).
    pub(in crate::os) fn reproducible(&self, node: &str, seq: u32) -> Result<Original> {
        let (rec, _) = self.action(node, seq)?;
        if !matches!(rec.action, ActionName::RunSft | ActionName::Evaluate) {
            return Err(Error::invalid(format!(
                "seq: action {seq} of {node} is a {}, which runs no training or evaluation job; reproduce re-runs a run_sft or an evaluate (rsim log --node {node} lists them)",
                rec.action
            )));
        }
        let Some(job) = rec.job.as_ref().filter(|j| j.state == JobState::Succeeded) else {
            return Err(Error::invalid(format!(
                "seq: {} {seq} of {node} has no succeeded job ({}), so there is nothing to reproduce",
                rec.action,
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
        let result = rec.result.clone().unwrap_or_default();
        let metrics_at = |key: &str| -> BTreeMap<String, f64> {
            serde_json::from_value(result[key].clone()).unwrap_or_default()
        };
        let reparse = |e: serde_json::Error| {
            Error::invalid(format!("seq: the recorded request no longer parses: {e}"))
        };
        if rec.action == ActionName::RunSft {
            let request: RunSftRequest =
                serde_json::from_value(rec.request.clone()).map_err(reparse)?;
            let checkpoint = result["checkpoint"].as_str().map(str::to_string).ok_or_else(|| {
                Error::invalid(format!(
                    "seq: run_sft {seq} of {node} recorded no checkpoint, so there is nothing to reproduce"
                ))
            })?;
            return Ok(Original {
                kind: OriginalKind::Sft(request),
                checkpoint,
                env: job.env.clone(),
                metrics: metrics_at("train_metrics"),
            });
        }
        let request: EvaluateRequest =
            serde_json::from_value(rec.request.clone()).map_err(reparse)?;
        if request.split == Split::Test {
            return Err(Error::invalid(format!(
                "seq: evaluate {seq} of {node} scored the test split; test evaluations are not re-run (each spends the node's limited test evaluations): reproduce the run_sft and its dev evaluations"
            )));
        }
        let checkpoint = rec
            .metrics
            .first()
            .map(|m| m.checkpoint.clone())
            .or(self.resolve_checkpoint(&request.checkpoint)?)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "seq: the checkpoint evaluate {seq} of {node} scored is no longer recorded"
                ))
            })?;
        Ok(Original {
            kind: OriginalKind::Eval(request),
            checkpoint,
            env: job.env.clone(),
            metrics: metrics_at("metrics"),
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
        let pin = self.pin_environment();
        let request = serde_json::to_value(&req)?;
        let job_id = crate::jobs::new_job_id();
        let (command, params, evaluation, evaluator, mut facts) = match &orig.kind {
            OriginalKind::Sft(sft) => {
                let base_sha = self.resolve_checkpoint(&sft.base)?;
                let mut facts = self.job_facts(caller, &req.node, base_sha.as_deref())?;
                let mut ds = Vec::new();
                for name in &sft.datasets {
                    match self.index.dataset(name)? {
                        Some((sha, _, rows)) => {
                            if let Some(why) = self.store.damage(&sha) {
                                facts.dataset_corrupt.push(format!("{name}: {why}"));
                            }
                            ds.push(DatasetRef {
                                name: name.clone(),
                                path: self.store.path(&sha),
                                sha256: sha,
                                rows,
                            });
                        }
                        None => facts
                            .dataset_corrupt
                            .push(format!("{name}: no longer registered")),
                    }
                }
                // The union is scanned again against the protected sets as they are now.
                if facts.dataset_corrupt.is_empty() {
                    facts.contamination =
                        self.scan_datasets(sft.datasets.iter().map(String::as_str))?;
                }
                let params = base_sha.map(|b| {
                    Ok::<_, Error>(JobParams::Sft(SftParams {
                        job: job_id.clone(),
                        node: req.node.clone(),
                        base: self.checkpoint_files(&b)?,
                        datasets: ds,
                        // Split as the run was (its trainer says so), whatever this
                        // machine's threads: the same pieces sum to the same gradients. The
                        // recorded count goes through the rule that made it, so a record
                        // claiming more pieces than a run could have had asks for no more.
                        hyper: super::run_sft::train_hyper(
                            sft,
                            crate::jobs::protocol::shards_for(
                                orig.metrics.get("shards").map(|s| *s as u32),
                                sft.batch_size,
                            ),
                        ),
                    }))
                });
                (self.config.jobs.sft.clone(), params, None, None, facts)
            }
            OriginalKind::Eval(ev) => {
                let task = self.config.tasks.get(&ev.task).cloned().ok_or_else(|| {
                    Error::invalid(format!(
                        "seq: the evaluation's task {:?} is no longer in rsim.toml",
                        ev.task
                    ))
                })?;
                let set_path = self.study_file(&task.dev.path)?;
                let ck = self.resolve_checkpoint(&orig.checkpoint)?;
                let evaluator = self.evaluator_fingerprint()?;
                let facts = Facts {
                    evaluator_actual: Some(evaluator.clone()),
                    evaluator_pinned: self.config.jobs.evaluator_sha256.clone(),
                    eval_set_actual: Some(crate::util::hash::sha256_file(&set_path)?),
                    eval_set_pinned: task.dev.sha256.clone(),
                    reproduced_evaluation: Some(ev.clone()),
                    ..self.job_facts(caller, &req.node, ck.as_deref())?
                };
                let params = ck.map(|ck| {
                    Ok::<_, Error>(JobParams::Evaluate(EvalParams {
                        job: job_id.clone(),
                        checkpoint: self.checkpoint_files(&ck)?,
                        task: ev.task.clone(),
                        split: ev.split,
                        metric: task.metric.clone(),
                        eval_set: set_path,
                    }))
                });
                let command = self.config.jobs.evaluate.clone();
                (command, params, Some(Split::Dev), Some(evaluator), facts)
            }
        };
        facts.environment_unpinned = pin.as_ref().err().cloned();
        if pin.is_ok() {
            let now = self.environment_label(&command, &pin)?;
            if now != orig.env {
                facts.environment_changed = Some((orig.env.clone(), now));
            }
        }
        let (timeout, _claim) = self.admit_or_record(
            caller,
            &job_id,
            Request::Reproduce(&req),
            &req.node,
            evaluation,
            facts,
            &request,
        )?;
        let params =
            params.ok_or_else(|| Error::internal("policy accepted an unknown checkpoint"))??;
        let spec = self.job_spec(job_id, &command, params, timeout, &pin)?;
        self.write_intent(
            caller,
            ActionName::Reproduce,
            &req.node,
            &request,
            &spec,
            evaluator.as_deref(),
        )?;
        let mut job = self.runner.run(&spec)?;
        job.log = self.store_log(&spec)?;
        self.finish_reproduce(caller, &req, request, &spec, job)
    }

    /// The label a job of `command` would record as its environment now.
    fn environment_label(
        &self,
        command: &[String],
        pin: &std::result::Result<Option<crate::jobs::EnvPin>, String>,
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
        let out = spec.out_dir();
        if job.state == JobState::Succeeded {
            let read = match &orig.kind {
                OriginalKind::Sft(_) => {
                    let ck_dir = protocol::checkpoint_dir(&out);
                    match protocol::read_train_metrics(&out) {
                        Ok(_) if !ck_dir.is_dir() => Err(
                            "the trainer exited 0 but wrote no out/checkpoint/ directory".into(),
                        ),
                        Ok(m) => {
                            checkpoint = Some(self.store.absorb_dir(&ck_dir)?);
                            Ok(m)
                        }
                        Err(e) => Err(e.message),
                    }
                }
                OriginalKind::Eval(_) => protocol::read_eval_result(&out)
                    .map(|r| r.metrics)
                    .map_err(|e| e.message),
            };
            match read {
                Ok(m) => metrics = m,
                Err(why) => {
                    job.state = JobState::Failed;
                    job.error = Some(why);
                }
            }
        }
        let env_changed = job.env != orig.env;
        let names: BTreeSet<&String> = orig.metrics.keys().chain(metrics.keys()).collect();
        let deltas: Vec<MetricDelta> = names
            .into_iter()
            .map(|n| {
                let (a, b) = (orig.metrics.get(n).copied(), metrics.get(n).copied());
                MetricDelta {
                    name: n.clone(),
                    recorded: a,
                    reproduced: b,
                    difference: a.zip(b).map(|(a, b)| b - a),
                }
            })
            .collect();
        let succeeded = job.state == JobState::Succeeded;
        let (action, identical, what, task, split) = match &orig.kind {
            OriginalKind::Sft(_) => (
                ActionName::RunSft,
                checkpoint.as_deref() == Some(orig.checkpoint.as_str()),
                "checkpoint",
                None,
                None,
            ),
            OriginalKind::Eval(ev) => (
                ActionName::Evaluate,
                succeeded && metrics == orig.metrics,
                "scores",
                Some(ev.task.clone()),
                Some(ev.split),
            ),
        };
        let verdict = if !succeeded {
            format!("not reproduced: the job {}", job.state.as_str())
        } else if identical {
            match action {
                ActionName::RunSft => "reproduced: the identical checkpoint, byte for byte".into(),
                _ => "reproduced: every score identical".into(),
            }
        } else if env_changed {
            format!(
                "different {what}, in another environment ({} → {}): the difference may be the environment's",
                orig.env, job.env
            )
        } else {
            format!(
                "NOT reproduced: different {what} in the same environment — the embedded trainer and evaluator are bit-for-bit repeatable, so the record, the store or the program is not what it was"
            )
        };
        let (train_metrics, eval_metrics) = match action {
            ActionName::RunSft => (deltas, Vec::new()),
            _ => (Vec::new(), deltas),
        };
        let result = ReproduceResult {
            job: job.clone(),
            action,
            seq: req.seq,
            recorded_checkpoint: orig.checkpoint.clone(),
            checkpoint: checkpoint.clone(),
            identical,
            task,
            split,
            metrics: eval_metrics,
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
                    "{action} #{} → {}",
                    req.seq,
                    if identical {
                        format!("identical {what}")
                    } else {
                        match (&checkpoint, succeeded) {
                            (Some(c), _) => format!("different checkpoint {}", &c[..12]),
                            (None, true) => format!("different {what}"),
                            (None, false) => format!("job {}", job.state.as_str()),
                        }
                    }
                );
                let mut p = Prepared::accepted(summary, stored.clone());
                p.body = format!(
                    "Reproduction of {action} #{} (checkpoint {}): {verdict}.",
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
