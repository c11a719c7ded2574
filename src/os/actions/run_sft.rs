//! The `run_sft` action.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::jobs::protocol::{self, DatasetRef, JobParams, SftParams, TrainHyper};
use crate::os::*;

impl Study {
    pub(in crate::os) fn exec_run_sft(
        &self,
        caller: &Caller,
        req: RunSftRequest,
    ) -> Result<RunSftResult> {
        check_caller(caller)?;
        self.check_eval_every(&req)?;
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
        let pin = self.pin_environment();
        let mut facts = self.job_facts(caller, &req.node, base_sha.as_deref())?;
        facts.node_status = Some(snap.meta.status);
        // What trains is the union of the datasets, in the order the trainer reads them: its
        // size is bounded before it is read, and it is scanned as one sequence.
        let size = crate::policy::SizeFact {
            what: format!("the union of the run's {} dataset(s)", req.datasets.len()),
            rows: ds.iter().map(|(_, _, rows)| *rows).sum(),
            bytes: ds.iter().try_fold(0u64, |acc, (name, _, _)| {
                Ok::<u64, Error>(
                    acc.saturating_add(self.dataset_size(name)?.map_or(0, |(_, bytes)| bytes)),
                )
            })?,
        };
        // Every object is re-hashed before it is used: the store's files are only as trustworthy
        // as the last check of their content (a changed one is refused, never read or scanned).
        facts.dataset_corrupt = ds
            .iter()
            .filter_map(|(name, sha, _)| self.store.damage(sha).map(|why| format!("{name}: {why}")))
            .collect();
        if unregistered.is_empty() && facts.dataset_corrupt.is_empty() && self.within_bounds(&size)
        {
            facts.contamination =
                self.scan_datasets(ds.iter().map(|(name, _, _)| name.as_str()))?;
        }
        facts.size = Some(size);
        facts.unregistered_datasets = unregistered;
        facts.environment_unpinned = pin.as_ref().err().cloned();
        let request = serde_json::to_value(&req)?;
        let job_id = crate::jobs::new_job_id();
        // Compute used (recorded + claimed by running jobs) is taken, decided on and claimed at once.
        let (timeout, claim) = self.admit_or_record(
            caller,
            &job_id,
            Request::RunSft(&req),
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
            hyper: train_hyper(
                &req,
                protocol::shards_for(self.config.backend.limits().threads, req.batch_size),
            ),
        });
        let spec = self.job_spec(job_id, &self.config.jobs.sft.clone(), params, timeout, &pin)?;
        self.write_intent(caller, ActionName::RunSft, &req.node, &request, &spec, None)?;
        let mut job = self.runner.run(&spec)?;
        job.log = self.store_log(&spec)?;
        let mut res = self.finish_sft(caller, &req, request, &spec, job, base_sha)?;
        // The run is recorded: its compute counts from the record now, and its checkpoints'
        // scoring (evaluations of their own) must not wait behind the run's own claim.
        drop(claim);
        res.dev_curve = self.score_steps(caller, &req, &res)?;
        Ok(res)
    }

    /// `eval_every` needs a task of this study, whole checkpoints and a bounded number of them.
    fn check_eval_every(&self, req: &RunSftRequest) -> Result<()> {
        if req.eval_every == 0 {
            if req.eval_task.is_some() {
                return Err(Error::invalid(
                    "eval_task: it names the task eval_every scores; set eval_every too, or leave eval_task out",
                ));
            }
            return Ok(());
        }
        let task = req.eval_task.as_deref().ok_or_else(|| {
            Error::invalid(
                "eval_task: eval_every needs the task whose dev split scores the checkpoints",
            )
        })?;
        if !self.config.tasks.contains_key(task) {
            return Err(Error::invalid(format!(
                "eval_task: the study has no task {task:?} (it has: {})",
                self.config
                    .tasks
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if matches!(req.adapter, types::Adapter::Lora { .. }) {
            return Err(Error::invalid(
                "eval_every: intermediate checkpoints are whole models; use adapter {\"kind\": \"full\"} with eval_every",
            ));
        }
        let kept = (req.steps.saturating_sub(1)) / req.eval_every;
        if kept > MAX_STEP_CHECKPOINTS {
            return Err(Error::invalid(format!(
                "eval_every: {} steps every {} would keep {kept} intermediate checkpoints; at most {MAX_STEP_CHECKPOINTS} per run",
                req.steps, req.eval_every
            )));
        }
        Ok(())
    }

    /// `eval_every`: score each intermediate checkpoint and the final one on the dev split, each
    /// through the `evaluate` action (its own commit, the evaluation budget, the pinned
    /// evaluator). A refusal (a spent budget) ends the curve there, with the reason.
    fn score_steps(
        &self,
        caller: &Caller,
        req: &RunSftRequest,
        res: &RunSftResult,
    ) -> Result<Vec<types::DevPoint>> {
        let (Some(task), Some(last)) = (&req.eval_task, &res.checkpoint) else {
            return Ok(Vec::new());
        };
        if req.eval_every == 0 {
            return Ok(Vec::new());
        }
        let points = res
            .intermediate
            .iter()
            .map(|s| (s.step, s.checkpoint.clone()))
            .chain([(req.steps, last.clone())]);
        let mut curve = Vec::new();
        for (step, checkpoint) in points {
            let r = self.evaluate(
                caller,
                EvaluateRequest {
                    node: req.node.clone(),
                    checkpoint: checkpoint.clone(),
                    task: task.clone(),
                    split: Split::Dev,
                },
            );
            let (metrics, error, stop) = match r {
                Ok(r) if r.job.state == JobState::Succeeded => (r.metrics, None, false),
                Ok(r) => (
                    BTreeMap::new(),
                    Some(format!(
                        "evaluation job {} {}: {}",
                        r.job.id,
                        r.job.state.as_str(),
                        r.job.error.unwrap_or_default()
                    )),
                    false,
                ),
                Err(e) => (BTreeMap::new(), Some(e.message), true),
            };
            curve.push(types::DevPoint {
                step,
                checkpoint,
                metrics,
                error,
            });
            if stop {
                break;
            }
        }
        Ok(curve)
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
        let mut intermediate = Vec::new();
        // The log is in the store by now (moved there when the job ended).
        let log = match &job.log {
            Some(sha) => self.store.path(sha),
            None => spec.log_path(),
        };
        let curve: Vec<types::LossPoint> = read_log_head(&log)
            .map(|log| {
                protocol::curve_in(&log, MAX_CURVE_POINTS)
                    .into_iter()
                    .map(|(step, loss)| types::LossPoint { step, loss })
                    .collect()
            })
            .unwrap_or_default();
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
                    checkpoint = Some(self.store.absorb_dir(&ck_dir)?);
                    train_metrics = m;
                    // Only the steps the run was asked to keep: whatever else a job leaves
                    // under out/ is not a checkpoint of the record.
                    if req.eval_every > 0 {
                        for (step, dir) in protocol::step_checkpoints(&out) {
                            if step % req.eval_every == 0 && step < req.steps {
                                intermediate.push(types::StepCheckpoint {
                                    step,
                                    checkpoint: self.store.absorb_dir(&dir)?,
                                });
                            }
                        }
                    }
                }
                Err(e) => {
                    job.state = JobState::Failed;
                    job.error = Some(e.message);
                }
            }
        }
        let mut result_stored = serde_json::json!({
            "job": job, "checkpoint": checkpoint, "train_metrics": train_metrics,
        });
        if !curve.is_empty() {
            result_stored["curve"] = serde_json::to_value(&curve)?;
        }
        if !intermediate.is_empty() {
            result_stored["intermediate"] = serde_json::to_value(&intermediate)?;
        }
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
                for s in &intermediate {
                    p.artifacts.push(ArtifactRef {
                        sha256: s.checkpoint.clone(),
                        kind: ArtifactKind::Checkpoint,
                        name: format!("{}-{}-step{}", req.node, &s.checkpoint[..12], s.step),
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
            curve,
            intermediate,
            dev_curve: Vec::new(),
            commit: oid,
        })
    }
}

/// Points of a learning curve kept in the record (the log's progress lines, thinned evenly).
pub const MAX_CURVE_POINTS: usize = 200;
/// Intermediate checkpoints one run may keep (`eval_every`).
pub const MAX_STEP_CHECKPOINTS: u64 = 50;
/// How much of a job's log the learning curve is read from.
const CURVE_LOG_BYTES: u64 = 16 << 20;

/// The first 16 MiB of a job's log as text (a job writes what it likes there).
fn read_log_head(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(CURVE_LOG_BYTES)
        .read_to_end(&mut buf)
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// What the trainer is told from the agent's request: its training parameters only. The request
/// is taken apart field by field, so a field added to it must be placed here on purpose (into
/// the job's spec, or not) rather than silently reaching every recipe.
pub(super) fn train_hyper(req: &RunSftRequest, shards: u32) -> TrainHyper {
    let RunSftRequest {
        node: _,
        base: _,
        datasets: _,
        learning_rate,
        steps,
        batch_size,
        warmup_steps,
        schedule,
        adapter,
        answer_only_loss,
        seed,
        eval_every,
        eval_task: _,
    } = req;
    TrainHyper {
        learning_rate: *learning_rate,
        steps: *steps,
        batch_size: *batch_size,
        warmup_steps: *warmup_steps,
        schedule: *schedule,
        adapter: adapter.clone(),
        answer_only_loss: *answer_only_loss,
        seed: *seed,
        save_every: *eval_every,
        shards,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_gets_training_parameters_not_the_request() {
        let req: RunSftRequest = serde_json::from_value(serde_json::json!({
            "node": "n1", "base": "base", "datasets": ["plain"], "learning_rate": 0.002,
            "steps": 30, "batch_size": 8, "warmup_steps": 3, "schedule": "linear",
            "adapter": {"kind": "lora", "rank": 4, "alpha": 8.0}, "answer_only_loss": false,
            "seed": 11,
        }))
        .expect("request");
        let h = serde_json::to_value(train_hyper(&req, 1)).expect("hyper");
        assert_eq!(
            h,
            serde_json::json!({
                "learning_rate": 0.002, "steps": 30, "batch_size": 8, "warmup_steps": 3,
                "schedule": "linear", "adapter": {"kind": "lora", "rank": 4, "alpha": 8.0},
                "answer_only_loss": false, "seed": 11, "save_every": 0, "shards": 1,
            })
        );
        let h = serde_json::to_value(train_hyper(&req, 2)).expect("hyper");
        assert_eq!(h["shards"], 2);
        assert_eq!(protocol::shards_for(Some(2), 32), 2);
        assert_eq!(
            protocol::shards_for(Some(16), 32),
            8,
            "pieces of at least 4 rows"
        );
        assert_eq!(protocol::shards_for(Some(2), 4), 1);
        assert_eq!(protocol::shards_for(None, 32), 1);
        // The request itself is not a valid hyper: the job side cannot be handed it by mistake.
        let request = serde_json::to_value(&req).expect("request");
        assert!(serde_json::from_value::<TrainHyper>(request).is_err());
    }
}
