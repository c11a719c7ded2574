//! The `register_dataset` action.

use std::fs;

use crate::os::*;

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
        // Materialise the rows first: the contamination scan is a fact the policy decides on.
        let mut unregistered = Vec::new();
        let mut decontaminated = 0u64;
        let rows = match &req.source {
            DatasetSource::Inline { rows } => rows.clone(),
            DatasetSource::Arith(p) => {
                let (rows, dropped) = self.decontaminate(datasets::generate_arith(p))?;
                decontaminated = dropped;
                rows
            }
            DatasetSource::Declared { source } => {
                let path = self.study_file(&self.config.datasets[source].path)?;
                let bytes = fs::read(&path).at("cannot read declared dataset", &path)?;
                datasets::parse_jsonl(&bytes, &format!("dataset source {source}"))?
            }
            DatasetSource::Mixture { parts, seed } => {
                let mut loaded = Vec::new();
                for p in parts {
                    match self.dataset_rows(&p.dataset)? {
                        Some(rows) => loaded.push((rows, p.rows)),
                        None => unregistered.push(p.dataset.clone()),
                    }
                }
                datasets::mix(&loaded, *seed)
            }
            DatasetSource::Filter {
                dataset,
                max_prompt_chars,
                max_answer_chars,
                prompt_contains,
            } => match self.dataset_rows(dataset)? {
                Some(rows) => rows
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
                    .collect(),
                None => {
                    unregistered.push(dataset.clone());
                    Vec::new()
                }
            },
        };
        let contamination = if unregistered.is_empty() {
            self.scan_for_contamination(&rows)?
        } else {
            Vec::new()
        };
        let facts = Facts {
            node_status: Some(snap.meta.status),
            dataset_name_taken: self.index.dataset(&req.name)?.is_some(),
            unregistered_datasets: unregistered,
            contamination,
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
                    serde_json::json!({ "dataset": req.name, "sha256": sha, "rows": n, "decontaminated": decontaminated }),
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
            decontaminated,
            commit: oid,
        })
    }
}
