//! The Experiment OS API: the one code path for every action. Faces (CLI, MCP, LSP,
//! orchestrator) call `Study::call` with JSON or the typed methods; none writes the record.
//!
//! Each action: validate (JSON Schema + semantic checks) → gather facts → policy → execute
//! (jobs, object store) → record (one git commit, compare-and-swap) → index.

mod actions;
pub mod audit;
mod campaign;
pub use actions::FreshEvidence;
pub use campaign::CampaignLease;
mod data;
mod diff;
pub mod fsck;
pub mod genesis;
mod jobrun;
mod jobview;
pub mod overview;
pub mod owner;
mod paging;
pub use overview::{DagOverview, OverviewNode};
mod queries;
mod recovery;
pub use recovery::OpenJob;
pub mod schemas;
pub mod session;
pub mod storage;
#[cfg(test)]
mod tests;
pub mod trend;
pub mod verify;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::api::actions::{AnyRequest, Kind, dispatch};
use crate::api::schema;

pub use crate::api::actions::Execute;
use crate::api::types::{self, *};
use crate::config::{CONFIG_FILE, StudyConfig};
use crate::jobs::{JobRunner, JobSpec};
use crate::model::paths;
use crate::model::*;
use crate::policy::{self, Facts, Request};
use crate::record::commit::{Prepared, Writer};
use crate::record::dag::Dag;
use crate::record::index::Index;
use crate::record::store::ObjectStore;
use crate::record::{self, NodeSnapshot, Record, TreeFile};
use crate::train::{code_tasks, datasets};
use crate::util::error::{Error, ErrorKind, IoContext, Result};
use recovery::read_intent;

/// This process's quick writes (no job), one at a time, served round-robin by agent: a loop
/// with many calls in flight waits its turn behind each other agent's next call.
static QUICK_WRITES: crate::util::fair::FairGate = crate::util::fair::FairGate::new();

pub use crate::model::ROOT_NODE;
pub use crate::model::paths::STATE_DIR;
/// An open study: config, record, index, object store and job runner.
pub struct Study {
    root: PathBuf,
    config: StudyConfig,
    record: Record,
    index: Index,
    store: ObjectStore,
    runner: Box<dyn JobRunner>,
    /// The binary `@rsim` in job commands stands for (default: this executable).
    rsim_bin: Option<PathBuf>,
    /// Whether the first write's preparation (`before_write`) has run.
    prepared: std::cell::Cell<bool>,
    /// The last count of what the study holds on disk, and when it was taken (`storage`):
    /// actions that store more are checked against a count at most `storage::FRESH` old.
    storage_seen: std::cell::RefCell<Option<(std::time::Instant, storage::StorageUse)>>,
    /// The protected eval sets as the contamination scan prepared them (`data::protected_sets`).
    eval_sets_seen: std::cell::RefCell<Option<data::SetsSeen>>,
    /// The contamination scan's index of the eval sets last prepared (`data::protected_sets`),
    /// for as long as those sets are the ones in force.
    #[allow(clippy::type_complexity)]
    scan_index_seen: std::cell::RefCell<
        Option<(
            std::sync::Arc<Vec<crate::policy::contamination::EvalSet>>,
            std::sync::Arc<crate::policy::contamination::ScanIndex>,
            std::sync::Arc<crate::train::behaviour::Reader>,
        )>,
    >,
    /// Sizes of store objects read once (an object's bytes never change under its hash).
    stored_sizes: std::cell::RefCell<std::collections::HashMap<String, u64>>,
    /// Running totals of the registered datasets (`register_dataset::registered_totals`).
    dataset_totals: std::cell::RefCell<Option<actions::DatasetTotals>>,
}

impl Study {
    /// Open the study at `root` (the directory holding rsim.toml and .git), with the job backend
    /// its committed config names (`[backend] kind`).
    pub fn open(root: &Path) -> Result<Study> {
        Self::open_inner(root, None)
    }

