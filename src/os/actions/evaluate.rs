//! The `evaluate` action.

use std::collections::BTreeMap;
use std::fs;

use serde_json::Value;

use crate::jobs::protocol::{self, EvalParams, JobParams};
use crate::os::*;

impl Study {
    pub(in crate::os) fn exec_evaluate(
        &self,
        caller: &Caller,
        req: EvaluateRequest,
    ) -> Result<EvaluateResult> {
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
        let pin = self.pin_environment();
        let facts = Facts {
            node_status: Some(snap.meta.status),
            environment_unpinned: pin.as_ref().err().cloned(),
            evaluations_total: self.index.evaluation_count(None, None)?,
            test_evaluations_on_node: self.index.evaluation_count(Some(&req.node), Some("test"))?,
            node_evaluations: self.index.evaluation_count(Some(&req.node), None)?,
            agent_evaluations: self
                .index
                .evaluation_count_by(None, None, Some(&caller.agent))?,
            evaluator_actual: Some(evaluator.clone()),
            evaluator_pinned: self.config.jobs.evaluator_sha256.clone(),
            eval_set_actual: Some(crate::util::hash::sha256_file(&set_path)?),
            eval_set_pinned: set.sha256.clone(),
            sealed_set_actual: match (&task.sealed, req.split) {
                (Some(sealed), Split::Test) => Some(crate::util::hash::sha256_file(
                    &self.study_file(&sealed.path)?,
                )?),
                _ => None,
            },
            sealed_set_pinned: match req.split {
                Split::Test => task.sealed.as_ref().and_then(|s| s.sha256.clone()),
                Split::Dev => None,
            },
            ..self.job_facts(caller, &req.node, ck.as_deref())?
        };
        let request = serde_json::to_value(&req)?;
        let job_id = crate::jobs::new_job_id();
        // Counts (recorded + claimed by running jobs) are taken, decided on and claimed at once.
        let (timeout, _claim) = self.admit_or_record(
            caller,
            &job_id,
            Request::Evaluate(&req),
            &req.node,
            Some(req.split),
            facts,
            &request,
        )?;
        let ck = ck.ok_or_else(|| Error::internal("policy accepted an unknown checkpoint"))?;
        let params = JobParams::Evaluate(EvalParams {
            job: job_id.clone(),
            checkpoint: self.checkpoint_files(&ck)?,
            task: req.task.clone(),
            split: req.split,
            metric: task.metric.clone(),
            eval_set: set_path,
        });
        let spec = self.job_spec(
            job_id,
            &self.config.jobs.evaluate.clone(),
            params,
            timeout,
            &pin,
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
    pub(in crate::os) fn finish_evaluate(
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
            match protocol::read_eval_result(&spec.out_dir()) {
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
        // The tripwire: a test score is published only when it is not significantly above the
        // sealed split's, scored by the same pinned evaluator (fails closed: no sealed score, no
        // test score).
        let mut suspected_contamination = false;
        if req.split == Split::Test
            && job.state == JobState::Succeeded
            && let Some(sealed) = &task.sealed
        {
            match self.sealed_tripwire(spec, job.charged_s(), &ck, &task, sealed, &metrics, n_items)
            {
                Ok((sealed_job, suspected)) => {
                    job.compute_s = Some(job.charged_s() + sealed_job.charged_s());
                    suspected_contamination = suspected;
                }
                Err(e) => {
                    job.state = JobState::Failed;
                    job.error = Some(format!(
                        "the sealed split could not be scored, so the test score is withheld: {}",
                        e.message
                    ));
                }
            }
            if suspected_contamination || job.state != JobState::Succeeded {
                metrics.clear();
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
            "suspected_contamination": suspected_contamination,
        });
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Evaluate, request, |snap| {
                let headline = if suspected_contamination {
                    "score withheld: suspected contamination (sealed-split tripwire)".to_string()
                } else {
                    metrics
                        .get(&task.metric)
                        .map(|v| format!("{}={v:.4}", task.metric))
                        .unwrap_or_else(|| format!("job {}", job.state.as_str()))
                };
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
                    p.files.push(TreeFile::new(
                        "metrics.json",
                        crate::util::hash::json_bytes(&all)?,
                    ));
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
            suspected_contamination,
            commit: oid,
        })
    }

    /// Score the task's sealed split with the same evaluator command and checkpoint as the test
    /// job, and test whether the test score is significantly above it (one-sided two-proportion
    /// test at `policy.tripwire_alpha`). Both scores and the verdict go to
    /// `.rsim/tripwire/<test job>.json` for the owner; the record gets the verdict only.
    #[allow(clippy::too_many_arguments)]
    fn sealed_tripwire(
        &self,
        test_spec: &JobSpec,
        test_used_s: f64,
        ck: &str,
        task: &crate::config::TaskConfig,
        sealed: &crate::config::EvalSet,
        test_metrics: &BTreeMap<String, f64>,
        n_test: u64,
    ) -> Result<(JobRecord, bool)> {
        let test_score = *test_metrics.get(&task.metric).ok_or_else(|| {
            Error::invalid(format!("the evaluator reported no {:?} score", task.metric))
        })?;
        let JobParams::Evaluate(test_params) = &test_spec.params else {
            return Err(Error::internal(
                "a test evaluation without evaluation parameters",
            ));
        };
        let job_id = crate::jobs::new_job_id();
        let params = JobParams::Evaluate(EvalParams {
            job: job_id.clone(),
            checkpoint: self.checkpoint_files(ck)?,
            eval_set: self.study_file(&sealed.path)?,
            ..test_params.clone()
        });
        // The sealed job runs in the study's environment pinned again now (a flake that can no
        // longer be pinned fails the tripwire closed: the test score is withheld).
        let pin = self.pin_environment();
        if let Err(why) = &pin {
            return Err(Error::invalid(format!(
                "the job environment cannot be pinned: {why}"
            )));
        }
        // The sealed job runs inside the test job's admission: what the test job left of its
        // time limit (which was cut to the budgets left), so the pair can never spend more than
        // one admitted evaluation. Too little left fails the tripwire closed.
        let left = test_spec
            .timeout_s
            .saturating_sub(test_used_s.ceil() as u64);
        if left == 0 {
            return Err(Error::invalid(format!(
                "no time was left of the evaluation's limit ({} s) to score the sealed split",
                test_spec.timeout_s
            )));
        }
        let spec = self.job_spec(
            job_id,
            &self.config.jobs.evaluate.clone(),
            params,
            left,
            &pin,
        )?;
        let job = self.runner.run(&spec)?;
        self.mark_recorded(&spec)?;
        if job.state != JobState::Succeeded {
            return Err(Error::invalid(format!(
                "job {} {}{}",
                job.id,
                job.state.as_str(),
                job.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )));
        }
        let r = protocol::read_eval_result(&spec.out_dir())?;
        let sealed_score = *r.metrics.get(&task.metric).ok_or_else(|| {
            Error::invalid(format!("the evaluator reported no {:?} score", task.metric))
        })?;
        let successes = |score: f64, n: u64| (score * n as f64).round().clamp(0.0, n as f64) as u64;
        let p_value = crate::util::stats::two_proportion_p_above(
            successes(test_score, n_test),
            n_test,
            successes(sealed_score, r.n_items),
            r.n_items,
        );
        let alpha = self.config.policy.tripwire_alpha;
        let suspected = p_value < alpha;
        let dir = paths::state_dir(&self.root).join("tripwire");
        fs::create_dir_all(&dir).at("cannot create", &dir)?;
        let note = dir.join(format!("{}.json", test_spec.id));
        fs::write(
            &note,
            crate::util::hash::json_bytes(&serde_json::json!({
                "task": test_params.task, "checkpoint": ck, "metric": task.metric,
                "test": {"score": test_score, "n": n_test, "job": test_spec.id},
                "sealed": {"score": sealed_score, "n": r.n_items, "job": job.id},
                "p_value": p_value, "alpha": alpha, "suspected_contamination": suspected,
            }))?,
        )
        .at("cannot write", &note)?;
        if suspected {
            tracing::warn!(
                "tripwire: test {test_score:.4} (n {n_test}) vs sealed {sealed_score:.4} (n {}), p {p_value:.2e} < {alpha}: score withheld",
                r.n_items
            );
        }
        Ok((job, suspected))
    }
}
