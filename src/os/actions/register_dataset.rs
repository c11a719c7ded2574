//! The `register_dataset` action.

use std::fs;

use crate::model::rule::Rule;
use crate::os::data::{Generator, text_bytes};
use crate::os::jobrun::ClaimGuard;
use crate::os::*;
use crate::policy::{SizeFact, StorageFact};
use crate::record::claims::{Hold, HoldKind};

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
        let request = serde_json::to_value(&req)?;
        let status = snap.meta.status;
        // A request whose exact size already passes a dataset budget (inline rows, generator
        // rows) is refused before anything is generated or scanned: past its budget, an agent
        // cannot make the study generate and scan a million rows per call.
        let projected = match &req.source {
            DatasetSource::Inline { rows } => Some(SizeFact {
                what: "the inline dataset".into(),
                rows: rows.len() as u64,
                bytes: text_bytes(rows),
            }),
            source => Generator::of(source).map(|g| g.size()),
        };
        if let Some(size) = projected {
            let n = size.rows;
            let (_, decision) = self.decide_registration(
                caller,
                &req,
                status,
                Vec::new(),
                Vec::new(),
                size,
                (n, 0),
                false,
                false,
            )?;
            // Refused before anything is materialised or scanned: past a budget, or an agent
            // past its probing limit (whose scan, which may run programs for minutes, would be
            // answered by the limit anyway).
            let early = [
                Rule::BudgetDatasetStorage,
                Rule::BudgetAgentDatasetStorage,
                Rule::ContaminationProbing,
            ]
            .map(Rule::as_str)
            .contains(&decision.rule.as_deref().unwrap_or_default());
            if early {
                return Err(self.record_rejection(
                    &req.node,
                    caller,
                    ActionName::RegisterDataset,
                    request,
                    decision,
                ));
            }
        }
        // Project the size first (nothing is materialised past the bounds), then materialise the
        // rows and scan them: the size and the scan are facts the policy decides on.
        let (unregistered, size, rows) = self.materialise(&req.source)?;
        let materialised = unregistered.is_empty() && self.within_bounds(&size);
        let contamination = if materialised {
            self.scan_for_contamination(&rows)?
        } else {
            Vec::new()
        };
        let empty = materialised && rows.is_empty();
        // What would be stored (the storage budgets count stored bytes).
        let bytes = if rows.is_empty() {
            Vec::new()
        } else {
            datasets::to_jsonl(&rows)?
        };
        let (token, decision) = self.decide_registration(
            caller,
            &req,
            status,
            unregistered,
            contamination,
            size,
            (rows.len() as u64, bytes.len() as u64),
            empty,
            true,
        )?;
        let _held = token.map(|t| ClaimGuard::hold_until_recorded(&self.index, t));
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
            return Err(Error::internal(
                "the policy accepted a dataset with no rows",
            ));
        }
        let sha = self.store.put_bytes(&bytes)?;
        let n = rows.len() as u64;
        let (oid, _) = self.commit_on_open_node(
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

/// What the registered datasets hold, counted once and then kept up to date from the new rows
/// alone (`Study::registered_totals`).
#[derive(Debug, Default)]
pub(in crate::os) struct DatasetTotals {
    /// The datasets counted and the largest row id among them (`Index::datasets_mark`).
    count: u64,
    last: i64,
    /// A registered dataset's object was missing when counted (0 bytes): count again next time.
    missing: bool,
    rows: u64,
    bytes: u64,
    /// Per registering agent: (rows, bytes).
    by_agent: std::collections::HashMap<String, (u64, u64)>,
}

impl DatasetTotals {
    #[cfg(test)]
    pub(in crate::os) fn rows(&self) -> u64 {
        self.rows
    }

    #[cfg(test)]
    pub(in crate::os) fn bytes(&self) -> u64 {
        self.bytes
    }

    fn add(&mut self, rowid: i64, rows: u64, bytes: Option<u64>, agent: String) {
        self.count += 1;
        self.last = self.last.max(rowid);
        self.missing |= bytes.is_none();
        let bytes = bytes.unwrap_or(0);
        self.rows = self.rows.saturating_add(rows);
        self.bytes = self.bytes.saturating_add(bytes);
        let a = self.by_agent.entry(agent).or_default();
        a.0 = a.0.saturating_add(rows);
        a.1 = a.1.saturating_add(bytes);
    }
}

impl Study {
    /// What every registered dataset holds, and `agent`'s share: [rows, stored bytes, agent's
    /// rows, agent's stored bytes]. A registration asks this inside its decision, and a study
    /// registers thousands: the totals are kept per handle and only the datasets registered since
    /// are read, while the table shows nothing else changed (its count grew by exactly the new
    /// rows, and its rows in all agree); otherwise, or after a missing object, everything is
    /// counted again.
    pub(in crate::os) fn registered_totals(&self, index: &Index, agent: &str) -> Result<[u64; 4]> {
        let (count, last, all_rows) = index.datasets_mark()?;
        let mut kept = self.dataset_totals.borrow_mut();
        let mut totals = match kept.take() {
            Some(t) if !t.missing && t.count == count && t.last == last && t.rows == all_rows => t,
            Some(t) if !t.missing && last > t.last => {
                let new = index.datasets_registered_after(t.last)?;
                let mut t = t;
                for (rowid, sha, n, who) in new {
                    t.add(rowid, n, self.stored_size(&sha), who);
                }
                if t.count == count && t.rows == all_rows {
                    t
                } else {
                    self.count_registered(index)?
                }
            }
            _ => self.count_registered(index)?,
        };
        let mine = totals.by_agent.get(agent).copied().unwrap_or_default();
        let out = [totals.rows, totals.bytes, mine.0, mine.1];
        if totals.count != count || totals.last != last || totals.rows != all_rows {
            // The table changed while it was read (no transaction around a pre-check): keep nothing.
            totals.missing = true;
        }
        *kept = Some(totals);
        Ok(out)
    }

    pub(in crate::os) fn count_registered(&self, index: &Index) -> Result<DatasetTotals> {
        let mut t = DatasetTotals::default();
        for (rowid, sha, n, who) in index.datasets_registered()? {
            t.add(rowid, n, self.stored_size(&sha), who);
        }
        Ok(t)
    }

    /// The size of store object `sha` (None when it is missing), read from disk once per handle:
    /// a content-addressed object's size never changes. A registration counts every registered
    /// dataset's bytes, which must not cost a `stat` per dataset per registration.
    fn stored_size(&self, sha: &str) -> Option<u64> {
        if let Some(n) = self.stored_sizes.borrow().get(sha) {
            return Some(*n);
        }
        let m = fs::metadata(self.store.path(sha)).ok()?;
        let mut seen = self.stored_sizes.borrow_mut();
        if seen.len() >= 1 << 16 {
            seen.clear();
        }
        seen.insert(sha.to_string(), m.len());
        Some(m.len())
    }

    /// Decide on a registration (with `hold`, in one write transaction of the index; without,
    /// the early pre-check, on the index as it stands and holding nothing): count what is registered
    /// plus what registrations in flight hold (names, rows, bytes, contamination rejections not
    /// yet recorded), ask the policy, and — with `hold` — hold this registration's share until it
    /// is recorded, so racing registrations cannot together take one name, pass the dataset
    /// budgets, or collect more contamination answers than the probing limit allows. `asked` is
    /// the (rows, stored bytes) the registration would add. Returns the hold's token.
    #[allow(clippy::too_many_arguments)]
    fn decide_registration(
        &self,
        caller: &Caller,
        req: &RegisterDatasetRequest,
        status: NodeStatus,
        unregistered: Vec<String>,
        contamination: Vec<crate::policy::contamination::Hit>,
        size: SizeFact,
        asked: (u64, u64),
        empty: bool,
        hold: bool,
    ) -> Result<(Option<String>, Decision)> {
        let disk = self.storage_fact(&caller.agent)?;
        let decide = |index: &Index| {
            let held = index.held(&caller.agent)?;
            let mut storage = StorageFact {
                used_rows: held.dataset_rows,
                used_bytes: held.dataset_bytes,
                agent_used_rows: held.agent_dataset_rows,
                agent_used_bytes: held.agent_dataset_bytes,
                rows: asked.0,
                bytes: asked.1,
            };
            let [rows, bytes, agent_rows, agent_bytes] =
                self.registered_totals(index, &caller.agent)?;
            storage.used_rows = storage.used_rows.saturating_add(rows);
            storage.used_bytes = storage.used_bytes.saturating_add(bytes);
            storage.agent_used_rows = storage.agent_used_rows.saturating_add(agent_rows);
            storage.agent_used_bytes = storage.agent_used_bytes.saturating_add(agent_bytes);
            let facts = Facts {
                node_status: Some(status),
                dataset_name_taken: index.dataset(&req.name)?.is_some()
                    || index.name_held(&req.name)?,
                unregistered_datasets: unregistered,
                contamination,
                size: Some(size),
                dataset_storage: Some(storage),
                storage: Some(disk),
                agent_contamination_rejections: Rule::PROBES
                    .iter()
                    .map(|r| index.rejection_count(&caller.agent, r.as_str()))
                    .sum::<Result<u64>>()?
                    + held.agent_probes,
                dataset_empty: empty,
                ..Facts::default()
            };
            let decision =
                policy::check(Request::RegisterDataset(req), caller, &self.config, &facts);
            let take = |kind, name: Option<String>, rows, bytes| Hold {
                kind,
                agent: caller.agent.clone(),
                name,
                rows,
                bytes,
            };
            let taken = if !hold {
                None
            } else if decision.accepted() {
                Some(take(
                    HoldKind::Dataset,
                    Some(req.name.clone()),
                    storage.rows,
                    storage.bytes,
                ))
            } else if Rule::PROBES
                .iter()
                .any(|r| decision.rule.as_deref() == Some(r.as_str()))
            {
                Some(take(HoldKind::Probe, None, 0, 0))
            } else {
                None
            };
            Ok((taken, decision))
        };
        if hold {
            self.index.with_holds(decide)
        } else {
            Ok((None, self.index.without_holds(decide)?))
        }
    }

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
            DatasetSource::Arith(_) | DatasetSource::Code(_) => {
                let g = Generator::of(source)
                    .ok_or_else(|| Error::internal("a generator source has no generator"))?;
                let size = g.size();
                let rows = if self.within_bounds(&size) {
                    self.generate_outside_protected(&g)?
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
                // The draws are known before any part is read: too many are refused unread.
                let drawn = fact(format!("the mixture ({draws} draws)"), draws, 0);
                if !self.within_bounds(&drawn) {
                    return Ok((unregistered, drawn, Vec::new()));
                }
                // Each dataset is read once, however many parts name it.
                let mut read: std::collections::BTreeMap<&str, Vec<Row>> = Default::default();
                for p in parts {
                    if !read.contains_key(p.dataset.as_str()) {
                        let rows = self.dataset_rows(&p.dataset)?.unwrap_or_default();
                        read.insert(p.dataset.as_str(), rows);
                    }
                }
                let mut loaded: Vec<(&[Row], u64)> = Vec::new();
                let mut out_bytes = 0u64;
                for p in parts {
                    let rows = read.get(p.dataset.as_str()).map_or(&[][..], |r| &r[..]);
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