    pub fn open_with_runner(root: &Path, runner: Box<dyn JobRunner>) -> Result<Study> {
        Self::open_inner(root, Some(runner))
    }

    /// Open with the runner the committed config chooses (local or Slurm), wrapped by `wrap`
    /// (e.g. a face that wants to know when a job starts).
    pub fn open_wrapping_runner(
        root: &Path,
        wrap: impl FnOnce(Box<dyn JobRunner>) -> Box<dyn JobRunner>,
    ) -> Result<Study> {
        let canonical = root
            .canonicalize()
            .map_err(|e| Error::invalid(format!("{}: {e}", root.display())))?;
        let config = Record::open(&canonical)
            .and_then(|record| load_committed_config(&record, &canonical))
            .map_err(|e| crate::record::explain_damage(&canonical.join(".git"), e))?;
        Self::open_inner(root, Some(wrap(crate::jobs::runner_for(&config.backend))))
    }

    fn open_inner(root: &Path, runner: Option<Box<dyn JobRunner>>) -> Result<Study> {
        let root = root
            .canonicalize()
            .map_err(|e| Error::invalid(format!("{}: {e}", root.display())))?;
        Self::open_canonical(&root, runner)
            .map_err(|e| crate::record::explain_damage(&root.join(".git"), e))
    }

    fn open_canonical(root: &Path, runner: Option<Box<dyn JobRunner>>) -> Result<Study> {
        let root = root.to_path_buf();
        let mut record = Record::open(&root)?;
        let config = load_committed_config(&record, &root)?;
        if config.record.fsync {
            record.enable_fsync()?;
        }
        let runner = runner.unwrap_or_else(|| crate::jobs::runner_for(&config.backend));
        refuse_foreign_state(&root, record.repo())?;
        let state = root.join(STATE_DIR);
        fs::create_dir_all(&state).at("cannot create", &state)?;
        let index_path = paths::index_path(&root);
        if !index_stamp_holds(&index_path) {
            // State this machine did not build (a copied or handed-over study, or one from
            // before stamps): nothing below .rsim/ may be a symlink, anywhere.
            refuse_symlinks_below(&root, &state)?;
        }
        let fresh = !index_is_ours(&index_path)?;
        let mut index = Index::open(&index_path)?;
        index.set_durable(config.record.fsync);
        if index.needs_rebuild || fresh {
            if !fresh {
                tracing::warn!(
                    "the index was written by another rsim version; rebuilding it from git"
                );
            }
            index.rebuild(&record)?;
            index.needs_rebuild = false;
            mark_index_ours(&index_path);
        }
        if record.read_only().is_some() {
            catch_up_with_fetched_refs(&mut index, &record)?;
        }
        // History that is not the study's is never shown as if it were: say so on every open.
        let refused = index.refused_nodes()?;
        if !refused.is_empty() {
            // A handful named, each cut short: a repository with thousands of crafted branches
            // gets one short line, not megabytes on every command.
            const NAMED: usize = 5;
            let mut named: Vec<String> = refused
                .iter()
                .take(NAMED)
                .map(|(n, why)| {
                    crate::util::text::sanitize_line_within(&format!("{n}: {why}"), 300)
                })
                .collect();
            if refused.len() > NAMED {
                named.push(format!("… and {} more", refused.len() - NAMED));
            }
            tracing::warn!(
                "{} node branch(es) of this repository are not this study's history and are left out of the views (`rsim fsck` lists them, `rsim verify` names each commit): {}",
                refused.len(),
                named.join("; ")
            );
        }
        let repaired = index.repair(&record)?;
        if repaired > 0 {
            tracing::info!(
                repaired,
                "index caught up with git after an interrupted write"
            );
        }
        let store = ObjectStore::new(state.join("objects")).durable(config.record.fsync);
        // Opening only reads (and builds the index, which is derived from git): orphaned jobs are
        // recorded, and dead writers' claims dropped, by the first write (`before_write`).
        Ok(Study {
            root,
            config,
            record,
            index,
            store,
            runner,
            rsim_bin: None,
            prepared: std::cell::Cell::new(false),
            storage_seen: std::cell::RefCell::new(None),
            eval_sets_seen: std::cell::RefCell::new(None),
            stored_sizes: Default::default(),
            dataset_totals: Default::default(),
            scan_index_seen: Default::default(),
        })
    }

