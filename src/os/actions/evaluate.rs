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
            hidden_set_actual: match task.hidden_twin(req.split) {
                Some((_, twin)) => Some(crate::util::hash::sha256_file(
                    &self.study_file(&twin.path)?,
                )?),
                None => None,
            },
            hidden_set_pinned: task
                .hidden_twin(req.split)
                .and_then(|(_, s)| s.sha256.clone()),
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
        // The tripwires. A test score is published only when it is not significantly above the
        // sealed split's; a dev score that is significantly above the dev twin's makes the
        // checkpoint suspect (its scores rank nowhere, its producer leaves every ranking: the
        // index's `RANKABLE`). Both hidden splits are scored
        // by the same pinned evaluator and checkpoint, and both fail closed: no hidden score, no
        // score. With `policy.train_on_dev`, the dev twin's score is the one recorded.
        let mut suspected_contamination = false;
        let mut evidence_suspect = false;
        let mut ranked_on = None;
        if job.state == JobState::Succeeded
            && let Some((hidden, twin)) = task.hidden_twin(req.split)
        {
            let ranked_on_twin = req.split == Split::Dev && self.config.policy.train_on_dev;
            let alpha = match req.split {
                Split::Test => self.config.policy.tripwire_alpha,
                Split::Dev => self.config.policy.dev_tripwire_alpha,
            };
            match self.twin_tripwire(
                spec,
                job.charged_s(),
                &ck,
                &task,
                twin,
                (&metrics, n_items),
                alpha,
            ) {
                Ok(t) => {
                    job.compute_s = Some(job.charged_s() + t.job.charged_s());
                    if ranked_on_twin {
                        metrics = t.metrics;
                        n_items = t.n_items;
                        ranked_on = Some("dev_twin".to_string());
                    } else if req.split == Split::Test {
                        suspected_contamination = t.suspected;
                    } else {
                        evidence_suspect = t.suspected;
                    }
                }
                Err(e) => {
                    job.state = JobState::Failed;
                    job.error = Some(format!(
                        "the {} split could not be scored, so the {} score is withheld: {}",
                        hidden,
                        req.split.as_str(),
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
        let mut result_stored = serde_json::json!({
            "job": job, "task": req.task, "split": req.split, "metrics": metrics, "n_items": n_items,
            "evaluator": evaluator, "items": items,
            "suspected_contamination": suspected_contamination,
            "evidence_suspect": evidence_suspect,
        });
        if let Some(r) = &ranked_on {
            result_stored["ranked_on"] = serde_json::json!(r);
        }
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Evaluate, request, |snap| {
                let headline = if suspected_contamination {
                    "score withheld: suspected contamination (sealed-split tripwire)".to_string()
                } else {
                    let score = metrics
                        .get(&task.metric)
                        .map(|v| format!("{}={v:.4}", task.metric))
                        .unwrap_or_else(|| format!("job {}", job.state.as_str()));
                    match (evidence_suspect, &ranked_on) {
                        (true, _) => format!(
                            "{score}, SUSPECT: significantly above the hidden dev twin (left out of every ranking)"
                        ),
                        (false, Some(r)) => format!("{score} (on the {r})"),
                        _ => score,
                    }
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
            evidence_suspect,
            ranked_on,
            commit: oid,
        })
    }

    /// Score a task's hidden split (the sealed split beside a test evaluation, the dev twin beside
    /// a dev evaluation) with the same evaluator command and checkpoint as the visible job, and
    /// test whether the visible score is significantly above it (one-sided two-proportion test
    /// at `alpha`). Both scores and the verdict go to `.rsim/tripwire/<job>.json` for the owner;
    /// the record gets the verdict only (or, ranking on the dev twin, its score).
    #[allow(clippy::too_many_arguments)]
    fn twin_tripwire(
        &self,
        visible_spec: &JobSpec,
        visible_used_s: f64,
        ck: &str,
        task: &crate::config::TaskConfig,
        twin: &crate::config::EvalSet,
        (visible_metrics, n_visible): (&BTreeMap<String, f64>, u64),
        alpha: f64,
    ) -> Result<Twin> {
        let visible_score = *visible_metrics.get(&task.metric).ok_or_else(|| {
            Error::invalid(format!("the evaluator reported no {:?} score", task.metric))
        })?;
        let JobParams::Evaluate(visible_params) = &visible_spec.params else {
            return Err(Error::internal(
                "an evaluation without evaluation parameters",
            ));
        };
        let (visible, hidden) = (
            visible_params.split.as_str(),
            crate::config::hidden_split_name(visible_params.split),
        );
        let job_id = crate::jobs::new_job_id();
        let params = JobParams::Evaluate(EvalParams {
            job: job_id.clone(),
            checkpoint: self.checkpoint_files(ck)?,
            eval_set: self.study_file(&twin.path)?,
            ..visible_params.clone()
        });
        // The hidden job runs in the study's environment pinned again now (a flake that can no
        // longer be pinned fails the tripwire closed: the score is withheld).
        let pin = self.pin_environment();
        if let Err(why) = &pin {
            return Err(Error::invalid(format!(
                "the job environment cannot be pinned: {why}"
            )));
        }
        // The hidden job runs inside the visible job's admission: what the visible job left of
        // its time limit (which was cut to the budgets left), so the pair can never spend more
        // than one admitted evaluation. Too little left fails the tripwire closed.
        let left = visible_spec
            .timeout_s
            .saturating_sub(visible_used_s.ceil() as u64);
        if left == 0 {
            return Err(Error::invalid(format!(
                "no time was left of the evaluation's limit ({} s) to score the {hidden} split",
                visible_spec.timeout_s
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
        let hidden_score = *r.metrics.get(&task.metric).ok_or_else(|| {
            Error::invalid(format!("the evaluator reported no {:?} score", task.metric))
        })?;
        let successes = |score: f64, n: u64| (score * n as f64).round().clamp(0.0, n as f64) as u64;
        let p_value = crate::util::stats::two_proportion_p_above(
            successes(visible_score, n_visible),
            n_visible,
            successes(hidden_score, r.n_items),
            r.n_items,
        );
        let suspected = p_value < alpha;
        let dir = paths::state_dir(&self.root).join("tripwire");
        fs::create_dir_all(&dir).at("cannot create", &dir)?;
        let note = dir.join(format!("{}.json", visible_spec.id));
        fs::write(
            &note,
            crate::util::hash::json_bytes(&serde_json::json!({
                "task": visible_params.task, "checkpoint": ck, "metric": task.metric,
                visible: {"score": visible_score, "n": n_visible, "job": visible_spec.id},
                hidden: {"score": hidden_score, "n": r.n_items, "job": job.id},
                "p_value": p_value, "alpha": alpha, "suspected": suspected,
            }))?,
        )
        .at("cannot write", &note)?;
        if suspected {
            tracing::warn!(
                "tripwire: {visible} {visible_score:.4} (n {n_visible}) vs {hidden} {hidden_score:.4} (n {}), p {p_value:.2e} < {alpha}",
                r.n_items
            );
        }
        Ok(Twin {
            job,
            suspected,
            metrics: r.metrics,
            n_items: r.n_items,
        })
    }
}

impl Study {
    /// The dev twin's score of a checkpoint: evidence it was not selected on (the dev twin is
    /// never ranked on unless the study trains on dev, and no agent sees it), read from the
    /// owner's tripwire notes of its dev evaluations. For the owner only; `None` when the task has
    /// no dev twin, the study ranks on it, or the checkpoint has no dev evaluation here. A note
    /// counts only when it agrees with the record: its visible score is the one the record holds
    /// for that checkpoint's dev evaluation (`dev`); notes of one checkpoint that disagree give
    /// no evidence.
    pub fn dev_twin_evidence(
        &self,
        caller: &Caller,
        task: &str,
        checkpoint: &str,
        dev: f64,
    ) -> Result<Option<FreshEvidence>> {
        if caller.role != Role::Owner {
            return Err(Error::forbidden(
                "the dev twin's scores are the owner's: no agent reads them",
            ));
        }
        if self.config.policy.train_on_dev
            || self
                .config
                .tasks
                .get(task)
                .is_none_or(|t| t.dev_twin.is_none())
        {
            return Ok(None);
        }
        let dir = paths::state_dir(&self.root).join("tripwire");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::internal(format!(
                    "cannot read {}: {e}",
                    dir.display()
                )));
            }
        };
        let mut found: Option<FreshEvidence> = None;
        for entry in entries.flatten() {
            let path = entry.path();
            // Notes are small: anything else (or anything not a plain file) is not a note.
            let small = entry
                .metadata()
                .is_ok_and(|m| m.is_file() && m.len() < 64 << 10);
            if !small || path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(v) = fs::read(&path)
                .map_err(|_| ())
                .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|_| ()))
            else {
                continue;
            };
            if v["task"] != task || v["checkpoint"] != checkpoint {
                continue;
            }
            let (Some(seen), Some(twin), Some(n)) = (
                v["dev"]["score"].as_f64(),
                v["dev_twin"]["score"].as_f64(),
                v["dev_twin"]["n"].as_u64(),
            ) else {
                continue;
            };
            if (seen - dev).abs() > 1e-9 || !(0.0..=1.0).contains(&twin) || n == 0 {
                continue;
            }
            // Evaluations are deterministic: every note of one checkpoint holds the same score.
            // Notes that disagree are no evidence at all.
            let this = FreshEvidence {
                split: "dev_twin".to_string(),
                dev,
                score: twin,
                n,
            };
            match &found {
                Some(f) if *f != this => {
                    tracing::warn!(
                        "the dev twin notes of checkpoint {checkpoint} disagree ({} vs {}): no fresh evidence",
                        f.score,
                        this.score
                    );
                    return Ok(None);
                }
                _ => found = Some(this),
            }
        }
        Ok(found)
    }
}

/// A checkpoint's score on evidence it was not selected on, beside the dev score it was.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct FreshEvidence {
    /// Where the fresh score comes from (`dev_twin`).
    pub split: String,
    /// The dev score it was selected on.
    pub dev: f64,
    /// Its score on the fresh evidence.
    pub score: f64,
    /// Items scored.
    pub n: u64,
}

/// What scoring a hidden split beside a visible one found.
struct Twin {
    job: JobRecord,
    /// The visible score was significantly above the hidden one.
    suspected: bool,
    /// The hidden split's own scores (recorded only when the study ranks on the dev twin).
    metrics: BTreeMap<String, f64>,
    n_items: u64,
}
