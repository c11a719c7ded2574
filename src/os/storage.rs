//! Storage accounting and `rsim gc`: one count of the bytes a study holds, per study and per
//! agent, across the object store (checkpoints, kept checkpoints, logs, datasets), the job
//! directories and the record (git), checked against `budgets.storage_bytes` and
//! `budgets.agent_storage_bytes` before anything that stores more (a job, a registration).
//!
//! Each stored object is charged once, to the agent whose action first referenced it (a
//! checkpoint: its manifest and every file it lists); a job directory to the agent that ran the
//! job; the record to the study (`.git` on disk) and, per agent, the bytes of the agent's action
//! records (the JSON each commit holds, before git compresses it). Objects nothing in the record
//! references — left by a job that failed after storing, or by a record that never landed — are
//! counted to the study and are what `rsim gc` removes.
//!
//! A finished job's outputs are moved into the store (`ObjectStore::absorb_dir`), never copied,
//! so a checkpoint is held once; `rsim gc` also removes what older job directories still hold
//! under `out/` once their job is recorded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::model::paths;
use crate::os::Study;
use crate::util::error::{Error, IoContext, Result};

/// How old a storage count may be when an action is checked against the storage budgets.
pub const FRESH: Duration = Duration::from_secs(5);

/// Bytes in each place.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Bytes {
    /// Objects in the store.
    pub objects: u64,
    /// Job directories.
    pub jobs: u64,
    /// The record.
    pub record: u64,
    pub total: u64,
}

impl Bytes {
    fn add(&mut self, objects: u64, jobs: u64, record: u64) {
        self.objects += objects;
        self.jobs += jobs;
        self.record += record;
        self.total = self.objects + self.jobs + self.record;
    }
}

/// What the study holds on disk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StorageUse {
    /// The whole study: every object in the store (referenced or not, temporary files
    /// included), every job directory, `.git`.
    pub study: Bytes,
    /// Each agent's share (see the module doc); their sum is at most the study's.
    pub agents: BTreeMap<String, Bytes>,
    /// Objects nothing in the record references, and their bytes (what `rsim gc` removes).
    pub unreferenced_objects: usize,
    pub unreferenced_bytes: u64,
    /// `budgets.storage_bytes` and `budgets.agent_storage_bytes`.
    pub budget: u64,
    pub agent_budget: u64,
}

/// What `rsim gc` removed (or, with `--dry-run`, would remove).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// Unreferenced objects (and temporary files) older than the grace period.
    pub objects: usize,
    pub object_bytes: u64,
    /// Recorded jobs whose directory still held outputs (`out/`, the log).
    pub job_dirs: usize,
    pub job_bytes: u64,
    /// Unreferenced objects kept because they are younger than the grace period.
    pub kept_recent: usize,
}

/// Bytes under `p` (files' lengths; symlinks are not followed).
fn du(p: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(p)
        .map(|r| r.flatten().map(|e| du(&e.path())).sum())
        .unwrap_or(0)
}

/// Every file in the store (objects and temporary files) with its size and modification time.
fn store_files(objects: &Path) -> Vec<(std::path::PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    let mut walk = vec![objects.to_path_buf()];
    while let Some(dir) = walk.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                walk.push(e.path());
            } else {
                out.push((e.path(), meta.len(), meta.modified().ok()));
            }
        }
    }
    out
}

impl Study {
    /// Each object the record references (a checkpoint: its manifest and its files), with the
    /// agent it is charged to: the first to reference it.
    fn referenced_objects(&self) -> Result<HashMap<String, String>> {
        let mut owner: HashMap<String, String> = HashMap::new();
        for (sha, kind, agent) in self.index.artifact_refs()? {
            if owner.contains_key(&sha) {
                continue;
            }
            if kind == crate::model::ArtifactKind::Checkpoint.as_str()
                && let Ok(m) = self.store.manifest(&sha)
            {
                for f in m.files.into_values() {
                    owner.entry(f).or_insert_with(|| agent.clone());
                }
            }
            owner.insert(sha, agent);
        }
        Ok(owner)
    }