    /// Commit the study's public key to `main` (a study signed before rsim recorded it).
    pub fn publish_key(&self) -> Result<git2::Oid> {
        self.record.publish_key()
    }

    /// Replace the study's signing key (see `Record::rotate_key`): old and new fingerprints.
    pub fn rotate_key(&mut self) -> Result<(git2::Oid, String, String)> {
        let root = self.root.clone();
        self.record.rotate_key(&root)
    }

    /// Pack merges since this handle opened the study (`Record::packs_merged_since_open`): a
    /// long-lived holder opens the study again after a few, to let go of the packs that are gone.
    pub fn packs_merged_since_open(&self) -> u64 {
        self.record.packs_merged_since_open()
    }

    /// Why this study is open read-only (a clone without the study's private key), if it is.
    pub fn read_only(&self) -> Option<&str> {
        self.record.read_only()
    }

    /// What every write does first: refuse in a read-only clone (`read-only clone: …`); then, once
    /// per opened study, record the jobs whose writers died and drop those writers' claims.
    /// Views and queries never do this: reading a study acts on nothing.
    #[tracing::instrument(level = "trace", name = "before_write", skip_all)]
    pub(crate) fn before_write(&self) -> Result<()> {
        self.record.refuse_write()?;
        if self.prepared.replace(true) {
            return Ok(());
        }
        // Recovery must never keep a write from running: a failure is reported and retried.
        let recovered = self.recover_open_jobs();
        // Claims of writers that died are void now that their jobs are recovered.
        if let Err(e) = self.index.drop_dead_claims() {
            tracing::warn!("could not drop the claims of dead writers: {}", e.message);
        }
        match recovered {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                n,
                "recorded jobs whose rsim process died before recording them"
            ),
            Err(e) => tracing::warn!("could not record orphaned jobs yet: {}", e.message),
        }
        Ok(())
    }

    /// Make `@rsim` in job commands run this binary (tests and embedders whose executable is not rsim).
    pub fn set_rsim_bin(&mut self, bin: PathBuf) {
        self.rsim_bin = Some(bin);
    }

    /// The node branches git holds, for the node budget beside the index's count: an index a
    /// failed write left behind git (a process out of file descriptors) must not undercount the
    /// nodes that exist.
    pub(crate) fn nodes_in_git(&self) -> Result<u64> {
        Ok(u64::try_from(self.record.node_tips()?.len()).unwrap_or(u64::MAX))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn config(&self) -> &StudyConfig {
        &self.config
    }
    pub fn record(&self) -> &Record {
        &self.record
    }
    pub fn index(&self) -> &Index {
        &self.index
    }
    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// Timed signatures and verifications of `node`'s tip commit, µs each (`rsim bench`).
    pub fn signing_cost(&self, node: &str, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        self.record.signing_cost(node, n)
    }

    /// Rebuild the index from git alone.
    pub fn reindex(&mut self) -> Result<crate::record::index::Rebuilt> {
        self.index.rebuild(&self.record)
    }

    /// The commit protocol over this study's record and index.
    fn writer(&self) -> Writer<'_> {
        Writer::new(&self.record, &self.index)
    }

    /// Record a policy rejection on `node` and return the error the caller sees (kind
    /// `rejected`, naming the rule). What is recorded is bounded: a request larger than
    /// `MAX_RECORDED_REQUEST` bytes is recorded as its digest, size and top-level fields
    /// (`bounded_request`). Identical refusals from one agent (same action, node, rule and
    /// request) are coalesced: recorded the 1st, 2nd, 4th, 8th… time and once per
    /// `REFUSAL_WINDOW_S`, each record counting the repeats it stands for (`result.repeats`, which
    /// the audit sums), so a loop adds a logarithmic number of commits. Rejections that answer
    /// something about the protected items (`Rule::PROBES`) are each recorded: the probing limit
    /// counts them.
    fn record_rejection(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: Value,
        decision: Decision,
    ) -> Error {
        let rule = decision.rule.clone().unwrap_or_default();
        let reason = decision.reason.clone().unwrap_or_default();
        let mut e = Error::new(
            ErrorKind::Rejected,
            format!("rejected by policy rule {rule}: {reason}"),
        );
        e.rule = Some(rule.clone());
        let bytes = crate::util::hash::json_bytes(&serde_json::json!([
            action.as_str(),
            node,
            rule,
            &request
        ]))
        .unwrap_or_default();
        let digest = crate::util::hash::sha256_hex(&bytes);
        let probe = rule::Rule::PROBES.iter().any(|r| r.as_str() == rule);
        let (record, repeats) = if probe {
            (true, 1)
        } else {
            self.index
                .note_refusal(
                    &caller.agent,
                    &digest,
                    crate::util::proc::now_epoch_s(),
                    REFUSAL_WINDOW_S,
                )
                .unwrap_or((true, 1))
        };
        if !record {
            e.message.push_str(
                " (the same refusal as one already recorded: counted, not recorded again)",
            );
            return e;
        }
        let recorded = bounded_request(&request);
        let res = self.writer().append(node, caller, action, &recorded, |_| {
            let mut p = Prepared::rejected(decision.clone());
            if repeats > 1 {
                p.result = Some(serde_json::json!({ "repeats": repeats }));
            }
            Ok(p)
        });
        match res {
            Ok((oid, _)) => e.commit = Some(oid),
            Err(err) => e.message.push_str(&format!(
                " (and the rejection could not be recorded: {})",
                err.message
            )),
        }
        e
    }

    /// The per-agent write rate (`policy.max_writes_per_agent_per_minute`; the owner is not
    /// throttled): `Err` with rule `throttled` for a call past it — the first of each minute
    /// recorded (bounded, on the node the request names or the root), the rest only refused.
    fn throttle(&self, caller: &Caller, action: &str, args: &Value) -> Result<()> {
        let limit = self.config.policy.max_writes_per_agent_per_minute;
        if limit == 0 || caller.role == Role::Owner {
            return Ok(());
        }
        let Some(first) =
            self.index
                .admit_write(&caller.agent, crate::util::proc::now_epoch_s(), limit)?
        else {
            return Ok(());
        };
        let reason = format!(
            "agent {} made more than {limit} write calls within a minute (policy.max_writes_per_agent_per_minute); calls are refused until the minute is over",
            caller.agent
        );
        let mut e = Error::new(
            ErrorKind::Rejected,
            format!("rejected by policy rule throttled: {reason}"),
        );
        e.rule = Some(rule::Rule::Throttled.as_str().to_string());
        let action = serde_json::from_value::<ActionName>(Value::String(action.to_string()));
        if !first {
            return Err(e);
        }
        let node = args
            .get("node")
            .and_then(Value::as_str)
            .filter(|n| self.record.node_tip(n).ok().flatten().is_some())
            .unwrap_or(ROOT_NODE);
        if let Ok(action) = action {
            let decision = Decision::reject(rule::Rule::Throttled, reason);
            let res = self
                .writer()
                .append(node, caller, action, &bounded_request(args), |_| {
                    Ok(Prepared::rejected(decision.clone()))
                });
            if let Ok((oid, _)) = res {
                e.commit = Some(oid);
            }
        }
        Err(e)
    }

    /// Append an action that may not land on a concluded node (`register_dataset`, `conclude`):
    /// the node's status is checked again on the very tip the commit protocol appends to (under
    /// its compare-and-swap), so a `conclude` that lands between the policy's check and this
    /// write turns the action into its recorded `node-concluded` rejection instead of an action
    /// on a concluded node (two racing concludes: the second is refused).
    fn commit_on_open_node(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: Value,
        mut prepare: impl FnMut(&NodeSnapshot) -> Result<Prepared>,
    ) -> Result<(String, ActionRecord)> {
        let (oid, rec) = self.commit_action(node, caller, action, request, |snap| {
            if snap.meta.status == NodeStatus::Concluded {
                return Ok(Prepared::rejected(Decision::reject(
                    rule::Rule::NodeConcluded,
                    "the node was concluded while this action was being decided; branch a new \
                     node from it to continue this direction",
                )));
            }
            prepare(snap)
        })?;
        if rec.decision.accepted() {
            return Ok((oid, rec));
        }
        let rule = rec.decision.rule.clone().unwrap_or_default();
        let mut e = Error::new(
            ErrorKind::Rejected,
            format!(
                "rejected by policy rule {rule}: {}",
                rec.decision.reason.clone().unwrap_or_default()
            ),
        );
        e.rule = Some(rule);
        e.commit = Some(oid);
        Err(e)
    }

    /// Append one action to `node` through the commit protocol.
    fn commit_action(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: Value,
        prepare: impl FnMut(&NodeSnapshot) -> Result<Prepared>,
    ) -> Result<(String, ActionRecord)> {
        self.writer()
            .append(node, caller, action, &request, prepare)
    }

    /// Load the DAG from the index.
    pub fn dag_graph(&self) -> Result<Dag> {
        Dag::load(&self.index)
    }

    /// Run any action or query from its JSON arguments (what an MCP client sends) and return its
    /// JSON result. Quick writes run one at a time in this process, so its own callers never race
    /// each other for a node id or a tip (other processes are kept apart by the commit protocol's
    /// compare-and-swap).
    #[tracing::instrument(level = "trace", name = "call", skip_all)]
    pub fn call(&self, caller: &Caller, action: &str, args: Value) -> Result<Value> {
        if schema::spec(action).is_some_and(|s| s.kind != Kind::Query) {
            check_caller(caller)?;
            self.before_write()?;
            self.throttle(caller, action, &args)?;
        }
        let req = AnyRequest::parse(action, args)?;
        let quick = schema::spec(action).is_some_and(|s| s.kind == Kind::Write);
        let _one = quick.then(|| QUICK_WRITES.enter(&caller.agent));
        dispatch(self, caller, req)
    }

    // ------------------------------------------------------------------ queries

    // ------------------------------------------------------------------ helpers

    fn require_node_tip(&self, id: &str) -> Result<git2::Oid> {
        self.record
            .node_tip(id)?
            .ok_or_else(|| Error::not_found(format!("no node {id} in this study")))
    }

    fn require_node(&self, id: &str) -> Result<NodeSnapshot> {
        let tip = self.require_node_tip(id).map_err(|e| e.context("node"))?;
        self.record.snapshot(tip)
    }

    /// A path from rsim.toml, inside the study, with symlink escapes refused.
    fn study_file(&self, rel: &str) -> Result<PathBuf> {
        crate::config::check_relative_path(rel).map_err(Error::invalid)?;
        let p = self.root.join(rel);
        let canon = p
            .canonicalize()
            .map_err(|e| Error::not_found(format!("{rel}: {e}")))?;
        if !canon.starts_with(&self.root) {
            return Err(Error::invalid(format!(
                "{rel} resolves outside the study (symlink escape)"
            )));
        }
        Ok(canon)
    }
}

