//! Datasets as the OS sees them: registered rows, protected test items, the contamination scan.

use std::fs;

use super::*;

impl Study {
    /// The rows of a registered dataset (hash-verified), or None if no dataset has that name.
    pub(in crate::os) fn dataset_rows(&self, name: &str) -> Result<Option<Vec<types::Row>>> {
        match self.index.dataset(name)? {
            Some((sha, _, _)) => Ok(Some(datasets::parse_jsonl(
                &self.store.get(&sha)?,
                &format!("dataset {name}"),
            )?)),
            None => Ok(None),
        }
    }

    /// Every task's protected test split: (task, items).
    pub(in crate::os) fn protected_test_items(&self) -> Result<Vec<(String, Vec<types::Row>)>> {
        let mut out = Vec::new();
        for (name, task) in &self.config.tasks {
            let path = self.study_file(&task.test.path)?;
            let bytes = fs::read(&path).at("cannot read protected eval set", &path)?;
            out.push((
                name.clone(),
                datasets::parse_jsonl(&bytes, &format!("task {name} test split"))?,
            ));
        }
        Ok(out)
    }

    /// Every task's protected test split, prepared for the contamination scan.
    pub(in crate::os) fn protected_sets(
        &self,
    ) -> Result<Vec<crate::policy::contamination::EvalSet>> {
        let cfg = self.scan_config();
        Ok(self
            .protected_test_items()?
            .iter()
            .map(|(name, items)| {
                crate::policy::contamination::EvalSet::new(name, "test", items, cfg)
            })
            .collect())
    }

    pub(in crate::os) fn scan_config(&self) -> crate::policy::contamination::ScanConfig {
        crate::policy::contamination::ScanConfig {
            ngram: self.config.policy.contamination_ngram as usize,
            threshold: self.config.policy.contamination_threshold,
        }
    }

    /// Rows that reproduce protected eval items (evidence for the contamination rule).
    pub fn scan_for_contamination(
        &self,
        rows: &[types::Row],
    ) -> Result<Vec<crate::policy::contamination::Hit>> {
        Ok(crate::policy::contamination::scan(
            rows,
            &self.protected_sets()?,
            self.scan_config(),
            50,
        ))
    }

    /// Generated rows minus those whose prompt is a protected test item's (after normalization).
    pub(in crate::os) fn decontaminate(
        &self,
        rows: Vec<types::Row>,
    ) -> Result<(Vec<types::Row>, u64)> {
        let protected: std::collections::HashSet<Vec<String>> = self
            .protected_test_items()?
            .iter()
            .flat_map(|(_, items)| {
                items
                    .iter()
                    .map(|i| crate::policy::contamination::tokens(&i.prompt))
            })
            .collect();
        let before = rows.len();
        let kept: Vec<types::Row> = rows
            .into_iter()
            .filter(|r| !protected.contains(&crate::policy::contamination::tokens(&r.prompt)))
            .collect();
        let dropped = (before - kept.len()) as u64;
        Ok((kept, dropped))
    }
}
