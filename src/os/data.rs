//! Datasets as the OS sees them: registered rows and their sizes, protected test items, the
//! contamination scan, and the generator's draws outside the protected items.

use std::fs;
use std::io::Write;

use super::*;
use crate::policy::SizeFact;
use crate::policy::contamination::{EvalSet, Hit, ScanConfig, ScanIndex, Scanner};

/// Most hits a scan collects (evidence lists a few; the count says how many items matched).
const HIT_LIMIT: usize = 50;

/// Bytes of training text (prompt + answer) of rows: what `policy.max_dataset_bytes` bounds.
pub(in crate::os) fn text_bytes(rows: &[types::Row]) -> u64 {
    rows.iter()
        .map(|r| (r.prompt.len() + r.answer.len()) as u64)
        .sum()
}

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

    /// A registered dataset's size without reading it: (rows, stored bytes). Stored JSON Lines
    /// are never shorter than their training text, so the bytes bound the text from above.
    pub(in crate::os) fn dataset_size(&self, name: &str) -> Result<Option<(u64, u64)>> {
        match self.index.dataset(name)? {
            Some((sha, _, rows)) => {
                let path = self.store.path(&sha);
                let bytes = fs::metadata(&path)
                    .at("cannot stat dataset object", &path)?
                    .len();
                Ok(Some((rows, bytes)))
            }
            None => Ok(None),
        }
    }

    /// Whether a projected size is within the study's dataset bounds.
    pub(in crate::os) fn within_bounds(&self, s: &SizeFact) -> bool {
        s.rows <= self.config.policy.max_dataset_rows
            && s.bytes <= self.config.policy.max_dataset_bytes
    }

    /// Every task's splits no agent may train on: the test split, the sealed split (never shown
    /// to anyone; protected like the test split so that the tripwire compares like with like),
    /// the dev split (the evidence reviewers rank on, unless `policy.train_on_dev`) and its hidden
    /// twin (protected like dev so that the dev tripwire compares like with like).
    ///
    /// They are prepared for the contamination scan (with the task's normal form, if it names
    /// one).
    ///
    /// Preparing them (n-grams, normal forms) costs far more than reading them, so a handle keeps
    /// what it prepared under a fingerprint of every protected file's bytes and the scan's
    /// settings, and the files' `stat` identities when it read them: while those hold (inode,
    /// size, modification and change times — a change time no process can set back), nothing is
    /// read; otherwise the files are read and hashed, and prepared again only if their bytes (or
    /// the settings) changed.
    pub(in crate::os) fn protected_sets(&self) -> Result<std::sync::Arc<Vec<EvalSet>>> {
        let cfg = self.scan_config();
        let stamp = self.protected_stamp(cfg);
        if let Some(seen) = self.eval_sets_seen.borrow().as_ref()
            && stamp.is_some()
            && seen.stamp == stamp
        {
            return Ok(seen.sets.clone());
        }
        let mut files = Vec::new();
        use sha2::Digest;
        let mut fp = sha2::Sha256::new();
        fp.update(format!("{}\0{}\0", cfg.ngram, cfg.threshold).as_bytes());
        for (name, task) in &self.config.tasks {
            for (split, set) in task.splits() {
                if split == "dev" && self.config.policy.train_on_dev {
                    continue;
                }
                let path = self.study_file(&set.path)?;
                let bytes = fs::read(&path).at("cannot read protected eval set", &path)?;
                let form = task.normal_form;
                fp.update(format!("{name}\0{split}\0{form:?}\0{}\0", bytes.len()).as_bytes());
                fp.update(&bytes);
                files.push((name.clone(), split, form, bytes));
            }
        }
        let fp: [u8; 32] = fp.finalize().into();
        let mut seen = self.eval_sets_seen.borrow_mut();
        if let Some(s) = seen.as_mut()
            && s.fp == fp
        {
            s.stamp = stamp;
            return Ok(s.sets.clone());
        }
        let mut sets = Vec::with_capacity(files.len());
        for (name, split, form, bytes) in files {
            let items = datasets::parse_eval_jsonl(&bytes, &format!("task {name} {split} split"))?;
            sets.push(EvalSet::new(&name, split, &items, cfg, form));
        }
        let sets = std::sync::Arc::new(sets);
        *seen = Some(SetsSeen {
            fp,
            stamp,
            sets: sets.clone(),
        });
        Ok(sets)
    }

    /// The protected files' identities as `stat` sees them (device, inode, size, modification
    /// and change times to the nanosecond), with the scan's settings; None when one cannot be
    /// read (the full path then reports why). Taken before the files are read: a file changed
    /// after it only makes the next call read them again.
    fn protected_stamp(&self, cfg: ScanConfig) -> Option<Vec<i64>> {
        use std::os::unix::fs::MetadataExt;
        let mut stamp = vec![cfg.ngram as i64, cfg.threshold.to_bits() as i64];
        for task in self.config.tasks.values() {
            for (split, set) in task.splits() {
                if split == "dev" && self.config.policy.train_on_dev {
                    continue;
                }
                let m = fs::metadata(self.root.join(&set.path)).ok()?;
                stamp.extend([
                    m.dev() as i64,
                    m.ino() as i64,
                    m.size() as i64,
                    m.mtime(),
                    m.mtime_nsec(),
                    m.ctime(),
                    m.ctime_nsec(),
                ]);
            }
        }
        Some(stamp)
    }

    pub(in crate::os) fn scan_config(&self) -> ScanConfig {
        ScanConfig {
            ngram: self.config.policy.contamination_ngram as usize,
            threshold: self.config.policy.contamination_threshold,
        }
    }

    /// Rows that reproduce protected eval items (evidence for the contamination rule).
    pub fn scan_for_contamination(&self, rows: &[types::Row]) -> Result<Vec<Hit>> {
        self.scan_union(&[rows])
    }

    /// Registered datasets, by name, scanned as the union a run_sft trains on (a name with no
    /// rows adds none).
    pub(in crate::os) fn scan_datasets<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<Hit>> {
        let mut parts = Vec::new();
        for name in names {
            parts.push(self.dataset_rows(name)?.unwrap_or_default());
        }
        let views: Vec<&[types::Row]> = parts.iter().map(Vec::as_slice).collect();
        self.scan_union(&views)
    }

    /// The union of several datasets, scanned as the one sequence a run_sft trains on.
    pub fn scan_union(&self, parts: &[&[types::Row]]) -> Result<Vec<Hit>> {
        let sets = self.protected_sets()?;
        Ok(self.scanner(&sets).scan_parts(parts, HIT_LIMIT))
    }

    /// A scanner over the protected sets `protected_sets` gave, with their index built once
    /// for as long as they are the sets in force.
    fn scanner<'s>(&self, sets: &'s std::sync::Arc<Vec<EvalSet>>) -> Scanner<'s> {
        let mut seen = self.scan_index_seen.borrow_mut();
        let (ix, reader) = match seen.as_ref() {
            Some((for_sets, ix, reader)) if std::sync::Arc::ptr_eq(for_sets, sets) => {
                (ix.clone(), reader.clone())
            }
            _ => {
                let ix = std::sync::Arc::new(ScanIndex::new(sets, self.scan_config()));
                // A code task's programs are read by running them too, under this rsim's
                // sandbox, on the study's probes: drawn from its secret (kept for the study's
                // life, known to no one outside it), their readings kept beside it; without a
                // secret, fresh ones, remembered by no file.
                let rsim = self
                    .rsim_bin
                    .clone()
                    .map_or_else(crate::os::current_rsim, Ok);
                let (seed, store) = match self.secret() {
                    Ok(mut salted) => {
                        salted.extend_from_slice(b"/behaviour-probes");
                        let h = crate::util::hash::sha256_hex(&salted);
                        let seed = u64::from_str_radix(&h[..16], 16).unwrap_or(0);
                        (seed, Some(paths::gate_readings_path(&self.root)))
                    }
                    Err(_) => (rand::random(), None),
                };
                let reader = std::sync::Arc::new(crate::train::behaviour::Reader::new(
                    rsim.map_err(|e| e.message),
                    seed,
                    store,
                ));
                *seen = Some((sets.clone(), ix.clone(), reader.clone()));
                (ix, reader)
            }
        };
        Scanner::with_index(sets, self.scan_config(), ix).running_programs(reader)
    }

    /// The study's secret salt (created on first use; in `.rsim/`, never in the record).
    fn secret(&self) -> Result<Vec<u8>> {
        let path = paths::secret_path(&self.root);
        if let Ok(s) = fs::read(&path) {
            return Ok(s);
        }
        let fresh = format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(fresh.as_bytes())
                    .at("cannot write the study secret", &path)?;
                Ok(fresh.into_bytes())
            }
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                fs::read(&path).at("cannot read the study secret", &path)
            }
            Err(e) => Err(e).at("cannot create the study secret", &path),
        }
    }

    /// The generator's rows for a request: `n` rows drawn from a seed salted with the study's
    /// secret, skipping every row the gate would refuse on its own (a protected item in any form
    /// the gate knows) or beside the row kept before it (the gate reads across adjacent rows:
    /// tiny-diff2's reversed `…=r02-` then `98-0=…` reads as the problem `2-98`), every row
    /// posing a protected item's problem (`Generator::problem_key`), and every **decoy**: a
    /// keyed one in `DECOY_EVERY` of the other problems,
    /// chosen by the study's secret on the problem's key (`Generator::problem_key`) and the same
    /// in every dataset of the study. A problem generated data lacks is then as likely a decoy as
    /// protected, so the data does not name the protected problems. Neither the number skipped
    /// nor an empty result ever reaches the caller: the result has exactly `n` rows, and which
    /// rows were drawn cannot be recomputed outside the study (so a dataset's hash says nothing
    /// about which draws were skipped).
    pub(in crate::os) fn generate_outside_protected(
        &self,
        g: &Generator,
    ) -> Result<Vec<types::Row>> {
        let secret = self.secret()?;
        let mut salted = secret.clone();
        salted.extend_from_slice(g.salt());
        salted.extend_from_slice(&g.seed().to_le_bytes());
        let digest = crate::util::hash::sha256_hex(&salted);
        let seed = u64::from_str_radix(&digest[..16], 16)
            .map_err(|e| Error::internal(format!("salted seed: {e}")))?;
        let sets = self.protected_sets()?;
        let scanner = self.scanner(&sets);
        // The problems protected items pose, in the generator's sense (for code, compositions:
        // a composition a split holds is held out of generated data in every letter).
        let held: std::collections::HashSet<String> = sets
            .iter()
            .flat_map(|s| s.prompts())
            .map(|p| {
                g.problem_key(&types::Row {
                    prompt: p.to_string(),
                    answer: String::new(),
                })
            })
            .collect();
        let n = g.n() as usize;
        // Protected items are a small share of any problem space the generator has (one digit:
        // 100 problems); a request that cannot be met in 4n + 10000 draws is refused without
        // saying which draws were skipped.
        let attempts = n.saturating_mul(4).saturating_add(10_000);
        let mut rows = Vec::with_capacity(n);
        let mut drawn = crate::policy::contamination::Drawn::default();
        for row in g.stream(seed).take(attempts) {
            let key = g.problem_key(&row);
            if !held.contains(&key) && !is_decoy(&secret, &key) && scanner.accepts(&mut drawn, &row)
            {
                rows.push(row);
                if rows.len() == n {
                    return Ok(rows);
                }
            }
        }
        Err(Error::invalid(format!(
            "source: the generator could not draw {n} rows outside the protected eval sets in \
             {attempts} draws ({})",
            g.too_few()
        )))
    }
}