use crate::model::paths::{INTENT_FILE, RECORDED_FILE};

/// Nothing a repository carries stands in for the study's own state: `.rsim/` is made by rsim on
/// this machine and never checked out. A repository that tracks anything there (job state, keys,
/// an index) or holds a symlink there is refused before anything is read, created or written
/// through it, naming what it found.
fn refuse_foreign_state(root: &Path, repo: &git2::Repository) -> Result<()> {
    let under_state = |p: &[u8]| {
        let d = STATE_DIR.as_bytes();
        p == d || (p.starts_with(d) && p.get(d.len()) == Some(&b'/'))
    };
    let mut found = Vec::new();
    for name in ["HEAD", crate::record::MAIN_REF] {
        if let Ok(tree) = repo.revparse_single(name).and_then(|o| o.peel_to_tree())
            && tree.get_name(STATE_DIR).is_some()
        {
            found.push(format!("{name} tracks {STATE_DIR}/"));
        }
    }
    if let Ok(ix) = repo.index()
        && let Some(e) = ix.iter().find(|e| under_state(&e.path))
    {
        found.push(format!(
            "git's index tracks {}",
            String::from_utf8_lossy(&e.path)
        ));
    }
    let state = root.join(STATE_DIR);
    let mut look = vec![state.clone()];
    match fs::symlink_metadata(&state) {
        Ok(m) if m.file_type().is_symlink() => found.push(format!("{STATE_DIR} is a symlink")),
        Ok(m) if !m.is_dir() => found.push(format!("{STATE_DIR} is not a directory")),
        Ok(_) => {
            let open = state.join("jobs").join("open");
            if fs::symlink_metadata(&open).is_ok_and(|m| m.file_type().is_symlink()) {
                found.push(format!("{STATE_DIR}/jobs/open is a symlink"));
            } else {
                look.push(open);
            }
        }
        Err(_) => look.clear(),
    }
    for dir in look {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                let rel = e.path();
                let rel = rel.strip_prefix(root).unwrap_or(&rel);
                found.push(format!("{} is a symlink", rel.display()));
            }
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(Error::forbidden(format!(
        "{}: refusing to open: {}. A study's {STATE_DIR}/ is rsim's own state on this machine \
         (job state it acts on, keys, the index) and never comes with a repository; nothing was \
         read through it. Remove it from git and from disk (git rm -r --cached {STATE_DIR}; \
         rm -r {STATE_DIR}) and open the study again",
        root.display(),
        found.join(", ")
    )))
}