    /// The job directories of this study: (job id, path).
    fn job_dirs(&self) -> Vec<(String, std::path::PathBuf)> {
        let Ok(rd) = std::fs::read_dir(paths::jobs_dir(&self.root)) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                (name.starts_with("j-") && e.file_type().ok()?.is_dir()).then(|| (name, e.path()))
            })
            .collect()
    }

    /// What the study holds on disk, per study and per agent.
    pub fn storage_use(&self) -> Result<StorageUse> {
        let objects = self.referenced_objects()?;
        let mut u = StorageUse {
            budget: self.config.budgets.storage_bytes,
            agent_budget: self.config.budgets.agent_storage_bytes,
            ..StorageUse::default()
        };
        let store_root = paths::objects_dir(&self.root);
        for (path, len, _) in store_files(&store_root) {
            u.study.add(len, 0, 0);
            let charged = object_sha(&store_root, &path).and_then(|sha| objects.get(&sha));
            match charged {
                Some(agent) => u.agents.entry(agent.clone()).or_default().add(len, 0, 0),
                None => {
                    u.unreferenced_objects += 1;
                    u.unreferenced_bytes += len;
                }
            }
        }
        let job_agents = self.index.job_agents()?;
        for (id, dir) in self.job_dirs() {
            let bytes = du(&dir);
            u.study.add(0, bytes, 0);
            let agent = job_agents
                .get(&id)
                .cloned()
                .or_else(|| super::recovery::read_intent(&dir).map(|i| i.agent));
            if let Some(a) = agent {
                u.agents.entry(a).or_default().add(0, bytes, 0);
            }
        }
        u.study.add(0, 0, du(&self.root.join(".git")));
        for (agent, bytes) in self.index.record_bytes_by_agent()? {
            u.agents.entry(agent).or_default().add(0, 0, bytes);
        }
        Ok(u)
    }

    /// The storage fact an action that stores more is checked against: the study's bytes and the
    /// calling agent's.
    /// The count is taken again when the last one this handle took is older than `FRESH` (a
    /// count walks the store, the job directories and `.git`; a loop of registrations must not
    /// pay it each time).
    pub(in crate::os) fn storage_fact(&self, agent: &str) -> Result<crate::policy::StorageBytes> {
        let mut seen = self.storage_seen.borrow_mut();
        let stale = seen.as_ref().is_none_or(|(at, _)| at.elapsed() >= FRESH);
        if stale {
            *seen = Some((std::time::Instant::now(), self.storage_use()?));
        }
        let u = seen
            .as_ref()
            .map(|(_, u)| u)
            .ok_or_else(|| Error::internal("no storage count"))?;
        Ok(crate::policy::StorageBytes {
            study: u.study.total,
            agent: u.agents.get(agent).map_or(0, |b| b.total),
        })
    }

    /// Remove what nothing in the record references: store objects (and temporary files) older
    /// than `grace`, and the outputs recorded jobs still hold in their directories. Runs only
    /// while no job runs or waits (a job stores its outputs just before its record lands).
    pub fn gc(&self, dry_run: bool, grace: Duration) -> Result<GcReport> {
        self.before_write()?;
        let running = self.running_jobs().len();
        let queued = self.index.queue()?.len();
        if running + queued > 0 {
            return Err(Error::conflict(format!(
                "{running} job(s) running and {queued} waiting: rsim gc runs when no job is in \
                 flight (a job stores its outputs just before its action is recorded)"
            )));
        }
        let mut rep = GcReport {
            dry_run,
            ..GcReport::default()
        };
        let objects: HashSet<String> = self.referenced_objects()?.into_keys().collect();
        let store_root = paths::objects_dir(&self.root);
        let now = SystemTime::now();
        for (path, len, modified) in store_files(&store_root) {
            if object_sha(&store_root, &path).is_some_and(|sha| objects.contains(&sha)) {
                continue;
            }
            let age = modified.and_then(|m| now.duration_since(m).ok());
            if age.is_none_or(|a| a < grace) {
                rep.kept_recent += 1;
                continue;
            }
            if !dry_run {
                std::fs::remove_file(&path).at("cannot remove", &path)?;
            }
            rep.objects += 1;
            rep.object_bytes += len;
        }
        let recorded = self.index.job_agents()?;
        for (id, dir) in self.job_dirs() {
            if !recorded.contains_key(&id) {
                continue;
            }
            let mut freed = 0;
            for leftover in [dir.join("out"), dir.join(crate::model::paths::JOB_LOG_FILE)] {
                let Ok(meta) = std::fs::symlink_metadata(&leftover) else {
                    continue;
                };
                freed += du(&leftover);
                if dry_run {
                    continue;
                }
                if meta.is_dir() {
                    std::fs::remove_dir_all(&leftover).at("cannot remove", &leftover)?;
                } else {
                    std::fs::remove_file(&leftover).at("cannot remove", &leftover)?;
                }
            }
            if freed > 0 {
                rep.job_dirs += 1;
                rep.job_bytes += freed;
            }
        }
        Ok(rep)
    }
}

/// The sha256 an object file of the store is named by (`sha256/ab/cdef…`), if it is one.
fn object_sha(store_root: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(store_root.join("sha256")).ok()?;
    let mut parts = rel.iter();
    let (a, b) = (parts.next()?.to_str()?, parts.next()?.to_str()?);
    if parts.next().is_some() {
        return None;
    }
    let sha = format!("{a}{b}");
    crate::util::hash::is_sha256(&sha).then_some(sha)
}
