//! The `evaluate` action.

use std::collections::BTreeMap;

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
        let pin = pin.map_err(|why| {
            Error::internal(format!(
                "the policy admitted a job whose environment is not pinned: {why}"
            ))
        })?;
        let spec = self.job_spec(
            job_id,
            &self.config.jobs.evaluate.clone(),
            params,
            timeout,
            pin.as_ref(),
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
            commit: oid,
        })
    }
}