/// A read-only clone's node branches move only by `git fetch`, outside rsim: when git's
/// references changed since the index last looked (their files' times and sizes), the index
/// catches up, proving each moved node's new commits. A writer's index is kept in step by the
/// commit protocol itself.
fn catch_up_with_fetched_refs(index: &mut Index, record: &Record) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let git = record.repo().path();
    let seen: String = [
        "packed-refs",
        "refs/heads/rsim/n",
        "refs/heads/main",
        "FETCH_HEAD",
    ]
    .iter()
    .map(|p| match fs::metadata(git.join(p)) {
        Ok(m) => format!("{}.{}:{}:{}", m.mtime(), m.mtime_nsec(), m.size(), m.ino()),
        Err(_) => "-".into(),
    })
    .collect::<Vec<_>>()
    .join(",");
    if index.meta("refs_seen")?.as_deref() == Some(seen.as_str()) {
        return Ok(());
    }
    let synced = index.catch_up(record)?;
    if synced > 0 {
        tracing::info!(synced, "the index caught up with fetched node branches");
    }
    index.set_meta("refs_seen", &seen)
}

/// Whether the index at `path` carries this machine's stamp (without a machine key: trusted).
fn index_stamp_holds(path: &Path) -> bool {
    !crate::util::origin::can_stamp()
        || crate::util::origin::is_ours("index", path, &path.with_extension("origin"))
}