/// A built-in generator's request.
pub(in crate::os) enum Generator<'a> {
    Arith(&'a types::ArithParams),
    Code(&'a types::CodeParams),
}

impl Generator<'_> {
    /// The generator of a built-in generator source.
    pub(in crate::os) fn of(source: &types::DatasetSource) -> Option<Generator<'_>> {
        match source {
            types::DatasetSource::Arith(p) => Some(Generator::Arith(p)),
            types::DatasetSource::Code(p) => Some(Generator::Code(p)),
            _ => None,
        }
    }

    /// The size of what it will generate, known before anything is: `n` rows, each within the
    /// generator's bound on a row's bytes.
    pub(in crate::os) fn size(&self) -> SizeFact {
        let per_row = match self {
            Generator::Arith(p) => datasets::arith_max_row_bytes(p),
            Generator::Code(p) => code_tasks::code_max_row_bytes(p),
        };
        SizeFact {
            what: "the generated dataset".into(),
            rows: self.n(),
            bytes: self.n().saturating_mul(per_row),
        }
    }

    fn salt(&self) -> &'static [u8] {
        match self {
            Generator::Arith(_) => b"\0arith\0",
            Generator::Code(_) => b"\0code\0",
        }
    }

    fn seed(&self) -> u64 {
        match self {
            Generator::Arith(p) => p.seed,
            Generator::Code(p) => p.seed,
        }
    }

    fn n(&self) -> u64 {
        match self {
            Generator::Arith(p) => p.n,
            Generator::Code(p) => p.n,
        }
    }

    fn stream(&self, seed: u64) -> Box<dyn Iterator<Item = types::Row>> {
        match self {
            Generator::Arith(p) => Box::new(datasets::arith_stream(p, seed)),
            Generator::Code(p) => Box::new(code_tasks::code_stream(p, seed)),
        }
    }

    /// What makes two rows one problem, for the decoys: for arithmetic the normal form (`12+34`
    /// and `34+12` are one problem; for sorting, `530912` and `219035`); for code the composition
    /// (`del a;add b` and `del c;add d` are one, as the gate's code skeleton sees their programs),
    /// whatever the style.
    fn problem_key(&self, row: &types::Row) -> String {
        match self {
            Generator::Arith(p) => {
                let keys = crate::policy::normal_form::keys_of_text(
                    crate::config::NormalForm::of(p.op),
                    &row.prompt,
                );
                // A problem its form gives no key (a one-digit string to sort) is its own.
                if keys.is_empty() {
                    row.prompt.clone()
                } else {
                    keys.join("\n")
                }
            }
            Generator::Code(_) => code_tasks::composition_key(&row.prompt),
        }
    }

    fn too_few(&self) -> String {
        match self {
            Generator::Arith(p) => {
                format!("digits {} may be too few for the protected items", p.digits)
            }
            Generator::Code(p) => format!(
                "max_ops {} may leave too few compositions outside them",
                p.max_ops
            ),
        }
    }
}

/// One in this many of the problems that are not protected is a decoy the generator never draws.
pub(in crate::os) const DECOY_EVERY: u64 = 16;

/// Whether a generated row's problem is one of the study's decoys: keyed by the study's secret on
/// the problem's key (`Generator::problem_key`), so every dataset of the study lacks the same
/// decoys and no one without the secret can tell them apart.
fn is_decoy(secret: &[u8], key: &str) -> bool {
    let mut keyed = secret.to_vec();
    keyed.extend_from_slice(b"\0decoy\0");
    keyed.extend_from_slice(key.as_bytes());
    let digest = crate::util::hash::sha256_hex(&keyed);
    u64::from_str_radix(&digest[..16], 16).is_ok_and(|v| v % DECOY_EVERY == 0)
}

/// The protected eval sets a handle prepared (`Study::protected_sets`): under the fingerprint of
/// their files' bytes and the scan's settings, and the files' `stat` identities when last read.
pub(in crate::os) struct SetsSeen {
    fp: [u8; 32],
    stamp: Option<Vec<i64>>,
    sets: std::sync::Arc<Vec<EvalSet>>,
}
