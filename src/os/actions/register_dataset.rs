//! The `register_dataset` action.

use std::fs;

use crate::os::data::text_bytes;
use crate::os::jobrun::ClaimGuard;
use crate::os::*;
use crate::policy::SizeFact;

impl Study {
    pub(in crate::os) fn exec_register_dataset(
        &self,
        caller: &Caller,
        req: RegisterDatasetRequest,
    ) -> Result<RegisterDatasetResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        if let DatasetSource::Declared { source } = &req.source
            && !self.config.datasets.contains_key(source)
        {
            return Err(Error::not_found(format!(
                "source: no dataset source {source:?} is declared in rsim.toml (declared: {})",
                self.config
                    .datasets
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        // Project the size first (nothing is materialised past the bounds), then materialise the
        // rows and scan them: the size and the scan are facts the policy decides on.
        let (unregistered, size, rows) = self.materialise(&req.source)?;
        let contamination = if unregistered.is_empty() && self.within_bounds(&size) {
            self.scan_for_contamination(&rows)?
        } else {
            Vec::new()
        };
        // The name is claimed atomically before the policy sees it, and held until the
        // registration is recorded (or refused): two racing registrations cannot both pass.
        let claimed = self.index.claim_dataset_name(&req.name)?;
        let _name = claimed.then(|| ClaimGuard::dataset_name(&self.index, &req.name));
        let facts = Facts {
            node_status: Some(snap.meta.status),
            dataset_name_taken: !claimed,
            unregistered_datasets: unregistered,
            contamination,
            size: Some(size),
            agent_contamination_rejections: self.index.rejection_count(
                &caller.agent,
                crate::model::rule::Rule::Contamination.as_str(),
            )?,
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::RegisterDataset(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::RegisterDataset,
                request,
                decision,
            ));
        }
        if rows.is_empty() {
            return Err(Error::invalid(
                "source: the dataset has no rows (a filter that keeps nothing?)",
            ));
        }
        let bytes = datasets::to_jsonl(&rows)?;
        let sha = self.store.put_bytes(&bytes)?;
        let n = rows.len() as u64;
        let (oid, _) = self.commit_action(
            &req.node,
            caller,
            ActionName::RegisterDataset,
            request,
            |_| {
                let mut p = Prepared::accepted(
                    format!("{} ({n} rows)", req.name),
                    serde_json::json!({ "dataset": req.name, "sha256": sha, "rows": n }),
                );
                p.body = format!(
                    "Dataset {} ({n} rows), sha256 {sha}.\n{}",
                    req.name, req.description
                );
                p.artifacts.push(ArtifactRef {
                    sha256: sha.clone(),
                    kind: ArtifactKind::Dataset,
                    name: req.name.clone(),
                    parent: None,
                });
                Ok(p)
            },
        )?;
        Ok(RegisterDatasetResult {
            dataset: req.name,
            sha256: sha,
            rows: n,
            commit: oid,
        })
    }
}

impl Study {
    /// The rows a source stands for, after its projected size was found within the bounds:
    /// (unregistered inputs, projected size, rows). Past the bounds (or with unregistered
    /// inputs) the rows are left empty and the policy refuses on the facts.
    fn materialise(
        &self,
        source: &DatasetSource,
    ) -> Result<(Vec<String>, SizeFact, Vec<types::Row>)> {
        let mut unregistered = Vec::new();
        let fact = |what: String, rows: u64, bytes: u64| SizeFact { what, rows, bytes };
        let (size, rows) = match source {
            DatasetSource::Inline { rows } => {
                let size = fact(
                    "the inline dataset".into(),
                    rows.len() as u64,
                    text_bytes(rows),
                );
                let rows = if self.within_bounds(&size) {
                    rows.clone()
                } else {
                    Vec::new()
                };
                (size, rows)
            }
            DatasetSource::Arith(p) => {
                let size = fact(
                    "the generated dataset".into(),
                    p.n,
                    p.n.saturating_mul(datasets::arith_max_row_bytes(p)),
                );
                let rows = if self.within_bounds(&size) {
                    self.generate_outside_protected(p)?
                } else {
                    Vec::new()
                };
                (size, rows)
            }
            DatasetSource::Declared { source } => {
                let path = self.study_file(&self.config.datasets[source].path)?;
                let bytes = fs::metadata(&path)
                    .at("cannot read declared dataset", &path)?
                    .len();
                let mut size = fact(format!("the declared source {source:?}"), 0, bytes);
                let rows = if self.within_bounds(&size) {
                    let bytes = fs::read(&path).at("cannot read declared dataset", &path)?;
                    let rows = datasets::parse_jsonl(&bytes, &format!("dataset source {source}"))?;
                    size.rows = rows.len() as u64;
                    rows
                } else {
                    Vec::new()
                };
                (size, rows)
            }
            DatasetSource::Mixture { parts, seed } => {
                // First what reading the parts costs (their stored sizes), then what the draws
                // would produce (rows drawn × the longest row of each part).
                let (mut in_rows, mut in_bytes, mut draws) = (0u64, 0u64, 0u64);
                let mut seen = std::collections::BTreeSet::new();
                for p in parts {
                    draws = draws.saturating_add(p.rows);
                    match self.dataset_size(&p.dataset)? {
                        Some((rows, bytes)) => {
                            if seen.insert(p.dataset.as_str()) {
                                in_rows = in_rows.saturating_add(rows);
                                in_bytes = in_bytes.saturating_add(bytes);
                            }
                        }
                        None => unregistered.push(p.dataset.clone()),
                    }
                }
                let inputs = fact("the mixture's parts".into(), in_rows, in_bytes);
                if !unregistered.is_empty() || !self.within_bounds(&inputs) {
                    return Ok((unregistered, inputs, Vec::new()));
                }
                let mut loaded = Vec::new();
                let mut out_bytes = 0u64;
                for p in parts {
                    let rows = self.dataset_rows(&p.dataset)?.unwrap_or_default();
                    let longest = rows
                        .iter()
                        .map(|r| (r.prompt.len() + r.answer.len()) as u64)
                        .max()
                        .unwrap_or(0);
                    out_bytes = out_bytes.saturating_add(p.rows.saturating_mul(longest));
                    loaded.push((rows, p.rows));
                }
                let size = fact(format!("the mixture ({draws} draws)"), draws, out_bytes);
                let rows = if self.within_bounds(&size) {
                    datasets::mix(&loaded, *seed)
                } else {
                    Vec::new()
                };
                (size, rows)
            }
            DatasetSource::Filter {
                dataset,
                max_prompt_chars,
                max_answer_chars,
                prompt_contains,
            } => {
                // A filter keeps at most its input.
                let Some((in_rows, in_bytes)) = self.dataset_size(dataset)? else {
                    unregistered.push(dataset.clone());
                    return Ok((unregistered, fact("the filter".into(), 0, 0), Vec::new()));
                };
                let size = fact(format!("the filter of {dataset:?}"), in_rows, in_bytes);
                let rows = if self.within_bounds(&size) {
                    self.dataset_rows(dataset)?
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|r| {
                            max_prompt_chars.is_none_or(|m| r.prompt.chars().count() as u64 <= m)
                        })
                        .filter(|r| {
                            max_answer_chars.is_none_or(|m| r.answer.chars().count() as u64 <= m)
                        })
                        .filter(|r| {
                            prompt_contains
                                .as_ref()
                                .is_none_or(|c| r.prompt.contains(c.as_str()))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                (size, rows)
            }
        };
        Ok((unregistered, size, rows))
    }
}