/// Every entry below `dir`, walked without following links: the first symlink is refused.
fn refuse_symlinks_below(root: &Path, dir: &Path) -> Result<()> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_symlink() {
                let p = e.path();
                return Err(Error::forbidden(format!(
                    "{}: refusing to open: {} is a symlink. A study's {STATE_DIR}/ is rsim's own \
                     state on this machine and is never followed out of the study; nothing was \
                     read through it. Remove the link (or the whole {STATE_DIR}/ of a study that \
                     came from elsewhere) and open the study again",
                    root.display(),
                    p.strip_prefix(root).unwrap_or(&p).display()
                )));
            }
            if t.is_dir() {
                todo.push(e.path());
            }
        }
    }
    Ok(())
}

/// Whether the index at `path` was built here (`util::origin`): one copied in with a study, or
/// crafted, is rebuilt from git instead of read. `Ok(false)` also when there is none yet; a file
/// that is not ours is removed first (never through a symlink: `refuse_foreign_state` ran).
fn index_is_ours(path: &Path) -> Result<bool> {
    let stamp = path.with_extension("origin");
    if !path.exists() {
        return Ok(false);
    }
    if !crate::util::origin::can_stamp() || crate::util::origin::is_ours("index", path, &stamp) {
        return Ok(true);
    }
    tracing::warn!(
        "{} was not built here (a copied or handed-over study, or one from before index stamps); rebuilding it from git",
        path.display()
    );
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => fs::remove_file(&p).at("cannot remove", &p)?,
            Ok(_) => {
                return Err(Error::forbidden(format!(
                    "{} is not a plain file; refusing to use it",
                    p.display()
                )));
            }
            Err(_) => {}
        }
    }
    Ok(false)
}

pub(crate) fn mark_index_ours(path: &Path) {
    if let Err(e) = crate::util::origin::stamp("index", path, &path.with_extension("origin")) {
        tracing::warn!("cannot mark {} as built here: {e}", path.display());
    }
}

/// The config as committed on `main` (the record says which config every action ran under).
fn load_committed_config(record: &Record, root: &Path) -> Result<StudyConfig> {
    let main = record.main_tip().map_err(|_| {
        Error::invalid(format!(
            "{} is not an initialised study (no main branch): run `rsim init`",
            root.display()
        ))
    })?;
    let main = crate::record::commit_at_most(record.repo(), main)?;
    let tree =
        crate::record::tree_at_most(record.repo(), main.tree_id(), crate::record::MAX_OWNER_FILE)
            .map_err(|e| e.context("main"))?;
    let entry = tree
        .get_name(CONFIG_FILE)
        .ok_or_else(|| Error::invalid(format!("{CONFIG_FILE} is not committed on main")))?;
    // A repository from elsewhere decides this file's size: it is refused before it is inflated.
    let blob =
        crate::record::blob_at_most(record.repo(), entry.id(), crate::record::MAX_OWNER_FILE)
            .map_err(|e| e.context(format!("{CONFIG_FILE} on main")))?;
    let text = std::str::from_utf8(blob.content())
        .map_err(|_| Error::invalid(format!("{CONFIG_FILE} is not UTF-8")))?;
    // The work tree's copy only earns a warning; it is read as a file a repository from
    // elsewhere may have planted (a link to /dev/zero, a FIFO, a huge file): bounded, no links.
    if let Ok(on_disk) = crate::util::file::read_regular_text(
        &root.join(CONFIG_FILE),
        crate::record::MAX_OWNER_FILE as u64,
    ) && on_disk != text
    {
        tracing::warn!(
            "{CONFIG_FILE} has uncommitted changes; the committed version applies (commit it to change the study)"
        );
    }
    StudyConfig::parse(text, CONFIG_FILE)
}

/// Fingerprint of an evaluator command: sha256 over its argv and the content of every file it
/// names (the program and any study file among its arguments). `@rsim` stands for rsim's embedded
/// evaluator, identified by the hash of its source, so rebuilding rsim for other reasons does not
/// change the fingerprint.
pub fn evaluator_fingerprint(root: &Path, command: &[String]) -> Result<String> {
    let mut parts = Vec::new();
    for (i, a) in command.iter().enumerate() {
        parts.push(a.clone());
        if a == "@rsim" {
            parts.push(crate::train::evaluator_source_hash());
            continue;
        }
        let file = if i == 0 {
            crate::jobs::resolve_program(root, a)
        } else {
            Some(root.join(a)).filter(|p| !a.starts_with('-') && p.is_file())
        };
        if let Some(f) = file {
            parts.push(crate::util::hash::sha256_file(&f)?);
        }
    }
    Ok(crate::util::hash::sha256_hex(parts.join("\0").as_bytes()))
}

/// Expand `@rsim` (this binary, or `bin`) in a command.
/// This rsim binary. When it was replaced on disk while running (a rebuild under a long-running
/// server or campaign), Linux names it `… (deleted)`: jobs then run the binary now at that path.
pub fn current_rsim() -> Result<PathBuf> {
    let exe =
        std::env::current_exe().map_err(|e| Error::internal(format!("cannot locate rsim: {e}")))?;
    if exe.is_file() {
        return Ok(exe);
    }
    let text = exe.to_string_lossy();
    match text.strip_suffix(" (deleted)").map(PathBuf::from) {
        Some(p) if p.is_file() => Ok(p),
        _ => Err(Error::internal(format!(
            "the running rsim binary {text} is gone from disk; restart rsim"
        ))),
    }
}

pub fn expand_command(cmd: &[String], bin: Option<&Path>) -> Result<Vec<String>> {
    cmd.iter()
        .map(|a| {
            if a == "@rsim" {
                let exe = match bin {
                    Some(b) => b.to_path_buf(),
                    None => current_rsim()?,
                };
                Ok(exe.to_string_lossy().into_owned())
            } else {
                Ok(a.clone())
            }
        })
        .collect()
}

/// A refused request larger than this (canonical JSON bytes) is recorded bounded.
const MAX_RECORDED_REQUEST: usize = 2048;
/// An identical refusal is recorded again at least this often while it repeats.
const REFUSAL_WINDOW_S: f64 = 600.0;

/// What the record keeps of a refused request: the request itself when it is small; otherwise
/// its sha256 and size with its top-level fields bounded (strings cut to 200 characters, arrays
/// and objects by their size), so that no refusal costs the record more than a few KB.
fn bounded_request(request: &Value) -> Value {
    let bytes = crate::util::hash::json_bytes(request).unwrap_or_default();
    if bytes.len() <= MAX_RECORDED_REQUEST {
        return request.clone();
    }
    let cut = |s: &str| -> String { s.chars().take(200).collect() };
    let mut fields = serde_json::Map::new();
    if let Value::Object(m) = request {
        for (k, v) in m.iter().take(32) {
            let k = cut(k);
            let v = match v {
                Value::String(s) => Value::String(cut(s)),
                Value::Array(a) => serde_json::json!({ "items": a.len() }),
                Value::Object(o) => serde_json::json!({ "keys": o.len() }),
                other => other.clone(),
            };
            fields.insert(k, v);
        }
    }
    serde_json::json!({
        "bounded": true,
        "sha256": crate::util::hash::sha256_hex(&bytes),
        "bytes": bytes.len(),
        "fields": fields,
    })
}

fn check_caller(caller: &Caller) -> Result<()> {
    let a = &caller.agent;
    // git's author names may hold no `<` or `>` (they delimit the address), so neither may an
    // agent's name: it is refused here, clearly, not inside git as an internal error.
    if a.is_empty()
        || a.len() > 64
        || a.chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '<' || c == '>')
        || a.contains("..")
    {
        return Err(Error::invalid(format!(
            "agent: {a:?} is not a valid agent name (1-64 characters, no spaces, control characters, \"<\", \">\" or \"..\")"
        )));
    }
    Ok(())
}

fn short_ck(c: &str) -> &str {
    if c.len() > 12 { &c[..12] } else { c }
}

fn first_line(s: &str) -> String {
    let l = s
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    crate::util::text::sanitize_line(l)
}
